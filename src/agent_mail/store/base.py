"""The storage interface every backend implements, and the contracts each keeps.

The service layer speaks only to this interface (SQLite and PostgreSQL implement it through the
shared SQL of store/sql.py). Methods work on plain dicts and must be called inside `transaction()`.

Contracts (tests/test_store_contract.py proves them on every backend):
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
from contextlib import AbstractContextManager


class Store:
    """A mailbox. Subclasses implement the queries; waiting has a polling default."""

    #: What `describe` calls this backend.
    kind = "abstract"
    #: How often the default `wait_for_wake` looks for a new message, in seconds.
    poll_seconds = 0.025
    #: A waiting watch refreshes its session every REFRESH_SECONDS times this, and looks for lost wake-ups
    #: every SAFETY_CHECK_SECONDS times this. More than 1 where the backend knows a watch is there without
    #: its refreshes (PostgreSQL: its open connection), so idle watches wake less often.
    idle_scale = 1
    #: How long a lost connection to a server is re-made before the operation fails (server backends only).
    #: A command waits out a server restart; the dashboard, which shows the loss and retries itself, less.
    reconnect_seconds = 15.0

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Release the connection."""

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
    def insert_message(self, message: dict) -> None:
        """Store one message row; one with deliver_at is also queued for publication."""
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
        """{identity: {"unread": n, "unacked": n}} for every identity seen in traffic, watches or profiles."""
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
    def open_session(self, session_id: str, agent: str, at: str) -> None:
        """Record an armed watch session for `agent`."""
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
        """Sessions not ended (of `agent`, or all): id, harness, agent, pid, host, started_at, last_seen."""
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

    def wait_for_wake(self, timeout: float) -> bool:
        """Block until a wake-up `listen` asked for arrives (True) or `timeout` passes (False).

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
            time.sleep(min(self.poll_seconds, remaining))
