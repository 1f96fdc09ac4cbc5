"""What the dashboard shows: the supervisor's read-only views, which live in agent_mail.supervision (below the front
ends, so that `agent-mail serve` can read them for a dashboard started on another machine). Named here as well,
for the screens that lay them out."""

from __future__ import annotations

from agent_mail.supervision import (BOUNCED, DEAF, DEFAULT_OVERDUE_MINUTES, FEED_SIZE, OVERDUE, PROBLEMS, STALE,
                                    Supervisor, age_seconds, group_sends, landed_at, recipient_state, short_age)

__all__ = ["BOUNCED", "DEAF", "DEFAULT_OVERDUE_MINUTES", "FEED_SIZE", "OVERDUE", "PROBLEMS", "STALE", "Supervisor",
           "age_seconds", "group_sends", "landed_at", "recipient_state", "short_age"]
