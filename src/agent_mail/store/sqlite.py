"""The embedded default: one SQLite file in WAL mode.

What every command needs is here: opening a mailbox, the dialect of the shared SQL, transactions, the
wake-up pipes rung after a commit, and the checks that refuse a damaged or exposed mailbox. What only
some do is imported when needed: the migrations and the making of a new file (store/sqlite_schema.py),
and describe's, doctor's and copy's look at a file (store/sqlite_checks.py).
"""

from __future__ import annotations

import os
import sys
import time

from agent_mail import errors, jsonout
from agent_mail.store.sql import SQLStore
from agent_mail.store.sql_values import ids_clause
from agent_mail.store.sqlite_bells import WakePipe, presence, ring_bells


def _lru_cache(maxsize=128, typed=False):
    """functools.lru_cache as the driver uses it, made of the same C cache functools itself wraps."""
    from _functools import _lru_cache_wrapper

    if callable(maxsize) and isinstance(typed, bool):  # lru_cache(function)
        return _lru_cache_wrapper(maxsize, 128, typed, _cache_info)
    if maxsize is not None and not isinstance(maxsize, int):
        raise TypeError("Expected first argument to be an integer, a callable, or None")
    return lambda function: _lru_cache_wrapper(function, maxsize if maxsize is None else max(maxsize, 0), typed,
                                               _cache_info)


def _cache_info(hits: int, misses: int, maxsize: int | None, currsize: int) -> tuple:
    return hits, misses, maxsize, currsize


def _load_driver():
    """The C driver `_sqlite3` (the `sqlite3` package adds only the datetime adapters, unused here, and imports
    `datetime` for them: ~1.5 ms of every start). On loading, the driver takes `functools.lru_cache` for its
    statement cache, and importing `functools` brings `collections`, `types`, `operator` and more: about a third
    of the interpreter's own start-up, on every command. Where nothing has imported functools yet, the driver is
    given, for that moment, a stand-in holding only lru_cache, built on the C cache functools.lru_cache is itself
    made of (`_functools._lru_cache_wrapper`); the stand-in is gone from sys.modules before anything else runs, so
    a later `import functools` gets the real module."""
    if "functools" in sys.modules or "_sqlite3" in sys.modules:
        import _sqlite3

        return _sqlite3
    stand_in = type(sys)("functools")
    stand_in.lru_cache = _lru_cache
    sys.modules["functools"] = stand_in
    try:
        import _sqlite3
    finally:
        if sys.modules.get("functools") is stand_in:
            del sys.modules["functools"]
    return _sqlite3


try:
    sqlite3 = _load_driver()
except ImportError:  # an interpreter without the C driver
    import sqlite3

# Marks a file as an agent-mail mailbox ("AGML"). Older mailboxes carry 0.
APPLICATION_ID = 0x41474D4C
# How many migrations sqlite_schema.MIGRATIONS holds, so the user_version of a mailbox that has them all: such a
# mailbox opens without importing them (a test holds the two equal).
SCHEMA_VERSION = 17
BUSY_TIMEOUT_SECONDS = 10.0
# SQLite's own busy handler sleeps in C, where a signal cannot act; it waits this long at most before
# control comes back to Python, which keeps waiting up to BUSY_TIMEOUT_SECONDS, signals acted on at once.
BUSY_SLICE_SECONDS = 0.02
# Beside the mailbox: written when a command meets damage, so that nothing more is written into it.
DAMAGE_MARKER_SUFFIX = ".damaged"



