"""The dashboard's modal screens: Compose (send, reply, broadcast as the human), Ask (one line: a filter, a
directory) and Help. Each gives its answer to the callback it was pushed with, or None when cancelled."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

HELP = """\
[b]agent-mail dashboard[/b]: who is listening, who is stuck, what is piling up.

[b]Screens[/b]   1 Fleet   2 Traffic   3 Inbox   4 Charts   (or click the tabs)
[b]Fleet[/b]     one row per identity, problems first:
          deaf with mail (unread waiting, nobody listening), overdue (unacked older
          than the threshold), stale (a watch killed without releasing), bounced.
          / filter by text   p cycle project   e cycle watch state   s cycle sort
          + / - overdue threshold   enter or i: that identity's inbox
[b]Traffic[/b]   the newest sends as they land; enter shows the thread.
          t thread of the selected message   w save its attachments
[b]Inbox[/b]     an identity's mail as it would see it (nothing is marked read).
[b]Step in[/b]   (needs --as PROJECT:NAME; that identity is marked human)
          c send   r reply to the selected message   b broadcast
          k cancel the selected scheduled message you sent
          a ack   d dismiss   x archive   (your own mail, in your inbox)
[b]Anywhere[/b]  ? this help   q quit   mouse works too
Looking never marks anything read.
"""


class Compose(ModalScreen):
    """Write a message as the human: to, subject, body (reply and broadcast fill some in)."""

    BINDINGS = [Binding("escape", "dismiss_form", "Cancel"), Binding("ctrl+s", "submit", "Send")]

    def __init__(self, title: str, to: str = "", subject: str = "", reply_to: str | None = None):
        super().__init__()
        self.form_title, self.to, self.subject, self.reply_to = title, to, subject, reply_to

    def compose(self) -> ComposeResult:
        with Vertical(id="compose"):
            yield Label(self.form_title, id="compose-title")
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
            yield Label(self.prompt)
            yield Input(self.value, id="answer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_dismiss_form(self) -> None:
        self.dismiss(None)


class Help(ModalScreen):
    """What every key does."""

    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)
