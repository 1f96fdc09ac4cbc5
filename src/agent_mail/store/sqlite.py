"""The embedded default: one SQLite file in WAL mode.

Schema changes are an ordered list of small named migrations, recorded in
`schema_migrations` and applied when the mailbox is opened, so a new mailbox and
one written by an earlier implementation take the same path. Migrations only
add (tables, indexes, nullable columns); they never rewrite or drop data.
"""

from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager

from agent_mail import errors, jsonout
from agent_mail.store.base import Store

# Marks a file as an agent-mail mailbox ("AGML"). Older mailboxes carry 0.
APPLICATION_ID = 0x41474D4C
BUSY_TIMEOUT_SECONDS = 10.0
# SQLite's own busy handler sleeps in C, where a signal cannot act; it waits this long at most before
# control comes back to Python, which keeps waiting up to BUSY_TIMEOUT_SECONDS, signals acted on at once.
BUSY_SLICE_SECONDS = 0.02
# Beside the mailbox: written when a command meets damage, so that nothing more is written into it.
DAMAGE_MARKER_SUFFIX = ".damaged"

# Columns the seed lineage's `messages` table has; anything without them is not a mailbox.
_REQUIRED_MESSAGE_COLUMNS = {
    "id", "sender", "recipient", "subject", "body", "refs", "reply_to", "type", "created", "read_at", "acked_at",
}


