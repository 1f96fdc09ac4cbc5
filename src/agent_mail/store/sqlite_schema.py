"""A SQLite mailbox's schema: its migrations, and the making of a new mailbox file.

Schema changes are an ordered list of small named migrations, recorded in `schema_migrations` and
applied when the mailbox is opened, so a new mailbox and one written by an earlier implementation take
the same path. Migrations only add (tables, indexes, nullable columns); they never rewrite or drop data.
SQLiteStore imports this module only to make a mailbox or to bring an older one up to date (user_version
below sqlite.SCHEMA_VERSION, which counts MIGRATIONS): a mailbox that is up to date opens without it.
"""

from __future__ import annotations

import os

try:  # the driver itself, as store/sqlite.py imports it
    import _sqlite3 as sqlite3
except ImportError:
    import sqlite3

from agent_mail import errors, jsonout

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
    envelope = jsonout.sqlite_lean_layout(jsonout.WATCH_LEVEL, alias="")
    db.execute(f"CREATE INDEX IF NOT EXISTS idx_messages_broadcast_envelopes ON messages({_ARRIVED}, recipient, "
               f"sender, cancelled_at, deliver_at, id, ({envelope})) WHERE recipient = '*'")


def m009_batch_index(db: sqlite3.Connection) -> None:
    """The rows of one send (a fan-out stores one per recipient) found together: the dashboard shows a send
    as one line with every recipient's state, and a thread with every copy of each message."""
    db.execute("CREATE INDEX IF NOT EXISTS idx_messages_batch ON messages(batch_id)")


SEARCH_TABLE = ("CREATE VIRTUAL TABLE IF NOT EXISTS message_search USING fts5(subject, people, files, body, "
                "tokenize = 'unicode61 remove_diacritics 0', columnsize = 0)")


def m010_search(db: sqlite3.Connection) -> None:
    """Full-text search: an FTS5 table of each message's words (agent_mail.store.index cuts them, the same as on
    PostgreSQL), rowid = the message's rowid, and every message already stored indexed now. A SQLite built
    without FTS5 skips it; `search` then says so."""
    try:
        db.execute(SEARCH_TABLE)
    except sqlite3.OperationalError:
        return
    index_missing(db)


def m011_route_marks(db: sqlite3.Connection) -> None:
    """Each index entry carries its route (agent_mail.store.index's marks, which --from/--to/--agent match); an index
    written before they were (m010 as it first shipped) is rebuilt. Checked on the newest indexed message: a
    mailbox m010 has just indexed has them, and costs two lookups here."""
    if not has_table(db, "message_search"):
        return
    newest = db.execute("SELECT m.rowid, m.sender FROM message_search s JOIN messages m ON m.rowid = s.rowid "
                        "ORDER BY s.rowid DESC LIMIT 1").fetchone()
    if newest is None:
        return
    from agent_mail.store import index

    marked = db.execute("SELECT 1 FROM message_search WHERE message_search MATCH ? AND rowid = ?",
                        (f'"{index.mark("f", newest[1])}"', newest[0])).fetchone()
    if marked is None:
        db.execute("DELETE FROM message_search")
        index_missing(db)


def m012_tokens(db: sqlite3.Connection) -> None:
    """The access tokens of `agent-mail serve`: the identities each acts as, and a hash of its secret."""
    db.execute("""CREATE TABLE IF NOT EXISTS tokens (
        id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL, agents TEXT NOT NULL, supervisor INTEGER NOT NULL DEFAULT 0,
        note TEXT, created TEXT NOT NULL, revoked_at TEXT)""")


