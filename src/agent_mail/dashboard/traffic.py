"""The Traffic screen: the newest sends as they land, and the selected send (or its thread) in full."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static, TabPane

from agent_mail import model
from agent_mail.dashboard import data
from agent_mail.dashboard.table import Table
from agent_mail.dashboard.text import cell, describe_send, recipients, state_summary


class TrafficPane(TabPane):
    """The feed as last read (`feed`: one entry per send, a fan-out grouped back into one)."""

    def __init__(self):
        super().__init__("2 Traffic", id="traffic")
        self.feed: list[dict] = []

    def compose(self) -> ComposeResult:
        yield Table(id="feed-table", cursor_type="row", zebra_stripes=True)
        yield VerticalScroll(Static("", id="detail-text", markup=False), id="detail")

    def on_mount(self) -> None:
        self.query_one(Table).add_columns("age", "from", "to", "subject", "state")

    def send_by_id(self, message_id: str) -> dict | None:
        """The send `message_id` belongs to (any copy of a fan-out names it)."""
        for send in self.feed:
            if send["id"] == message_id or message_id in send["ids"]:
                return send
        return None

    def selected(self) -> str | None:
        return self.query_one(Table).selected_key()

    def draw(self, project: str | None) -> None:
        """Lay out `feed`: the sends from or to `project` (every send when None)."""
        table = self.query_one(Table)
        selected = table.selected_key()
        at = model.now()
        # At 80 columns every column fits: names and subjects are cut to the width there is.
        subject_width = max(18, self.app.size.width - 62)
        rows = []
        for send in self.feed:
            if project and project not in (send["sender"].split(":", 1)[0],
                                           *(r.split(":", 1)[0] for r in send["recipients"])):
                continue
            rows.append((send["id"], (Text(data.short_age(data.age_seconds(send["at"], at))),
                                      cell(send["sender"], 14), cell(recipients(send), 16),
                                      cell(send["subject"], subject_width), state_summary(send))))
        # Like `tail -f`: while the newest send is selected, the newest stays selected and in view as sends
        # land; a send picked further down stays picked (and the view follows it) until the cursor goes up.
        following = selected is None or table.cursor_row == 0
        table.sync(rows)
        if following and rows:
            if table.cursor_row != 0:
                table.move_cursor(row=0, animate=False)
            if selected != rows[0][0]:
                self.show_send(rows[0][0])
        else:
            table.keep_selected(selected)

    def show_send(self, message_id: str) -> None:
        send = self.send_by_id(message_id)
        if send is not None:
            self.query_one("#detail-text", Static).update(describe_send(send))

    def show_thread(self, sends: list[dict]) -> None:
        text = Text()
        for send in sends:
            text.append(describe_send(send))
            text.append("\n" + "─" * 40 + "\n")
        self.query_one("#detail-text", Static).update(text)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key and event.row_key.value is not None:
            self.show_send(event.row_key.value)
