"""The Inbox screen: one identity's mail as it would see it (looking marks nothing read)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static, TabPane

from agent_mail import model
from agent_mail.dashboard import data
from agent_mail.dashboard.table import Table
from agent_mail.dashboard.text import cell, describe_message, own_state, visible

OWN_MAIL_KEYS = " · a ack  d dismiss  x archive  r reply"


def holding(reservations: list[dict]) -> str:
    """The files an identity holds, a line under its inbox's title ("" when none); a dead holder's marked."""
    if not reservations:
        return ""
    parts = [f"{visible(r['pattern'])} ({r['mode']}{'' if r['held'] else ', holder dead: blocks nobody'})"
             for r in reservations]
    return "\nHolds: " + ", ".join(parts)


class InboxPane(TabPane):
    """The inbox last drawn (`messages`, newest first) and the selected message in full."""

    def __init__(self):
        super().__init__("3 Inbox", id="inbox")
        self.messages: list[dict] = []

    def compose(self) -> ComposeResult:
        yield Static("", id="inbox-title", markup=False)
        yield Table(id="inbox-table", cursor_type="row", zebra_stripes=True)
        yield VerticalScroll(Static("", id="inbox-detail-text", markup=False), id="inbox-detail")

    def on_mount(self) -> None:
        self.query_one(Table).add_columns("age", "from", "subject", "state")

    def message_by_id(self, message_id: str) -> dict | None:
        return next((m for m in self.messages if m["id"] == message_id), None)

    def selected(self) -> str | None:
        return self.query_one(Table).selected_key()

    def show_title(self, agent: str | None, human: str | None) -> None:
        """The line above the table before `agent`'s inbox is read (`human`: the identity stepping in)."""
        text = (f"Inbox of {agent} as it sees it (nothing is marked read by looking)" if agent else
                "No identity chosen: select one on the Fleet screen (enter or i).")
        if agent and agent == human:
            text += OWN_MAIL_KEYS
        self.query_one("#inbox-title", Static).update(text)

    def draw(self, result: dict, human: str | None) -> None:
        """Lay out an inbox as Supervisor.inbox reads it."""
        self.messages = list(reversed(result["messages"]))
        table = self.query_one(Table)
        selected = table.selected_key()
        at = model.now()
        rows = []
        for m in self.messages:
            state = own_state(m, result["agent"])
            rows.append((m["id"], (Text(data.short_age(data.age_seconds(m["deliver_at"] or m["created"], at))),
                                   cell(m["sender"], 20), cell(m["subject"], max(18, self.app.size.width - 44)),
                                   Text(state, style="bold" if state == "unread" else ""))))
        table.sync(rows)
        table.keep_selected(selected)
        if selected is None and self.messages:
            self.show_message(self.messages[0]["id"])
        self.query_one("#inbox-title", Static).update(
            f"Inbox of {result['agent']}: {result['unread']} unread, {len(self.messages)} shown "
            "(looking marks nothing read)" + (OWN_MAIL_KEYS if result["agent"] == human else "")
            + holding(result.get("reservations", [])))

    def show_message(self, message_id: str) -> None:
        message = self.message_by_id(message_id)
        if message is not None:
            self.query_one("#inbox-detail-text", Static).update(describe_message(message))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key and event.row_key.value is not None:
            self.show_message(event.row_key.value)
