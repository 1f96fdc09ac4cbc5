"""A SQLite mailbox file inspected, checked and repaired: what `describe`, `doctor` and `copy` do to one.

The registry (store/__init__.py) names this module for SQLite locations; `backend_for(location)` calls its
`report`, `doctor` and `locate`. None of them creates a mailbox, and only those commands import it.

`doctor`'s check is SQLite's integrity_check (the file's structure) plus a read of every row (its
content: text that no longer decodes is damage integrity_check does not see), the schema's
migrations, and row counts. The repair copies every row that can still be read, table by
table in rowid order, into a fresh mailbox; where a damaged page stops a scan, it finds the
first rowid past the damage and carries on, and reports the rowids (and, from the id index
where it survived, the message ids) it could not save. The damaged file is kept aside.

A file cut short (its header counts pages that are gone) is read as far as it goes, and what it
held is counted from the file itself: the size its header records, and the rowids its surviving
b-tree pages name, so a repair never passes off what it could not read as nothing lost.
"""

from __future__ import annotations

import os

try:  # the driver itself, as store/sqlite.py imports it
    import _sqlite3 as sqlite3
except ImportError:
    import sqlite3

from agent_mail import errors, model, spec
from agent_mail.store import schema, sqlite_pages, sqlite_schema
from agent_mail.store import sqlite as sqlite_store
from agent_mail.store.maintenance import doctor_report

INTEGRITY_LIST_MAX = 100
_ROWID_MIN, _ROWID_MAX = -(2 ** 63), 2 ** 63 - 1


# ---------------------------------------------------------------- describe and copy


def report(location: str, source: str, given: str | None) -> dict:
    """What `describe` says of the SQLite mailbox at `location` (resolved from `given`, as written)."""
    found = {"backend": "sqlite", "path": location, "source": source}
    if given and os.path.abspath(os.path.expanduser(given)) != location:
        found["link"] = os.path.abspath(os.path.expanduser(given))
    return {**found, **inspect(location)}


def locate(value: str, field: str) -> str:
    """The mailbox file `value` names on the command line; the one to copy from (--from) must exist."""
    path = os.path.realpath(os.path.expanduser(value))
    if field == "from" and not os.path.isfile(path):
        raise errors.InvalidInput([(field, f"{path} is not a mailbox file; nothing was copied.")])
    return path


INSPECT_CHECK_MAX_BYTES = 32 * 1024 * 1024  # describe checks the file's integrity up to this size


def inspect(path: str) -> dict:
    """Facts about a mailbox file for `describe`, without creating or changing it."""
    import stat

    report: dict = {"exists": os.path.isfile(path), "messages": None, "size_bytes": None}
    if os.path.isdir(os.path.dirname(os.path.abspath(path))):
        report["permissions"] = permissions(path)
    try:
        info = os.stat(path)
    except OSError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        report["problem"] = sqlite_store.not_a_file(path, info.st_mode)
        return report
    damage = sqlite_store.read_damage_record(path)
    if damage:
        report["damaged"] = damage
    if not report["exists"]:
        return report
    report["size_bytes"] = info.st_size
    try:
        db = sqlite3.connect(f"file:{_uri_path(path)}?mode=ro", uri=True, timeout=2.0)
        try:
            report["messages"] = db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
            if info.st_size <= INSPECT_CHECK_MAX_BYTES:
                found = [r[0] for r in db.execute("PRAGMA quick_check(5)")]
                report["integrity"] = "ok" if found == ["ok"] else "damaged: " + "; ".join(found)
            else:
                report["integrity"] = "not checked (large mailbox): run agent-mail doctor"
        finally:
            db.close()
    except sqlite3.Error as exc:
        report["problem"] = f"cannot read it as a mailbox: {exc}"
        if sqlite_store.is_damage(exc):
            report["integrity"] = f"damaged: {exc}"
    if report.get("integrity", "ok").startswith("damaged"):
        report["problem"] = sqlite_store.damaged_error(path, report["integrity"]).message
    return report


