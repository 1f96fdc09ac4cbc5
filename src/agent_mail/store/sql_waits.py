"""The looks of many identities' waits at once, in the shared SQL of store/sql.py (a server's waits woken together).

Each function is the body of the SQLStore method of the same name (see store/base.py for what each promises). A
broadcast wakes every wait a server carries: each looks at its unread mail, and one statement for all of them (the
identities as a table joined to the mail) costs one round trip and one plan where a statement per identity costs a
thousand. The rule for what is unread is `SQLStore.unread`'s (its lean envelopes, in arrival order), spelled with
the identities' table in place of :agent; the list of identities reaches the engine through the store's
`_identities` hook (an array on PostgreSQL, a list of values elsewhere).
"""

from __future__ import annotations

CHUNK = 500  # identities per statement where each is a parameter of its own (SQLite's limit is 32766)


def _chunks(store, agents: list[str]):
    """The distinct `agents` in statements' worth: (the CTE naming them `a(agent)`, its parameters)."""
    distinct = list(dict.fromkeys(agents))
    named = getattr(store, "_IDENTITIES", None)
    if named is not None:
        if distinct:
            yield named, {"agents": distinct}
        return
    for start in range(0, len(distinct), CHUNK):
        params = {f"a{i}": agent for i, agent in enumerate(distinct[start:start + CHUNK])}
        yield f"WITH a(agent) AS (VALUES {', '.join(f'(:{name})' for name in params)})", params


def unread_of_many(store, agents: list[str], now: str) -> dict[str, list[dict]]:
    F = store.F
    found: dict[str, list] = {agent: [] for agent in agents}
    for identities, params in _chunks(store, agents):
        # Direct mail through the recipient's unread rows; broadcasts from others the identity has not read.
        direct = (f"SELECT a.agent, {F.lean} FROM a JOIN messages m ON m.recipient = a.agent "
                  f"WHERE m.read_at IS NULL AND {F.visible}")
        broadcast = (f"SELECT a.agent, {F.lean} FROM a JOIN messages m ON m.recipient = '*' AND m.sender != a.agent "
                     f"WHERE {F.visible} AND NOT EXISTS (SELECT 1 FROM broadcast_acks b WHERE b.message_id = m.id "
                     "AND b.agent = a.agent AND b.read_at IS NOT NULL)")
        for row in store._x(f"{identities} {direct} UNION ALL {broadcast}", {**params, "now": now}):
            found[row[0]].append(row)
    envelopes = {}
    for agent, rows in found.items():
        rows.sort(key=lambda row: (row[7], row[1]))  # arrival, then insertion
        envelopes[agent] = [{"id": r[2], "sender": r[3], "subject": r[4], "type": r[5], "created": r[6]} for r in rows]
    return envelopes


def next_due_of_many(store, agents: list[str], now: str) -> dict[str, str | None]:
    direct: dict[str, str] = {}
    everyone = None
    for identities, params in _chunks(store, agents):
        for recipient, due in store._x(
                f"{identities} SELECT recipient, MIN(deliver_at) FROM scheduled WHERE published_at IS NULL "
                "AND deliver_at > :now AND (recipient = '*' OR recipient IN (SELECT agent FROM a)) GROUP BY recipient",
                {**params, "now": now}):
            if recipient == "*":
                everyone = due
            else:
                direct[recipient] = due
    return {agent: min((due for due in (direct.get(agent), everyone) if due is not None), default=None)
            for agent in agents}
