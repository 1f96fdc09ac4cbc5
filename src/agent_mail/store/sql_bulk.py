"""Whole-mailbox rows for copy, export and import, in the shared SQL of store/sql.py.

Each function is the body of the SQLStore method of the same name (see store/base.py for what each
promises); they live here so that the commands that never move a whole mailbox (send, read, watch)
never load them. Statements are written once; where the dialects differ they go through the store's
hooks (SEQ, _ts, _SEARCH_COLUMN, _index_batch).
"""

from __future__ import annotations

from agent_mail.store import schema
from agent_mail.store.sql_values import decode_json, encode_json, ids_clause

_STATE = schema.STATE_COLUMNS


# ---------------------------------------------------------------- copy: tables as stored


def table_counts(store) -> dict[str, int]:
    return {table: store._value(f"SELECT COUNT(*) FROM {table}") for table in schema.TABLES}


def read_rows(store, table: str, *, with_seq: bool, batch: int):
    columns, numbered, _ = schema.TABLES[table]
    read_columns = ((f"{store.SEQ} AS seq",) if numbered and with_seq else ()) + columns
    order = f" ORDER BY {store.SEQ}" if numbered else ""  # merged records are appended in their own order
    cursor = store._x(f"SELECT {', '.join(read_columns)} FROM {table}{order}")
    while True:
        rows = cursor.fetchmany(batch)
        if not rows:
            return
        yield rows


def write_rows(store, table: str, rows: list, *, with_seq: bool, attachments_of=None) -> int:
    from agent_mail.store import index

    columns, numbered, key = schema.TABLES[table]
    write_columns = ((store.SEQ,) if numbered and with_seq else ()) + columns
    values = ["?" for _ in write_columns]
    # Where the search index is a column of the row (PostgreSQL), it is written with the row: filled in
    # afterwards, every row would be written twice (1,000,000 rows: minutes more).
    search_column, search_value = store._SEARCH_COLUMN
    indexed = table == "messages" and bool(search_column)
    if indexed:
        at = {name: write_columns.index(name) for name in ("id", "sender", "recipient", "subject", "body")}
        write_columns += (search_column,)
        values.append(search_value.format("?"))
        names = attachments_of([row[at["id"]] for row in rows]) if attachments_of is not None else {}
        rows = [[*row, index.tsvector(index.document({field: row[i] for field, i in at.items()},
                                                     [a["name"] for a in names.get(row[at["id"]], ())]))]
                for row in rows]
    insert = (f"INSERT INTO {table} ({', '.join(write_columns)}) VALUES ({', '.join(values)}) "
              f"ON CONFLICT ({', '.join(key)}) DO NOTHING")
    return store._many(insert, rows)


# ---------------------------------------------------------------- export: records with what hangs off them


def _scope(store, agent: str | None, since: str | None, now: str) -> tuple[str, dict]:
    where, params = ["1 = 1"], {"now": now}
    if agent is not None:
        where.append(store.F.party)
        params["agent"] = agent
    if since is not None:
        where.append(f"{store.F.m_arrived} >= {store._ts(':since')}")
        params["since"] = since
    return " AND ".join(where), params


def count_stored(store, *, agent: str | None, since: str | None, now: str) -> int:
    where, params = _scope(store, agent, since, now)
    return store._value(f"SELECT COUNT(*) FROM messages m WHERE {where}", params)


# (not the seed lineage's inert ttl_hours: it stays in the mailbox, and no record carries a lifetime)
_STORED = ("seq", "id", "batch_id", "type", "sender", "recipient", "subject", "body", "refs", "reply_to", "created",
           "deliver_at", "cancelled_at", *_STATE)


def last_seq(store) -> int:
    return store._value(f"SELECT COALESCE(MAX({store.SEQ}), 0) FROM messages")


def stored_messages(store, *, agent: str | None, since: str | None, now: str, after: int, limit: int,
                    ids: list[str] | None = None) -> list[dict]:
    where, params = _scope(store, agent, since, now)
    if ids is not None:
        marks, named = ids_clause(ids)
        where += f" AND m.id IN ({marks})"
        params.update(named)
    seq = store.SEQ
    rows = [dict(zip(_STORED, r, strict=True)) for r in store._x(
        f"SELECT m.{seq}, {', '.join('m.' + c for c in _STORED[1:])} FROM messages m WHERE {where} "
        f"AND m.{seq} > :after ORDER BY m.{seq} LIMIT {int(limit)}", {**params, "after": after}).fetchall()]
    if not rows:
        return rows
    marks, found = ids_clause([r["id"] for r in rows])
    states: dict[str, list[dict]] = {}
    for r in store._x(f"SELECT message_id, agent, {', '.join(_STATE)} FROM broadcast_acks WHERE message_id IN "
                      f"({marks}) ORDER BY message_id, agent", found):
        states.setdefault(r[0], []).append(dict(zip(("agent", *_STATE), r[1:], strict=True)))
    files = store.attachments_of([r["id"] for r in rows])
    schedules = {r[0]: {"deliver_at": r[1], "published_at": r[2]} for r in store._x(
        f"SELECT message_id, deliver_at, published_at FROM scheduled WHERE message_id IN ({marks})", found)}
    for row in rows:
        row["broadcast_states"] = states.get(row["id"], [])
        row["attachments"] = files.get(row["id"], [])
        row["schedule"] = schedules.get(row["id"])
    return rows


