"""Statements over deliveries awaiting their reader's confirmation: the bodies of the SQLStore methods of the same
name (store/base.py says what each promises), loaded only by a read that takes delivery in two steps (a client of
`agent-mail serve`: the server answers, the client prints, then confirms). Written once for every engine."""

from __future__ import annotations

from agent_mail.store.sql_values import ids_clause

_COLUMNS = "lease, agent, message_id, flags, at, expires_at"


def leased_ids(store, agent: str, now: str) -> set[str]:
    """The ids of `agent`'s messages held by a delivery not yet confirmed and not expired at `now`."""
    return {row[0] for row in store._x("SELECT message_id FROM deliveries WHERE agent = ? AND expires_at > ?",
                                       (agent, now))}


def holds_of_many(store, agents: list[str], now: str) -> dict[str, dict[str, str]]:
    """{agent: {message id: when its hold ends}} of the holds of `agents` not expired at `now` (only agents that
    have some)."""
    found: dict[str, dict[str, str]] = {}
    for start in range(0, len(agents), 500):
        marks, params = ids_clause(agents[start:start + 500], "agent")
        for agent, message_id, expires_at in store._x(
                f"SELECT agent, message_id, expires_at FROM deliveries WHERE expires_at > :now AND agent IN ({marks})",
                {"now": now, **params}):
            found.setdefault(agent, {})[message_id] = expires_at
    return found


def lease_deliveries(store, lease: str, agent: str, marks: list[tuple[str, str]], at: str, expires_at: str) -> None:
    """Hold each (message id, flags) of `agent` for `lease` until `expires_at` (the marks to make at `at` once it
    is confirmed); an expired hold of the same message is replaced, and `agent`'s other expired ones cleared."""
    store._x("DELETE FROM deliveries WHERE agent = ? AND expires_at <= ?", (agent, at))
    store._many(f"INSERT INTO deliveries ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent, message_id) DO "
                "UPDATE SET lease = excluded.lease, flags = excluded.flags, at = excluded.at, "
                "expires_at = excluded.expires_at",
                [(lease, agent, message_id, flags, at, expires_at) for message_id, flags in marks])


def lease_of(store, lease: str) -> list[dict]:
    """The holds of `lease` (expired or not): {agent, message_id, flags, at, expires_at}."""
    return store._query(f"SELECT {_COLUMNS} FROM deliveries WHERE lease = ? ORDER BY message_id", (lease,))


def end_lease(store, lease: str) -> int:
    """Delete the holds of `lease`; how many there were."""
    return store._x("DELETE FROM deliveries WHERE lease = ?", (lease,)).rowcount
