"""A team mailbox in PostgreSQL, for agents on several machines.

Chosen by `AGENT_MAIL_DB=postgresql://...` (or `postgres://`); every libpq connection parameter
and environment variable (PGPASSFILE, sslmode, service files, ...) works as it does for libpq.
Our own URL parameter `schema=NAME` (or AGENT_MAIL_PG_SCHEMA) picks the PostgreSQL schema holding
the tables, `agent_mail` by default, so a mailbox can share a database with other applications.

The contract the shared SQL relies on, made explicit here:
- Writers are serialised: every write transaction first takes one transaction-level advisory lock
  of its schema, so (as with SQLite's BEGIN IMMEDIATE) a writer sees everything committed before
  it, two readers never both take the same unread message, and `seq` (insertion order) is commit
  order. A read transaction is one REPEATABLE READ snapshot.
- One clock: every timestamp is taken from the database server's clock (sampled at connect and
  carried forward by the monotonic clock), so machines whose clocks disagree still agree.
- Wake-ups are NOTIFY on a channel per recipient (and one for broadcasts), sent inside the
  committing transaction, so a listening watch hears of mail exactly when it is committed. A
  watch holds one connection, LISTENs, and waits with no transaction open (the waits of an `agent-mail
  serve` process share one: postgres_hub).
- Only errors.StorageError leaves this module; no psycopg type escapes, and no message shows a
  password.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from contextlib import contextmanager

import psycopg
from psycopg import errors as pg_errors

from agent_mail import errors, model
from agent_mail.urls import redact_url as redact
from agent_mail.urls import url_secrets as _secrets
from agent_mail.store.postgres_schema import MIGRATIONS, T, index_missing
from agent_mail.store.sql import SQLStore

DEFAULT_SCHEMA = "agent_mail"
SCHEMA_ENV = "AGENT_MAIL_PG_SCHEMA"
BUSY_TIMEOUT_SECONDS = 10.0  # how long a writer waits for the write lock, as on SQLite
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_SESSION_ID = re.compile(r"^[0-9a-f-]{1,40}$")
_WATCH_APP = "agent-mail watch "  # application_name of a watch's connection, followed by its session id
# application_name of a server process's LISTEN connection (postgres_hub), followed by its instance; the watch
# sessions that server holds are named INSTANCE.UUID.
SERVE_APP = "agent-mail serve "
# The payload of a notification on an identity's channel that says which session its client's stop call released
# (Store.announce_release): the server holding that wait ends it (postgres_hub, served_waits), whichever replica
# took the call.
RELEASED_NOTE = "released "
# Connection settings we choose unless the URL or the environment does: a dead peer (a partition) is
# noticed in seconds rather than the kernel's quarter of an hour.
CONNECT_DEFAULTS = {"connect_timeout": ("PGCONNECT_TIMEOUT", "5"), "application_name": ("PGAPPNAME", "agent-mail"),
             "keepalives": (None, "1"), "keepalives_idle": (None, "5"), "keepalives_interval": (None, "2"),
             "keepalives_count": (None, "3"), "tcp_user_timeout": (None, "10000")}

def split_url(url: str) -> tuple[str, str]:
    """(the URL libpq is given, the schema): our own `schema=` parameter taken out, anything else kept."""
    from urllib.parse import parse_qsl, urlsplit

    from agent_mail.urls import with_query

    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = os.environ.get(SCHEMA_ENV) or DEFAULT_SCHEMA
    kept = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if not _SCHEMA_NAME.match(schema):
        raise errors.InvalidInput([("AGENT_MAIL_DB", f"schema {schema!r} is not a usable PostgreSQL schema name: "
                                                     "use lower-case letters, digits and _ (at most 63), starting "
                                                     "with a letter or _, e.g. ?schema=agent_mail.")])
    return (with_query(url, kept) if len(kept) != len(query) else url), schema


def _scrubbed(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, "***")
    return text.strip()


def error_text(exc: Exception, secrets: list[str]) -> str:
    """The first line of a driver error, without any password: the only form a driver error is shown in."""
    return _scrubbed(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, secrets)


def channel(schema: str, recipient: str) -> str:
    """The NOTIFY channel of `recipient`'s mail in `schema` ('*': broadcasts); a valid identifier whatever
    the identity's length."""
    return "am_" + hashlib.sha1(f"{schema}\0{recipient}".encode()).hexdigest()


