"""The storage interface every backend implements, and the contracts each keeps.

Every other module (the operations, history, copy, the dashboard's reads) speaks only to this interface;
SQLite and PostgreSQL implement it through the shared SQL of store/sql.py and its siblings. Methods work on
plain dicts and must be called inside `transaction()`.

Contracts (tests/contract/test_store_contract.py proves them on every backend):
- Writers are serialised: a `transaction(write=True)` holds the mailbox's one write lock from its
  start to its end, and sees everything committed before it started. So two readers racing for
  the same unread mail never both take a message.
- Every message gets an insertion sequence (`seq` in results) when it is stored; since writers are
  serialised, insertion order is commit order. Mail is ordered by arrival (a delayed message when
  it falls due), then by that sequence.
- A read transaction sees one snapshot: nothing another writer commits meanwhile.
- A transaction is all or nothing: an exception inside it rolls everything back, and its
  wake-ups are never sent.
- Only errors.StorageError (and the other errors.AgentMailError kinds) leaves a store: no driver
  exception type escapes, and no message shows a password.
- Timestamps are ISO 8601 text; the service takes them from model.now(), which a backend with a
  clock of its own (a database server several machines share) sets with model.follow_clock().
"""

from __future__ import annotations

import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (never evaluated): contextlib is not imported by a command
    from contextlib import AbstractContextManager


