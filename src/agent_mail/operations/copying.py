"""Copy a whole mailbox into another, on any backends: how a team moves its SQLite mailbox onto PostgreSQL.

Everything is copied as stored: message ids and insertion sequence (so threads, the hooks' watermarks
and arrival order survive), every recipient's read/ack/archive/delete state, schedules, attachments,
profiles, system events, liveness and harness sessions, tokens (their hashes) and file reservations. The
target is written in one transaction (all or nothing) and then counted against the source.
"""

from __future__ import annotations

from agent_mail import errors, model
from agent_mail.store import schema

BATCH = 1000


def _utc(value):
    if isinstance(value, str) and value and not value.endswith("+00:00"):
        moment = model.parse_iso(value)
        if moment is not None:
            return model.iso(moment)
    return value


def copy(source_location: str, target_location: str, *, merge: bool = False, dry_run: bool = False) -> dict:
    """Copy every record of the mailbox at `source_location` into the one at `target_location`."""
    from agent_mail.store import open_store, redact_url, scheme_of

    def shown(location: str) -> str:
        return location if scheme_of(location) is None else redact_url(location)

    if source_location == target_location:
        raise errors.InvalidInput([("from", f"is the target mailbox itself ({shown(target_location)}); name "
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
        before = source.table_counts()
        with target.transaction(write=True):  # all or nothing
            existing = target.table_counts()
            if any(existing.values()) and not merge:
                raise errors.InvalidInput([("merge", f"the target {target_name} already holds "
                                                       f"{existing['messages']} messages and other records; nothing "
                                                       "was copied. Copy into an empty mailbox, or give --merge to "
                                                       "add what it lacks (records it has are kept as they are).")])
            if dry_run:
                copied, after = dict.fromkeys(schema.TABLES, 0), existing
            else:
                # Into an empty mailbox the insertion sequence is kept as it was; merged records are appended.
                copied = {table: _copy_table(source, target, table, keep_seq=not merge) for table in schema.TABLES}
                target.after_bulk_insert()
                target.index_missing()  # the search index is the target's own, built from what arrived
                after = target.table_counts()
                # Counted again, independently of what the inserts reported: an empty target now holds exactly
                # what the source holds, or nothing is committed.
                short = {t: before[t] - (after[t] - existing[t]) for t in schema.TABLES
                         if after[t] - existing[t] != before[t]}
                if short and not merge:
                    raise errors.StorageError(f"the copy into {target_name} did not count out (rows short: {short}); "
                                              "nothing was copied. Please report this.")
    return {"source": source_name, "target": target_name, "dry_run": dry_run, "merge": merge,
            "source_counts": before, "target_counts_before": existing, "target_counts": after, "copied": copied,
            "verified": not dry_run and all(after[t] >= before[t] for t in schema.TABLES)}


def _copy_table(source, target, table: str, keep_seq: bool) -> int:
    columns, numbered, _ = schema.TABLES[table]
    with_seq = numbered and keep_seq
    stamps = [i for i, name in enumerate((("seq",) if with_seq else ()) + columns) if name in schema.STAMPS]
    total = 0
    for rows in source.read_rows(table, with_seq=with_seq, batch=BATCH):
        batch = []
        for row in rows:
            row = list(row)
            for i in stamps:
                row[i] = _utc(row[i])
            batch.append(row)
        # The target's search index, where it is written with the row, takes the names of the attachments
        # from the source (the target has none of them yet).
        total += target.write_rows(table, batch, with_seq=with_seq, attachments_of=source.attachments_of)
    return total
