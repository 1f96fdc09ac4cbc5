"""What operations hand back, shared by every group of them: the `next` steps, the default `emit`, the
one answer for a message an identity may not see, and a message projected onto chosen fields."""

from __future__ import annotations

from agent_mail import spec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Emit = Callable[[dict], None]  # receives the result document, inside the transaction


def no_emit(document: dict) -> None:
    """Used when the caller wants the returned value only."""


def project(message: dict, fields: list[str] | None) -> dict:
    return {f: message.get(f) for f in (fields or spec.MESSAGE_FIELDS)}


def next_steps(agent: str, *, unread: int = 0, ack_ids: list[str] | tuple = (), reachable: bool) -> list[str]:
    """The steps, in order: take delivery, settle what was acted on, re-arm (spec.Step: literal commands
    to the CLI, tool calls to the MCP server)."""
    steps = []
    if unread:
        steps.append(spec.Step("read", agent=agent))
    if ack_ids:
        if len(ack_ids) <= 10:
            steps.append(spec.Step("ack", agent=agent, ids=list(ack_ids)))
        else:
            steps.append(spec.Step("ack", agent=agent, all=True))
    if not reachable:
        steps.append(spec.Step("watch", agent=agent))
    return steps


def invisible(message_id: str, agent: str) -> str:
    """The one answer for a message an identity may not see, whether or not it exists."""
    return (f"no message {message_id} is visible to {agent} (it does not exist, or {agent} neither sent nor "
            "received it).")
