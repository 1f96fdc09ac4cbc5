"""The dashboard's modal screens: Compose (send, reply, broadcast as the human), Ask (one line: a filter, a
directory) and Help. Each gives its answer to the callback it was pushed with, or None when cancelled."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

#: What ? lists: (screen or topic, its keys, what they do), a topic named on its first row only. Laid out as
#: three columns, the last wrapping within itself, so it reads as a list at any width.
HELP = (
    ("Screens", "1 2 3 4", "Fleet, Traffic, Inbox, Charts (or click the tabs)"),
    ("Fleet", "", "one row per identity, problems first: deaf with mail (unread waiting, nobody listening), "
                  "overdue (unacked older than the threshold), stale (a watch killed without releasing), bounced"),
    ("", "/", "filter by text in the name or the problem"),
    ("", "p  e  s", "cycle project, watch state, sort"),
    ("", "+  -", "overdue threshold, 5 minutes a step"),
    ("", "enter  i", "that identity's inbox"),
    ("Traffic", "", "the newest sends as they land"),
    ("", "enter  t", "the selected send's whole thread"),
    ("", "w", "save its attachments into a directory"),
    ("Inbox", "", "an identity's mail as it sees it"),
    ("Charts", "g", "sends per hour by project or by identity"),
    ("Step in", "", "as the identity named by --as, marked human"),
    ("", "c  b", "send, broadcast to everyone"),
    ("", "r", "reply to the selected message"),
    ("", "k", "cancel a scheduled message you sent"),
    ("", "a  d  x", "ack, dismiss, archive (your own mail, in your inbox)"),
    ("Anywhere", "?  q", "this help, quit; the mouse works too"),
)
READ_ONLY = "read-only: start with --as PROJECT:NAME to step in"


def help_text(human: str | None):
    """The help as a table (a rich renderable); read-only (`human` None), Step in says how to."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(style="bold yellow", no_wrap=True)
    table.add_column(ratio=1)
    for topic, keys, what in HELP:
        if topic == "Step in" and human is None:
            what = READ_ONLY
        table.add_row(topic, keys, what)
    title = Text.assemble(("agent-mail dashboard", "bold"),
                          ": who is listening, who is stuck, what is piling up.\nLooking marks nothing read.")
    return Group(title, table)


class Compose(ModalScreen):
    """Write a message as the human: to, subject, body (reply and broadcast fill some in)."""

    BINDINGS = [Binding("escape", "dismiss_form", "Cancel"), Binding("ctrl+s", "submit", "Send")]

    def __init__(self, title: str, to: str = "", subject: str = "", reply_to: str | None = None):
        super().__init__()
        self.form_title, self.to, self.subject, self.reply_to = title, to, subject, reply_to

    def compose(self) -> ComposeResult:
        with Vertical(id="compose"):
            yield Label(self.form_title, id="compose-title", markup=False)
            yield Input(self.to, placeholder="to: project:name, several with commas, * for everyone", id="to")
            yield Input(self.subject, placeholder="subject", id="subject")
            yield TextArea(id="body")
            with Horizontal(id="compose-buttons"):
                yield Button("Send (ctrl+s)", variant="primary", id="send")
                yield Button("Cancel (esc)", id="cancel")

    def on_mount(self) -> None:
        # The first field left to fill: a reply goes straight to its body.
        self.query_one("#body" if self.subject else "#subject" if self.to else "#to").focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "send":
            self.action_submit()
        else:
            self.dismiss(None)

    def action_dismiss_form(self) -> None:
        self.dismiss(None)

    def action_submit(self) -> None:
        to = [t.strip() for t in self.query_one("#to", Input).value.split(",") if t.strip()]
        self.dismiss({"to": to, "subject": self.query_one("#subject", Input).value,
                      "body": self.query_one("#body", TextArea).text, "reply_to": self.reply_to})


class Ask(ModalScreen):
    """One line of input (a filter, a directory)."""

    BINDINGS = [Binding("escape", "dismiss_form", "Cancel")]

    def __init__(self, prompt: str, value: str = ""):
        super().__init__()
        self.prompt, self.value = prompt, value

    def compose(self) -> ComposeResult:
        with Vertical(id="ask"):
            yield Label(self.prompt, markup=False)
            yield Input(self.value, id="answer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_dismiss_form(self) -> None:
        self.dismiss(None)


class Help(ModalScreen):
    """What every key does (`human`: the identity stepping in, None when read-only)."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "Close")]

    def __init__(self, human: str | None = None):
        super().__init__()
        self.human = human

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(help_text(self.human))

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
