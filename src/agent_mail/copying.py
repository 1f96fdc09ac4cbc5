"""Copy a whole mailbox into another, on any backends: how a team moves its SQLite mailbox onto PostgreSQL.

Everything is copied as stored: message ids and insertion sequence (so threads, the hooks' watermarks
and arrival order survive), every recipient's read/ack/archive/delete state, schedules, attachments,
profiles, system events, liveness and harness sessions. The target is written in one transaction
(all or nothing) and then counted against the source.
"""

from __future__ import annotations

from agent_mail import errors, model

# table -> (its columns, whether it is numbered by the backend's insertion sequence, its key)
TABLES = {
    "messages": (("id", "sender", "recipient", "subject", "body", "refs", "reply_to", "type", "ttl_hours", "created",
                  "read_at", "acked_at", "deliver_at", "cancelled_at", "batch_id", "archived_at", "deleted_at"),
                 True, ("id",)),
    "broadcast_acks": (("message_id", "agent", "read_at", "acked_at", "archived_at", "deleted_at"), False,
                       ("message_id", "agent")),
    "scheduled": (("message_id", "recipient", "deliver_at", "published_at"), False, ("message_id",)),
    "attachment_blobs": (("sha256", "size", "content", "created"), False, ("sha256",)),
    "attachments": (("message_id", "position", "name", "size", "sha256"), False, ("message_id", "position")),
    "profiles": (("agent", "human", "mirror_dir", "max_entries", "updated_at"), False, ("agent",)),
    "system_events": (("id", "agent", "source", "payload", "created", "dismissed_at"), True, ("id",)),
    "watchers": (("agent", "started_at", "last_seen"), False, ("agent",)),
    "watch_sessions": (("id", "agent", "started_at", "last_seen", "state", "released_at", "released_reason"), False,
                       ("id",)),
    "heartbeats": (("agent", "last_seen"), False, ("agent",)),
    "harness_sessions": (("id", "harness", "agent", "pid", "host", "started_at", "last_seen", "told_seq", "told_at",
                          "told_event", "waiter", "ended_at"), False, ("id",)),
}
# Columns holding timestamps: written as UTC, so that text order is time order on every backend (mailboxes
# of older implementations stored local offsets, which SQLite orders through julianday()).
_STAMPS = {"created", "read_at", "acked_at", "deliver_at", "cancelled_at", "archived_at", "deleted_at", "published_at",
           "updated_at", "dismissed_at", "started_at", "last_seen", "released_at", "told_at", "ended_at"}
BATCH = 1000


def _utc(value):
    if isinstance(value, str) and value and not value.endswith("+00:00"):
        moment = model.parse_iso(value)
        if moment is not None:
            return model.iso(moment)
    return value


def counts(store) -> dict[str, int]:
    return {table: store._value(f"SELECT COUNT(*) FROM {table}") for table in TABLES}


def copy(source_location: str, target_location: str, *, merge: bool = False, dry_run: bool = False) -> dict:
    """Copy every record of the mailbox at `source_location` into the one at `target_location`."""
    from agent_mail.store import open_store, redact_url, scheme_of

    def shown(location: str) -> str:
        return location if scheme_of(location) is None else redact_url(location)

    if source_location == target_location:
        raise errors.InvalidInput([("--from", f"is the target mailbox itself ({shown(target_location)}); name "
                                              "another mailbox to copy from.")])
    source = open_store(source_location)
    try:
        target = open_store(target_location)
        try:
            result = _copy(source, target, shown(source_location), shown(target_location), merge, dry_run)
            if not dry_run:
                target.after_copy()
            return result
        finally:
            target.close()
    finally:
        source.close()


def _copy(source, target, source_name: str, target_name: str, merge: bool, dry_run: bool) -> dict:
    with source.transaction():  # one snapshot of the source
        before = counts(source)
        with target.transaction(write=True):  # all or nothing
            existing = counts(target)
            if any(existing.values()) and not merge:
                raise errors.InvalidInput([("--merge", f"the target {target_name} already holds "
                                                       f"{existing['messages']} messages and other records; nothing "
                                                       "was copied. Copy into an empty mailbox, or give --merge to "
                                                       "add what it lacks (records it has are kept as they are).")])
            if dry_run:
                copied, after = dict.fromkeys(TABLES, 0), existing
            else:
                # Into an empty mailbox the insertion sequence is kept as it was; merged records are appended.
                copied = {table: _copy_table(source, target, table, keep_seq=not merge) for table in TABLES}
                target._after_bulk_insert()
                target.index_missing()  # the search index is the target's own, built from what arrived
                after = counts(target)
                # Counted again, independently of what the inserts reported: an empty target now holds exactly
                # what the source holds, or nothing is committed.
                short = {t: before[t] - (after[t] - existing[t]) for t in TABLES if after[t] - existing[t] != before[t]}
                if short and not merge:
                    raise errors.StorageError(f"the copy into {target_name} did not count out (rows short: {short}); "
                                              "nothing was copied. Please report this.")
    return {"source": source_name, "target": target_name, "dry_run": dry_run, "merge": merge,
            "source_counts": before, "target_counts_before": existing, "target_counts": after, "copied": copied,
            "verified": not dry_run and all(after[t] >= before[t] for t in TABLES)}


def _copy_table(source, target, table: str, keep_seq: bool) -> int:
    columns, numbered, key = TABLES[table]
    read_columns = ((f"{source.SEQ} AS seq",) if numbered and keep_seq else ()) + columns
    write_columns = ((target.SEQ,) if numbered and keep_seq else ()) + columns
    values = ["?" for _ in write_columns]
    # Where the search index is a column of the row (PostgreSQL), it is written with the row: filled in
    # afterwards, every row would be written twice (1,000,000 rows: minutes more).
    indexed = table == "messages" and bool(target._SEARCH_COLUMN[0])
    if indexed:
        from agent_mail import index

        at = {name: write_columns.index(name) for name in ("id", "sender", "recipient", "subject", "body")}
        write_columns += ("search",)
        values.append("CAST(? AS tsvector)")
    order = f" ORDER BY {source.SEQ}" if numbered else ""  # merged records are appended in their own order
    insert = (f"INSERT INTO {table} ({', '.join(write_columns)}) VALUES ({', '.join(values)}) "
              f"ON CONFLICT ({', '.join(key)}) DO NOTHING")
    stamps = [i for i, name in enumerate(write_columns) if name in _STAMPS]
    cursor = source._x(f"SELECT {', '.join(read_columns)} FROM {table}{order}")
    total = 0
    while True:
        rows = cursor.fetchmany(BATCH)
        if not rows:
            return total
        batch = []
        names = source.attachments_of([row[at["id"]] for row in rows]) if indexed else {}
        for row in rows:
            row = list(row)
            for i in stamps:
                row[i] = _utc(row[i])
            if indexed:
                entry = index.document({field: row[i] for field, i in at.items()},
                                       [a["name"] for a in names.get(row[at["id"]], ())])
                row.append(index.tsvector(entry))
            batch.append(row)
        total += target._many(insert, batch)