_PLACEHOLDER = re.compile(r"(?<![:\w]):([a-z_][a-z0-9_]*)|\?")
_translated: dict[str, str] = {}


def _translate(sql: str) -> str:
    """The shared SQL's :name and ? placeholders in psycopg's style, once per statement text."""
    done = _translated.get(sql)
    if done is None:
        pieces = sql.replace("%", "%%").split("'")
        for i in range(0, len(pieces), 2):  # outside string literals only
            pieces[i] = _PLACEHOLDER.sub(lambda m: f"%({m.group(1)})s" if m.group(1) else "%s", pieces[i])
        done = _translated[sql] = "'".join(pieces)
    return done


class PostgresStore(SQLStore):
    """A mailbox in a schema of a PostgreSQL database."""

    kind = "postgresql"
    SEQ = "seq"
    _BROADCAST_STATE_BY_JOIN = True
    # A watch's connection carries its presence (application_name names its session; see liveness()), so it
    # refreshes its row only every HELD_REFRESH_SECONDS (presence_held); NOTIFY loses no wake-up, so a follower
    # of the notifications looks for lost ones less often too.
    idle_scale = model.POSTGRES_IDLE_SCALE

    def __init__(self, url: str):
        self.url = url
        self.display = redact(url)
        self._conninfo, self.schema = split_url(url)
        self._secrets = _secrets(url)
        self._lock_key = int.from_bytes(hashlib.sha1(f"agent-mail {self.schema}".encode()).digest()[:8], "big",
                                        signed=True)
        self._wakes: set[str] = set()
        self._activity = ""  # the statement recording activity, sent with the commit
        self._listening: list[str] = []
        self._session: str | None = None
        self._woken = False
        self._relaxed = False
        self.db = None
        self._connect(first=True)

    # -- dialect hooks (see store/sql.py) ------------------------------------------
    _SEARCH_COLUMN = ("search", "CAST({} AS tsvector)")
    # A walk of 5,000 rows is ~15 ms; a word in more than ~1 % of the mail fills a page of results within it.
    SEARCH_WINDOW = 5000

    def searchable(self) -> bool:
        return True

    def _search_source(self) -> tuple[str, str, str]:
        # The lexemes are ours already (agent_mail.store.index cut them, as it cut the stored tsvector): taken as
        # written, not passed through to_tsquery's parser, which could cut some differently.
        return "messages m", "m.search @@ CAST(:q AS tsquery)", "m.seq"

    def _search_text(self, query, subject_only: bool, marks: tuple[tuple[str, ...], ...]) -> str:
        return query.tsquery(subject_only, marks)

    def index_missing(self) -> int:
        return index_missing(self._x)

    def index_behind(self) -> bool:
        return False  # every row is written with its search column

    def _x(self, sql: str, params: object = ()):
        return self.db.execute(_translate(sql), params)

    # The identities of a look at many (store/sql_waits.py): one array parameter, one statement text whatever
    # their number.
    _IDENTITIES = "WITH a(agent) AS (SELECT unnest(CAST(:agents AS text[])))"

    def _many(self, sql: str, rows: list) -> int:
        cursor = self.db.cursor()
        cursor.executemany(_translate(sql), rows)
        return cursor.rowcount

    @staticmethod
    def _distinct(column: str, table: str) -> str:
        # PostgreSQL reads every index entry for a DISTINCT; hopping from one value to the next through the
        # index (a recursive query) reads one entry per distinct value instead.
        return (f"WITH RECURSIVE d(v) AS (SELECT MIN({column}) FROM {table} UNION ALL SELECT (SELECT MIN({column}) "
                f"FROM {table} WHERE {column} > d.v) FROM d WHERE d.v IS NOT NULL) SELECT v FROM d WHERE v IS NOT NULL")

    def after_copy(self) -> None:
        # Fresh statistics for the planner, and the visibility map that index-only scans need, at once rather
        # than whenever autovacuum gets to a table that just grew by the whole of another mailbox.
        for table in ("messages", "broadcast_acks", "attachments", "scheduled"):
            self._autocommit("analysing the copy", lambda t=table: self._x(f"VACUUM (ANALYZE) {t}"))

    def after_bulk_insert(self) -> None:
        for table in ("messages", "system_events"):
            self._x(f"SELECT setval(pg_get_serial_sequence('{table}', 'seq'), GREATEST(COALESCE(MAX(seq), 0), 1), "
                    f"MAX(seq) IS NOT NULL) FROM {table}")

    def _wake(self, recipient: str) -> None:
        self._wakes.add(recipient)

    # -- errors ----------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return _scrubbed(text, self._secrets)

    def _fail(self, exc: Exception, doing: str) -> errors.StorageError:
        """The one place a driver error becomes ours: what went wrong, that nothing changed, what to do."""
        text = error_text(exc, self._secrets)
        where = f"the PostgreSQL mailbox {self.display} (schema {self.schema})"
        if isinstance(exc, pg_errors.LockNotAvailable):
            return errors.StorageError(f"{where} was locked by another writer while {doing} (waited up to "
                                       f"{BUSY_TIMEOUT_SECONDS:.0f} s); nothing was changed. Retry in a moment.",
                                       told=f"the mailbox was locked by another writer while {doing} (waited up to "
                                            f"{BUSY_TIMEOUT_SECONDS:.0f} s); nothing was changed. Retry in a moment.")
        if isinstance(exc, pg_errors.QueryCanceled):
            return errors.StorageError(f"{where}: a statement was cancelled while {doing} ({text}: the server's "
                                       "statement_timeout, or an operator); nothing was changed. Retry, or raise "
                                       "statement_timeout for this role.",
                                       told=f"a statement of the database was cancelled while {doing} (its time "
                                            "limit, or its operator); nothing was changed. Retry in a while.")
        if isinstance(exc, pg_errors.InsufficientPrivilege):
            return errors.StorageError(
                f"{where}: the role lacks a right it needs while {doing} ({text}). To create the mailbox the role "
                f"needs CREATE on the database (GRANT CREATE ON DATABASE <db> TO <role>), or an owner creates "
                f"schema {self.schema} once; then USAGE and CREATE on the schema and rights on its tables.")
        if isinstance(exc, pg_errors.InvalidCatalogName):
            return errors.StorageError(f"{where} cannot be opened: {text}. Create the database (createdb), or "
                                       "point AGENT_MAIL_DB at one that exists.")
        if isinstance(exc, pg_errors.InvalidAuthorizationSpecification | pg_errors.InvalidPassword):
            return errors.StorageError(f"{where} refused the login: {text}. Check the user, the password "
                                       "(PGPASSFILE, ~/.pgpass) and the server's pg_hba.conf.",
                                       told=errors.CANNOT_REACH)
        if "commit" in doing and isinstance(exc, psycopg.OperationalError):
            return errors.StorageError(f"the connection to {where} was lost while {doing} ({text}): the server "
                                       "may or may not have saved the change. Check with read/status before "
                                       "repeating it.",
                                       told=f"the connection to the database was lost while {doing}: it may or may "
                                            "not have saved the change. Check with read/status before repeating it.")
        if isinstance(exc, psycopg.OperationalError | pg_errors.AdminShutdown):
            return errors.StorageError(f"cannot reach {where} while {doing}: {text}. Nothing was changed; check "
                                       "that the server is running and reachable, then retry.",
                                       told=errors.CANNOT_REACH)
        return errors.StorageError(f"cannot use {where} while {doing}: {text}.")

    # -- connecting --------------------------------------------------------------
    def _connect(self, first: bool = False) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        try:
            given = conninfo_to_dict(self._conninfo)
        except psycopg.ProgrammingError as exc:
            raise errors.InvalidInput([("AGENT_MAIL_DB", f"is not a usable PostgreSQL URL: {self._scrub(str(exc))}. "
                                                         "Write postgresql://USER@HOST[:PORT]/DATABASE.")]) from None
        extra = {key: value for key, (env, value) in CONNECT_DEFAULTS.items()
                 if key not in given and not (env and os.environ.get(env))}
        try:
            self.db = psycopg.connect(make_conninfo(self._conninfo, **extra), autocommit=True)
        except psycopg.Error as exc:
            raise self._fail(exc, "connecting") from None
        try:
            # One round trip: the server's clock, this connection's settings, and whether the schema is there.
            # (No JIT: our statements are short lookups, and a misestimated one was seen to spend 466 ms of 824
            # compiling itself.)
            before = time.monotonic()
            moment, _, _, _, made = self._x(
                f"SELECT clock_timestamp(), set_config('search_path', '{self.schema}', false), "
                f"set_config('lock_timeout', '{int(BUSY_TIMEOUT_SECONDS * 1000)}ms', false), "
                "set_config('jit', 'off', false), to_regclass(?)",
                (f'"{self.schema}".schema_migrations',)).fetchone()
            # The server's clock is this process's clock from now on (see model.follow_clock).
            model.follow_clock(moment, (before + time.monotonic()) / 2)
            if self._relaxed:
                self._x("SET synchronous_commit = off")
            self._migrate(made is not None)
        except psycopg.Error as exc:
            self._close_quietly()
            raise self._fail(exc, "creating the schema" if first else "reconnecting") from None
        except BaseException:
            self._close_quietly()
            raise

    def _migrate(self, recorded: bool) -> None:
        """Create or bring the schema up to date: additive named migrations, recorded, applied by one process
        at a time (an advisory lock) however many start together on however many machines. `recorded`: the
        schema_migrations table exists."""
        names = {m.__name__ for m in MIGRATIONS}
        if recorded and {r[0] for r in self._x("SELECT name FROM schema_migrations")} >= names:
            return  # the common case: one query
        with self._raw_transaction():
            self._x("SELECT pg_advisory_xact_lock(?)", (self._lock_key ^ 1,))
            if self._x("SELECT 1 FROM pg_namespace WHERE nspname = ?", (self.schema,)).fetchone() is None:
                self._x(f'CREATE SCHEMA "{self.schema}"')
            self._x(f"CREATE TABLE IF NOT EXISTS schema_migrations (name {T} PRIMARY KEY, applied_at {T} NOT NULL)")
            applied = {r[0] for r in self._x("SELECT name FROM schema_migrations")}
            for migration in MIGRATIONS:
                if migration.__name__ not in applied:
                    migration(self._x)
                    self._x("INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)",
                            (migration.__name__, model.now_iso()))

    @contextmanager
    def _raw_transaction(self):
        self._x("BEGIN")
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        self._x("COMMIT")

    def _close_quietly(self) -> None:
        try:
            if self.db is not None:
                self.db.close()
        except psycopg.Error:
            pass

    def _healthy(self) -> bool:
        return self.db is not None and not self.db.closed and not self.db.broken

    def _reconnect(self, doing: str) -> None:
        """Connect again, trying for reconnect_seconds; resume listening. Raises StorageError past then."""
        self._close_quietly()
        deadline = time.monotonic() + self.reconnect_seconds
        pause = 0.05
        while True:
            try:
                self._connect()
                break
            except errors.StorageError:
                if time.monotonic() + pause > deadline:
                    raise errors.StorageError(
                        f"lost the connection to the PostgreSQL mailbox {self.display} (schema {self.schema}) while "
                        f"{doing}, and it stayed unreachable for {self.reconnect_seconds:g} s; nothing more was "
                        "changed. Check that the server is running and reachable, then run the command again.",
                        told=errors.CANNOT_REACH) from None
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
        if self._listening or self.presence_held:
            self._listen_all()
            self._woken = True  # look again: mail may have arrived while the connection was down

    def _ready(self, doing: str) -> None:
        """Make sure the connection is there and idle: one left busy or inside a transaction by an interrupted
        statement is rolled back (or closed), one that broke is made again."""
        if self._healthy() and self.db.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._rollback()
        if not self._healthy():
            self._reconnect(doing)

    def _autocommit(self, doing: str, action):
        """Run `action` in autocommit outside a transaction, reconnecting once if the connection broke; inside
        our open transaction, simply as part of it."""
        if self._healthy() and self.db.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            try:
                return action()
            except psycopg.Error as exc:
                raise self._fail(exc, doing) from None
        for attempt in (1, 2):
            self._ready(doing)
            try:
                return action()
            except psycopg.OperationalError as exc:
                if attempt == 2 or self._healthy():
                    raise self._fail(exc, doing) from None
            except psycopg.Error as exc:
                raise self._fail(exc, doing) from None

    # -- lifecycle -----------------------------------------------------------------
    def close(self) -> None:
        self._close_quietly()

    def reusable(self) -> bool:
        return self._healthy() and not self._wakes and not self._listening and not self._relaxed \
            and self.db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def relax_durability(self) -> None:
        # A watch writes liveness only: its commits need not wait for the server's disk.
        self._relaxed = True
        self._autocommit("starting to watch", lambda: self._x("SET synchronous_commit = off"))

    _driver_error = psycopg.Error

    def _start(self, write: bool, patience: float | None, doing: str) -> None:
        self._activity = ""
        self._ready(doing)
        try:
            self._begin(write, patience)
        except psycopg.OperationalError as exc:
            if self._healthy():
                raise self._fail(exc, doing) from None
            self._reconnect(doing)  # the server went away between commands: nothing was begun
            try:
                self._begin(write, patience)
            except psycopg.Error as again:
                self._rollback()
                raise self._fail(again, doing) from None
        except psycopg.Error as exc:
            self._rollback()
            raise self._fail(exc, doing) from None

    def _write_active(self) -> None:
        # Sent with the commit (_finish), so recording activity costs no round trip of its own: the values as
        # literals, quoted by the driver (several statements in one message take no parameters).
        rows, self._active = self._active, {}
        literal = psycopg.sql.Literal
        self._activity = self._ACTIVE.format(rows=", ".join(
            f"({literal(agent).as_string(self.db)}, {literal(host).as_string(self.db)}, "
            f"{literal(at).as_string(self.db)})" for (agent, host), at in rows.items())) + "; "

    def _finish(self, write: bool, doing: str) -> None:
        try:
            # The wake-ups inside the transaction: PostgreSQL delivers them exactly when (and only if) it
            # commits. One round trip for them, the activity noted (_write_active) and the commit (channel names
            # are hex digests: nothing to quote). The "" channel hears every message (a supervisor's dashboard
            # listens there).
            notify = "".join(f"NOTIFY {channel(self.schema, r)}; " for r in sorted(self._wakes | {""} if self._wakes
                                                                                   else ()))
            self.db.execute(f"{self._activity}{notify}COMMIT".encode())
        except psycopg.Error as exc:
            self._rollback()
            raise self._fail(exc, "committing" if write else doing) from None
        finally:
            self._wakes, self._activity = set(), ""

    def _begin(self, write: bool, patience: float | None) -> None:
        if not write:
            self._x("BEGIN ISOLATION LEVEL REPEATABLE READ")
            return
        # One round trip: BEGIN, the lock's patience if not the default, the write lock (all ours to spell).
        patience_ms = "" if patience is None else f"SET LOCAL lock_timeout = '{max(1, int(patience * 1000))}ms'; "
        self.db.execute(f"BEGIN; {patience_ms}SELECT pg_advisory_xact_lock({int(self._lock_key)})".encode())

    def _rollback(self) -> None:
        """Roll back whatever is open. A statement cut off mid-flight (a signal's exception raised while
        the driver waited for the server) leaves the connection busy: it is closed instead, which rolls the
        transaction back on the server, and the next transaction connects afresh."""
        if not self._healthy():
            return
        status = self.db.info.transaction_status
        if status in (psycopg.pq.TransactionStatus.ACTIVE, psycopg.pq.TransactionStatus.UNKNOWN):
            self._close_quietly()
            return
        try:
            if status != psycopg.pq.TransactionStatus.IDLE:
                self.db.execute("ROLLBACK")
        except psycopg.Error:
            self._close_quietly()

    # -- liveness, waiting ---------------------------------------------------------
    def refresh_session(self, session_id: str, at: str) -> None:
        # One autocommit statement, no write lock: it touches only this session's row.
        self._autocommit("refreshing a watch", lambda: self.touch_session(session_id, at))

    def release_session_alone(self, session_id: str, at: str, reason: str, patience: float | None = None) -> None:
        # Likewise: the session's own row only, one round trip on the way out of a watch; the looks at everything
        # told (tell_supervisors) by a NOTIFY of its own, delivered at once in autocommit, else at the commit.
        def release():
            self.release_session(session_id, at, reason)
            self._wakes.discard("")
            self._x(f"NOTIFY {channel(self.schema, '')}")
        self._autocommit("releasing a watch", release)

    def announce_release(self, agent: str, session_id: str) -> None:
        # On the identity's channel, naming the session (delivered at commit, as every wake-up): the hub holding
        # it ends that one wait; no other wait of the identity looks again for it.
        self._x("SELECT pg_notify(?, ?)", (channel(self.schema, agent), RELEASED_NOTE + session_id))

    def mail_marker(self) -> object:
        return self._autocommit("waiting", lambda: self._value("SELECT MAX(seq) FROM messages"))

    def check_still_there(self) -> None:
        found = self._autocommit("waiting", lambda: self._value("SELECT to_regclass(?)",
                                                                (f'"{self.schema}".messages',)))
        if found is None:
            raise errors.StorageError(
                f"the mailbox schema {self.schema} in {self.display} was dropped while this command was waiting; "
                "it stopped rather than wait on a mailbox nobody writes to. Run the command again.",
                told="the mailbox was removed while this command was waiting; it stopped rather than wait on a "
                     "mailbox nobody writes to. Run the command again.")

    def liveness(self, agent: str | None = None) -> dict[str, dict]:
        """As stored, with what the watches' connections tell (_presence)."""
        return _presence(self, super().liveness(agent), agent)

    def listen(self, agent: str, session: str | None = None) -> None:
        """LISTEN on `agent`'s channel and the broadcast channel, before the first look (AGENT_MAIL_POLL:
        poll instead, as on SQLite). Either way the connection names the watch session it serves: its
        presence (see liveness())."""
        self._session = session
        self.presence_held = session is not None and bool(_SESSION_ID.match(session))
        if os.environ.get("AGENT_MAIL_POLL"):
            self._listening = []
            self._autocommit("starting to watch", self._name_session)
            return super().listen(agent)
        self._listening = [channel(self.schema, agent), channel(self.schema, "*")]
        self._autocommit("starting to watch", self._listen_all)
        self._woken = False

    def _name_session(self) -> None:
        # The connection names the watch session it serves (its presence, see liveness()), and asks the server
        # to probe the client every few seconds, so a watch cut off by a partition stops counting as present.
        if self.presence_held:
            self.db.execute(f"SET application_name = '{_WATCH_APP}{self._session}'; SET tcp_keepalives_idle = 5; "
                            "SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3".encode())

    def _listen_all(self) -> None:
        self._name_session()
        for name in self._listening:
            self.db.execute(f'LISTEN "{name}"'.encode())

    def wait_for_wake(self, timeout: float, also: tuple[int, ...] = ()) -> bool:
        """Sleep (no transaction open) until a NOTIFY for us arrives (True) or `timeout` passes (False). A
        dropped connection is re-made and answers True: the caller looks again, so nothing sent while it was
        down is missed. The sleep is the kernel's (poll on the connection's socket: files.wait_readable): the
        driver's own wait wakes ten times a second, which a hundred idle watches would pay for. `also`: other
        descriptors slept on with the socket (a pidfd of the harness a waiter serves); one ready answers True."""
        if not self._listening:
            return super().wait_for_wake(timeout, also)
        if not self._woken:
            if not self._healthy():
                self._reconnect("waiting")
            else:
                from agent_mail.files import wait_readable

                try:
                    if not self._drain():
                        ready = wait_readable([self.db.fileno(), *also], timeout)
                        if self.db.fileno() in ready:
                            self._drain()
                        if ready - {self.db.fileno()}:
                            self._woken = True  # what the caller also watches: it looks, and sees which
                except psycopg.OperationalError:
                    self._reconnect("waiting")
                except psycopg.Error as exc:
                    raise self._fail(exc, "waiting") from None
        woken, self._woken = self._woken, False
        return woken

    def _drain(self) -> bool:
        """Take the notifications already received or waiting on the socket, without blocking."""
        for _ in self.db.notifies(timeout=0):
            self._woken = True
        return self._woken