class SQLiteStore(SQLStore):
    """A mailbox in one SQLite file.

    Writers are serialised by the database lock (BEGIN IMMEDIATE); a read transaction sees one
    snapshot; rowid is the insertion sequence.
    """

    kind = "sqlite"
    SEQ = "rowid"

    # -- dialect hooks (see store/sql.py) ------------------------------------------
    # Both lookups by index, as a list (SQLite scans every message at each step for an OR in the join: 216 ms a
    # thread at 200,000 messages).
    _THREAD_STEP = ("thread t JOIN messages m ON m.rowid IN (SELECT rowid FROM messages WHERE reply_to = t.id "
                    "UNION ALL SELECT rowid FROM messages WHERE batch_id = t.batch_id)")

    @staticmethod
    def _ts(expression: str) -> str:
        return f"julianday({expression})"  # honours the local offsets older mailboxes wrote

    @staticmethod
    def _hint(index: str) -> str:
        return f"INDEXED BY {index}"

    def _x(self, sql: str, params: object = ()):
        return self.db.execute(sql, params)

    # -- search: an FTS5 table of its own, keyed by the message's rowid --------------------------------
    def searchable(self) -> bool:
        if self._has_search is None:
            self._has_search = self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'message_search'").fetchone() is not None
        return self._has_search

    def _index_inserted(self, entry: dict) -> None:
        if self.searchable():
            self._x("INSERT INTO message_search (rowid, subject, people, files, body) VALUES (last_insert_rowid(), "
                    ":subject, :people, :files, :body)", entry)

    def _index_batch(self, entries: dict[str, dict]) -> None:
        if not self.searchable() or not entries:
            return
        marks, params = ids_clause(list(entries))
        rows = self._x(f"SELECT rowid, id FROM messages WHERE id IN ({marks})", params).fetchall()
        self._many("INSERT INTO message_search (rowid, subject, people, files, body) VALUES (?, ?, ?, ?, ?)",
                   [(seq, *(entries[i][f] for f in ("subject", "people", "files", "body"))) for seq, i in rows])

    def _search_source(self) -> tuple[str, str, str]:
        return ("message_search JOIN messages m ON m.rowid = message_search.rowid", "message_search MATCH :q",
                "message_search.rowid")

    def _search_text(self, query, subject_only: bool, marks: tuple[tuple[str, ...], ...]) -> str:
        return query.fts5(subject_only, marks)

    def index_missing(self) -> int:
        if not self.searchable():
            return 0
        from agent_mail.store import sqlite_schema

        return sqlite_schema.index_missing(self.db)

    def index_behind(self) -> bool:
        """Whether messages were stored past the index's newest entry (by a tool that does not index)."""
        if not self.searchable():
            return False
        newest = self._x("SELECT rowid FROM messages ORDER BY rowid DESC LIMIT 1").fetchone()
        indexed = self._x("SELECT rowid FROM message_search ORDER BY rowid DESC LIMIT 1").fetchone()
        return newest is not None and (indexed is None or newest[0] > indexed[0])

    def _unindex(self, where: str, params: dict) -> None:
        if self.searchable():
            self._x(f"DELETE FROM message_search WHERE rowid IN (SELECT rowid FROM messages WHERE {where})", params)

    def _many(self, sql: str, rows: list) -> int:
        return self.db.executemany(sql, rows).rowcount

    def _wake(self, recipient: str) -> None:
        self._wakes.add(recipient)

    def _latest(self, column: str) -> str:
        # Maxima by julianday(); the bare column next to MAX() is taken from the row holding that maximum,
        # so the stored text comes back exact.
        return f"{column}, MAX(julianday({column}))"

    def _tuples(self, sql: str, params: object = ()) -> list[tuple]:
        return self._rows(sql, params).fetchall()

    def _rows(self, sql: str, params: object = ()):
        # Plain tuples, zipped with the column names by _query: a third of the cost of sqlite3.Row -> dict,
        # which counts when a watch lists thousands of envelopes.
        cursor = self.db.cursor()
        cursor.row_factory = None
        return cursor.execute(sql, params)

    def _unread_laid_out(self, direct: str, broadcast: str, *, lean_columns: str, params: dict,
                         layout_level: int):
        """Every unread envelope, laid out by SQLite as it walks the indexes: (arrival, seq, text) in index
        order, merged here (the halves are sorted runs, so the sort is a merge). At the watch's own depth
        the text is read from the indexes that hold it (m008), not built per row."""
        if not self._lays_out_json():
            return None
        laid_out = f"{self.F.m_arrived}, m.rowid, {jsonout.sqlite_lean_layout(layout_level)}"
        if layout_level == jsonout.WATCH_LEVEL and self._envelope_index():
            broadcast = broadcast.replace("idx_messages_broadcast_arrival", "idx_messages_broadcast_envelopes")
        found = (self._tuples(direct.replace(lean_columns, laid_out, 1), params)
                 + self._tuples(broadcast.replace(lean_columns, laid_out, 1), params))
        found.sort()
        return jsonout.Rendered([row[2] for row in found], layout_level)

    def liveness(self, agent: str | None = None) -> dict[str, dict]:
        """As stored, with what the armed sessions' wake-up pipes tell (sqlite_bells.presence)."""
        return presence(self.path, self.db, super().liveness(agent), agent)

    def own_file(self, path: str) -> bool:
        """The database and every file SQLite keeps beside it (-wal, -shm, -journal): named after it, in its folder."""
        mine = os.path.realpath(self.path)
        return os.path.dirname(path) == os.path.dirname(mine) and os.path.basename(path).startswith(
            os.path.basename(mine))

    def __init__(self, path: str, any_thread: bool = False):
        self.path = path
        self._any_thread = any_thread  # used by one thread at a time, whichever (a pool's store)
        self._pipe: WakePipe | None = None  # our wake-up, while waiting
        self._wakes: set[str] = set()  # identities to wake once the current transaction commits
        self._has_search: bool | None = None  # whether the mailbox has its search index (asked once)
        self._identity = None  # (st_dev, st_ino) of the file opened, to notice it being replaced
        self._marked: tuple = (None, None)  # (the mailbox files' stat when mail_marker last asked, its answer)
        self.doing = "using it"  # what the current command is doing, for the damage record
        self.db = self.connect()

    # -- opening ----------------------------------------------------------
    def _fail(self, exc: Exception, doing: str) -> errors.StorageError:
        text = str(exc)
        if is_damage(exc) and self._identity is not None:
            return self._damaged(text, doing)
        if "locked" in text or "busy" in text:
            return errors.StorageError(
                f"the mailbox {self.path} was locked by another process while {doing} (waited up to "
                f"{BUSY_TIMEOUT_SECONDS:.0f} s); nothing was changed. Retry in a moment.",
                told=f"the mailbox was locked by another process while {doing} (waited up to "
                     f"{BUSY_TIMEOUT_SECONDS:.0f} s); nothing was changed. Retry in a moment.")
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return errors.StorageError(
                f"{self.path} is not a readable agent-mail mailbox ({text}); it was left untouched. "
                "Point AGENT_MAIL_DB at another file or restore it from a backup."
            )
        if "disk I/O" in text or "full" in text or "no space" in text.lower():
            return errors.StorageError(
                f"the mailbox {self.path} could not be written while {doing}: no space left ({text}: is the disk "
                "full, or a file-size limit in force?); nothing was changed. Free some space and retry.",
                told=f"the mailbox could not be written while {doing}: no space left where the server keeps it; "
                     "nothing was changed. Tell the server's operator.")
        return errors.StorageError(f"cannot use the mailbox {self.path} while {doing}: {text}.")

    def _damaged(self, text: str, doing: str) -> errors.StorageError:
        """Record that this mailbox met damage (so nothing more is written into it) and say what to do."""
        record_damage(self.path, text, doing)
        return damaged_error(self.path, text)

    def connect(self) -> sqlite3.Connection:
        import stat

        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            if not os.path.isdir(directory):
                from agent_mail import files

                files.make_private_dirs(directory)
            try:
                info = os.stat(self.path)
            except FileNotFoundError:
                info = None
            if info is not None and not stat.S_ISREG(info.st_mode):
                raise errors.StorageError(not_a_file(self.path, info.st_mode))
            problem = damage_problem(self.path)
            if problem:
                raise errors.StorageError(problem)
            if info is None:
                from agent_mail.store import sqlite_schema

                try:
                    sqlite_schema.create(self.path, APPLICATION_ID, BUSY_TIMEOUT_SECONDS)
                except sqlite3.Error as exc:
                    raise self._fail(exc, "creating it") from None
            problem = permission_problem(self.path)
            if problem:
                raise errors.StorageError(problem)
            info = os.stat(self.path)
        except OSError as exc:
            raise self._fail(exc, "creating it") if _no_space(exc) else errors.StorageError(
                f"cannot create the mailbox {self.path}: {exc.strerror or exc}.") from None
        try:
            db = sqlite3.connect(os.fsencode(self.path), timeout=BUSY_SLICE_SECONDS, isolation_level=None,
                                 check_same_thread=not self._any_thread)
        except sqlite3.Error as exc:
            raise self._fail(exc, "opening it") from None
        db.row_factory = sqlite3.Row
        try:
            self._prepare_patiently(db)
        except sqlite3.Error as exc:
            db.close()
            raise self._fail(exc, "opening it") from None
        except errors.AgentMailError:
            db.close()
            raise
        db.execute("PRAGMA cell_size_check = ON")  # notice more kinds of damage as pages are read
        self._identity = (info.st_dev, info.st_ino)
        return db

    def _prepare_patiently(self, db: sqlite3.Connection) -> None:
        """_prepare, retried while another process holds the lock it needs.

        Switching a new file to WAL needs the file to itself, and SQLite reports a conflict
        there at once instead of waiting; two agents touching a new mailbox together must
        not make one of them fail.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        pause = 0.005
        while True:
            try:
                return self._prepare(db)
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if ("locked" not in text and "busy" not in text) or time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)

    def _prepare(self, db: sqlite3.Connection) -> None:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        if app_id == APPLICATION_ID and version >= SCHEMA_VERSION:
            return  # the common case: one header read, nothing to do
        from agent_mail.store import sqlite_schema

        sqlite_schema.migrate(db, self.path, APPLICATION_ID)

    def relax_durability(self) -> None:
        # In WAL mode, NORMAL syncs at checkpoints only: a crash keeps the database intact.
        try:
            self.db.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise self._fail(exc, "starting to watch") from None

    _driver_error = sqlite3.Error

    def _start(self, write: bool, patience: float | None, doing: str) -> None:
        try:
            self._begin("BEGIN IMMEDIATE" if write else "BEGIN", BUSY_TIMEOUT_SECONDS if patience is None else patience)
        except sqlite3.Error as exc:
            raise self._fail(exc, doing) from None

    def _finish(self, write: bool, doing: str) -> None:
        try:
            self.db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise self._fail(exc, doing) from None
        if self._wakes:
            wakes, self._wakes = self._wakes, set()
            ring_bells(self.path, wakes)  # after the commit: a woken watch finds the mail there

    def _begin(self, statement: str, patience: float) -> None:
        """Begin, waiting for the write lock up to `patience` seconds in slices short enough that a
        signal (SIGINT, SIGTERM) acts at once instead of after SQLite's own wait."""
        deadline = time.monotonic() + patience
        while True:
            try:
                self.db.execute(statement)
                return
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                    raise
            time.sleep(0.001)  # a signal's handler runs here

    def _rollback(self) -> None:
        try:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite has rolled back by itself (a failed write aborts the transaction)

    def _envelope_index(self) -> bool:
        """Whether this mailbox has m008's index of laid-out broadcast envelopes (not where SQLite lacks JSON)."""
        if getattr(self, "_has_envelope_index", None) is None:
            self._has_envelope_index = self.db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'idx_messages_broadcast_envelopes'"
            ).fetchone() is not None
        return self._has_envelope_index

    _json_functions: bool | None = None  # whether this SQLite has json_quote (built in since 3.38)

    def _lays_out_json(self) -> bool:
        if SQLiteStore._json_functions is None:
            try:
                self.db.execute("SELECT json_quote('')").fetchone()
                SQLiteStore._json_functions = True
            except sqlite3.OperationalError:
                SQLiteStore._json_functions = False
        return SQLiteStore._json_functions

    def refresh_session(self, session_id: str, at: str) -> None:
        if self._pipe is not None and self._pipe.session == session_id and self._pipe.touch():
            # The session's pipe carries its refreshes: touching it writes nothing into the mailbox, so
            # no other process's cache is invalidated, and liveness() reads it back (a killed watch's
            # pipe no longer counts, so the session still turns stale).
            return
        # One autocommit statement instead of BEGIN, UPDATE and COMMIT: a blocked watch runs this every
        # few seconds with cold caches, where every statement costs tens of microseconds.
        sql = "UPDATE watch_sessions SET last_seen = ? WHERE id = ? AND state = 'armed'"
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        while True:
            try:
                self.db.execute(sql, (at, session_id))
                return
            except sqlite3.OperationalError as exc:
                text = str(exc)
                if ("locked" not in text and "busy" not in text) or time.monotonic() >= deadline:
                    raise self._fail(exc, "refreshing a watch") from None
                time.sleep(0.001)  # a signal's handler runs here
            except sqlite3.Error as exc:
                raise self._fail(exc, "refreshing a watch") from None

    def mail_marker(self) -> object:
        # Asked again only when the mailbox's files changed since it was last asked: an idle watch's periodic
        # look is then two stat() calls, not a query on a connection whose caches went cold meanwhile.
        stamp = []
        for path in (self.path, self.path + "-wal"):
            try:
                info = os.stat(path)
                stamp += [info.st_mtime_ns, info.st_size, info.st_ino]
            except OSError:
                stamp.append(None)
        if stamp == self._marked[0]:
            return self._marked[1]
        try:
            self._marked = (stamp, self.db.execute("SELECT MAX(rowid) FROM messages").fetchone()[0])
        except sqlite3.Error as exc:
            raise self._fail(exc, "waiting") from None
        return self._marked[1]

    def leftovers(self) -> list[str]:
        from agent_mail.store import sqlite_schema

        return sqlite_schema.creation_leftovers(self.path)

    def remove_leftovers(self, names: list[str]) -> None:
        from agent_mail import files

        files.sweep(os.path.dirname(os.path.abspath(self.path)), names)

    def check_still_there(self) -> None:
        """Raise if the mailbox file was deleted or replaced since it was opened: a watch on the old
        file would wait forever for mail that goes to the new one."""
        try:
            info = os.stat(self.path)
            same = (info.st_dev, info.st_ino) == self._identity
        except OSError:
            same = False
        if not same:
            raise errors.StorageError(
                f"the mailbox {self.path} was deleted or replaced while this command was waiting; it stopped "
                "rather than wait on a file nobody writes to. Run the command again (it opens the mailbox now at "
                "that path).",
                told="the mailbox was replaced while this command was waiting; it stopped rather than wait on a file "
                     "nobody writes to. Run the command again.")

    def listen(self, agent: str, session: str | None = None) -> None:
        """Wait on this process's own wake-up pipe (WakePipe), so a blocked watch is woken by its own mail
        only; the pipe's lock, held while it waits, is the session's presence. Where a pipe cannot be made
        (AGENT_MAIL_POLL set, or a file system without them), the polling default of the base class stands
        in, and the session is refreshed in its row."""
        self._stop_listening()
        if not os.environ.get("AGENT_MAIL_POLL"):
            self._pipe = WakePipe.open(self.path, agent, session)
        self.presence_held = self._pipe is not None and session is not None and self._pipe.locked
        if self._pipe is None:
            super().listen(agent)

    def wait_for_wake(self, timeout: float, also: tuple[int, ...] = ()) -> bool:
        """Sleep until our pipe is written to or one of `also` reads as ready (True) or `timeout` passes (False)."""
        if self._pipe is None:
            return super().wait_for_wake(timeout, also)
        return self._pipe.wait(timeout, also)

    def _stop_listening(self) -> None:
        pipe, self._pipe = self._pipe, None
        self.presence_held = False
        if pipe is not None:
            pipe.close()

    def close(self) -> None:
        self._stop_listening()
        self.db.close()

    def reusable(self) -> bool:
        return self._pipe is None and not self._wakes and not self.db.in_transaction