class WholeMailbox:
    """What a store answers about every identity's mail at once (search, supervision) and whole tables (copy,
    export, import): part of Store, declared apart to keep each class readable."""

    # -- search -------------------------------------------------------------
    def searchable(self) -> bool:
        """Whether this mailbox has its search index (a SQLite built without FTS5 has none)."""
        return False

    def index_missing(self) -> int:
        """Index every message the search index lacks (rows another tool wrote, a copy, a migration); how many."""
        return 0

    def index_behind(self) -> bool:
        """Whether messages were stored past the search index's newest entry (by a tool that does not index)."""
        return False

    def search_rows(self, query, *, subject_only: bool, now: str, limit: int, before: int | None = None,
                    agent: str | None = None, sender: str | None = None, recipient: str | None = None,
                    since: str | None = None, thread_ids: list[str] | None = None) -> list[dict]:
        """Stored rows matching `query` (a search.Query; subject only, if asked), newest stored first, at most
        `limit`, stored before seq `before`: {seq, id, batch_id, sender, recipient, subject, body, type, created,
        deliver_at, reply_to, cancelled_at}. Within what `agent` may see when given; from `sender`, to
        `recipient`, arrived since `since`, among `thread_ids`, when given."""
        raise NotImplementedError

    # -- supervision (the dashboard): read only, no identity's view -----------------------
    def recent_rows(self, limit: int, before_seq: int | None = None) -> list[dict]:
        """The newest `limit` message rows (one per recipient of a fan-out, one per broadcast) stored before seq
        `before_seq`, newest first, with each row's own state, scheduled and withdrawn ones included."""
        raise NotImplementedError

    def batch_rows(self, batch_ids: list[str]) -> list[dict]:
        """Every row of these sends (a send to several recipients is one row each, sharing its batch_id)."""
        raise NotImplementedError

    def broadcast_tallies(self, message_ids: list[str]) -> dict[str, dict]:
        """{broadcast id: {"read": n, "acked": n}}: how many identities have read, and acted on, each."""
        raise NotImplementedError

    def whole_thread(self, message_id: str) -> list[dict]:
        """Every row of the thread `message_id` belongs to (replies to any copy of a send, and every copy),
        whoever it was for, in arrival order, with each row's own state."""
        raise NotImplementedError

    def oldest_unacked(self, now: str, agents: list[str]) -> dict[str, str]:
        """{identity: when its oldest visible mail not yet acted on arrived}: direct mail for every identity,
        broadcasts for `agents` (those with something unacked)."""
        raise NotImplementedError

    def open_bounces(self) -> dict[str, int]:
        """{sender: bounce events it has not dismissed}."""
        raise NotImplementedError

    def sends_per_hour(self, since: str) -> list[tuple[str, str, int]]:
        """[(hour 'YYYY-MM-DDTHH', sender, sends)] of mail that arrived since `since` (a fan-out counts once)."""
        raise NotImplementedError

    def open_over_time(self, moments: list[str]) -> list[tuple[int, int]]:
        """[(unread, unacked)] of direct mail at each of `moments` (ascending ISO timestamps), from the rows' own
        times."""
        raise NotImplementedError

    # -- whole tables: copy (schema.TABLES names them and their columns) ---------------------
    def table_counts(self) -> dict[str, int]:
        """{table: rows} for every table of schema.TABLES."""
        raise NotImplementedError

    def read_rows(self, table: str, *, with_seq: bool, batch: int):
        """Yield every row of `table` as stored, in lists of at most `batch` tuples of its schema.TABLES columns
        (numbered tables in insertion order, with the insertion sequence first when `with_seq`)."""
        raise NotImplementedError

    def write_rows(self, table: str, rows: list, *, with_seq: bool, attachments_of=None) -> int:
        """Insert `rows` laid out as read_rows yields them (with_seq: keeping their insertion sequence), skipping
        those whose key is there; how many were added. A backend that indexes messages as it stores them asks
        `attachments_of(ids)` (as Store.attachments_of answers) for their attachments' names."""
        raise NotImplementedError

    def after_bulk_insert(self) -> None:
        """Called after rows were written with their insertion sequence given: the engine's own numbering
        continues after them."""

    def after_copy(self) -> None:
        """Called after a copy committed, outside any transaction: let the engine catch up (statistics)."""

    # -- records: export and import ------------------------------------------------
    def count_stored(self, *, agent: str | None, since: str | None, now: str) -> int:
        """How many stored rows stored_messages would list (all of them, however many batches)."""
        raise NotImplementedError

    def stored_messages(self, *, agent: str | None, since: str | None, now: str, after: int,
                        limit: int, ids: list[str] | None = None) -> list[dict]:
        """The next `limit` stored rows after seq `after`, in insertion order: those `agent` may see (all, if
        None) that arrived since `since` (and have one of `ids`, when given). Each {seq, id, batch_id, type,
        sender, recipient, subject, body, refs (as stored: JSON text or None), reply_to, created, deliver_at,
        cancelled_at, read_at, acked_at, archived_at, deleted_at, broadcast_states: [{agent, read_at, acked_at,
        archived_at, deleted_at}] (every identity's), attachments: [{name, size, sha256}], schedule:
        {deliver_at, published_at} or None}. Never the seed lineage's inert ttl_hours."""
        raise NotImplementedError

    def last_seq(self) -> int:
        """The insertion number of the newest stored message (0 if there is none): what is stored after
        this has higher ones."""
        raise NotImplementedError

    def attachment_blob(self, sha256: str) -> dict | None:
        """{sha256, size, created, content} of stored attachment content, or None."""
        raise NotImplementedError

    def blob_size(self, sha256: str) -> int | None:
        """The size of stored attachment content, or None if there is none (without reading it)."""
        raise NotImplementedError

    def stored_profiles(self, agent: str | None = None) -> list[dict]:
        """Profiles (`agent`'s, or all) by identity: {agent, human, mirror_dir, max_entries, updated_at}."""
        raise NotImplementedError

    def stored_events(self, agent: str | None = None, since: str | None = None) -> list[dict]:
        """System events (`agent`'s, or all; created since `since`), dismissed ones too, in insertion order:
        {id, agent, source, payload, created, dismissed_at}."""
        raise NotImplementedError

    def restore_messages(self, messages: list[dict]) -> int:
        """Store rows shaped as stored_messages gives them (refs a list or None; no seq), with their
        attachments, broadcast states and schedule, indexed for search (the inert ttl_hours column takes its
        default); those whose id is there (or came earlier in `messages`) are skipped. Their recipients are
        woken on commit. How many were added."""
        raise NotImplementedError

    def restore_blob(self, sha256: str, content: bytes, created: str) -> bool:
        """Store attachment content unless it is there; whether it was added."""
        raise NotImplementedError

    def restore_profile(self, profile: dict) -> bool:
        """Store a profile (stored_profiles' shape) unless its identity has one; whether it was added."""
        raise NotImplementedError

    def restore_event(self, event: dict) -> bool:
        """Store a system event (stored_events' shape) unless its id is there; whether it was added."""
        raise NotImplementedError