def permissions(path: str) -> dict:
    """The mailbox's and its directory's modes, and whether only the owner can read them."""
    import stat

    directory = os.path.dirname(os.path.abspath(path))
    modes = {}
    for key, target in (("directory", directory), ("file", path)):
        try:
            modes[key] = stat.S_IMODE(os.stat(target).st_mode)
        except OSError:
            modes[key] = None
    exposed = [k for k, mode in modes.items() if mode is not None and mode & 0o077 and
               not (k == "directory" and mode & stat.S_ISVTX)]
    report = {k: (f"{v:04o}" if v is not None else None) for k, v in modes.items()}
    report["private"] = not exposed
    if exposed:
        report["warning"] = (f"the mailbox {' and its '.join(exposed)} can be read by other users; "
                             f"run: chmod 700 {directory}" + (f" && chmod 600 {path}" if "file" in exposed else ""))
    return report


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.fsencode(os.path.abspath(path)))


# ---------------------------------------------------------------- doctor


def doctor(path: str, repair: bool, emit) -> dict:
    """Check the mailbox at `path` (and with `repair`, rebuild it if damaged and remove what killed processes
    left beside it); emit and return the report."""
    import stat

    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise errors.StorageError(sqlite_store.not_a_file(path, info.st_mode))
    marker = sqlite_store.read_damage_record(path)
    # Files of mailbox creations whose process is gone: never the mailbox, safe to remove whatever its state.
    removed = sqlite_schema.sweep_creation_leftovers(path) if repair else []
    leftovers = sqlite_schema.creation_leftovers(path)
    if info is None:
        report = doctor_report(path, ok=marker is None, integrity=[], schema=None, counts={}, marker=marker,
                               leftovers=leftovers)
        report["temporary_files_removed"] = removed
        report["next"] = [] if marker is None and not leftovers else [spec.Step("doctor", repair=True)]
        emit(report)
        return report
    findings, schema, counts = _check(path)
    healthy = not findings
    ok = healthy and schema is not None and schema["complete"]
    report = doctor_report(path, ok=ok, integrity=findings, schema=schema, counts=counts, marker=marker,
                           leftovers=leftovers)
    report["temporary_files_removed"] = removed
    if repair and not healthy:
        report["repair"] = _repair(path)
        report["next"] = [spec.Step("doctor")]
    elif healthy:
        report["next"] = [] if ok or schema is None else [spec.Step("status")]  # any command applies migrations
        if leftovers:
            report["next"].append(spec.Step("doctor", repair=True))
    else:
        report["next"] = [spec.Step("doctor", repair=True)]
    emit(report)
    # A clean bill of health lifts an earlier refusal; a repaired mailbox is a new file with no marker.
    if (healthy or report["repair"]) and marker is not None:
        try:
            os.unlink(sqlite_store.damage_marker(path))
        except FileNotFoundError:
            pass
    return report


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(os.fsencode(path), timeout=sqlite_store.BUSY_TIMEOUT_SECONDS, isolation_level=None)
    db.text_factory = bytes  # decode ourselves, so text that no longer decodes is found, not fatal
    # SQLite refuses a whole file whose header counts more pages than it has (a copy cut short) unless
    # writable_schema is on; then it reads the pages that remain. Nothing is written through this connection.
    db.execute("PRAGMA writable_schema = ON")
    return db


def _tables(db: sqlite3.Connection) -> list[str]:
    """The mailbox's own tables (names come back as bytes on the damaged file's connection). Not the search
    index (an FTS5 table and its shadow tables): it is derived from the messages, and rebuilt from them."""
    rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                      "AND name NOT LIKE ? ORDER BY name", (schema.SQLITE_SEARCH_TABLE + "%",))
    return [r[0].decode() if isinstance(r[0], bytes) else r[0] for r in rows]


def _text_columns(db: sqlite3.Connection, table: str) -> list[tuple[str, bool]]:
    """(column, declared as text) for each column of `table`."""
    return [(r[1].decode(), b"BLOB" not in (r[2] or b"").upper())
            for r in db.execute(f'PRAGMA table_info("{table}")')]