# ---------------------------------------------------------------- damage and odd files

def is_damage(exc: Exception) -> bool:
    """Whether SQLite (or the decoding of what it returned) says the file's content is damaged."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (11, 26):  # SQLITE_CORRUPT, SQLITE_NOTADB
        return True
    text = str(exc)
    return "malformed" in text or "Could not decode" in text or "not a database" in text


def _no_space(exc: OSError) -> bool:
    import errno

    return exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)


def not_a_file(path: str, mode: int) -> str:
    import stat

    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))
    kind = next((name for test, name in kinds if test(mode)), "not a regular file")
    return (f"the mailbox path {path} is {kind}, not a mailbox file; nothing was done. Point AGENT_MAIL_DB at a "
            "regular file, or at a path where one can be created.")


def damage_marker(path: str) -> str:
    return path + DAMAGE_MARKER_SUFFIX


def record_damage(path: str, error: str, doing: str) -> None:
    """Leave the marker that stops every later command from writing into a damaged mailbox."""
    from agent_mail import jsonout, model

    record = {"path": path, "found_at": model.now_iso(), "command": doing, "error": error}
    try:
        fd = os.open(damage_marker(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return  # already marked (the first finding is kept), or the directory refuses: the error still says it
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(jsonout.dumps(record) + "\n")


def read_damage_record(path: str) -> dict | None:
    import json

    try:
        with open(damage_marker(path), encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"path": path, "found_at": None, "command": None, "error": "unreadable damage record"}


def damaged_error(path: str, text: str) -> errors.StorageError:
    return errors.StorageError(
        f"the mailbox {path} is damaged ({text}); nothing more will be written into it. Run `agent-mail doctor` to "
        "see what is wrong, then `agent-mail doctor --repair` to save every readable message into a fresh mailbox "
        "(the damaged file is kept aside).",
        told="the mailbox is damaged; nothing more will be written into it. Tell the server's operator: agent-mail "
             "doctor on the server's machine says what is wrong, and doctor --repair saves what can be read.")


def damage_problem(path: str) -> str | None:
    """Why the mailbox must not be used: a command met damage in it earlier. One stat when it is fine."""
    if not os.path.lexists(damage_marker(path)):
        return None
    record = read_damage_record(path) or {}
    when = f" at {record['found_at']}" if record.get("found_at") else ""
    return damaged_error(path, f"found{when}: {record.get('error')}").message


def permission_problem(path: str) -> str | None:
    """Why the mailbox must not be used as it is: anyone else could rewrite or replace it.

    Refused: a mailbox file writable by other users, or a directory writable by them without
    the sticky bit (which would let them swap the file). Merely readable by others is reported
    by `describe` (sqlite_checks.permissions) instead: the mail is exposed, but nothing can be forged.
    """
    import stat

    directory = os.path.dirname(os.path.abspath(path))
    info = os.stat(directory)
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        return (f"the mailbox directory {directory} is writable by every user (mode {stat.S_IMODE(info.st_mode):04o}), "
                f"so anyone could replace your mail; nothing was done. Run: chmod 700 {directory}")
    if os.path.exists(path) and os.stat(path).st_mode & stat.S_IWOTH:
        return (f"the mailbox {path} is writable by every user (mode {stat.S_IMODE(os.stat(path).st_mode):04o}), so "
                f"anyone could rewrite your mail; nothing was done. Run: chmod 600 {path}")
    return None
