"""The text of the dashboard's rows and details, made from what agent_mail.dashboard.data reads.

Text from mail is data (subjects, bodies, refs, attachment names, identities): every piece is a rich.text.Text,
never a string Rich or Textual would read as markup (a subject `fix [/bold] now` would stop the app, `[link=...]`
would make a live hyperlink), and its control characters are written out (`visible`: ESC as `\\x1b`), never
passed to the terminal as commands.
"""

from __future__ import annotations

from rich.text import Text

from agent_mail import model


def visible(text: object, lines: bool = False) -> str:
    """`text` with every control character written out as an escape (`lines`: a body's newlines and tabs kept,
    a CRLF read as a newline)."""
    text = str(text)
    return model.visible(text.replace("\r\n", "\n"), keep="\n\t") if lines else model.visible(text)


def fit(text: str, width: int) -> str:
    text = visible(text)
    return text if len(text) <= width else text[:width - 1] + "…"


def cell(text: str, width: int, style: str = "") -> Text:
    """A table's cell: `text` cut to `width`, plain text (Textual reads a str cell as markup)."""
    return Text(fit(text, width), style=style)


def recipients(send: dict) -> str:
    if send["recipients"] == ["*"]:
        return "* everyone"
    if len(send["recipients"]) > 2:
        return f"{send['recipients'][0]} +{len(send['recipients']) - 1}"
    return ", ".join(send["recipients"])


def state_summary(send: dict) -> Text:
    if send["broadcast"] is not None:
        state = send["states"].get("*", "sent")
        if state in ("withdrawn", "scheduled"):
            return Text(state, style="dim")
        b = send["broadcast"]
        return Text(f"read {b['read']}/{b['of']} ack {b['acked']}")
    states = list(send["states"].values())
    if len(set(states)) == 1:
        return Text(states[0], style="bold" if states[0] == "unread" else "")
    counts: dict[str, int] = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    return Text(" ".join(f"{n} {s}" for s, n in counts.items()))


def when(send: dict) -> str:
    """When a send was sent and, if it was scheduled, when it fell due or falls due, or when it was withdrawn."""
    due, states = send["deliver_at"], set(send["states"].values())
    if not due:
        return send["created"]
    if send.get("withdrawn_at") and states == {"withdrawn"}:
        return f"sent {send['created']} · withdrawn {send['withdrawn_at']}, was due {due}"
    if "scheduled" in states:  # (any copies withdrawn say so beside their recipient)
        return f"sent {send['created']} · due {due}"
    return f"sent {send['created']} · delivered {due}"


def describe_send(send: dict) -> Text:
    text = Text()
    text.append(f"{visible(send['subject'])}\n", style="bold")
    text.append(f"from {visible(send['sender'])} · {when(send)} · id {send['id']}\n", style="dim")
    if send["broadcast"] is not None:
        b = send["broadcast"]
        text.append(f"to everyone: read by {b['read']} of {b['of']}, acted on by {b['acked']}\n")
    else:
        text.append("to " + ", ".join(f"{visible(r)} ({send['states'].get(r, '?')})" for r in send["recipients"])
                    + "\n")
    if send["reply_to"]:
        text.append(f"in reply to {send['reply_to']}\n", style="dim")
    if send["refs"]:
        text.append("refs: " + ", ".join(map(visible, send["refs"])) + "\n")
    if send["attachments"]:
        text.append("attachments: " + ", ".join(f"{visible(a['name'])} ({a['size']} B)" for a in send["attachments"])
                    + "  (w: save)\n")
    text.append("\n" + visible(send["body"] or "", lines=True))
    return text


def own_state(message: dict, agent: str) -> str:
    if message["sender"] == agent:
        return "sent"
    for column, word in (("archived_at", "archived"), ("acked_at", "acked"), ("read_at", "read")):
        if message.get(column):
            return word
    return "unread"


def describe_message(message: dict) -> Text:
    send = {**message, "recipients": [message["recipient"]], "states": {}, "broadcast": None,
            "attachments": message.get("attachments", [])}
    return describe_send(send)
