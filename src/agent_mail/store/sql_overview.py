"""Statements over every identity's mail at once: supervision (the dashboard), search, cleanup.

Each function is the body of the SQLStore method of the same name (store/base.py says what each
promises); they live here so that the commands an agent runs all day (send, read, watch) never load
them. Written once for every engine, through the store's dialect hooks.
"""

from __future__ import annotations

from agent_mail.store import schema
from agent_mail.store.sql_values import ids_clause


def recent_rows(store, limit: int, before_seq: int | None = None) -> list[dict]:
    """The newest `limit` message rows (one per recipient of a fan-out, one per broadcast), newest first,
    with each row's own state, scheduled and withdrawn ones included."""
    where = "WHERE m.{0} < :before".format(store.SEQ) if before_seq is not None else ""
    return store._query(
        f"SELECT {store.F.columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at, m.cancelled_at, "
        f"m.batch_id FROM messages m {where} ORDER BY m.{store.SEQ} DESC LIMIT :limit",
        {"limit": limit, "before": before_seq})


def batch_rows(store, batch_ids: list[str]) -> list[dict]:
    """Every row of these fan-outs (a send to several recipients is one row each, sharing its batch)."""
    if not batch_ids:
        return []
    marks, params = ids_clause(batch_ids)
    return store._query(
        f"SELECT {store.F.columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at, m.cancelled_at, "
        f"m.batch_id FROM messages m WHERE m.batch_id IN ({marks}) ORDER BY m.{store.SEQ}", params)


def broadcast_tallies(store, message_ids: list[str]) -> dict[str, dict]:
    """{broadcast id: {"read": n, "acked": n}}: how many identities have read and acted on each."""
    if not message_ids:
        return {}
    marks, params = ids_clause(message_ids)
    return {row[0]: {"read": row[1], "acked": row[2]} for row in store._x(
        "SELECT message_id, COUNT(read_at), COUNT(CASE WHEN acked_at IS NOT NULL OR archived_at IS NOT NULL "
        f"OR deleted_at IS NOT NULL THEN 1 END) FROM broadcast_acks WHERE message_id IN ({marks}) "
        "GROUP BY message_id", params)}


def whole_thread(store, message_id: str) -> list[dict]:
    """Every row of the thread `message_id` belongs to, whoever it was for, in arrival order, with each
    row's own state (what a supervisor sees; no identity's view)."""
    root = store._thread_root(message_id)
    return store._query(
        # Replies to any copy of a fan-out, and every copy of each send: the thread as the whole team has it.
        "WITH RECURSIVE thread(id, batch_id) AS (SELECT r.id, r.batch_id FROM messages r WHERE r.id = :root "
        f"UNION SELECT m.id, m.batch_id FROM {store._THREAD_STEP}) "
        f"SELECT {store.F.columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at, m.cancelled_at, "
        "m.batch_id FROM messages m WHERE m.id IN (SELECT id FROM thread) ORDER BY arrival, seq", {"root": root})