def _check(path: str) -> tuple[list[str], dict | None, dict]:
    findings: list[str] = []
    extent = sqlite_pages.extent(path)
    if extent and extent["cut_short"]:
        findings.append(f"the file is cut short: {extent['size_bytes']} bytes of the {extent['size_in_header_bytes']} "
                        "its header records; what was past the cut is lost")
    try:
        db = _connect(path)
    except sqlite3.Error as exc:
        return findings + [f"cannot open: {exc}"], None, {}
    try:
        try:
            check = db.execute(f"PRAGMA integrity_check({INTEGRITY_LIST_MAX})")
            found = [r[0].decode("utf-8", "replace") for r in check]
            if found != ["ok"]:
                findings += found
        except sqlite3.Error as exc:
            return findings + [f"integrity_check failed: {exc}"], None, {}
        counts: dict = {}
        try:
            tables = _tables(db)
        except sqlite3.Error as exc:
            return findings + [f"cannot read the schema: {exc}"], None, {}
        for table in tables:
            columns = _text_columns(db, table)
            rows, bad = 0, 0
            try:
                for row in db.execute(f'SELECT rowid, * FROM "{table}"'):
                    rows += 1
                    if any(isinstance(v, bytes) and is_text and not _decodes(v)
                           for v, (_, is_text) in zip(row[1:], columns, strict=True)):
                        bad += 1
                        if len(findings) < INTEGRITY_LIST_MAX:
                            findings.append(f"{table} rowid {row[0]}: text that is not UTF-8 (damaged content)")
                counts[table] = rows
            except sqlite3.Error as exc:
                counts[table] = None
                findings.append(f"{table}: cannot be read whole ({exc})")
        schema = _schema(db, tables)
        return findings, schema, counts
    finally:
        db.close()


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _schema(db: sqlite3.Connection, tables: list[str]) -> dict:
    expected = [m.__name__ for m in sqlite_schema.MIGRATIONS]
    try:
        applied = {r[0].decode() for r in db.execute(f"SELECT name FROM {schema.MIGRATIONS_TABLE}")}
    except sqlite3.Error:
        applied = set()
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    missing = sorted(set(schema.REQUIRED_TABLES) - set(tables))
    return {"migrations_applied": sorted(applied & set(expected)), "migrations_expected": expected,
            "application_id_ok": app_id == sqlite_store.APPLICATION_ID, "missing_tables": missing,
            "complete": set(expected) <= applied and app_id == sqlite_store.APPLICATION_ID and not missing}


# ---------------------------------------------------------------- repair