def m013_reservations(db: sqlite3.Connection) -> None:
    """File reservations: an identity's pattern in a repository (its key), exclusive or shared, until it is
    released or expires_at (or its holder is dead: decided when read, from liveness). One row per repository,
    holder and pattern: reserving again renews it."""
    db.execute("""CREATE TABLE IF NOT EXISTS reservations (
        id TEXT PRIMARY KEY, repo TEXT NOT NULL, agent TEXT NOT NULL, pattern TEXT NOT NULL,
        exclusive INTEGER NOT NULL, reason TEXT, created TEXT NOT NULL, renewed_at TEXT NOT NULL,
        expires_at TEXT NOT NULL, UNIQUE (repo, agent, pattern))""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_reservations_repo ON reservations(repo, expires_at)")


def m014_deliveries(db: sqlite3.Connection) -> None:
    """Deliveries answered to a reader through a server and not yet confirmed: which messages of an identity
    each holds (one hold per message), the marks to make once it is confirmed, and until when."""
    db.execute("""CREATE TABLE IF NOT EXISTS deliveries (
        lease TEXT NOT NULL, agent TEXT NOT NULL, message_id TEXT NOT NULL, flags TEXT NOT NULL, at TEXT NOT NULL,
        expires_at TEXT NOT NULL, PRIMARY KEY (agent, message_id))""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_deliveries_lease ON deliveries(lease)")


def m015_token_lifetimes(db: sqlite3.Connection) -> None:
    """A token's expiry (create --expires-in, or a rotation's grace), the token that replaced it (rotate), and when
    the server last took it (to the minute)."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(tokens)")}
    for column in ("expires_at", "last_used", "rotated_to"):
        if column not in columns:
            db.execute(f"ALTER TABLE tokens ADD COLUMN {column} TEXT")


def m016_activity(db: sqlite3.Connection) -> None:
    """When each identity last did something, per machine (one row per identity and host, '' where the machine is
    not known: an MCP client over HTTP), and the machine of each watch session: what a supervisor of several
    machines reads in status's last_active and hosts."""
    db.execute("""CREATE TABLE IF NOT EXISTS activity (
        agent TEXT NOT NULL, host TEXT NOT NULL DEFAULT '', last_active TEXT NOT NULL, PRIMARY KEY (agent, host))""")
    if "host" not in {r[1] for r in db.execute("PRAGMA table_info(watch_sessions)")}:
        db.execute("ALTER TABLE watch_sessions ADD COLUMN host TEXT")


def m017_webhooks(db: sqlite3.Connection) -> None:
    """Webhooks (agent-mail webhook add): where each POSTs, for which events and identities, and the secret it
    signs with; and their outbox, one row per event to deliver, claimed by a server with a lease."""
    db.execute("""CREATE TABLE IF NOT EXISTS webhooks (
        id TEXT PRIMARY KEY, url TEXT NOT NULL, agents TEXT NOT NULL, events TEXT NOT NULL, secret TEXT NOT NULL,
        format TEXT NOT NULL, after_minutes REAL, with_body INTEGER NOT NULL DEFAULT 0, created TEXT NOT NULL)""")
    db.execute("""CREATE TABLE IF NOT EXISTS webhook_outbox (
        id TEXT PRIMARY KEY, webhook_id TEXT NOT NULL, event_key TEXT NOT NULL, kind TEXT NOT NULL,
        payload TEXT NOT NULL, created TEXT NOT NULL, due_at TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
        state TEXT NOT NULL DEFAULT 'pending', lease_until TEXT, leased_by TEXT, last_status INTEGER,
        last_error TEXT, done_at TEXT, UNIQUE (webhook_id, event_key))""")
    db.execute("CREATE INDEX IF NOT EXISTS idx_webhook_outbox_due ON webhook_outbox(state, due_at)")


def has_table(db: sqlite3.Connection, name: str) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


MIGRATIONS = (m001_seed_schema, m002_inbox_indexes, m003_liveness, m004_delivery, m005_count_indexes,
              m006_arrival_indexes, m007_harness_sessions, m008_envelope_indexes, m009_batch_index, m010_search,
              m011_route_marks, m012_tokens, m013_reservations, m014_deliveries, m015_token_lifetimes,
              m016_activity, m017_webhooks)


def index_missing(db: sqlite3.Connection) -> int:
    """Index the messages message_search lacks, a batch at a time; how many. A bulk run (a migration, a
    copy) gets a 64 MB page cache while it lasts: FTS5 merges its segments through it (40 % faster at
    200,000 messages than the default 2 MB)."""
    total, after, cache = 0, 0, None
    try:
        while True:
            rows = db.execute(
                "SELECT m.rowid, m.sender, m.recipient, m.subject, m.body, (SELECT group_concat(name, char(10)) "
                "FROM (SELECT name FROM attachments a WHERE a.message_id = m.id ORDER BY position)) FROM messages m "
                "WHERE m.rowid > ? AND NOT EXISTS (SELECT 1 FROM message_search s WHERE s.rowid = m.rowid) "
                "ORDER BY m.rowid LIMIT 2000", (after,)).fetchall()
            if not rows:
                return total
            from agent_mail.store import index  # only when there is something to index (a new mailbox has nothing)

            if cache is None and len(rows) == 2000:  # more than a trickle: a bulk run
                cache = db.execute("PRAGMA cache_size").fetchone()[0]
                db.execute("PRAGMA cache_size = -65536")
            entries = []
            for seq, sender, recipient, subject, body, names in rows:
                entry = index.document({"sender": sender, "recipient": recipient, "subject": subject,
                                         "body": body}, names.split("\n") if names else ())
                entries.append((seq, entry["subject"], entry["people"], entry["files"], entry["body"]))
            db.executemany("INSERT INTO message_search (rowid, subject, people, files, body) VALUES "
                           "(?, ?, ?, ?, ?)", entries)
            total, after = total + len(rows), rows[-1][0]
    finally:
        if cache is not None:
            db.execute(f"PRAGMA cache_size = {int(cache)}")

def migrate(db: sqlite3.Connection, path: str, application_id: int) -> None:
    """Apply the migrations `db` lacks, in WAL mode, and mark it as ours (`application_id`); refuse a database of
    another application, or one without a usable messages table (`path` names the mailbox in the error)."""
    _check_is_mailbox(db, path, application_id)
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
        db.execute(f"PRAGMA application_id = {application_id}")
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


def _check_is_mailbox(db: sqlite3.Connection, path: str, application_id: int) -> None:
    """Refuse to touch a database that belongs to something else."""
    if db.execute("PRAGMA application_id").fetchone()[0] not in (0, application_id):
        raise errors.StorageError(
            f"{path} is a SQLite database of another application; it was left untouched. "
            "Point AGENT_MAIL_DB at an agent-mail mailbox or a new file."
        )
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return
    columns = {r[1] for r in db.execute("PRAGMA table_info(messages)")}
    if not _REQUIRED_MESSAGE_COLUMNS <= columns:
        raise errors.StorageError(
            f"{path} is a SQLite database but not an agent-mail mailbox (it has no usable "
            "messages table); it was left untouched. Point AGENT_MAIL_DB at a mailbox or a new file."
        )


# ---------------------------------------------------------------- a new mailbox file

_CREATION_MARK = ".am-"  # .NAME.am-PID-RANDOM.new: a new mailbox being built aside
_CREATION_SUFFIX = ".new"


def create(path: str, application_id: int, timeout: float) -> None:
    """Build a new mailbox aside and link it into place whole (sqlite3.Error and OSError are the caller's to
    report; `timeout`: how long SQLite waits for a lock).

    Nobody ever sees a half-made mailbox: the schema and WAL mode are set up in a private
    file, which a hard link then publishes under the real name only if that name is still
    free. When several processes start on a new mailbox at once, one link wins and the
    others simply open the winner's file.
    """
    directory = os.path.dirname(os.path.abspath(path))
    sweep_creation_leftovers(path)
    private = os.path.join(directory, f".{os.path.basename(path)}{_CREATION_MARK}{os.getpid()}-"
                                      f"{os.urandom(4).hex()}{_CREATION_SUFFIX}")
    os.close(os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        db = sqlite3.connect(os.fsencode(private), timeout=timeout, isolation_level=None)
        try:
            migrate(db, path, application_id)
        finally:
            db.close()
        try:
            os.link(private, path)
        except FileExistsError:
            pass  # another process published its mailbox first: that one is used
        except OSError:
            # no hard links on this file system: claim the name directly, as a last resort
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass
    finally:
        for leftover in (private, private + "-wal", private + "-shm"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass


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