def attachment_blob(store, sha256: str) -> dict | None:
    row = store._x("SELECT size, created, content FROM attachment_blobs WHERE sha256 = ?", (sha256,)).fetchone()
    return None if row is None else {"sha256": sha256, "size": row[0], "created": row[1], "content": bytes(row[2])}


def stored_profiles(store, agent: str | None = None) -> list[dict]:
    sql = f"SELECT {', '.join(schema.PROFILE_COLUMNS)} FROM profiles"
    params: tuple = ()
    if agent is not None:
        sql, params = sql + " WHERE agent = ?", (agent,)
    return [{**dict(zip(schema.PROFILE_COLUMNS, r, strict=True)), "human": bool(r[1])}
            for r in store._x(sql + " ORDER BY agent", params).fetchall()]


def stored_events(store, agent: str | None = None, since: str | None = None) -> list[dict]:
    where, params = ["1 = 1"], {}
    if agent is not None:
        where.append("agent = :agent")
        params["agent"] = agent
    if since is not None:
        where.append(f"{store._ts('created')} >= {store._ts(':since')}")
        params["since"] = since
    return [{**dict(zip(schema.EVENT_COLUMNS, r, strict=True)), "payload": decode_json(r[3])}
            for r in store._x(f"SELECT {', '.join(schema.EVENT_COLUMNS)} FROM system_events WHERE "
                              f"{' AND '.join(where)} ORDER BY {store.SEQ}", params).fetchall()]


# ---------------------------------------------------------------- import: records put back, what is there kept


def blob_size(store, sha256: str) -> int | None:
    row = store._x("SELECT size FROM attachment_blobs WHERE sha256 = ?", (sha256,)).fetchone()
    return None if row is None else row[0]


def restore_blob(store, sha256: str, content: bytes, created: str) -> bool:
    return bool(store._x("INSERT INTO attachment_blobs (sha256, size, content, created) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT (sha256) DO NOTHING", (sha256, len(content), content, created)).rowcount)


def restore_profile(store, profile: dict) -> bool:
    return bool(store._x(
        "INSERT INTO profiles (agent, human, mirror_dir, max_entries, updated_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (agent) DO NOTHING", (profile["agent"], int(profile["human"]), profile["mirror_dir"],
                                           profile["max_entries"], profile["updated_at"])).rowcount)


def restore_event(store, event: dict) -> bool:
    return bool(store._x(
        "INSERT INTO system_events (id, agent, source, payload, created, dismissed_at) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (id) DO NOTHING", (event["id"], event["agent"], event["source"], encode_json(event["payload"]),
                                        event["created"], event["dismissed_at"])).rowcount)


# Every column a record fills: the inert ttl_hours takes its default.
_RESTORED = tuple(c for c in schema.MESSAGE_COLUMNS if c != "ttl_hours")


def restore_messages(store, messages: list[dict]) -> int:
    from agent_mail.store import index

    marks, params = ids_clause([m["id"] for m in messages])
    there = {r[0] for r in store._x(f"SELECT id FROM messages WHERE id IN ({marks})", params)}
    fresh = []
    for message in messages:
        if message["id"] not in there:  # nor earlier in this batch
            there.add(message["id"])
            fresh.append(message)
    if not fresh:
        return 0
    columns = _RESTORED
    search_column, search_value = store._SEARCH_COLUMN
    rows, entries = [], {}
    for message in fresh:
        row = {**message, "refs": encode_json(message["refs"]) if message["refs"] else None}
        entries[message["id"]] = entry = index.document(row, [f["name"] for f in message["attachments"]])
        rows.append([row[c] for c in columns] + ([index.tsvector(entry)] if search_column else []))
    store._many(f"INSERT INTO messages ({', '.join(columns)}{', ' + search_column if search_column else ''}) "
                f"VALUES ({', '.join('?' for _ in columns)}"
                f"{', ' + search_value.format('?') if search_column else ''})", rows)
    store._index_batch(entries)
    store._many("INSERT INTO attachments (message_id, position, name, size, sha256) VALUES (?, ?, ?, ?, ?)",
                [(m["id"], i, f["name"], f["size"], f["sha256"]) for m in fresh
                 for i, f in enumerate(m["attachments"])])
    store._many("INSERT INTO broadcast_acks (message_id, agent, read_at, acked_at, archived_at, deleted_at) VALUES "
                "(?, ?, ?, ?, ?, ?) ON CONFLICT (message_id, agent) DO NOTHING",
                [(m["id"], st["agent"], *(st[c] for c in _STATE)) for m in fresh for st in m["broadcast_states"]])
    store._many("INSERT INTO scheduled (message_id, recipient, deliver_at, published_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (message_id) DO NOTHING",
                [(m["id"], m["recipient"], m["schedule"]["deliver_at"], m["schedule"]["published_at"])
                 for m in fresh if m["schedule"] is not None])
    for recipient in {m["recipient"] for m in fresh}:
        store._wake(recipient)  # a watch waiting for it wakes once the import commits
    return len(fresh)