def _presence(store: PostgresStore, facts: dict[str, dict], agent: str | None) -> dict[str, dict]:
    """The stored liveness `facts`, with what the watches' connections tell: an armed session whose watch is
    connected now (its connection's application_name names the session, or, for a wait a server holds, the
    server's LISTEN connection names the instance its id starts with; visible to every role) is seen now,
    unless its row was not refreshed for HUNG_SECONDS (hung); an armed session whose connection is gone is a
    dead watch, stale at once (a killed watch's connection ends at once; a partitioned one is ended by the
    server within seconds, by the session's server-side keepalives). A session a server abandoned (its client
    hung up: Store.abandon_sessions) names the holder GONE_HOLDER, which no connection is named after: stale."""
    from agent_mail.store.base import gone_since

    present, serving = set(), set()
    for (name,) in store._x("SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                            "AND (application_name LIKE ? OR application_name LIKE ?)",
                            (_WATCH_APP + "%", SERVE_APP + "%")):
        if name.startswith(_WATCH_APP):
            present.add(name[len(_WATCH_APP):])
        else:
            serving.add(name[len(SERVE_APP):])
    now = model.now()
    armed: dict[str, list] = {}  # identity: [(the moment its armed session was last known alive, alive now)]
    for session, name, last_seen in store._x(
            "SELECT id, agent, last_seen FROM watch_sessions WHERE state = 'armed'"
            + (" AND agent = :agent" if agent else ""), {"agent": agent}):
        stored = model.parse_iso(last_seen)
        holder, dot, _ = session.partition(".")
        if session not in present and not (dot and holder in serving):
            armed.setdefault(name, []).append((gone_since(stored, now), False))
        elif stored is not None and (now - stored).total_seconds() > model.HUNG_SECONDS:
            armed.setdefault(name, []).append((stored, False))  # connected, but hung
        else:
            armed.setdefault(name, []).append((now, True))
    for name, seen in armed.items():
        entry = store.fact_entry(facts, name)
        entry["armed_seen"] = max(moment for moment, _ in seen)
        if any(alive for _, alive in seen):
            entry["session_seen"] = now
    return facts


