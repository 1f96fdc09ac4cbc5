"""What the dashboard shows: the supervisor's read-only views, which live in agent_mail.operations.supervision (below
the front ends, so that `agent-mail serve` can read them for a dashboard started on another machine), and the
human's actions on a mailbox opened here. Named here as well, for the screens that lay them out."""

from __future__ import annotations

from agent_mail.operations import supervision
from agent_mail.operations.supervision import (BOUNCED, DEAF, DEFAULT_OVERDUE_MINUTES, FEED_SIZE, OVERDUE, PROBLEMS,
                                               STALE, age_seconds, group_sends, landed_at, recipient_state,
                                               short_age)

__all__ = ["BOUNCED", "DEAF", "DEFAULT_OVERDUE_MINUTES", "FEED_SIZE", "OVERDUE", "PROBLEMS", "STALE", "Supervisor",
           "age_seconds", "group_sends", "landed_at", "recipient_state", "short_age"]


class Supervisor(supervision.Supervisor):
    """The views of a mailbox opened here, and the human's actions on it (as ServedSupervisor's through a server)."""

    def call(self, name: str, values: dict) -> object:
        """One of the human's actions (send, ack, cancel, ...), by argument name through the call layer: the
        same checks and problems as every front end, on this supervisor's mailbox."""
        from agent_mail import calls

        return calls.call(name, values, mailbox=self.mailbox)