def _repair(path: str) -> dict:
    directory = os.path.dirname(path)
    stamp = model.now_iso().replace(":", "").replace("-", "").split(".")[0] + "Z"
    fresh_path = os.path.join(directory, f".{os.path.basename(path)}.am-{os.getpid()}-{os.urandom(4).hex()}.repair")
    damaged = _connect(path)
    try:
        try:  # keep writers out while the rows are copied (readers carry on)
            damaged.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise errors.StorageError(
                    f"another process is writing to {path}; stop every agent-mail process on this mailbox, then run "
                    "doctor --repair again. Nothing was changed.") from None
        fresh_store = sqlite_store.SQLiteStore(fresh_path)  # the whole current schema
        fresh_store.close()
        fresh = sqlite3.connect(os.fsencode(fresh_path), isolation_level=None)
        try:
            fresh.execute("BEGIN IMMEDIATE")
            saved, unsaved, altered, walked = {}, [], [], {}
            try:
                source_tables = set(_tables(damaged))
            except sqlite3.Error:
                source_tables = None
            for table in _tables(fresh):
                if table == schema.MIGRATIONS_TABLE or table not in (source_tables or ()):
                    continue
                saved[table] = _copy_table(damaged, fresh, table, unsaved, altered, walked)
            if sqlite_schema.has_table(fresh, schema.SQLITE_SEARCH_TABLE):
                sqlite_schema.index_missing(fresh)  # the search index of what was saved
            fresh.execute("COMMIT")
            check = [r[0] for r in fresh.execute("PRAGMA integrity_check")]
            lost = _lost(unsaved, walked)
        finally:
            fresh.close()
        if check != ["ok"]:
            raise errors.StorageError(f"the rebuilt mailbox did not pass its own check ({check[:3]}); the damaged "
                                      f"mailbox {path} was left in place.")
    except BaseException:
        for leftover in (fresh_path, fresh_path + "-wal", fresh_path + "-shm"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        raise
    finally:
        damaged.close()
    aside = f"{path}.damaged-{stamp}"
    for suffix in ("-wal", ""):  # the damaged file and its journal go aside together
        if os.path.exists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    try:
        os.unlink(path + "-shm")
    except OSError:
        pass
    os.replace(fresh_path, path)
    extent = sqlite_pages.extent(aside)
    complete = source_tables is not None and not unsaved and not (extent and extent["cut_short"])
    return {"complete": complete, "summary": _summary(saved, lost, extent, source_tables is not None, aside),
            "saved": saved, "lost": lost if source_tables is not None else None,
            "unsaved": unsaved[:INTEGRITY_LIST_MAX], "unsaved_count": len(unsaved),
            "altered": altered[:INTEGRITY_LIST_MAX], "altered_count": len(altered), "damaged_file": extent,
            "damaged_copy": aside, "mailbox": path}


def _lost(unsaved: list, walked: dict) -> dict:
    """{table: {rows_estimated, more_unknown}} for each table that lost rows. A lost range's rows are counted
    from its rowids (rowids are given in order, so a range holds about that many); a scan that never read again
    is counted up to the highest rowid the surviving pages name, and what lay past that cannot be counted."""
    lost: dict = {}
    for entry in unsaved:
        counted = lost.setdefault(entry["table"], {"rows_estimated": 0, "more_unknown": False})
        if "rowid" in entry:
            counted["rows_estimated"] += 1
            continue
        after = entry["after_rowid"] or 0
        if entry["up_to_rowid"] is not None:
            counted["rows_estimated"] += max(0, entry["up_to_rowid"] - after)
            continue
        counted["more_unknown"] = True
        highest = walked[entry["table"]].highest
        if highest is not None:
            counted["rows_estimated"] += max(0, highest - after)
    return lost


def _summary(saved: dict, lost: dict, extent: dict | None, schema_read: bool, aside: str) -> str:
    """One sentence a person can act on: what was saved, what was lost, where the damaged file is."""
    if not schema_read:
        return (f"nothing could be read: the damaged file's list of tables is lost, so what it held cannot be told "
                f"and the mailbox is now empty. The damaged file is kept at {aside}; restore a backup if you have one.")
    words = [f"saved {sum(saved.values())} rows ({saved.get('messages', 0)} messages)"]
    for table, counted in lost.items():
        more = "; more past the last readable page, which cannot be counted" if counted["more_unknown"] else ""
        words.append(f"lost about {counted['rows_estimated']} rows of {table}{more}")
    if extent and extent["cut_short"]:
        words.append(f"the file was cut short ({extent['size_bytes']} of the {extent['size_in_header_bytes']} bytes "
                     "its header records)")
    if not lost and not (extent and extent["cut_short"]):
        words.append("nothing was lost")
    return "; ".join(words) + f". The damaged file is kept at {aside}."


def _copy_table(damaged: sqlite3.Connection, fresh: sqlite3.Connection, table: str, unsaved: list,
                altered: list, walked: dict) -> int:
    """Copy every readable row of `table`; note what could not be read or stored. Returns how many were saved.
    `walked` gets what the table's surviving pages say of its rowids, once a scan meets damage."""
    is_text = dict(_text_columns(damaged, table))
    have = {r[1] for r in fresh.execute(f'PRAGMA table_info("{table}")')}
    columns = [c for c in is_text if c in have]
    select = f'SELECT rowid, {", ".join(f"{chr(34)}{c}{chr(34)}" for c in columns)} FROM "{table}" ' \
             "WHERE rowid >= ? ORDER BY rowid"
    marks = ", ".join("?" * (len(columns) + 1))
    insert = f'INSERT OR IGNORE INTO "{table}" (rowid, {", ".join(columns)}) VALUES ({marks})'
    saved, last = 0, _ROWID_MIN
    while last < _ROWID_MAX:
        try:
            for row in damaged.execute(select, (last + 1,)):
                last = row[0]
                values, changed = [row[0]], []
                for column, value in zip(columns, row[1:], strict=True):
                    if isinstance(value, bytes) and is_text[column]:
                        try:
                            value = value.decode("utf-8")
                        except UnicodeDecodeError:
                            value = value.decode("utf-8", "replace")
                            changed.append(column)
                    values.append(value)
                try:
                    fresh.execute(insert, values)
                except sqlite3.Error as exc:
                    unsaved.append({"table": table, "rowid": row[0], "id": _id_of(columns, values), "reason": str(exc)})
                    continue
                saved += 1
                if changed:
                    altered.append({"table": table, "rowid": row[0], "id": _id_of(columns, values), "columns": changed,
                                    "reason": "text was not UTF-8; damaged bytes replaced by U+FFFD"})
            return saved
        except sqlite3.Error as exc:
            if table not in walked:
                walked[table] = _walk(damaged, table)
            resume = _next_readable(damaged, table, last, walked[table].leaf_starts)
            lost = {"table": table, "after_rowid": last if last != _ROWID_MIN else None,
                    "up_to_rowid": resume, "reason": f"unreadable ({exc})"}
            ids = _ids_in_range(damaged, table, last, resume)
            if ids:
                lost["ids"] = ids
            unsaved.append(lost)
            if resume is None:
                return saved
            last = resume
    return saved


def _id_of(columns: list[str], values: list) -> object:
    return values[columns.index("id") + 1] if "id" in columns else None


def _readable_after(db: sqlite3.Connection, table: str, start: int) -> bool:
    # `rowid >= start + 1`, not `rowid > start`: SQLite seeks to the key it is given, and `> start` seeks into
    # the page that holds `start`, which may be the lost one just before a surviving page.
    if start >= _ROWID_MAX:
        return False
    try:
        db.execute(f'SELECT rowid FROM "{table}" WHERE rowid >= ? ORDER BY rowid LIMIT 1', (start + 1,)).fetchall()
        return True
    except sqlite3.Error:
        return False


def _walk(db: sqlite3.Connection, table: str) -> sqlite_pages.TableKeys:
    """What the surviving pages of `table`'s b-tree in the damaged file say of its rowids."""
    try:
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        path = db.execute("PRAGMA database_list").fetchone()[2]
    except sqlite3.Error:
        return sqlite_pages.TableKeys()
    if not root or not root[0] or not path:
        return sqlite_pages.TableKeys()
    return sqlite_pages.table_keys(path.decode() if isinstance(path, bytes) else path, root[0])


def _next_readable(db: sqlite3.Connection, table: str, failed_after: int, leaf_starts: list[int]) -> int | None:
    """The smallest start past `failed_after` from which a scan of `table` reads again, or None.

    Probes forward with doubling steps until a scan works, then narrows the boundary, so the rows
    given up are (about) those of the damaged pages only. Readable pages need not follow each other
    (a file cut short keeps pages of every part of the table), so the first surviving leaf past the
    damage, found by walking the file's pages, is tried too, and the nearer of the two wins.
    """
    low, step = failed_after, 1
    high = None
    while True:
        candidate = min(_ROWID_MAX, low + step)
        if _readable_after(db, table, candidate):
            high = candidate
            break
        if candidate >= _ROWID_MAX:
            break
        low, step = candidate, step * 2
    if high is not None:
        while high - low > 1:
            middle = (low + high) // 2
            if _readable_after(db, table, middle):
                high = middle
            else:
                low = middle
    from bisect import bisect_right

    for start in leaf_starts[bisect_right(leaf_starts, failed_after + 1):]:
        if high is not None and start - 1 >= high:
            break
        if _readable_after(db, table, start - 1):
            return start - 1
    return high


def _ids_in_range(db: sqlite3.Connection, table: str, after: int, up_to: int | None) -> list[str]:
    """Message ids of lost rows, from the id index where it survived the damage."""
    if table != "messages":
        return []
    rows = []
    try:  # the index may be damaged too: keep what it gave before the damage
        for row in db.execute("SELECT id FROM messages INDEXED BY sqlite_autoindex_messages_1 WHERE id IS NOT NULL "
                              "AND rowid > ? AND rowid <= ?", (after, _ROWID_MAX if up_to is None else up_to)):
            rows.append(row)
            if len(rows) >= INTEGRITY_LIST_MAX:
                break
    except sqlite3.Error:
        pass
    return [r[0].decode("utf-8", "replace") if isinstance(r[0], bytes) else r[0] for r in rows]
