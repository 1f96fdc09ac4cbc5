"""The storage interface every backend implements.

The service layer speaks only to this interface, so a PostgreSQL backend can
replace the embedded SQLite one without touching the operations above it.
Methods work on plain dicts and must be called inside `transaction()`.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager


class Store:
    """A mailbox. Subclasses implement the queries; waiting has a polling default."""

    #: What `describe` calls this backend.
    kind = "abstract"
    #: How often the default `wait_for_change` looks for a change, in seconds.
    poll_seconds = 0.025

    # -- lifecycle -------------------------------------------------------
    def close(self) -> None:
        """Release the connection."""

    def transaction(self, write: bool = False) -> AbstractContextManager:
        """A transaction; `write=True` takes the write lock up front. Rolls back on error."""
        raise NotImplementedError

    def relax_durability(self) -> None:
        """Let this connection's later commits skip waiting for the disk.

        For connections that write only liveness (a watch): a power cut may lose the last
        refresh, never corrupt or lose mail. The default keeps full durability.
        """

    # -- messages --------------------------------------------------------
    def insert_message(self, message: dict) -> None:
        """Store one message row (id, sender, recipient, subject, body, refs, reply_to, type, created)."""
        raise NotImplementedError

    def get_message(self, message_id: str) -> dict | None:
        """The stored row, or None."""
        raise NotImplementedError

    def inbox(self, agent: str, *, unread_only: bool, sender: str | None, limit: int | None) -> list[dict]:
        """Messages addressed to `agent` (direct, or broadcasts from others), oldest first.

        read_at / acked_at are this agent's own state (per agent for broadcasts).
        """
        raise NotImplementedError

    def addressed(self, agent: str, message_ids: list[str]) -> dict[str, dict]:
        """Those of `message_ids` addressed to `agent`, keyed by id, with the agent's state."""
        raise NotImplementedError

    def unacked(self, agent: str) -> list[dict]:
        """Every message addressed to `agent` that it has not acknowledged, oldest first."""
        raise NotImplementedError

    def count_unread(self, agent: str) -> int:
        raise NotImplementedError

    def mark_read(self, agent: str, messages: list[dict], at: str) -> None:
        """Record that `agent` took delivery of `messages` (keeps an earlier read time)."""
        raise NotImplementedError

    def mark_acked(self, agent: str, messages: list[dict], at: str) -> None:
        """Record that `agent` acted on `messages`; also marks them read."""
        raise NotImplementedError

    def thread(self, message_id: str) -> list[dict]:
        """Every message in the thread holding `message_id`, from its root, oldest first."""
        raise NotImplementedError

    # -- overview and maintenance -----------------------------------------
    def agent_counts(self) -> dict[str, dict]:
        """{identity: {"unread": n, "unacked": n}} for every identity seen in traffic."""
        raise NotImplementedError

    def cleanup(self, cutoff: str, dry_run: bool) -> dict:
        """Delete (or count) messages created before `cutoff` and liveness rows last seen before it."""
        raise NotImplementedError

    # -- liveness -------------------------------------------------------------
    def open_session(self, session_id: str, agent: str, at: str) -> None:
        """Record an armed watch session for `agent`."""
        raise NotImplementedError

    def touch_session(self, session_id: str, at: str) -> None:
        """Refresh an armed session's last_seen."""
        raise NotImplementedError

    def release_session(self, session_id: str, at: str, reason: str) -> None:
        """Mark a session released (its watch exited), with why."""
        raise NotImplementedError

    def record_heartbeat(self, agent: str, at: str) -> None:
        """Record that `agent` is present without a blocked watch."""
        raise NotImplementedError

    def liveness(self, agent: str | None = None) -> dict[str, dict]:
        """{identity: {armed_seen, released_at, session_seen, heartbeat, sessions}}; times are aware datetimes.

        armed_seen: latest refresh of a session still marked armed; released_at: latest clean exit;
        session_seen: latest refresh of any session; heartbeat: latest heartbeat; sessions: how many.
        """
        raise NotImplementedError

    # -- waiting ------------------------------------------------------------
    def change_token(self) -> object:
        """A value that differs once another process has committed a change."""
        raise NotImplementedError

    def mail_marker(self) -> object:
        """A cheap value that changes whenever a message is added."""
        raise NotImplementedError

    def wait_for_change(self, token: object, timeout: float) -> object:
        """Block up to `timeout` seconds for a commit by someone else; return the new token.

        The default polls `change_token`; backends with push notification override it.
        """
        deadline = time.monotonic() + timeout
        while True:
            current = self.change_token()
            if current != token:
                return current
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return current
            time.sleep(min(self.poll_seconds, remaining))