def search_rows(store, query, *, subject_only: bool, now: str, limit: int, before: int | None = None,
                agent: str | None = None, sender: str | None = None, recipient: str | None = None,
                since: str | None = None, thread_ids: list[str] | None = None) -> list[dict]:
    """Stored rows matching `query` (newest stored first, at most `limit`, stored before seq `before`),
    within what `agent` may see when given."""
    from agent_mail.store import index

    source, match, order = store._search_source()
    marks = index.routes(agent=agent, sender=sender, recipient=recipient)
    where, params = [match], {"q": store._search_text(query, subject_only, marks), "now": now, "limit": limit}
    if agent is not None:
        where.append(store.F.party)
        params["agent"] = agent
    if sender is not None:
        where.append("m.sender = :sender")
        params["sender"] = sender
    if recipient is not None:
        where.append("m.recipient = :recipient")
        params["recipient"] = recipient
    if since is not None:
        where.append(f"{store.F.m_arrived} >= {store._ts(':since')}")
        params["since"] = since
    if thread_ids is not None:
        # A thread's rows by id, and the index read only between its first and last (probing the index row
        # by row costs ~0.3 ms a row for a common word's subject tier at 200,000 messages).
        marks, ids = ids_clause(thread_ids or [""], "t")
        where.append(f"m.id IN ({marks})")
        params.update(ids)
        params["lo"], params["hi"] = store._x(
            f"SELECT MIN({store.SEQ}), MAX({store.SEQ}) FROM messages WHERE id IN ({marks})", ids).fetchone()
        where.append(f"{order} BETWEEN :lo AND :hi")
    if before is not None:
        where.append(f"{order} < :before")
        params["before"] = before
    select = (f"SELECT m.{store.SEQ} AS seq, m.id, m.batch_id, m.sender, m.recipient, m.subject, m.body, m.type, "
              f"m.created, m.deliver_at, m.reply_to, m.cancelled_at FROM {source} WHERE {' AND '.join(where)}")
    if not store.SEARCH_WINDOW or thread_ids is not None:
        return store._query(f"{select} ORDER BY {order} DESC LIMIT :limit", params)
    # The newest rows first, walked in order, a window of them at most: a common word fills the page there.
    # Then the rest through the full-text index alone, sorted (the `+ 0` keeps the planner from walking
    # every older row in order looking for a rare one, which its estimates invite: 2.8 s at a million).
    top = before if before is not None else (store._value(f"SELECT MAX({store.SEQ}) FROM messages") or 0) + 1
    params["floor"] = top - store.SEARCH_WINDOW
    found = store._query(f"{select} AND {order} > :floor ORDER BY {order} DESC LIMIT :limit", params)
    if len(found) < limit:
        params["limit"] = limit - len(found)
        found += store._query(f"{select} AND {order} <= :floor ORDER BY {order} + 0 DESC LIMIT :limit", params)
    return found


def oldest_unacked(store, now: str, agents: list[str]) -> dict[str, str]:
    """{agent: when its oldest visible mail not yet acted on arrived}, direct mail and broadcasts, for
    `agents` (those with something unacked)."""
    from agent_mail.model import parse_iso

    oldest: dict[str, str] = {}
    for agent, arrived in store._x(
            f"SELECT recipient, MIN(COALESCE(deliver_at, created)) FROM messages m "
            f"{store._hint('idx_messages_unacked')} WHERE acked_at IS NULL AND archived_at IS NULL AND "
            f"deleted_at IS NULL AND recipient != '*' AND {store.F.visible} GROUP BY recipient", {"now": now}):
        oldest[agent] = arrived
    if not agents or store._x(f"SELECT 1 FROM messages m WHERE m.recipient = '*' AND {store.F.visible} LIMIT 1",
                             {"now": now}).fetchone() is None:
        return oldest  # no broadcast to wait on anyone
    # Each agent's oldest broadcast it has not acted on, many agents to a statement (one round trip each).
    for start in range(0, len(agents), 500):
        chunk = agents[start:start + 500]
        params: dict = {"now": now, **{f"a{i}": agent for i, agent in enumerate(chunk)}}
        rows = store._x(
            f"WITH a(agent) AS (VALUES {', '.join(f'(:a{i})' for i in range(len(chunk)))}) "
            f"SELECT a.agent, (SELECT COALESCE(m.deliver_at, m.created) FROM messages m WHERE m.recipient = '*' "
            f"AND m.sender != a.agent AND {store.F.visible} AND m.id NOT IN (SELECT message_id FROM broadcast_acks "
            f"{store._hint('idx_broadcast_acks_done')} WHERE agent = a.agent AND (acked_at IS NOT NULL OR "
            f"archived_at IS NOT NULL OR deleted_at IS NOT NULL)) ORDER BY {store.F.m_arrived} LIMIT 1) FROM a",
            params).fetchall()
        for agent, arrived in rows:
            if arrived is not None and (agent not in oldest or parse_iso(arrived) < parse_iso(oldest[agent])):
                oldest[agent] = arrived
    return oldest


def open_bounces(store) -> dict[str, int]:
    """{sender: bounces it has not dismissed}."""
    return dict(store._x("SELECT agent, COUNT(*) FROM system_events WHERE source = 'email.bounce' AND "
                        "dismissed_at IS NULL GROUP BY agent").fetchall())


def sends_per_hour(store, since: str) -> list[tuple[str, str, int]]:
    """[(hour 'YYYY-MM-DDTHH', sender, sends)] for mail that arrived since `since` (a fan-out counts once)."""
    return [tuple(row) for row in store._x(
        "SELECT substr(COALESCE(m.deliver_at, m.created), 1, 13) AS hour, m.sender, "
        "COUNT(DISTINCT COALESCE(m.batch_id, m.id)) FROM messages m "
        f"WHERE {store.F.m_arrived} >= {store._ts(':since')} AND m.cancelled_at IS NULL "
        "GROUP BY hour, m.sender", {"since": since})]