def gone_since(last_seen, now):
    """What liveness() reports as the last refresh of an armed session whose watch is known to be gone (its
    lock or its connection freed when it died): its stored one, but never within the stale window, so the
    session reads as stale at once rather than STALE_SECONDS after it was last refreshed."""
    from agent_mail import model

    latest = now - model.timedelta(seconds=model.STALE_SECONDS, milliseconds=1)
    return latest if last_seen is None or last_seen > latest else last_seen


# The holder part of the id of a session a server held for a client that hung up without stopping its wait
# (killed, or its connection dropped): see Store.abandon_sessions.
GONE_HOLDER = "gone"


def holder_gone(session_id: str) -> bool:
    """Whether a watch session's id says nothing holds it any more (Store.abandon_sessions)."""
    return session_id.startswith(GONE_HOLDER + ".")


class Store(WholeMailbox):
    """A mailbox. Subclasses implement the queries; waiting has a polling default."""

    #: What `describe` calls this backend.
    kind = "abstract"
    #: How often the default `wait_for_wake` looks for a new message, in seconds.
    poll_seconds = 0.025
    #: A waiting watch whose presence nothing holds refreshes its session every REFRESH_SECONDS times this,
    #: and a listener looks for lost wake-ups every SAFETY_CHECK_SECONDS times this. More than 1 where
    #: wake-ups are never lost (PostgreSQL's NOTIFY), so idle listeners wake less often.
    idle_scale = 1
    #: Set by listen(agent, session): whether something this process holds tells that the session's watch is
    #: alive (SQLite: a lock on its wake-up pipe; PostgreSQL: its open connection), and death frees it at
    #: once. Such a watch refreshes only every HELD_REFRESH_SECONDS, to show it is not hung.
    presence_held = False
    #: How long a lost connection to a server is re-made before the operation fails (server backends only).
    #: A command waits out a server restart; the dashboard, which shows the loss and retries itself, less.
    reconnect_seconds = 15.0

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Release the connection."""

    def own_file(self, path: str) -> bool:
        """Whether `path` (a real path) is one of the files this mailbox lives in, which nothing else written (a
        saved attachment, say) may ever replace. A server's mailbox has none on this machine."""
        return False

    def reusable(self) -> bool:
        """Whether this open store may serve another caller as it is (a pool's check when it is given back):
        its connection sound, no transaction open, no wake-up pending, not listening."""
        return True

    def transaction(self, write: bool = False, patience: float | None = None) -> AbstractContextManager:
        """A transaction; `write=True` takes the write lock up front, waiting for it up to `patience`
        seconds (the backend's busy timeout by default) in a way a signal can interrupt at once.
        Rolls back on error. Raises only errors.AgentMailError subclasses, never driver exceptions."""
        raise NotImplementedError

    def relax_durability(self) -> None:
        """Let this connection's later commits skip waiting for the disk.

        For connections that write only liveness (a watch): a power cut may lose the last
        refresh, never corrupt or lose mail. The default keeps full durability.
        """

    # -- messages --------------------------------------------------------
    # `now` (ISO UTC) decides visibility: a scheduled message is invisible to its recipients until
    # due, and a cancelled one forever. Per-agent state (read_at, acked_at, archived_at, deleted_at)
    # lives on the row for direct mail and per agent for broadcasts.
    def insert_message(self, message: dict, attachment_names=()) -> None:
        """Store one message row, indexed for search in the same transaction (with its attachments' names);
        one with deliver_at is also queued for publication. Wakes its recipient's watches on commit."""
        raise NotImplementedError

    def get_message(self, message_id: str) -> dict | None:
        """The stored row whoever it is for, or None."""
        raise NotImplementedError

    def archived(self, agent: str, now: str, *, sender: str | None = None) -> list[dict]:
        """`agent`'s archived (and not deleted) visible messages, in arrival order, whole rows."""
        raise NotImplementedError

    def addressed(self, agent: str, message_ids: list[str], now: str) -> dict[str, dict]:
        """Those of `message_ids` visible to `agent` as a recipient, keyed by id, with its state."""
        raise NotImplementedError

    def unread(self, agent: str, now: str, *, limit: int | None = None, newest: bool = False,
               sender: str | None = None, lean: bool = False, layout_level: int | None = None) -> list[dict]:
        """`agent`'s unread visible mail (from `sender` only, if given), in arrival order: all of it, or the
        oldest `limit` (the newest `limit` with newest=True, still returned oldest first). Envelope columns
        and the agent's state; lean=True: envelopes only (id, sender, subject, type, created). With lean and
        layout_level, a backend may return them already laid out as JSON for that nesting depth
        (jsonout.Rendered, byte for byte what jsonout.dumps would write); plain dicts are always correct.
        Costs the page, not the backlog: backends walk an arrival-ordered index and stop at the limit."""
        raise NotImplementedError

    def unread_of_many(self, agents: list[str], now: str) -> dict[str, list[dict]]:
        """{agent: what unread(agent, now, lean=True) finds} for each of `agents`, in one statement (a server's
        waits woken together: a broadcast wakes them all)."""
        raise NotImplementedError

    def latest(self, agent: str, now: str, *, limit: int, sender: str | None = None) -> list[dict]:
        """The newest `limit` visible messages for `agent`, read or not, neither archived nor deleted,
        returned oldest first (envelope columns and state)."""
        raise NotImplementedError

    def read_unacked(self, agent: str, now: str) -> list[dict]:
        """Visible messages for `agent` that it has read but not acknowledged, archived or deleted: what
        `ack --all` settles (unread mail is never settled in bulk)."""
        raise NotImplementedError

    def count_unread(self, agent: str, now: str) -> int:
        """How many visible messages `agent` has not read; exact, whatever the backlog."""
        raise NotImplementedError

    def count_unacked(self, agent: str, now: str) -> int:
        """How many visible messages `agent` has neither acknowledged, archived nor deleted."""
        raise NotImplementedError

    def set_flags(self, agent: str, messages: list[dict], at: str, flags: tuple[str, ...]) -> None:
        """Stamp `agent`'s "read" / "ack" / "archive" / "delete" times on `messages`, keeping earlier ones."""
        raise NotImplementedError

    def thread(self, message_id: str, agent: str, now: str) -> list[dict]:
        """The messages of the thread holding `message_id` that `agent` may see (see visible_to), from its
        root, in arrival order; read_at/acked_at/archived_at are `agent`'s own (null on what it sent)."""
        raise NotImplementedError

    def visible_to(self, agent: str, message_ids: list[str], now: str) -> set[str]:
        """Those of `message_ids` that `agent` may see: the one visibility rule.

        Its sender always; a recipient (the addressee, or anyone but the sender of a broadcast)
        once the message is due and not withdrawn, unless that recipient deleted it.
        """
        raise NotImplementedError

    # -- scheduled delivery -------------------------------------------------------
    def due_unpublished(self, now: str) -> list[dict]:
        """Scheduled messages that fell due and were not announced yet: [{message_id, recipient, deliver_at}]."""
        raise NotImplementedError

    def mark_published(self, message_ids: list[str], at: str) -> None:
        raise NotImplementedError

    def next_due(self, agent: str, now: str) -> str | None:
        """When the next scheduled message for `agent` (or everyone) falls due, or None."""
        raise NotImplementedError

    def next_due_of_many(self, agents: list[str], now: str) -> dict[str, str | None]:
        """{agent: next_due(agent, now)} for each of `agents`, in one statement."""
        raise NotImplementedError

    def cancel(self, message_id: str, at: str) -> None:
        """Withdraw a scheduled message."""
        raise NotImplementedError

    # -- attachments ----------------------------------------------------------
    def add_attachment(self, message_id: str, position: int, name: str, content: bytes, sha256: str,
                       at: str) -> None:
        """Link content to a message; the content itself is stored once per sha256."""
        raise NotImplementedError

    def attachments_of(self, message_ids: list[str]) -> dict[str, list[dict]]:
        """{message id: [{name, size, sha256}, ...]} in the order they were attached."""
        raise NotImplementedError

    def attachment_content(self, sha256: str) -> bytes | None:
        raise NotImplementedError

    # -- profiles and the system channel ---------------------------------------------
    def profile(self, agent: str) -> dict | None:
        """{agent, human, mirror_dir, max_entries, updated_at} or None."""
        raise NotImplementedError

    def save_profile(self, profile: dict) -> None:
        raise NotImplementedError

    def mirrored_agents(self) -> list[str]:
        """Identities with a mirror directory."""
        raise NotImplementedError

    def humans(self) -> set[str]:
        raise NotImplementedError

    def add_event(self, event_id: str, agent: str, source: str, payload: dict, at: str) -> None:
        """Add an event to `agent`'s system channel; it stays until dismissed or cleaned up."""
        raise NotImplementedError

    def events(self, agent: str) -> list[dict]:
        """`agent`'s undismissed system events, oldest first."""
        raise NotImplementedError

    def dismiss_events(self, agent: str, event_ids: list[str], at: str) -> list[str]:
        raise NotImplementedError

    # -- overview and maintenance -----------------------------------------
    def agent_counts(self, now: str) -> dict[str, dict]:
        """{identity: {"unread": n, "unacked": n}} for every identity seen in traffic, watches, heartbeats, profiles
        or activity."""
        raise NotImplementedError

    def cleanup(self, cutoff: str, dry_run: bool) -> dict:
        """Delete (or count) messages that arrived before `cutoff` (a delayed one arrives at deliver_at), with
        everything that hangs off them, and liveness rows, system events and unreferenced attachment content
        older than it."""
        raise NotImplementedError

    def leftovers(self) -> list[str]:
        """Files that killed processes of this backend left behind (none by default)."""
        return []

    def remove_leftovers(self, names: list[str]) -> None:
        """Remove what leftovers() listed."""

    # -- liveness -------------------------------------------------------------
    def open_session(self, session_id: str, agent: str, at: str, host: str | None = None) -> None:
        """Record an armed watch session for `agent`, on machine `host` (model.host_shown's, or None: unknown)."""
        raise NotImplementedError

    def note_active(self, agent: str, host: str | None, at: str) -> None:
        """Note, inside a write transaction, that `agent` did something at `at` on machine `host` (None: unknown):
        written with the commit (one row per identity and machine, only ever moved forward; a read transaction
        writes nothing, so a look that changes nothing leaves no trace). Wakes no wait: nothing waits for it."""
        raise NotImplementedError

    def activity(self, agent: str | None = None, *, since: str) -> dict[str, dict]:
        """{identity: {last_active: the latest time it did anything (note_active), or None; hosts: {machine: the
        latest time}}} (of `agent`, or of everyone): the machines where it did something at or after `since`, and
        those of its watch sessions still armed (live or stale), however old."""
        raise NotImplementedError

    def touch_session(self, session_id: str, at: str) -> None:
        """Refresh an armed session's last_seen."""
        raise NotImplementedError

    def refresh_session(self, session_id: str, at: str) -> None:
        """Refresh an armed session's last_seen in a transaction of its own.

        Every blocked watch calls this every few seconds, so backends make it as cheap as they can."""
        with self.transaction(write=True):
            self.touch_session(session_id, at)

    def release_session(self, session_id: str, at: str, reason: str) -> None:
        """Mark a session released (its watch exited), with why."""
        raise NotImplementedError

    def release_sessions(self, session_ids: list[str], at: str, reason: str) -> None:
        """release_session of each of `session_ids` in one statement (the waits a server ends together)."""
        raise NotImplementedError

    def touch_sessions(self, prefix: str, at: str) -> int:
        """Refresh, in one statement, every armed session whose id starts with `prefix` (the sessions one
        server process holds, named INSTANCE.UUID); how many."""
        raise NotImplementedError

    def abandon_sessions(self, session_ids: list[str]) -> None:
        """Mark the armed sessions of a server's waits whose clients hung up without stopping them (killed, or
        their connection dropped) as held by nobody: each id's holder part (INSTANCE in INSTANCE.KEY) becomes
        GONE_HOLDER, so liveness() reads them as a killed watch's, stale at once (gone_since), neither
        released (the client never exited) nor alive (the server still is). Released ones are left as they are."""
        raise NotImplementedError

    def release_keyed_session(self, agent: str, key: str, at: str, reason: str) -> dict | None:
        """Release `agent`'s armed sessions made with `key` (HOLDER.KEY.NONCE: a server's wait, stopped by its
        client, which any replica can do), whatever holder their ids name, and announce each (announce_release).
        {sessions: those released now, released (False: they were released already), released_at}, or None when
        `agent` has no session of that key."""
        raise NotImplementedError

    def session_state(self, session_id: str) -> str | None:
        """A watch session's state ('armed', 'released'), or None when there is no such session."""
        raise NotImplementedError

    def release_session_alone(self, session_id: str, at: str, reason: str, patience: float | None = None) -> None:
        """release_session in a transaction of its own, waiting for the write lock up to `patience` seconds
        (backends may do it in one statement: it touches only that session's row)."""
        with self.transaction(write=True, patience=patience):
            self.release_session(session_id, at, reason)

    def record_heartbeat(self, agent: str, at: str) -> None:
        """Record that `agent` is present without a blocked watch."""
        raise NotImplementedError

    def liveness(self, agent: str | None = None) -> dict[str, dict]:
        """{identity: {armed_seen, released_at, session_seen, heartbeat, sessions}}; times are aware datetimes.

        armed_seen: latest refresh of a session still marked armed; released_at: latest clean exit;
        session_seen: latest refresh of any session; heartbeat: latest heartbeat; sessions: how many.
        """
        raise NotImplementedError

    # -- harness sessions (hooks) -------------------------------------------
    # What a harness session (Claude Code, Codex, Gemini CLI) has been told: told_seq, the newest message
    # in insertion order it was told of, and told_at, when (for delayed mail falling due since).
    def harness_session(self, session_id: str) -> dict | None:
        """The session row (id, harness, agent, pid, host, started_at, last_seen, told_seq, told_at,
        told_event, waiter, ended_at), or None."""
        raise NotImplementedError

    def save_harness_session(self, session: dict) -> None:
        """Insert or replace the session row, every column as given."""
        raise NotImplementedError

    def harness_sessions_of(self, agent: str | None = None) -> list[dict]:
        """Sessions not ended (of `agent`, or all): id, harness, agent, pid, host, started_at, last_seen, waiter."""
        raise NotImplementedError

    def untold(self, agent: str, now: str, told_seq: int, told_at: str | None, limit: int) -> tuple[list[dict], int]:
        """(the oldest `limit` unread visible envelopes of `agent` added after told_seq or fallen due after
        told_at, how many such there are). Reads only what came since, not the backlog."""
        raise NotImplementedError

    def newest_seq(self) -> int:
        """The insertion sequence of the newest message (0 when there is none)."""
        raise NotImplementedError

    def events_since(self, agent: str, after: int) -> tuple[list[dict], int]:
        """(`agent`'s undismissed system events added after sequence `after`, the newest event sequence)."""
        raise NotImplementedError

    # -- file reservations (store/sql_reservations.py) -------------------------------------------
    def reservations_in(self, repo: str | None, now: str, agent: str | None = None) -> list[dict]:
        """Reservations of `repo` (of every repository when None: the dashboard's) not expired at `now` (only
        `agent`'s when given), oldest first: {id, repo, agent,
        pattern, exclusive (bool), reason, created, renewed_at, expires_at}."""
        raise NotImplementedError

    def save_reservations(self, rows: list[dict]) -> None:
        """Insert each row (fields as reservations_in returns), or renew the one with its repo, agent and pattern:
        mode, reason, renewed_at and expires_at replaced, id and created kept."""
        raise NotImplementedError

    def delete_reservations(self, ids: list[str]) -> int:
        """Delete these reservations; how many there were."""
        raise NotImplementedError

    def expire_reservations(self, repo: str, now: str) -> int:
        """Delete the reservations of `repo` expired at `now`; how many."""
        raise NotImplementedError

    # -- deliveries awaiting confirmation (store/sql_deliveries.py) -----------------------------------
    def leased_ids(self, agent: str, now: str) -> set[str]:
        """The ids of `agent`'s messages held by a delivery not yet confirmed and not expired at `now`."""
        raise NotImplementedError

    def holds_of_many(self, agents: list[str], now: str) -> dict[str, dict[str, str]]:
        """{agent: {message id: when its hold ends}} of the holds of `agents` not expired at `now`, for the
        agents that have any (one statement per 500 agents)."""
        raise NotImplementedError

    def lease_deliveries(self, lease: str, agent: str, marks: list[tuple[str, str]], at: str,
                         expires_at: str) -> None:
        """Hold each (message id, flags: "read" or "read,ack") of `agent` for `lease` until `expires_at`, the
        marks to be made at `at` once the delivery is confirmed; an expired hold of the same message is replaced
        and `agent`'s other expired holds cleared."""
        raise NotImplementedError

    def lease_of(self, lease: str) -> list[dict]:
        """The holds of `lease`, expired or not: {lease, agent, message_id, flags, at, expires_at}."""
        raise NotImplementedError

    def end_lease(self, lease: str) -> int:
        """Delete the holds of `lease`; how many there were."""
        raise NotImplementedError

    # -- access tokens (agent-mail serve) ------------------------------------
    def add_token(self, token: dict) -> None:
        """Store a token: {id, secret_hash (hex sha256 of the secret; the secret itself is never stored),
        agents (the identities it acts as: 'P:N', 'P:*', '*'), supervisor, note, created, expires_at (or None)}."""
        raise NotImplementedError

    def tokens(self) -> list[dict]:
        """Every token, oldest first: {id, agents, supervisor, note, created, expires_at, last_used, rotated_to,
        revoked_at}, never its hash."""
        raise NotImplementedError

    def end_token(self, token_id: str, until: str, rotated_to: str) -> None:
        """A rotated token: its expires_at set to `until` (the grace), rotated_to the token replacing it; every
        wait is woken."""
        raise NotImplementedError

    def note_token_use(self, token_id: str, at: str) -> None:
        """Set the token's last_used to `at` (never back in time)."""
        raise NotImplementedError

    def token(self, token_id: str) -> dict | None:
        """One token with its secret_hash (to compare a presented secret with), or None."""
        raise NotImplementedError

    def revoke_token(self, token_id: str, at: str) -> bool:
        """Mark the token revoked (False: no such token, or revoked already) and wake every wait, so a wait
        made with it ends at once (its server looks the token up again when woken)."""
        raise NotImplementedError

    def wake_waits(self) -> None:
        """Wake every wait on this mailbox, in every process, when the transaction commits (a token revoked, a
        server stopping): each looks again, and goes back to waiting if nothing is new for it."""
        raise NotImplementedError

    # -- webhooks (agent-mail webhook; delivered by agent-mail serve) ------------------------
    def add_webhook(self, row: dict) -> None:
        """Store a webhook: {id, url, agents (identities it is about, [] for any), events, secret (kept: the server
        signs with it), format ('json' or 'slack'), after_minutes (deaf's, or None), with_body, created}."""
        raise NotImplementedError

    def webhooks(self) -> list[dict]:
        """Every webhook, oldest first: {id, url, agents, events, format, after_minutes, with_body, created}, never
        its secret."""
        raise NotImplementedError

    def remove_webhook(self, webhook_id: str) -> int | None:
        """Delete the webhook and its deliveries still pending; how many of those, or None when no webhook has
        that id."""
        raise NotImplementedError

    def queue_webhook_events(self, rows: list[dict]) -> int:
        """Queue deliveries {id, webhook_id, event_key, kind, payload, created}, due at once; one whose webhook and
        event_key were queued before is skipped (replicas noticing the same event queue it once). How many were
        queued; a server's deliveries are woken when the transaction commits."""
        raise NotImplementedError

    def claim_webhook_deliveries(self, holder: str, now: str, lease_until: str, limit: int) -> list[dict]:
        """Lease up to `limit` pending deliveries due by `now` that no unexpired lease holds to `holder` until
        `lease_until`, with their webhook's url, secret and format: {id, webhook_id, kind, payload, created,
        attempts, url, secret, format}. Call it in a write transaction."""
        raise NotImplementedError

    def settle_webhook_delivery(self, delivery_id: str, holder: str, state: str, status: int | None,
                                error: str | None, due_at: str | None, at: str) -> bool:
        """Record an attempt of a delivery `holder` leased: state 'delivered', 'failed', or 'pending' again (due at
        `due_at`); False when the lease was lost meanwhile (another server took it)."""
        raise NotImplementedError

    def next_webhook_due(self) -> str | None:
        """When the next pending delivery is due (or its lease ends), or None."""
        raise NotImplementedError

    def webhook_deliveries(self, webhook_id: str | None, limit: int, state: str | None = None) -> list[dict]:
        """The newest deliveries (of one webhook, of one state): {id, webhook_id, kind, created, due_at, attempts,
        state, last_status, last_error, done_at}."""
        raise NotImplementedError

    def webhook_tallies(self) -> dict[str, dict[str, int]]:
        """webhook id -> {state: how many deliveries}."""
        raise NotImplementedError

    # -- waiting ------------------------------------------------------------
    # A watch waits for a wake-up meant for it, never for "the mailbox changed": a write that cannot
    # change what it waits for (another watch's liveness, a heartbeat, a read or an ack, mail for
    # someone else) must not wake it. Every message stored in a transaction queues a wake-up for its
    # recipient ('*': everyone), delivered only if and when that transaction commits.
    def mail_marker(self) -> object:
        """A cheap value that changes whenever a message is added (the safety net for mail whose
        wake-up was lost: its sender killed between commit and wake-up, or another tool's write)."""
        raise NotImplementedError

    def check_still_there(self) -> None:
        """Raise StorageError if the mailbox this store opened is gone (deleted or replaced); a waiter
        calls it at each refresh, so it never waits on a mailbox nobody writes to any more."""

    def listen(self, agent: str, session: str | None = None) -> None:
        """Start receiving the wake-ups for `agent`'s mail and for broadcasts. Call it before looking at
        the inbox, so that mail committed after the look always wakes the next wait. `session` is the
        watch session waiting, if any (a backend may keep its liveness with the wake-up)."""
        self._marker = self.mail_marker()

    def listen_everything(self) -> None:
        """Start receiving a wake-up for every message stored, whoever it is for (a supervisor's view: the
        dashboard). A listener of everything is nobody's watch: it counts for no identity's liveness."""
        self.listen("")

    def wait_for_wake(self, timeout: float, also: tuple[int, ...] = ()) -> bool:
        """Block until a wake-up `listen` asked for arrives (True) or `timeout` passes (False). `also`: other
        descriptors to sleep on (a pidfd of the harness a waiter serves): one that reads as ready answers True
        too, and the caller sees which (files.wait_readable).

        A wake-up is a reason to look, not a promise of mail. The default polls mail_marker (any
        new message wakes every waiter); backends with notification override it. Raises
        StorageError if the mailbox it waits on went away (deleted or replaced).
        """
        deadline = time.monotonic() + timeout
        while True:
            current = self.mail_marker()
            if current != self._marker:
                self._marker = current
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if also:
                from agent_mail.files import wait_readable

                if wait_readable(list(also), min(self.poll_seconds, remaining)):
                    return True
            else:
                time.sleep(min(self.poll_seconds, remaining))