def inspect(url: str) -> dict:
    """Facts about a PostgreSQL mailbox for `describe`, without creating or changing anything."""
    conninfo, schema = split_url(url)
    report: dict = {"schema": schema, "exists": False, "messages": None}
    try:
        from psycopg.conninfo import make_conninfo

        with psycopg.connect(make_conninfo(conninfo, connect_timeout=os.environ.get("PGCONNECT_TIMEOUT", "5")),
                             autocommit=True) as db:
            report["server_version"] = db.info.server_version
            if db.execute("SELECT to_regclass(%s)", (f'"{schema}".messages',)).fetchone()[0] is not None:
                report["exists"] = True
                report["messages"] = db.execute(f'SELECT COUNT(*) FROM "{schema}".messages').fetchone()[0]
                report["migrations"] = [r[0] for r in db.execute(
                    f'SELECT name FROM "{schema}".schema_migrations ORDER BY name')]
    except psycopg.Error as exc:
        report["problem"] = f"cannot read it: {error_text(exc, _secrets(url))}"
    return report


def check(url: str) -> dict:
    """What `doctor` reports of a PostgreSQL mailbox, without creating or changing anything: {schema: {...},
    counts: {table: n}}; the server keeps its own integrity, so there is nothing of ours to repair."""
    from agent_mail.store import schema

    tables = schema.ALL_TABLES
    conninfo, schema = split_url(url)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=os.environ.get("PGCONNECT_TIMEOUT", "5")) as db:
            present = {r[0] for r in db.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,))}
            counts = {t: db.execute(f'SELECT COUNT(*) FROM "{schema}"."{t}"').fetchone()[0]
                      for t in tables if t in present}
            applied = ({r[0] for r in db.execute(f'SELECT name FROM "{schema}".schema_migrations')}
                       if "schema_migrations" in present else set())
    except psycopg.Error as exc:
        raise errors.StorageError(f"cannot check the PostgreSQL mailbox {redact(url)}: "
                                  f"{error_text(exc, _secrets(url))}.") from None
    expected = [m.__name__ for m in MIGRATIONS]
    missing = [t for t in tables if t not in present] if present else []
    return {"schema": {"migrations_applied": len(applied & set(expected)), "migrations_expected": len(expected),
                       "application_id_ok": True, "missing_tables": missing,
                       "complete": set(expected) <= applied and not missing} if present else None,
            "counts": counts}