def m001_seed_schema(db: sqlite3.Connection) -> None:
    """The tables of the seed lineage, exactly, so its mailboxes open unchanged."""
    db.execute("""CREATE TABLE IF NOT EXISTS messages (
        id TEXT PRIMARY KEY, sender TEXT NOT NULL, recipient TEXT NOT NULL, subject TEXT NOT NULL,
        body TEXT NOT NULL DEFAULT '', refs TEXT, reply_to TEXT, type TEXT NOT NULL DEFAULT 'direct',
        ttl_hours INTEGER NOT NULL DEFAULT 24, created TEXT NOT NULL, read_at TEXT, acked_at TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_recipient ON messages(recipient)")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_sender ON messages(sender)")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_created ON messages(created)")
    db.execute("""CREATE TABLE IF NOT EXISTS broadcast_acks (
        message_id TEXT NOT NULL, agent TEXT NOT NULL, read_at TEXT, acked_at TEXT,
        PRIMARY KEY (message_id, agent))""")
    db.execute("""CREATE TABLE IF NOT EXISTS watchers (
        agent TEXT PRIMARY KEY, started_at TEXT NOT NULL, last_seen TEXT NOT NULL)""")
    db.execute("""CREATE TABLE IF NOT EXISTS watch_sessions (
        id TEXT PRIMARY KEY, agent TEXT NOT NULL, started_at TEXT NOT NULL, last_seen TEXT NOT NULL,
        state TEXT NOT NULL DEFAULT 'armed', released_at TEXT, released_reason TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_watch_sessions_agent ON watch_sessions(agent)")


def m002_inbox_indexes(db: sqlite3.Connection) -> None:
    """Indexes that make the inbox, per-agent counts and thread walks index-only."""
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_inbox ON messages(recipient, read_at, acked_at)")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_reply_to ON messages(reply_to)")
    db.execute("CREATE INDEX IF NOT EXISTS idx_broadcast_acks_agent ON broadcast_acks(agent)")


def m003_liveness(db: sqlite3.Connection) -> None:
    """Presence without a blocked watch (heartbeat), and per-agent session lookups."""
    db.execute("CREATE TABLE IF NOT EXISTS heartbeats (agent TEXT PRIMARY KEY, last_seen TEXT NOT NULL)")
    db.execute("CREATE INDEX IF NOT EXISTS idx_watch_sessions_agent_state ON watch_sessions(agent, state)")


def m004_delivery(db: sqlite3.Connection) -> None:
    """Fan-out, scheduled delivery, per-agent archive/delete, attachments, profiles, the system channel."""
    for column in ("deliver_at", "cancelled_at", "batch_id", "archived_at", "deleted_at"):
        db.execute(f"ALTER TABLE messages ADD COLUMN {column} TEXT")
    for column in ("archived_at", "deleted_at"):
        db.execute(f"ALTER TABLE broadcast_acks ADD COLUMN {column} TEXT")
    # Supersedes m002's inbox index (an index holds no data): counts and inbox reads stay index-only.
    db.execute("DROP INDEX IF EXISTS idx_messages_inbox")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_state ON messages(recipient, read_at, acked_at, archived_at, "
               "deleted_at, cancelled_at, deliver_at)")
    db.execute("""CREATE TABLE IF NOT EXISTS scheduled (
        message_id TEXT PRIMARY KEY, recipient TEXT NOT NULL, deliver_at TEXT NOT NULL, published_at TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_scheduled_pending ON scheduled(deliver_at) WHERE published_at IS NULL")
    db.execute("""CREATE TABLE IF NOT EXISTS attachment_blobs (
        sha256 TEXT PRIMARY KEY, size INTEGER NOT NULL, content BLOB NOT NULL, created TEXT NOT NULL)""")
    db.execute("""CREATE TABLE IF NOT EXISTS attachments (
        message_id TEXT NOT NULL, position INTEGER NOT NULL, name TEXT NOT NULL, size INTEGER NOT NULL,
        sha256 TEXT NOT NULL, PRIMARY KEY (message_id, position))""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_attachments_sha256 ON attachments(sha256)")
    db.execute("""CREATE TABLE IF NOT EXISTS profiles (
        agent TEXT PRIMARY KEY, human INTEGER NOT NULL DEFAULT 0, mirror_dir TEXT, max_entries INTEGER,
        updated_at TEXT NOT NULL)""")
    db.execute("""CREATE TABLE IF NOT EXISTS system_events (
        id TEXT PRIMARY KEY, agent TEXT NOT NULL, source TEXT NOT NULL, payload TEXT NOT NULL,
        created TEXT NOT NULL, dismissed_at TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_system_events_agent ON system_events(agent, dismissed_at)")


def m005_count_indexes(db: sqlite3.Connection) -> None:
    """Partial indexes holding only open mail, so per-agent counts read thousands of entries, not every message."""
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_unread ON messages(recipient, cancelled_at, deliver_at) "
               "WHERE read_at IS NULL")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_unacked ON messages(recipient, cancelled_at, deliver_at) "
               "WHERE acked_at IS NULL AND archived_at IS NULL AND deleted_at IS NULL")
    db.execute("CREATE INDEX IF NOT EXISTS idx_broadcast_acks_read ON broadcast_acks(agent, message_id) "
               "WHERE read_at IS NOT NULL")
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_broadcasts ON messages(recipient, sender, cancelled_at, "
               "deliver_at, id) WHERE recipient = '*'")
    db.execute("CREATE INDEX IF NOT EXISTS idx_broadcast_acks_done ON broadcast_acks(agent) "
               "WHERE acked_at IS NOT NULL OR archived_at IS NOT NULL OR deleted_at IS NOT NULL")
    # Superseded by the three above (an index holds no data).
    db.execute("DROP INDEX IF EXISTS idx_messages_state")
    db.execute("DROP INDEX IF EXISTS idx_broadcast_acks_agent")


# When a message arrived in its recipients' inbox: a delayed one when it fell due. julianday(), because
# older mailboxes stored local-offset timestamps. Index expressions and queries must spell it alike.
_ARRIVED = "julianday(COALESCE(deliver_at, created))"


def m006_arrival_indexes(db: sqlite3.Connection) -> None:
    """Indexes in arrival order, so per-agent work reads a page, not the backlog: a page of unread mail,
    the newest messages, unread broadcasts (covering the columns that decide visibility, so the walk never
    reads a row it skips), read broadcasts not yet acted on, and arrival ranges for cleanup."""
    db.execute(f"CREATE INDEX IF NOT EXISTS idx_messages_arrival ON messages({_ARRIVED})")
    db.execute(f"CREATE INDEX IF NOT EXISTS idx_messages_recipient_arrival ON messages(recipient, {_ARRIVED})")
    db.execute(f"CREATE INDEX IF NOT EXISTS idx_messages_unread_arrival ON messages(recipient, {_ARRIVED}) "
               "WHERE read_at IS NULL")
    # Broadcasts also carry their envelope, so listing a backlog of them never reads the table.
    db.execute(f"CREATE INDEX IF NOT EXISTS idx_messages_broadcast_arrival ON messages({_ARRIVED}, recipient, "
               "sender, cancelled_at, deliver_at, id, subject, type, created) WHERE recipient = '*'")
    db.execute("CREATE INDEX IF NOT EXISTS idx_broadcast_acks_open ON broadcast_acks(agent, message_id) "
               "WHERE read_at IS NOT NULL AND acked_at IS NULL AND archived_at IS NULL AND deleted_at IS NULL")


def m007_harness_sessions(db: sqlite3.Connection) -> None:
    """Harness sessions (a Claude Code, Codex or Gemini CLI session reached through hooks): which identity
    each holds, and how far its context has been told about mail (told_seq: the newest message row it was
    told of; told_at: when, for delayed mail falling due since; told_event: the newest system event)."""
    db.execute("""CREATE TABLE IF NOT EXISTS harness_sessions (
        id TEXT PRIMARY KEY, harness TEXT NOT NULL, agent TEXT NOT NULL, pid INTEGER, host TEXT,
        started_at TEXT NOT NULL, last_seen TEXT NOT NULL, told_seq INTEGER NOT NULL DEFAULT 0, told_at TEXT,
        told_event INTEGER NOT NULL DEFAULT 0, waiter TEXT, ended_at TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_harness_sessions_agent ON harness_sessions(agent) "
               "WHERE ended_at IS NULL")


WATCH_LEVEL = 2  # where a watch result's envelopes sit: result["messages"][i]


def m008_envelope_indexes(db: sqlite3.Connection) -> None:
    """Broadcasts indexed with each envelope already laid out as a watch prints it, so a watch over a
    backlog of tens of thousands of unread broadcasts reads the text from the index instead of building
    it per row (2.5x faster). Only broadcasts: the index costs their sends, never a read (marking a
    broadcast read writes broadcast_acks, not this index); direct mail, whose reads would have to update
    it, keeps m006's index. A SQLite without JSON functions skips it, and watch lays envelopes out itself."""
    try:
        db.execute("SELECT json_quote('')").fetchone()
    except sqlite3.OperationalError:
        return
    db.execute(f"CREATE INDEX IF NOT EXISTS idx_messages_broadcast_envelopes ON messages({_ARRIVED}, recipient, "
               f"sender, cancelled_at, deliver_at, id, ({_laid_out(WATCH_LEVEL, alias='')})) WHERE recipient = '*'")


MIGRATIONS = (m001_seed_schema, m002_inbox_indexes, m003_liveness, m004_delivery, m005_count_indexes,
              m006_arrival_indexes, m007_harness_sessions, m008_envelope_indexes)

_ENVELOPE = ("m.rowid AS seq, m.id, m.sender, m.recipient, m.subject, m.type, m.created, m.deliver_at, "
             "julianday(COALESCE(m.deliver_at, m.created)) AS arrival")
# What a watch lists: the envelope, and the arrival order (sorted by _lean_order: arrival, then seq).
_LEAN = ("m.rowid AS seq, m.id, m.sender, m.subject, m.type, m.created, "
         "julianday(COALESCE(m.deliver_at, m.created)) AS arrival")


def _lean_order(row: tuple) -> tuple:
    return (row[6], row[0])


def _laid_out(level: int, alias: str = "m.") -> str:
    """SQL laying out the envelope of a message as jsonout.dumps does at nesting depth `level`: json_quote
    escapes exactly what the json module does (quote, backslash, control characters; \\b \\f \\n \\r
    \\t short), and keeps other characters as they are (tests compare the two)."""
    pieces = [f"'{piece}'" for piece in jsonout.lean_layout(level)]
    values = [f"json_quote({alias}{column})" for column in ("id", "sender", "subject", "type", "created")]
    return " || ".join(p for pair in zip(pieces[:-1], values, strict=True) for p in pair) + " || " + pieces[-1]


# The arrival expression over the `m` alias; SQLite matches it to the index expressions above.
_M_ARRIVED = "julianday(COALESCE(m.deliver_at, m.created))"
# Mail is ordered by when it arrived in the inbox (a delayed message at its delivery time), through
# julianday() because older mailboxes stored local-offset timestamps; insertion order breaks ties.
_BY_ARRIVAL = "ORDER BY arrival, seq"
_COLUMNS = f"{_ENVELOPE}, m.body, m.refs, m.reply_to"
# Visible to recipients: not withdrawn, and due (a scheduled message is invisible until then).
_VISIBLE = "m.cancelled_at IS NULL AND (m.deliver_at IS NULL OR m.deliver_at <= :now)"


def _addressed_to(columns: str) -> tuple[str, str]:
    """The two halves of "mail for :agent", with this agent's own state: on the row for direct
    mail, in broadcast_acks for broadcasts."""
    direct = (f"SELECT {columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at FROM messages m "
              f"WHERE m.recipient = :agent AND {_VISIBLE}")
    broadcast = (f"SELECT {columns}, b.read_at, b.acked_at, b.archived_at, b.deleted_at FROM messages m "
                 "LEFT JOIN broadcast_acks b ON b.message_id = m.id AND b.agent = :agent "
                 f"WHERE m.recipient = '*' AND m.sender != :agent AND {_VISIBLE}")
    return direct, broadcast


_DIRECT, _BROADCAST = _addressed_to(_COLUMNS)


# A broadcast `m` that :agent has not read, or not acted on (ack, archive, delete). NOT IN builds the
# agent's set once from its partial index and probes it in memory: several times cheaper than a
# correlated lookup per broadcast into a table that holds every agent's state.
_NOT_READ_BY = ("m.id NOT IN (SELECT message_id FROM broadcast_acks INDEXED BY idx_broadcast_acks_read "
                "WHERE agent = :agent AND read_at IS NOT NULL)")
_NOT_DONE_BY = ("m.id NOT IN (SELECT message_id FROM broadcast_acks INDEXED BY idx_broadcast_acks_done "
                "WHERE agent = :agent AND (acked_at IS NOT NULL OR archived_at IS NOT NULL "
                "OR deleted_at IS NOT NULL))")


def _page(rows: list[dict], limit: int | None, newest: bool) -> list[dict]:
    """Merge the direct and broadcast halves into arrival order and keep the oldest (or newest) `limit`,
    returned oldest first."""
    rows.sort(key=lambda r: (r["arrival"], r["seq"]))
    if limit is not None:
        rows = rows[-limit:] if newest else rows[:limit]
    return rows


# "`:agent` may see this message": its sender always; a recipient (the addressee, or anyone but the
# sender for a broadcast) once it is due and not withdrawn, unless that recipient deleted it.
_PARTY = (
    "(m.sender = :agent OR ((m.recipient = :agent OR m.recipient = '*') AND "
    "m.cancelled_at IS NULL AND (m.deliver_at IS NULL OR m.deliver_at <= :now))) "
    "AND NOT (m.recipient = :agent AND m.deleted_at IS NOT NULL) "
    "AND NOT (m.recipient = '*' AND EXISTS (SELECT 1 FROM broadcast_acks d WHERE d.message_id = m.id "
    "AND d.agent = :agent AND d.deleted_at IS NOT NULL))"
)

_FLAG_COLUMNS = {"read": "read_at", "ack": "acked_at", "archive": "archived_at", "delete": "deleted_at"}


def _decode_refs(raw: object) -> list:
    """Refs are stored as JSON text; older mailboxes may hold anything, so never fail on them."""
    if raw is None or raw == "":
        return []
    import json  # only for rows that carry refs: `import json` costs more than a whole query

    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return [raw]
    if isinstance(value, list):
        return value
    return [value]


def _encode_json(value: object) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)


def _decode_json(text: str) -> dict:
    import json

    return json.loads(text)


def _ids_clause(ids: list[str], prefix: str = "id") -> tuple[str, dict]:
    params = {f"{prefix}{i}": value for i, value in enumerate(ids)}
    return ",".join(f":{name}" for name in params), params


class SQLiteStore(Store):
    """A mailbox in one SQLite file."""

    kind = "sqlite"

    def __init__(self, path: str):
        self.path = path
        self._pipe: tuple[str, int, int] | None = None  # (path, read end, write end) of our wake-up, if waiting
        self._pipe_session: str | None = None  # the watch session that pipe belongs to
        self._wakes: set[str] = set()  # identities to wake once the current transaction commits
        self._identity = None  # (st_dev, st_ino) of the file opened, to notice it being replaced
        self.doing = "using it"  # what the current command is doing, for the damage record
        self.db = self._connect()

    # -- opening ----------------------------------------------------------
    def _fail(self, exc: Exception, doing: str) -> errors.StorageError:
        text = str(exc)
        if _is_damage(exc) and self._identity is not None:
            return self._damaged(text, doing)
        if "locked" in text or "busy" in text:
            return errors.StorageError(
                f"the mailbox {self.path} was locked by another process while {doing} (waited up to "
                f"{BUSY_TIMEOUT_SECONDS:.0f} s); nothing was changed. Retry in a moment."
            )
        if "not a database" in text or "malformed" in text or "corrupt" in text:
            return errors.StorageError(
                f"{self.path} is not a readable agent-mail mailbox ({text}); it was left untouched. "
                "Point AGENT_MAIL_DB at another file or restore it from a backup."
            )
        if "disk I/O" in text or "full" in text or "no space" in text.lower():
            return errors.StorageError(
                f"the mailbox {self.path} could not be written while {doing}: no space left ({text}: is the disk "
                "full, or a file-size limit in force?); nothing was changed. Free some space and retry."
            )
        return errors.StorageError(f"cannot use the mailbox {self.path} while {doing}: {text}.")

    def _damaged(self, text: str, doing: str) -> errors.StorageError:
        """Record that this mailbox met damage (so nothing more is written into it) and say what to do."""
        record_damage(self.path, text, doing)
        return damaged_error(self.path, text)

    def _connect(self) -> sqlite3.Connection:
        import stat

        from agent_mail import files

        directory = os.path.dirname(os.path.abspath(self.path))
        try:
            if not os.path.isdir(directory):
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
                self._create(directory)
            problem = permission_problem(self.path)
            if problem:
                raise errors.StorageError(problem)
            info = os.stat(self.path)
        except OSError as exc:
            raise self._fail(exc, "creating it") if _no_space(exc) else errors.StorageError(
                f"cannot create the mailbox {self.path}: {exc.strerror or exc}.") from None
        try:
            db = sqlite3.connect(os.fsencode(self.path), timeout=BUSY_SLICE_SECONDS, isolation_level=None)
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

    def _create(self, directory: str) -> None:
        """Build a new mailbox aside and link it into place whole.

        Nobody ever sees a half-made mailbox: the schema and WAL mode are set up in a private
        file, which a hard link then publishes under the real name only if that name is still
        free. When several processes start on a new mailbox at once, one link wins and the
        others simply open the winner's file.
        """
        sweep_creation_leftovers(self.path)
        private = os.path.join(directory, f".{os.path.basename(self.path)}{_CREATION_MARK}{os.getpid()}-"
                                          f"{os.urandom(4).hex()}{_CREATION_SUFFIX}")
        os.close(os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            db = sqlite3.connect(os.fsencode(private), timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
            try:
                self._prepare(db)
            finally:
                db.close()
            try:
                os.link(private, self.path)
            except FileExistsError:
                pass  # another process published its mailbox first: that one is used
            except OSError:
                # no hard links on this file system: claim the name directly, as a last resort
                try:
                    os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                except FileExistsError:
                    pass
        except sqlite3.Error as exc:
            raise self._fail(exc, "creating it") from None
        finally:
            for leftover in (private, private + "-wal", private + "-shm"):
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass

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
        if app_id == APPLICATION_ID and version >= len(MIGRATIONS):
            return  # the common case: one header read, nothing to do
        self._check_is_mailbox(db, app_id)
        if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
            applied = {r[0] for r in db.execute("SELECT name FROM schema_migrations")}
            for migration in MIGRATIONS:
                if migration.__name__ not in applied:
                    migration(db)
                    db.execute(
                        "INSERT INTO schema_migrations (name, applied_at) VALUES (?, strftime('%Y-%m-%dT%H:%M:%fZ'))",
                        (migration.__name__,),
                    )
            if db.execute("PRAGMA user_version").fetchone()[0] < len(MIGRATIONS):
                db.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute("COMMIT")
        except BaseException:
            # SQLite may have rolled back by itself (a full disk does that); then the original error
            # is the one to report, not "cannot rollback - no transaction is active".
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise

    def _check_is_mailbox(self, db: sqlite3.Connection, app_id: int) -> None:
        """Refuse to touch a database that belongs to something else."""
        if app_id not in (0, APPLICATION_ID):
            raise errors.StorageError(
                f"{self.path} is a SQLite database of another application; it was left untouched. "
                "Point AGENT_MAIL_DB at an agent-mail mailbox or a new file."
            )
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return
        columns = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
        if not _REQUIRED_MESSAGE_COLUMNS <= columns:
            raise errors.StorageError(
                f"{self.path} is a SQLite database but not an agent-mail mailbox (it has no usable "
                "messages table); it was left untouched. Point AGENT_MAIL_DB at a mailbox or a new file."
            )

    def relax_durability(self) -> None:
        # In WAL mode, NORMAL syncs at checkpoints only: a crash keeps the database intact.
        try:
            self.db.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise self._fail(exc, "starting to watch") from None

    @contextmanager
    def transaction(self, write: bool = False, patience: float | None = None):
        doing = "writing" if write else "reading"
        try:
            self._begin("BEGIN IMMEDIATE" if write else "BEGIN", BUSY_TIMEOUT_SECONDS if patience is None else patience)
        except sqlite3.Error as exc:
            raise self._fail(exc, doing) from None
        self._wakes = set()
        try:
            yield self
        except sqlite3.Error as exc:
            self._rollback()
            raise self._fail(exc, doing) from None
        except BaseException:
            self._rollback()
            raise
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

    def _tuples(self, sql: str, params: object = ()) -> list[tuple]:
        cursor = self.db.cursor()
        cursor.row_factory = None
        return cursor.execute(sql, params).fetchall()

    def _query(self, sql: str, params: object = ()) -> list[dict]:
        # Plain tuples zipped with the column names: a third of the cost of sqlite3.Row -> dict, which
        # counts when a watch lists thousands of envelopes.
        cursor = self.db.cursor()
        cursor.row_factory = None
        cursor.execute(sql, params)
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor]
        if "refs" in names:
            for message in rows:
                message["refs"] = _decode_refs(message["refs"])
        return rows

    # -- messages ---------------------------------------------------------
    def insert_message(self, message: dict) -> None:
        self.db.execute(
            "INSERT INTO messages (id, sender, recipient, subject, body, refs, reply_to, type, created, deliver_at, "
            "batch_id) VALUES (:id, :sender, :recipient, :subject, :body, :refs, :reply_to, :type, :created, "
            ":deliver_at, :batch_id)",
            {"deliver_at": None, "batch_id": None, **message,
             "refs": _encode_json(message["refs"]) if message["refs"] else None},
        )
        if message.get("deliver_at"):
            self.db.execute("INSERT INTO scheduled (message_id, recipient, deliver_at) VALUES (?, ?, ?)",
                            (message["id"], message["recipient"], message["deliver_at"]))
        self._wakes.add(message["recipient"])  # a scheduled one too: its watch learns when it falls due

    def get_message(self, message_id: str) -> dict | None:
        rows = self._query(
            f"SELECT {_COLUMNS}, m.read_at, m.acked_at, m.archived_at, m.deleted_at, m.cancelled_at "
            "FROM messages m WHERE m.id = ?",
            (message_id,),
        )
        return rows[0] if rows else None

    def archived(self, agent: str, now: str, *, sender: str | None = None) -> list[dict]:
        direct, broadcast = _addressed_to(_COLUMNS)
        direct += " AND m.deleted_at IS NULL AND m.archived_at IS NOT NULL"
        broadcast += " AND b.deleted_at IS NULL AND b.archived_at IS NOT NULL"
        if sender is not None:
            direct += " AND m.sender = :sender"
            broadcast += " AND m.sender = :sender"
        return self._query(f"SELECT * FROM ({direct} UNION ALL {broadcast}) {_BY_ARRIVAL}",
                           {"agent": agent, "sender": sender, "now": now})

    def addressed(self, agent: str, message_ids: list[str], now: str) -> dict[str, dict]:
        found: dict[str, dict] = {}
        for start in range(0, len(message_ids), 500):
            marks, params = _ids_clause(message_ids[start:start + 500])
            sql = f"SELECT * FROM ({_DIRECT} UNION ALL {_BROADCAST}) WHERE id IN ({marks})"
            for message in self._query(sql, {"agent": agent, "now": now, **params}):
                found[message["id"]] = message
        return found

    def count_unread(self, agent: str, now: str) -> int:
        params = {"agent": agent, "now": now}
        direct = self.db.execute(
            f"SELECT COUNT(*) FROM messages m WHERE m.recipient = :agent AND m.read_at IS NULL AND {_VISIBLE}", params
        ).fetchone()[0]
        return direct + self._count_broadcasts(agent, now, _NOT_READ_BY)

    def count_unacked(self, agent: str, now: str) -> int:
        direct = self.db.execute(
            "SELECT COUNT(*) FROM messages m WHERE m.recipient = :agent AND m.acked_at IS NULL "
            f"AND m.archived_at IS NULL AND m.deleted_at IS NULL AND {_VISIBLE}", {"agent": agent, "now": now}
        ).fetchone()[0]
        return direct + self._count_broadcasts(agent, now, _NOT_DONE_BY)

    def _count_broadcasts(self, agent: str, now: str, unsettled: str) -> int:
        """Visible broadcasts from others that `agent` has not settled (read, or acted on): one walk of the
        covering broadcast index with one probe each, in SQLite; exact whatever other writers did."""
        return self.db.execute(
            f"SELECT COUNT(*) FROM messages m INDEXED BY idx_messages_broadcasts WHERE m.recipient = '*' "
            f"AND m.sender != :agent AND {_VISIBLE} AND {unsettled}", {"agent": agent, "now": now}
        ).fetchone()[0]

    def unread(self, agent: str, now: str, *, limit: int | None = None, newest: bool = False,
               sender: str | None = None, lean: bool = False, layout_level: int | None = None) -> list[dict]:
        # Each half walks its arrival-ordered index and stops at the page: unread direct mail through the
        # partial index of unread rows, unread broadcasts through the covering broadcast index (skipping
        # those the agent read, found in its read set). Without a limit every row is fetched anyway, and
        # the merge below orders them, so SQLite is spared the tie-break sort.
        params = {"agent": agent, "now": now, "sender": sender, "limit": -1 if limit is None else limit}
        order = "DESC" if newest else "ASC"
        by_sender = " AND m.sender = :sender" if sender is not None else ""
        ordered = f"ORDER BY {_M_ARRIVED} {order}" + (f", m.rowid {order} LIMIT :limit" if limit is not None else "")
        direct_columns = _LEAN if lean else f"{_ENVELOPE}, m.read_at, m.acked_at, m.archived_at, m.deleted_at"
        broadcast_columns = _LEAN if lean else (f"{_ENVELOPE}, NULL AS read_at, NULL AS acked_at, "
                                                "NULL AS archived_at, NULL AS deleted_at")
        direct = (f"SELECT {direct_columns} FROM messages m INDEXED BY idx_messages_unread_arrival "
                  f"WHERE m.recipient = :agent AND m.read_at IS NULL AND {_VISIBLE}{by_sender} {ordered}")
        broadcast = (f"SELECT {broadcast_columns} "
                     "FROM messages m INDEXED BY idx_messages_broadcast_arrival WHERE m.recipient = '*' "
                     f"AND m.sender != :agent AND {_VISIBLE}{by_sender} AND {_NOT_READ_BY} {ordered}")
        if lean and layout_level is not None and limit is None and self._lays_out_json():
            # Every unread envelope, laid out by SQLite as it walks the indexes: (arrival, seq, text) in
            # index order, merged here (the halves are sorted runs, so the sort is a merge). At the watch's
            # own depth the text is read from the indexes that hold it (m008), not built per row.
            laid_out = _laid_out(layout_level)
            if layout_level == WATCH_LEVEL and self._envelope_index():
                broadcast = broadcast.replace("idx_messages_broadcast_arrival", "idx_messages_broadcast_envelopes")
            found = (self._tuples(direct.replace(direct_columns, f"{_M_ARRIVED}, m.rowid, {laid_out}", 1), params)
                     + self._tuples(broadcast.replace(broadcast_columns, f"{_M_ARRIVED}, m.rowid, {laid_out}", 1),
                                    params))
            found.sort()
            return jsonout.Rendered([row[2] for row in found], layout_level)
        if lean:  # only envelopes: sort the tuples, then make one dict per envelope
            found = self.db.execute(direct, params).fetchall() + self.db.execute(broadcast, params).fetchall()
            found.sort(key=_lean_order)
            if limit is not None:
                found = found[-limit:] if newest else found[:limit]
            return [{"id": r[1], "sender": r[2], "subject": r[3], "type": r[4], "created": r[5]} for r in found]
        rows = self._query(direct, params) + self._query(broadcast, params)
        return _page(rows, limit, newest)

    def latest(self, agent: str, now: str, *, limit: int, sender: str | None = None) -> list[dict]:
        params = {"agent": agent, "now": now, "sender": sender, "limit": limit}
        by_sender = " AND m.sender = :sender" if sender is not None else ""
        direct = (f"SELECT {_ENVELOPE}, m.read_at, m.acked_at, m.archived_at, m.deleted_at FROM messages m "
                  "INDEXED BY idx_messages_recipient_arrival WHERE m.recipient = :agent AND m.archived_at IS NULL "
                  f"AND m.deleted_at IS NULL AND {_VISIBLE}{by_sender} "
                  f"ORDER BY {_M_ARRIVED} DESC, m.rowid DESC LIMIT :limit")
        broadcast = (f"SELECT {_ENVELOPE}, b.read_at, b.acked_at, b.archived_at, b.deleted_at FROM messages m "
                     "INDEXED BY idx_messages_broadcast_arrival LEFT JOIN broadcast_acks b ON b.message_id = m.id "
                     f"AND b.agent = :agent WHERE m.recipient = '*' AND m.sender != :agent AND {_VISIBLE}{by_sender} "
                     "AND b.archived_at IS NULL AND b.deleted_at IS NULL "
                     f"ORDER BY {_M_ARRIVED} DESC, m.rowid DESC LIMIT :limit")
        return _page(self._query(direct, params) + self._query(broadcast, params), limit, newest=True)

    def read_unacked(self, agent: str, now: str) -> list[dict]:
        params = {"agent": agent, "now": now}
        direct = (f"SELECT {_COLUMNS}, m.read_at, m.acked_at, m.archived_at, m.deleted_at FROM messages m "
                  "WHERE m.recipient = :agent AND m.read_at IS NOT NULL AND m.acked_at IS NULL "
                  f"AND m.archived_at IS NULL AND m.deleted_at IS NULL AND {_VISIBLE}")
        broadcast = (f"SELECT {_COLUMNS}, b.read_at, b.acked_at, b.archived_at, b.deleted_at "
                     "FROM broadcast_acks b INDEXED BY idx_broadcast_acks_open JOIN messages m ON m.id = b.message_id "
                     "WHERE b.agent = :agent AND b.read_at IS NOT NULL AND b.acked_at IS NULL "
                     "AND b.archived_at IS NULL AND b.deleted_at IS NULL AND m.recipient = '*' AND m.sender != :agent "
                     f"AND {_VISIBLE}")
        return _page(self._query(direct, params) + self._query(broadcast, params), None, newest=False)

    def set_flags(self, agent: str, messages: list[dict], at: str, flags: tuple[str, ...]) -> None:
        """Stamp this agent's read / ack / archive / delete times (earlier stamps are kept)."""
        columns = [_FLAG_COLUMNS[f] for f in flags]
        updates = ", ".join(f"{c} = COALESCE({c}, :at)" for c in columns)
        direct = [{"at": at, "id": m["id"]} for m in messages if m["recipient"] != "*"]
        self.db.executemany(f"UPDATE messages SET {updates} WHERE id = :id", direct)
        broadcast = [{"at": at, "id": m["id"], "agent": agent} for m in messages if m["recipient"] == "*"]
        values = ", ".join(":at" if c in columns else "NULL" for c in _FLAG_COLUMNS.values())
        merge = ", ".join(f"{c} = COALESCE({c}, excluded.{c})" for c in columns)
        self.db.executemany(
            f"INSERT INTO broadcast_acks (message_id, agent, {', '.join(_FLAG_COLUMNS.values())}) "
            f"VALUES (:id, :agent, {values}) ON CONFLICT (message_id, agent) DO UPDATE SET {merge}",
            broadcast,
        )

    def thread(self, message_id: str, agent: str, now: str) -> list[dict]:
        root, seen = message_id, set()
        while root not in seen:
            seen.add(root)
            row = self.db.execute("SELECT reply_to FROM messages WHERE id = ?", (root,)).fetchone()
            if row is None or not row[0]:
                break
            parent = self.db.execute("SELECT 1 FROM messages WHERE id = ?", (row[0],)).fetchone()
            if parent is None:  # the parent was cleaned up: this is as far back as the thread goes
                break
            root = row[0]
        # The messages of the thread this agent may see (the one visibility rule), withdrawn ones
        # left out; the state columns are this agent's own (null on what it sent to others).
        own = "CASE WHEN m.recipient = '*' AND m.sender != :agent THEN b.{0} WHEN m.recipient = :agent THEN m.{0} END"
        return self._query(
            "WITH RECURSIVE thread(id) AS (SELECT :root UNION SELECT m.id FROM messages m JOIN thread t "
            f"ON m.reply_to = t.id) SELECT {_COLUMNS}, {own.format('read_at')} AS read_at, "
            f"{own.format('acked_at')} AS acked_at, {own.format('archived_at')} AS archived_at "
            "FROM messages m JOIN thread t ON m.id = t.id "
            "LEFT JOIN broadcast_acks b ON b.message_id = m.id AND b.agent = :agent "
            f"WHERE m.cancelled_at IS NULL AND {_PARTY} {_BY_ARRIVAL}",
            {"root": root, "agent": agent, "now": now},
        )

    def visible_to(self, agent: str, message_ids: list[str], now: str) -> set[str]:
        marks, params = _ids_clause(message_ids)
        return {r[0] for r in self.db.execute(
            f"SELECT m.id FROM messages m WHERE m.id IN ({marks}) AND {_PARTY}", {"agent": agent, "now": now, **params}
        )}

    # -- scheduled delivery -------------------------------------------------------
    def due_unpublished(self, now: str) -> list[dict]:
        return [dict(r) for r in self.db.execute(
            "SELECT message_id, recipient, deliver_at FROM scheduled WHERE published_at IS NULL AND deliver_at <= ?",
            (now,),
        )]

    def mark_published(self, message_ids: list[str], at: str) -> None:
        self.db.executemany("UPDATE scheduled SET published_at = ? WHERE message_id = ?",
                            [(at, i) for i in message_ids])

    def next_due(self, agent: str, now: str) -> str | None:
        return self.db.execute(
            "SELECT MIN(deliver_at) FROM scheduled WHERE published_at IS NULL AND deliver_at > ? "
            "AND recipient IN (?, '*')",
            (now, agent),
        ).fetchone()[0]

    def cancel(self, message_id: str, at: str) -> None:
        self.db.execute("UPDATE messages SET cancelled_at = ? WHERE id = ?", (at, message_id))
        self.db.execute("DELETE FROM scheduled WHERE message_id = ?", (message_id,))

    # -- attachments ----------------------------------------------------------
    def add_attachment(self, message_id: str, position: int, name: str, content: bytes, sha256: str,
                       at: str) -> None:
        self.db.execute(
            "INSERT INTO attachment_blobs (sha256, size, content, created) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (sha256) DO NOTHING",
            (sha256, len(content), content, at),
        )
        self.db.execute(
            "INSERT INTO attachments (message_id, position, name, size, sha256) VALUES (?, ?, ?, ?, ?)",
            (message_id, position, name, len(content), sha256),
        )

    def attachments_of(self, message_ids: list[str]) -> dict[str, list[dict]]:
        listed: dict[str, list[dict]] = {}
        for start in range(0, len(message_ids), 500):
            marks, params = _ids_clause(message_ids[start:start + 500])
            for row in self.db.execute(
                f"SELECT message_id, name, size, sha256 FROM attachments WHERE message_id IN ({marks}) "
                "ORDER BY message_id, position",
                params,
            ):
                listed.setdefault(row[0], []).append({"name": row[1], "size": row[2], "sha256": row[3]})
        return listed

    def attachment_content(self, sha256: str) -> bytes | None:
        row = self.db.execute("SELECT content FROM attachment_blobs WHERE sha256 = ?", (sha256,)).fetchone()
        return None if row is None else bytes(row[0])

    # -- profiles and the system channel ---------------------------------------------
    def profile(self, agent: str) -> dict | None:
        row = self.db.execute(
            "SELECT agent, human, mirror_dir, max_entries, updated_at FROM profiles WHERE agent = ?", (agent,)
        ).fetchone()
        if row is None:
            return None
        profile = dict(row)
        profile["human"] = bool(profile["human"])
        return profile

    def save_profile(self, profile: dict) -> None:
        self.db.execute(
            "INSERT INTO profiles (agent, human, mirror_dir, max_entries, updated_at) "
            "VALUES (:agent, :human, :mirror_dir, :max_entries, :updated_at) ON CONFLICT (agent) DO UPDATE SET "
            "human = excluded.human, mirror_dir = excluded.mirror_dir, max_entries = excluded.max_entries, "
            "updated_at = excluded.updated_at",
            {**profile, "human": int(bool(profile["human"]))},
        )

    def mirrored_agents(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT agent FROM profiles WHERE mirror_dir IS NOT NULL ORDER BY agent")]

    def humans(self) -> set[str]:
        return {r[0] for r in self.db.execute("SELECT agent FROM profiles WHERE human = 1")}

    def add_event(self, event_id: str, agent: str, source: str, payload: dict, at: str) -> None:
        self.db.execute(
            "INSERT INTO system_events (id, agent, source, payload, created) VALUES (?, ?, ?, ?, ?)",
            (event_id, agent, source, _encode_json(payload), at),
        )

    def events(self, agent: str) -> list[dict]:
        return [
            {"id": r[0], "source": r[1], **_decode_json(r[2]), "created": r[3]}
            for r in self.db.execute(
                "SELECT id, source, payload, created FROM system_events WHERE agent = ? AND dismissed_at IS NULL "
                "ORDER BY rowid",
                (agent,),
            )
        ]

    def dismiss_events(self, agent: str, event_ids: list[str], at: str) -> list[str]:
        """Dismiss these events of `agent`; return the ids that were open."""
        marks, params = _ids_clause(event_ids)
        found = [r[0] for r in self.db.execute(
            f"SELECT id FROM system_events WHERE agent = :agent AND dismissed_at IS NULL AND id IN ({marks})",
            {"agent": agent, **params},
        )]
        self.db.executemany("UPDATE system_events SET dismissed_at = ? WHERE id = ?", [(at, i) for i in found])
        return found

    # -- overview and maintenance ---------------------------------------------
    def agent_counts(self, now: str) -> dict[str, dict]:
        counts: dict[str, dict] = {}
        params = {"now": now}

        def entry(agent: str) -> dict:
            return counts.setdefault(agent, {"unread": 0, "unacked": 0})

        # INDEXED BY: the partial indexes of open mail cover these counts; the planner would otherwise take
        # an arrival-ordered index and read every row.
        for key, index, condition in (
            ("unread", "idx_messages_unread", "read_at IS NULL"),
            ("unacked", "idx_messages_unacked", "acked_at IS NULL AND archived_at IS NULL AND deleted_at IS NULL"),
        ):
            for agent, n in self.db.execute(
                f"SELECT recipient, COUNT(*) FROM messages m INDEXED BY {index} WHERE {condition} AND recipient != '*' "
                f"AND {_VISIBLE} GROUP BY recipient",
                params,
            ):
                entry(agent)[key] = n
        # Separate DISTINCTs: each walks its index skipping duplicates; a UNION would sort every row.
        for sql in ("SELECT DISTINCT sender FROM messages",
                    "SELECT DISTINCT recipient FROM messages INDEXED BY idx_messages_recipient",
                    "SELECT DISTINCT agent FROM watch_sessions", "SELECT agent FROM heartbeats",
                    "SELECT agent FROM profiles"):
            for (agent,) in self.db.execute(sql):
                if agent != "*":
                    entry(agent)
        sent_broadcasts = dict(self.db.execute(
            f"SELECT sender, COUNT(*) FROM messages m WHERE recipient = '*' AND {_VISIBLE} GROUP BY sender", params
        ).fetchall())
        total_broadcasts = sum(sent_broadcasts.values())
        if total_broadcasts:
            settled = self._broadcast_state(params)
            for agent, row in counts.items():
                waiting = total_broadcasts - sent_broadcasts.get(agent, 0)
                read, done = settled.get(agent, (0, 0))
                row["unread"] += waiting - read
                row["unacked"] += waiting - done
        return counts

    def _broadcast_state(self, params: dict) -> dict[str, tuple[int, int]]:
        """{agent: (broadcasts read, broadcasts acted on)} over visible broadcasts from others.

        Every broadcast_acks row is made for a visible broadcast by someone else (state is only
        ever recorded for mail an agent could see, cancelling works only before a message is
        visible, and cleanup removes a message's rows with it). When a count of the rows that
        belong to visible broadcasts confirms that, the rows are aggregated per agent straight
        from an index; otherwise (a mailbox some other writer left inconsistent) they are joined
        to their messages, which is exact but reads every row's message.
        """
        total = self.db.execute("SELECT COUNT(*) FROM broadcast_acks").fetchone()[0]
        belonging = self.db.execute(
            "SELECT COUNT(*) FROM messages m INDEXED BY idx_messages_broadcasts CROSS JOIN broadcast_acks b "
            "ON b.message_id = m.id "
            f"WHERE m.recipient = '*' AND {_VISIBLE}",
            params,
        ).fetchone()[0]
        acted = "b.acked_at IS NOT NULL OR b.archived_at IS NOT NULL OR b.deleted_at IS NOT NULL"
        if total != belonging:
            sql = (f"SELECT b.agent, COUNT(b.read_at), SUM({acted}) FROM messages m CROSS JOIN broadcast_acks b "
                   f"ON b.message_id = m.id WHERE m.recipient = '*' AND m.sender != b.agent AND {_VISIBLE} "
                   "GROUP BY b.agent")
            return {agent: (read, done) for agent, read, done in self.db.execute(sql, params)}
        state: dict[str, tuple[int, int]] = {}
        for agent, read in self.db.execute(
            "SELECT agent, COUNT(*) FROM broadcast_acks b WHERE read_at IS NOT NULL GROUP BY agent"
        ):
            state[agent] = (read, 0)
        for agent, done in self.db.execute(
            f"SELECT agent, COUNT(*) FROM broadcast_acks b WHERE {acted} GROUP BY agent"
        ):
            state[agent] = (state.get(agent, (0, 0))[0], done)
        return state

    def cleanup(self, cutoff: str, dry_run: bool) -> dict:
        # Age counts from arrival: a delayed message not yet delivered has not arrived, whatever its creation.
        arrived = "julianday(COALESCE(deliver_at, created))"
        old = f"{arrived} < julianday(:cutoff)"
        params = {"cutoff": cutoff}
        count, oldest, newest = self.db.execute(
            f"SELECT COUNT(*), (SELECT COALESCE(deliver_at, created) FROM messages WHERE {old} ORDER BY {arrived} "
            f"LIMIT 1), (SELECT COALESCE(deliver_at, created) FROM messages WHERE {old} ORDER BY {arrived} DESC "
            f"LIMIT 1) FROM messages WHERE {old}",
            params,
        ).fetchone()
        stale = "julianday(last_seen) < julianday(:cutoff)"
        liveness = ("watch_sessions", "watchers", "heartbeats", "harness_sessions")
        sessions = sum(
            self.db.execute(f"SELECT COUNT(*) FROM {table} WHERE {stale}", params).fetchone()[0]
            for table in liveness
        )
        old_event = "julianday(created) < julianday(:cutoff)"
        events = self.db.execute(
            f"SELECT COUNT(*) FROM system_events WHERE {old_event}", params
        ).fetchone()[0]
        doomed = f"SELECT id FROM messages WHERE {old}"
        # Content no message will refer to once these are gone.
        orphans = (
            "SELECT sha256 FROM attachment_blobs WHERE julianday(created) < julianday(:cutoff) AND sha256 NOT IN "
            f"(SELECT sha256 FROM attachments WHERE message_id NOT IN ({doomed}))"
        )
        blobs = self.db.execute(f"SELECT COUNT(*) FROM ({orphans})", params).fetchone()[0]
        if not dry_run:
            for table, column in (("broadcast_acks", "message_id"), ("attachments", "message_id"),
                                  ("scheduled", "message_id")):
                self.db.execute(f"DELETE FROM {table} WHERE {column} IN ({doomed})", params)
            self.db.execute(f"DELETE FROM attachment_blobs WHERE sha256 IN ({orphans})", params)
            self.db.execute(f"DELETE FROM messages WHERE {old}", params)
            for table in liveness:
                self.db.execute(f"DELETE FROM {table} WHERE {stale}", params)
            self.db.execute(f"DELETE FROM system_events WHERE {old_event}", params)
        return {"deleted_count": count, "oldest_deleted": oldest, "newest_deleted": newest,
                "sessions_deleted": sessions, "events_deleted": events, "attachments_deleted": blobs}

    # -- liveness ------------------------------------------------------------
    def open_session(self, session_id: str, agent: str, at: str) -> None:
        self.db.execute(
            "INSERT INTO watch_sessions (id, agent, started_at, last_seen, state) VALUES (?, ?, ?, ?, 'armed')",
            (session_id, agent, at, at),
        )

    def touch_session(self, session_id: str, at: str) -> None:
        self.db.execute("UPDATE watch_sessions SET last_seen = ? WHERE id = ? AND state = 'armed'", (at, session_id))

    def refresh_session(self, session_id: str, at: str) -> None:
        if self._pipe is not None and self._pipe_session == session_id:
            # The session's pipe carries its refreshes: touching it writes nothing into the mailbox, so
            # no other process's cache is invalidated, and liveness() reads it back (a killed watch's
            # pipe no longer counts, so the session still turns stale).
            try:
                os.utime(self._pipe[1] if os.utime in os.supports_fd else self._pipe[0])
                return
            except OSError:
                pass  # fall back to the row
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

    def release_session(self, session_id: str, at: str, reason: str) -> None:
        self.db.execute(
            "UPDATE watch_sessions SET state = 'released', released_at = ?1, released_reason = ?2, last_seen = ?1 "
            "WHERE id = ?3 AND state = 'armed'",
            (at, reason, session_id),
        )

    def record_heartbeat(self, agent: str, at: str) -> None:
        self.db.execute(
            "INSERT INTO heartbeats (agent, last_seen) VALUES (?, ?) "
            "ON CONFLICT (agent) DO UPDATE SET last_seen = excluded.last_seen",
            (agent, at),
        )

    def liveness(self, agent: str | None = None) -> dict[str, dict]:
        from agent_mail.model import parse_iso

        # Maxima by julianday(), which honours the offsets older mailboxes wrote; the bare column
        # next to MAX() is taken from the row holding that maximum, so the stored text comes back exact.
        where = "agent = :agent" if agent is not None else "1"
        params = {"agent": agent}
        facts: dict[str, dict] = {}

        def fact(name: str) -> dict:
            return facts.setdefault(name, {"armed_seen": None, "released_at": None, "session_seen": None,
                                           "heartbeat": None, "sessions": 0})

        queries = (
            ("session_seen", f"SELECT agent, last_seen, MAX(julianday(last_seen)) FROM watch_sessions WHERE {where}"),
            ("armed_seen", "SELECT agent, last_seen, MAX(julianday(last_seen)) FROM watch_sessions "
                           f"WHERE state = 'armed' AND {where}"),
            ("released_at", "SELECT agent, released_at, MAX(julianday(released_at)) FROM watch_sessions "
                            f"WHERE state = 'released' AND {where}"),
            ("heartbeat", f"SELECT agent, last_seen, MAX(julianday(last_seen)) FROM heartbeats WHERE {where}"),
        )
        for key, sql in queries:
            for name, stamp, _ in self.db.execute(sql + " GROUP BY agent", params):
                fact(name)[key] = parse_iso(stamp)
        for name, count in self.db.execute(f"SELECT agent, COUNT(*) FROM watch_sessions WHERE {where} GROUP BY agent",
                                           params):
            fact(name)["sessions"] = count
        # Armed sessions whose refreshes their wake-up pipe carries (see refresh_session).
        touched = _pipe_refreshes(self.path, agent)
        sessions = list(touched)
        for start in range(0, len(sessions), 500):
            marks, ids = _ids_clause(sessions[start:start + 500])
            for (session,) in self.db.execute(
                f"SELECT id FROM watch_sessions WHERE state = 'armed' AND id IN ({marks})", ids
            ):
                name, seen = touched[session]
                entry = fact(name)
                for key in ("armed_seen", "session_seen"):
                    if entry[key] is None or seen > entry[key]:
                        entry[key] = seen
        return facts

    # -- harness sessions (hooks) -------------------------------------------
    def harness_session(self, session_id: str) -> dict | None:
        row = self.db.execute("SELECT id, harness, agent, pid, host, started_at, last_seen, told_seq, told_at, "
                              "told_event, waiter, ended_at FROM harness_sessions WHERE id = ?",
                              (session_id,)).fetchone()
        return None if row is None else dict(row)

    def save_harness_session(self, session: dict) -> None:
        columns = ("id", "harness", "agent", "pid", "host", "started_at", "last_seen", "told_seq", "told_at",
                   "told_event", "waiter", "ended_at")
        self.db.execute(
            f"INSERT INTO harness_sessions ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)}) "
            f"ON CONFLICT (id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in columns[1:])}",
            {c: session.get(c) for c in columns})

    def harness_sessions_of(self, agent: str | None = None) -> list[dict]:
        """Sessions not ended, of one identity or all."""
        where = "ended_at IS NULL" + (" AND agent = :agent" if agent is not None else "")
        return [dict(r) for r in self.db.execute(
            f"SELECT id, harness, agent, pid, host, started_at, last_seen FROM harness_sessions WHERE {where}",
            {"agent": agent})]

    def untold(self, agent: str, now: str, told_seq: int, told_at: str | None, limit: int) -> tuple[list[dict], int]:
        """(the oldest `limit` unread envelopes for `agent` it has not been told of, how many there are): mail
        committed after message row `told_seq`, and delayed mail that fell due after `told_at`. Reads only the
        rows since (the table's rowid order), and the delayed mail that arrived since (the arrival index)."""
        params = {"agent": agent, "now": now, "seq": told_seq, "since": told_at or now}
        unread = (f"((m.recipient = :agent AND m.read_at IS NULL) OR (m.recipient = '*' AND m.sender != :agent "
                  f"AND {_NOT_READ_BY})) AND {_VISIBLE}")
        rows = self._query(
            f"SELECT {_ENVELOPE} FROM messages m WHERE m.rowid > :seq AND {unread} "
            f"UNION SELECT {_ENVELOPE} FROM messages m INDEXED BY idx_messages_arrival WHERE {_M_ARRIVED} > "
            f"julianday(:since) AND {_M_ARRIVED} <= julianday(:now) AND m.deliver_at IS NOT NULL AND {unread}",
            params)
        return _page(rows, limit, newest=False), len(rows)

    def newest_seq(self) -> int:
        return self.mail_marker() or 0  # the newest rowid, as the watch's safety net reads it

    def events_since(self, agent: str, after: int) -> tuple[list[dict], int]:
        """(undismissed system events of `agent` after event row `after`, the newest event row)."""
        rows = self.db.execute("SELECT rowid, id, source, payload, created FROM system_events WHERE agent = ? "
                               "AND dismissed_at IS NULL AND rowid > ? ORDER BY rowid", (agent, after)).fetchall()
        newest = self.db.execute("SELECT COALESCE(MAX(rowid), 0) FROM system_events").fetchone()[0]
        return [{"id": r[1], "source": r[2], **_decode_json(r[3]), "created": r[4]} for r in rows], newest

    # -- waiting -------------------------------------------------------------
    def mail_marker(self) -> object:
        try:
            return self.db.execute("SELECT MAX(rowid) FROM messages").fetchone()[0]
        except sqlite3.Error as exc:
            raise self._fail(exc, "waiting") from None

    def leftovers(self) -> list[str]:
        return creation_leftovers(self.path)

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
                "that path)."
            )

    def listen(self, agent: str, session: str | None = None) -> None:
        """Open this process's own wake-up: a named pipe in the private directory beside the mailbox,
        called IDENTITY@PID-SESSION. A sender that commits mail for IDENTITY (or a broadcast) writes a byte
        into every such pipe of its recipients; nothing else does. So a blocked watch is woken by its own
        mail only, and sleeps in the kernel otherwise. Where a pipe cannot be made (AGENT_MAIL_POLL set,
        or a file system without them), the polling default of the base class stands in."""
        from agent_mail import files

        self._stop_listening()
        if os.environ.get("AGENT_MAIL_POLL"):
            return super().listen(agent)
        bells = bell_dir(self.path)
        pipe = os.path.join(bells, f"{agent}@{os.getpid()}-{session or os.urandom(4).hex()}")
        try:
            files.make_private_dirs(bells)
            os.mkfifo(pipe, 0o600)
        except OSError:
            return super().listen(agent)
        try:
            reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            # Our own writer end keeps the pipe from reading as closed (EOF) between senders.
            writer = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            os.unlink(pipe)
            return super().listen(agent)
        self._pipe = (pipe, reader, writer)
        self._pipe_session = session

    def wait_for_wake(self, timeout: float) -> bool:
        """Sleep until our pipe is written to (True) or `timeout` passes (False)."""
        if self._pipe is None:
            return super().wait_for_wake(timeout)
        import select

        reader = self._pipe[1]
        try:
            ready, _, _ = select.select([reader], [], [], max(0.0, timeout))
        except InterruptedError:
            return False
        if not ready:
            return False
        try:
            while os.read(reader, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        return True

    def _stop_listening(self) -> None:
        if self._pipe is None:
            return
        pipe, reader, writer = self._pipe
        self._pipe = None
        for fd in (reader, writer):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.unlink(pipe)
        except OSError:
            pass

    def close(self) -> None:
        self._stop_listening()
        self.db.close()


def bell_dir(path: str) -> str:
    """Where the wake-ups of the mailbox at `path` live: a private directory beside it."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.wake")


def ring_bells(path: str, recipients) -> None:
    """Wake the watches waiting for mail for `recipients` ('*': every watch): one byte into each of their
    pipes. Never blocks and never fails a send: a pipe whose reader is gone (its watch was killed) is
    removed once its process is gone, and mail whose wake-up is lost is still found by every watch's
    periodic look at the mailbox."""
    import errno
    import stat

    bells = bell_dir(path)
    try:
        names = os.listdir(bells)
    except OSError:
        return
    everyone = "*" in recipients
    for name in names:
        agent, at, owner = name.partition("@")
        if not at or not (everyone or agent in recipients):
            continue
        pipe = os.path.join(bells, name)
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nobody reads it: a watch that was killed
                _sweep_pipe(pipe, owner)
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"\0")
        except OSError:
            pass  # full: a wake-up is pending already
        finally:
            os.close(fd)


def _pipe_refreshes(path: str, agent: str | None) -> dict[str, tuple]:
    """{watch session: (identity, when its pipe was last touched)} for the live waiting watches of `agent`
    (or all)."""
    import datetime as dt

    from agent_mail import files

    bells = bell_dir(path)
    try:
        names = os.listdir(bells)
    except OSError:
        return {}
    found = {}
    for name in names:
        identity, at, owner = name.partition("@")
        pid, _, session = owner.partition("-")
        if not at or not session or (agent is not None and identity != agent):
            continue
        if not pid.isdigit() or not files.pid_alive(int(pid)):
            continue  # a killed watch: its refreshes stopped when it died
        try:
            mtime = os.stat(os.path.join(bells, name)).st_mtime
        except OSError:
            continue
        found[session] = (identity, dt.datetime.fromtimestamp(mtime, dt.timezone.utc))
    return found


def _sweep_pipe(pipe: str, owner: str) -> None:
    from agent_mail import files

    pid = owner.partition("-")[0]
    if pid.isdigit() and not files.pid_alive(int(pid)):
        try:
            os.unlink(pipe)
        except OSError:
            pass


# ---------------------------------------------------------------- damage and odd files

_CREATION_MARK = ".am-"  # .NAME.am-PID-RANDOM.new: a new mailbox being built aside
_CREATION_SUFFIX = ".new"


def _is_damage(exc: Exception) -> bool:
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
        "(the damaged file is kept aside)."
    )


def damage_problem(path: str) -> str | None:
    """Why the mailbox must not be used: a command met damage in it earlier. One stat when it is fine."""
    if not os.path.lexists(damage_marker(path)):
        return None
    record = read_damage_record(path) or {}
    when = f" at {record['found_at']}" if record.get("found_at") else ""
    return damaged_error(path, f"found{when}: {record.get('error')}").message


def creation_leftovers(path: str) -> list[str]:
    """Files of mailbox creations that were killed before they finished (their process is gone)."""
    from agent_mail import files

    directory = os.path.dirname(os.path.abspath(path))
    base = f".{os.path.basename(path)}"
    return files.stale_temporary_files(directory, mark=_CREATION_MARK, suffix=_CREATION_SUFFIX, prefix=base) + \
        files.stale_temporary_files(directory, mark=base + ".", suffix=_CREATION_SUFFIX, prefix=base)  # older naming


def sweep_creation_leftovers(path: str, dry_run: bool = False) -> list[str]:
    from agent_mail import files

    found = creation_leftovers(path)
    if dry_run:
        return found
    return files.sweep(os.path.dirname(os.path.abspath(path)), found)


def permission_problem(path: str) -> str | None:
    """Why the mailbox must not be used as it is: anyone else could rewrite or replace it.

    Refused: a mailbox file writable by other users, or a directory writable by them without
    the sticky bit (which would let them swap the file). Merely readable by others is reported
    by `describe` (see permissions()) instead: the mail is exposed, but nothing can be forged.
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
        report["problem"] = not_a_file(path, info.st_mode)
        return report
    damage = read_damage_record(path)
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
        if _is_damage(exc):
            report["integrity"] = f"damaged: {exc}"
    if report.get("integrity", "ok").startswith("damaged"):
        report["problem"] = damaged_error(path, report["integrity"]).message
    return report


def _uri_path(path: str) -> str:
    from urllib.parse import quote

    return quote(os.fsencode(os.path.abspath(path)))