def open_over_time(store, moments: list[str]) -> list[tuple[int, int]]:
    """[(unread, unacked)] of direct mail at each of `moments` (ascending ISO timestamps), from the rows'
    own times: what was delivered by then and not yet read (not yet acted on) at that moment."""
    if not moments:
        return []
    arrived, first = "COALESCE(deliver_at, created)", ":t0"
    settled = "COALESCE(acked_at, archived_at, deleted_at)"
    columns, params = [], {}
    for n, moment in enumerate(moments):
        params[f"t{n}"] = moment
        t = f":t{n}"
        columns.append(f"COUNT(CASE WHEN {arrived} <= {t} AND (read_at IS NULL OR read_at > {t}) THEN 1 END)")
        columns.append(f"COUNT(CASE WHEN {arrived} <= {t} AND ({settled} IS NULL OR {settled} > {t}) THEN 1 END)")
    row = store._x(
        f"SELECT {', '.join(columns)} FROM messages WHERE recipient != '*' AND cancelled_at IS NULL AND "
        f"(read_at IS NULL OR read_at > {first} OR {settled} IS NULL OR {settled} > {first})", params).fetchone()
    return [(row[2 * n], row[2 * n + 1]) for n in range(len(moments))]


def cleanup(store, cutoff: str, dry_run: bool) -> dict:
    # Age counts from arrival: a delayed message not yet delivered has not arrived, whatever its creation.
    ts = store._ts
    arrived = ts("COALESCE(deliver_at, created)")
    old = f"{arrived} < {ts(':cutoff')}"
    params = {"cutoff": cutoff}
    count, oldest, newest = store._x(
        f"SELECT COUNT(*), (SELECT COALESCE(deliver_at, created) FROM messages WHERE {old} ORDER BY {arrived} "
        f"LIMIT 1), (SELECT COALESCE(deliver_at, created) FROM messages WHERE {old} ORDER BY {arrived} DESC "
        f"LIMIT 1) FROM messages WHERE {old}",
        params,
    ).fetchone()
    stale = {table: f"{ts(column)} < {ts(':cutoff')}" for table, column in schema.LIVENESS_TABLES.items()}
    sessions = sum(store._value(f"SELECT COUNT(*) FROM {table} WHERE {old_row}", params)
                   for table, old_row in stale.items())
    old_event = f"{ts('created')} < {ts(':cutoff')}"
    events = store._value(f"SELECT COUNT(*) FROM system_events WHERE {old_event}", params)
    doomed = f"SELECT id FROM messages WHERE {old}"
    # Content no message will refer to once these are gone.
    orphans = (
        f"SELECT sha256 FROM attachment_blobs WHERE {ts('created')} < {ts(':cutoff')} AND sha256 NOT IN "
        f"(SELECT sha256 FROM attachments WHERE message_id NOT IN ({doomed}))"
    )
    blobs = store._value(f"SELECT COUNT(*) FROM ({orphans}) AS orphans", params)
    if not dry_run:
        store._unindex(old, params)
        for table, column in (("broadcast_acks", "message_id"), ("attachments", "message_id"),
                              ("scheduled", "message_id")):
            store._x(f"DELETE FROM {table} WHERE {column} IN ({doomed})", params)
        store._x(f"DELETE FROM attachment_blobs WHERE sha256 IN ({orphans})", params)
        store._x(f"DELETE FROM messages WHERE {old}", params)
        for table, old_row in stale.items():
            store._x(f"DELETE FROM {table} WHERE {old_row}", params)
        store._x(f"DELETE FROM system_events WHERE {old_event}", params)
        # Holds of deliveries that ended before the cutoff (their reader never confirmed them): nothing of the
        # mail, which stayed unread; a client's hold lasts a minute, so these are long over.
        store._x(f"DELETE FROM deliveries WHERE {ts('expires_at')} < {ts(':cutoff')}", params)
    return {"deleted_count": count, "oldest_deleted": oldest, "newest_deleted": newest,
            "sessions_deleted": sessions, "events_deleted": events, "attachments_deleted": blobs}
