"""The dashboard's Textual application: Fleet, Traffic, Inbox and Charts over one mailbox.

Imported only by `agent-mail dashboard` (Textual is the `tui` extra). The screens lay out what
agent_mail.dashboard.data reads; a background thread (the Feeder) sleeps on the same wake-up a
`watch` uses, listening to every message, and re-reads when mail lands or every few seconds for
liveness and ages. Looking marks nothing read; the human's own actions go through the same
service calls as the CLI.
"""

from __future__ import annotations

import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import (Button, DataTable, Footer, Header, Input, Label, Static, TabbedContent, TabPane,
                             TextArea)

from agent_mail import errors, model, service
from agent_mail.dashboard import data

#: How often the Feeder re-reads with no mail landing: ages, liveness and states others change.
REFRESH_SECONDS = 10.0
#: How often the charts are recomputed while shown (they change by the hour).
CHART_SECONDS = 60.0
#: The least time between two reads: a busy fleet's sends are drawn in batches, a few times a second.
GATHER_SECONDS = 0.25

STATE_STYLE = {"armed": "bold green", "released": "yellow", "stale": "bold red", "never": "dim"}
PROBLEM_STYLE = {data.DEAF: "bold red", data.OVERDUE: "bold yellow", data.STALE: "red", data.BOUNCED: "magenta"}
SORTS = ("problems", "agent", "unread", "unacked", "oldest", "last seen")
STATES = (None, "armed", "released", "stale", "never")

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


def _cells(value) -> int:
    return cell_len(value.plain if isinstance(value, Text) else str(value))


def _age(seconds) -> str:
    return data.short_age(seconds)


def _styled(text: str, style: str) -> Text:
    return Text(text, style=style)


class Table(DataTable):
    """A DataTable given its whole content on every refresh that changes only what changed.

    Rebuilding means measuring every cell of every row again (Textual sizes columns to their content),
    which is what a dashboard showing a few hundred identities would otherwise spend its time on, idle or
    busy: rows that are still there stay, changed cells are replaced one by one, new rows are added, and the
    order is set once at the end."""

    def __init__(self, **options):
        super().__init__(**options)
        self.drawn: list[tuple[str, tuple]] = []

    def sync(self, rows: list[tuple[str, tuple]]) -> None:
        if rows == self.drawn:
            return
        before = dict(self.drawn)
        kept = sum(key in before for key, _ in rows)
        if kept < len(rows) / 2 or not hasattr(self, "_row_locations"):
            self.clear()
            for key, cells in rows:
                self.add_row(*cells, key=key)
        else:
            wanted = {key for key, _ in rows}
            for key in before:
                if key not in wanted:
                    self.remove_row(key)
            columns = list(self.columns)
            for key, cells in rows:
                if key not in before:
                    self.add_row(*cells, key=key)
                elif before[key] != cells:
                    for column, was, now in zip(columns, before[key], cells, strict=True):
                        if was != now:  # measured (for the column's width) only when it grew
                            self.update_cell(key, column, now, update_width=_cells(now) > _cells(was))
            self._put_in_order([key for key, _ in rows])
        self.drawn = list(rows)

    def _put_in_order(self, keys: list[str]) -> None:
        """As DataTable.sort does, with the order given rather than computed from the cells."""
        from textual._two_way_dict import TwoWayDict
        from textual.widgets.data_table import RowKey

        locations = self._row_locations
        if all(locations.get(RowKey(key)) == index for index, key in enumerate(keys)):
            return
        self._row_locations = TwoWayDict({RowKey(key): index for index, key in enumerate(keys)})
        # DataTable's own counter (set to 0 in DataTable.__init__), which keys its caches of the drawn order:
        # without the step, rows given a new order keep being drawn in the old one.
        self._update_count += 1
        self.refresh()

    def clear(self, columns: bool = False):
        self.drawn = []
        return super().clear(columns)


class Feeder(threading.Thread):
    """Reads the fleet and the feed into the app: at once, then whenever mail lands (the wake-up every
    message rings) and every REFRESH_SECONDS. A lost connection is shown and retried, never raised."""

    def __init__(self, app: "Dashboard"):
        super().__init__(name="agent-mail dashboard feeder", daemon=True)
        self.app = app
        self.stopping = threading.Event()
        self.poke = threading.Event()

    def run(self) -> None:
        from agent_mail.store import open_store

        backoff = 1.0
        while not self.stopping.is_set():
            store = None
            try:
                store = open_store(service.resolve_location()[0])
                store.reconnect_seconds = 1.0  # a lost server is shown at once; this loop keeps retrying
                supervisor = data.Supervisor(service.Mailbox(store))
                store.listen_everything()
                backoff = 1.0
                self._loop(supervisor, store)
            except errors.AgentMailError as exc:
                self._post(self.app.show_problem, exc.message)
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 15.0)
            except Exception as exc:  # noqa: BLE001 - a bug: shown on screen and retried, never a dead feed
                self._post(self.app.show_problem, f"internal error ({type(exc).__name__}: {exc}); please report this")
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 15.0)
            finally:
                if store is not None:
                    try:
                        store.close()
                    except Exception:  # noqa: BLE001 - closing a broken connection may fail; it is gone anyway
                        pass

    def _loop(self, supervisor: data.Supervisor, store) -> None:
        charts_at = 0.0
        while not self.stopping.is_set():
            self.poke.clear()
            # What the screen in view shows is read; the others are read when they are shown (a poke).
            shown = self.app._shown_tab()
            snapshot = {}
            if shown in ("fleet", None):
                snapshot["fleet"] = supervisor.fleet(self.app.overdue_minutes)
            if shown in ("traffic", None):
                snapshot["feed"] = supervisor.feed()
            if self.app.inbox_agent and shown in ("inbox", None):
                snapshot["inbox"] = supervisor.inbox(self.app.inbox_agent)
            if shown == "charts" and time.monotonic() - charts_at > CHART_SECONDS:
                snapshot["hourly"] = supervisor.hourly(by=self.app.chart_by)
                snapshot["backlog"] = supervisor.backlog()
                charts_at = time.monotonic()
            self._post(self.app.apply_snapshot, snapshot)
            # Sleep on the mailbox's wake-up in short slices so a stop or a poke (a changed threshold,
            # the charts opened) acts within a fraction of a second; no query runs while nothing happens.
            read_at = time.monotonic()
            deadline = read_at + REFRESH_SECONDS
            while not self.stopping.is_set() and not self.poke.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if store.wait_for_wake(min(left, 0.5)):
                    # Mail landed: gather what else lands in the next moment into the same read.
                    self.stopping.wait(max(0.0, read_at + GATHER_SECONDS - time.monotonic()))
                    break
            if self.poke.is_set():
                charts_at = 0.0

    def _post(self, callback, *args) -> None:
        if self.stopping.is_set():
            return
        try:
            self.app.call_from_thread(callback, *args)
        except RuntimeError:
            pass  # the app has stopped


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
    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Static(HELP)

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class Dashboard(App):
    TITLE = "agent-mail"
    ENABLE_COMMAND_PALETTE = False  # every action has its key, listed by ?
    CSS = """
    #problem { height: auto; background: $error; color: $text; padding: 0 1; display: none; }
    #problem.shown { display: block; }
    #summary { height: 1; padding: 0 1; }
    DataTable { height: 1fr; }
    #detail, #inbox-detail { height: 9; border-top: solid $primary; padding: 0 1; }
    #compose, #ask { width: 76; height: auto; max-height: 22; border: thick $primary; background: $surface;
                     padding: 0 1; }
    #compose TextArea { height: 6; }
    #compose-buttons { height: 3; }
    Compose, Ask, Help { align: center middle; }
    #help { width: 84; max-width: 100%; height: auto; max-height: 100%; border: thick $primary;
            background: $surface; padding: 0 1; }
    PlotextPlot { height: 1fr; }
    """
    BINDINGS = [
        Binding("1", "screen('fleet')", "Fleet", show=False),
        Binding("2", "screen('traffic')", "Traffic", show=False),
        Binding("3", "screen('inbox')", "Inbox", show=False),
        Binding("4", "screen('charts')", "Charts", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
        Binding("slash", "filter", "Filter"),
        Binding("s", "sort", "Sort"),
        Binding("p", "project", "Project", show=False),
        Binding("e", "state", "State", show=False),
        Binding("plus", "overdue(5)", "Overdue+", show=False),
        Binding("minus", "overdue(-5)", "Overdue-", show=False),
        Binding("i", "inbox", "Inbox", show=False),
        Binding("t", "thread", "Thread", show=False),
        Binding("w", "save", "Save", show=False),
        Binding("c", "send", "Send"),
        Binding("r", "reply", "Reply"),
        Binding("b", "broadcast", "Bcast", show=False),
        Binding("k", "cancel", "Cancel", show=False),
        Binding("a", "ack", "Ack", show=False),
        Binding("d", "dismiss_mail", "Dismiss", show=False),
        Binding("x", "archive", "Archive", show=False),
        Binding("g", "chart_by", "By", show=False),
    ]

    def __init__(self, *, human: str | None = None, project: str | None = None, first: dict | None = None,
                 live: bool = True):
        super().__init__()
        self.human, self.live = human, live
        self.project = project
        self.pinned_project = project is not None
        self.overdue_minutes: float = data.DEFAULT_OVERDUE_MINUTES
        self.filter_text = ""
        self.state_filter: str | None = None
        self.sort_by = SORTS[0]
        self.chart_by = "project"
        self.snapshot: dict = first or {"fleet": [], "feed": []}
        self.inbox_agent: str | None = human
        self.inbox_messages: list[dict] = []
        self.thread_of: str | None = None
        self.feeder: Feeder | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-mail dashboard io")
        self._supervisor: data.Supervisor | None = None
        self.shown_tab: str | None = None
        self._behind: set[str] = set()  # screens whose table was not redrawn with the last snapshot
        self._summary = ""
        self._problem = ""  # the banner's text: a storage problem being retried
        self._settled = False
        self._signals: list = []  # (loop, signal number) handled through the app's loop
        self.stopped_by: int | None = None  # the signal that ended the app, if one did
        self._store = None
        self.sub_title = (f"as {human}" if human else "read-only (start with --as PROJECT:NAME to step in)") + (
            f" · project {project}" if project else "")

    # -- layout -------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="problem")
        with TabbedContent(id="tabs", initial="fleet"):
            with TabPane("1 Fleet", id="fleet"):
                yield Static("", id="summary")
                yield Table(id="fleet-table", cursor_type="row", zebra_stripes=True)
            with TabPane("2 Traffic", id="traffic"):
                yield Table(id="feed-table", cursor_type="row", zebra_stripes=True)
                yield VerticalScroll(Static("", id="detail-text"), id="detail")
            with TabPane("3 Inbox", id="inbox"):
                yield Static("", id="inbox-title")
                yield Table(id="inbox-table", cursor_type="row", zebra_stripes=True)
                yield VerticalScroll(Static("", id="inbox-detail-text"), id="inbox-detail")
            with TabPane("4 Charts", id="charts"):
                from textual_plotext import PlotextPlot

                yield PlotextPlot(id="hourly")
                yield PlotextPlot(id="backlog")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#fleet-table", DataTable).add_columns(
            "identity", "watch", "sess", "unread", "unacked", "oldest", "seen", "problem")
        self.query_one("#feed-table", DataTable).add_columns("age", "from", "to", "subject", "state")
        self.query_one("#inbox-table", DataTable).add_columns("age", "from", "subject", "state")
        self.apply_snapshot(self.snapshot)
        self.shown_tab = "fleet"  # TabbedContent's initial pane
        self._show_inbox_title()
        self.query_one("#fleet-table", DataTable).focus()
        if self.live:
            self.feeder = Feeder(self)
            self.feeder.start()
        self._catch_signals()

    def _catch_signals(self) -> None:
        """SIGHUP (the terminal went away) and SIGTERM end the app through its own loop. Raised from a plain
        signal handler, the CLI's stop could land inside a handler that reports errors and carries on: a
        dashboard left drawing into a closed terminal."""
        import asyncio
        import signal

        loop = asyncio.get_running_loop()
        for number in (signal.SIGHUP, signal.SIGTERM):
            try:
                loop.add_signal_handler(number, self._stop_by_signal, number)
                self._signals.append((loop, number))
            except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
                pass

    def _stop_by_signal(self, number: int) -> None:
        self.stopped_by = number
        self.exit(return_code=128 + number)

    def on_unmount(self) -> None:
        for loop, number in self._signals:
            try:
                loop.remove_signal_handler(number)
            except (RuntimeError, ValueError):
                pass
        if self.feeder is not None:
            self.feeder.stopping.set()
            self.feeder.join(timeout=5)
        self._executor.submit(self._close_here)
        self._executor.shutdown(wait=True)

    # -- the data coming in -------------------------------------------------------------------------------
    def show_problem(self, text: str | None) -> None:
        shown = f"{text} (retrying)" if text else ""
        if shown == self._problem:
            return
        self._problem = shown
        banner = self.query_one("#problem", Static)
        banner.update(shown)
        banner.set_class(bool(text), "shown")

    def apply_snapshot(self, snapshot: dict) -> None:
        self.show_problem(None)
        self.snapshot.update(snapshot)
        # Only the screen in view is drawn now; the other catches up when it is shown (drawing what nobody
        # sees is most of what an idle dashboard would cost).
        shown = self._shown_tab()
        if shown in ("fleet", None):
            self._fill_fleet()
        if shown in ("traffic", None):
            self._fill_feed()
        self._behind = {"fleet", "traffic"} - {shown}
        if not self._settled:
            # The objects made at start-up live as long as the app: keep them out of every later collection,
            # which would otherwise walk them all a few times a minute.
            self._settled = True
            gc.freeze()
        if "hourly" in snapshot:
            self._draw_charts()
        if "inbox" in snapshot:
            self._fill_inbox(snapshot["inbox"])

    def _shown_tab(self) -> str | None:
        """The screen in view (None before the first is shown: everything). A plain attribute, set on the
        app's thread, so the feeder may read it without touching the widgets from its own."""
        return self.shown_tab

    def _visible_fleet(self) -> list[dict]:
        rows = self.snapshot["fleet"]
        if self.project:
            rows = [r for r in rows if r["project"] == self.project]
        if self.state_filter:
            rows = [r for r in rows if r["watch_state"] == self.state_filter]
        if self.filter_text:
            needle = self.filter_text.lower()
            rows = [r for r in rows if needle in r["agent"].lower() or any(needle in p for p in r["problems"])]
        key = {
            "problems": None,
            "agent": lambda r: r["agent"],
            "unread": lambda r: (-r["unread"], r["agent"]),
            "unacked": lambda r: (-r["unacked"], r["agent"]),
            "oldest": lambda r: (-(r["oldest_unacked_age"] or -1), r["agent"]),
            "last seen": lambda r: (r["last_seen_age"] is None, r["last_seen_age"] or 0, r["agent"]),
        }[self.sort_by]
        return sorted(rows, key=key) if key else rows

    def _fill_fleet(self) -> None:
        table = self.query_one("#fleet-table", Table)
        selected = self._selected_key(table)
        rows = []
        for r in self._visible_fleet():
            shown = r["problems"][0] + (f" +{len(r['problems']) - 1}" if len(r["problems"]) > 1 else "") \
                if r["problems"] else "ok"
            problem = Text(shown,
                           style=PROBLEM_STYLE.get(r["problems"][0], "") if r["problems"] else "dim")
            name = Text(_fit(r["agent"], 24) + (" (h)" if r["human"] else ""), style="bold" if r["problems"] else "")
            rows.append((r["agent"], (name, _styled(r["watch_state"], STATE_STYLE.get(r["watch_state"], "")),
                                      str(r["sessions"]), str(r["unread"]), str(r["unacked"]),
                                      _age(r["oldest_unacked_age"]), _age(r["last_seen_age"]), problem)))
        table.sync(rows)
        self._restore(table, selected)
        everyone = self.snapshot["fleet"]
        counts = {p: sum(p in r["problems"] for r in everyone) for p in data.PROBLEMS}
        armed = sum(r["watch_state"] == "armed" for r in everyone)
        filters = [f"sort {self.sort_by}", f"overdue > {self.overdue_minutes:g} min"]
        if self.project:
            filters.append(f"project {self.project}")
        if self.state_filter:
            filters.append(f"state {self.state_filter}")
        if self.filter_text:
            filters.append(f"filter {self.filter_text!r}")
        summary = (f"{len(everyone)} identities, {armed} armed · " + " · ".join(f"{n} {p}" for p, n in counts.items())
                   + " · " + " · ".join(filters))
        if summary != self._summary:  # an unchanged line costs no layout
            self._summary = summary
            self.query_one("#summary", Static).update(summary)

    def _fill_feed(self) -> None:
        table = self.query_one("#feed-table", Table)
        selected = self._selected_key(table)
        at = model.now()
        # At 80 columns every column fits: names and subjects are cut to the width there is.
        subject_width = max(18, self.size.width - 62)
        rows = []
        for send in self.snapshot["feed"]:
            if self.project and self.project not in (send["sender"].split(":", 1)[0],
                                                     *(r.split(":", 1)[0] for r in send["recipients"])):
                continue
            rows.append((send["id"], (_age(data.age_seconds(send["deliver_at"] or send["created"], at)),
                                      _fit(send["sender"], 14), _fit(_recipients(send), 16),
                                      _fit(send["subject"], subject_width), _state_summary(send))))
        # Like `tail -f`: while the newest send is selected, the newest stays selected and in view as sends
        # land; a send picked further down stays picked (and the view follows it) until the cursor goes up.
        following = selected is None or table.cursor_row == 0
        table.sync(rows)
        if following and rows:
            if table.cursor_row != 0:
                table.move_cursor(row=0, animate=False)
            if selected != rows[0][0]:
                self._show_send(rows[0][0])
        else:
            self._restore(table, selected)

    @staticmethod
    def _selected_key(table: DataTable) -> str | None:
        if not table.row_count:
            return None
        try:
            return table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - no row under the cursor
            return None

    @staticmethod
    def _restore(table: DataTable, key: str | None) -> None:
        if key is None:
            return
        try:
            index = table.get_row_index(key)
            if index != table.cursor_row:  # the row moved: the cursor follows it (staying put costs nothing)
                table.move_cursor(row=index, animate=False, scroll=False)
        except Exception:  # noqa: BLE001 - that row is gone (filtered out, cleaned up)
            pass

    # -- selections ---------------------------------------------------------------------------------------
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key is None:
            return
        if event.data_table.id == "feed-table":
            self._show_send(key)
        elif event.data_table.id == "inbox-table":
            self._show_inbox_message(key)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value if event.row_key else None
        if event.data_table.id == "fleet-table" and key:
            self.open_inbox(key)
        elif event.data_table.id == "feed-table" and key:
            self.thread_of = key
            self.load_thread(key)

    def _send_by_id(self, message_id: str) -> dict | None:
        for send in self.snapshot["feed"]:
            if send["id"] == message_id or message_id in send["ids"]:
                return send
        return None

    def _show_send(self, message_id: str) -> None:
        send = self._send_by_id(message_id)
        if send is not None:
            self.query_one("#detail-text", Static).update(_describe_send(send))

    def _show_inbox_message(self, message_id: str) -> None:
        for message in self.inbox_messages:
            if message["id"] == message_id:
                self.query_one("#inbox-detail-text", Static).update(_describe_message(message))
                return

    def _selected(self, table_id: str) -> str | None:
        return self._selected_key(self.query_one(f"#{table_id}", DataTable))

    # -- reading on demand (a second connection, never the feeder's) ---------------------------------------
    def _call(self, what, *args, **kwargs):
        """Run `what(supervisor, ...)` on the on-demand connection, which lives in one thread of its own (a
        SQLite connection belongs to the thread that made it); an error is returned, never raised."""
        return self._executor.submit(self._call_here, what, *args, **kwargs).result()

    def _call_here(self, what, *args, **kwargs):
        try:
            if self._supervisor is None:
                from agent_mail.store import open_store

                self._store = open_store(service.resolve_location()[0])
                self._supervisor = data.Supervisor(service.Mailbox(self._store))
            return what(self._supervisor, *args, **kwargs), None
        except errors.AgentMailError as exc:
            if isinstance(exc, errors.StorageError):
                self._close_here()  # reopened at the next call
            return None, exc

    def _close_here(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001 - a broken connection is gone anyway
                pass
        self._store = self._supervisor = None

    def open_inbox(self, agent: str) -> None:
        self.inbox_agent = agent
        self._show_inbox_title()
        self.query_one("#tabs", TabbedContent).active = "inbox"
        self.load_inbox(agent)

    def _show_inbox_title(self) -> None:
        agent = self.inbox_agent
        text = (f"Inbox of {agent} as it sees it (nothing is marked read by looking)" if agent else
                "No identity chosen: select one on the Fleet screen (enter or i).")
        if agent and agent == self.human:
            text += " · a ack  d dismiss  x archive  r reply"
        self.query_one("#inbox-title", Static).update(text)

    @work(thread=True, exclusive=True, group="inbox")
    def load_inbox(self, agent: str) -> None:
        result, problem = self._call(lambda s: s.inbox(agent))
        if problem is not None:
            self.call_from_thread(self.notify, problem.message, severity="error")
            return
        self.call_from_thread(self._fill_inbox, result)

    def _fill_inbox(self, result: dict) -> None:
        if result["agent"] != self.inbox_agent:
            return
        self.inbox_messages = list(reversed(result["messages"]))
        table = self.query_one("#inbox-table", Table)
        selected = self._selected_key(table)
        at = model.now()
        rows = []
        for m in self.inbox_messages:
            state = _own_state(m, result["agent"])
            rows.append((m["id"], (_age(data.age_seconds(m["deliver_at"] or m["created"], at)), _fit(m["sender"], 20),
                                   _fit(m["subject"], max(18, self.size.width - 44)),
                                   _styled(state, "bold" if state == "unread" else ""))))
        table.sync(rows)
        self._restore(table, selected)
        if selected is None and self.inbox_messages:
            self._show_inbox_message(self.inbox_messages[0]["id"])
        self.query_one("#inbox-title", Static).update(
            f"Inbox of {result['agent']}: {result['unread']} unread, {len(self.inbox_messages)} shown "
            "(looking marks nothing read)" + (" · a ack  d dismiss  x archive  r reply"
                                               if result["agent"] == self.human else ""))

    @work(thread=True, exclusive=True, group="thread")
    def load_thread(self, message_id: str) -> None:
        result, problem = self._call(lambda s: s.thread(message_id))
        if problem is not None:
            self.call_from_thread(self.notify, problem.message, severity="error")
            return
        text = Text()
        for send in result:
            text.append(_describe_send(send))
            text.append("\n" + "─" * 40 + "\n")
        self.call_from_thread(self.query_one("#detail-text", Static).update, text)

    # -- actions: looking -------------------------------------------------------------------------------
    def action_screen(self, name: str) -> None:
        self.query_one("#tabs", TabbedContent).active = name
        if name == "charts" and self.feeder is not None:
            self.feeder.poke.set()
        elif name == "charts" and not self.live:
            self._load_charts_now()

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self.shown_tab = event.pane.id
        if event.pane.id in self._behind:  # what was last read at once, then what is there now
            self._behind.discard(event.pane.id)
            (self._fill_fleet if event.pane.id == "fleet" else self._fill_feed)()
        if self.feeder is not None:
            self.feeder.poke.set()
        tables = event.pane.query(DataTable)
        if tables:
            tables.first().focus()

    @work(thread=True, group="charts")
    def _load_charts_now(self) -> None:
        result, problem = self._call(lambda s: {"hourly": s.hourly(by=self.chart_by), "backlog": s.backlog()})
        if problem is None:
            self.call_from_thread(self.apply_snapshot, result)

    def action_help(self) -> None:
        self.push_screen(Help())

    def action_filter(self) -> None:
        def done(value):
            if value is not None:
                self.filter_text = value.strip()
                self._fill_fleet()

        self.action_screen("fleet")
        self.push_screen(Ask("Filter identities (text in the name or problem; empty: all):", self.filter_text), done)

    def action_sort(self) -> None:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]
        self._fill_fleet()

    def action_project(self) -> None:
        if self.pinned_project:
            self.notify(f"started with --project {self.project}", severity="warning")
            return
        projects = [None] + sorted({r["project"] for r in self.snapshot["fleet"]})
        self.project = projects[(projects.index(self.project) + 1) % len(projects)] if self.project in projects \
            else None
        self._fill_fleet()
        self._fill_feed()

    def action_state(self) -> None:
        self.state_filter = STATES[(STATES.index(self.state_filter) + 1) % len(STATES)]
        self._fill_fleet()

    def action_overdue(self, change: int) -> None:
        self.overdue_minutes = max(1, self.overdue_minutes + change)
        if self.feeder is not None:
            self.feeder.poke.set()
        self._fill_fleet()

    def action_inbox(self) -> None:
        agent = self._selected("fleet-table")
        if agent:
            self.open_inbox(agent)

    def action_thread(self) -> None:
        message_id = self._selected("feed-table")
        if message_id:
            self.load_thread(message_id)

    def action_chart_by(self) -> None:
        self.chart_by = "identity" if self.chart_by == "project" else "project"
        if self.feeder is not None:
            self.feeder.poke.set()
        else:
            self._load_charts_now()

    def action_save(self) -> None:
        message_id = self._selected_message()
        if message_id is None:
            return
        send = self._send_by_id(message_id)
        attached = send["attachments"] if send else next(
            (m["attachments"] for m in self.inbox_messages if m["id"] == message_id), [])
        if not attached:
            self.notify("The selected message has no attachments.", severity="warning")
            return

        def done(directory):
            if directory:
                self._save(message_id, directory.strip(), send)

        self.push_screen(Ask(f"Save {len(attached)} attachment(s) into directory:", "."), done)

    @work(thread=True, group="act")
    def _save(self, message_id: str, directory: str, send: dict | None) -> None:
        # Saved as a party to the message (its sender sees it always), with the CLI's checks: no path leaves
        # the directory, nothing is overwritten, nothing is left half written.
        agent = send["sender"] if send else self.inbox_agent
        result, problem = self._call(lambda s: s.mailbox.attachments(agent=agent, id=message_id, save_to=directory))
        self._report(problem, f"Saved {', '.join(result['saved']) if result else ''} in {directory}")

    def _selected_message(self) -> str | None:
        active = self.query_one("#tabs", TabbedContent).active
        if active == "inbox":
            return self._selected("inbox-table")
        return self._selected("feed-table")

    # -- actions: stepping in as the human -----------------------------------------------------------------
    def _need_human(self) -> bool:
        if self.human is None:
            self.notify("Read-only: start the dashboard with --as PROJECT:NAME to send, reply and handle mail.",
                        severity="warning")
            return False
        return True

    def action_send(self) -> None:
        if self._need_human():
            self.push_screen(Compose(f"Send as {self.human}"), self._sent)

    def action_broadcast(self) -> None:
        if self._need_human():
            self.push_screen(Compose(f"Broadcast as {self.human} to everyone", to="*"), self._sent)

    def action_reply(self) -> None:
        if not self._need_human():
            return
        message_id = self._selected_message()
        if message_id is None:
            self.notify("Select a message to reply to (Traffic or Inbox).", severity="warning")
            return
        send = self._send_by_id(message_id) or next((m for m in self.inbox_messages if m["id"] == message_id), None)
        if send is None:
            return
        subject = send["subject"] if send["subject"].lower().startswith("re:") else f"Re: {send['subject']}"
        self.push_screen(Compose(f"Reply as {self.human}", to=send["sender"], subject=subject, reply_to=message_id),
                         self._sent)

    def _sent(self, form: dict | None) -> None:
        if form is not None:
            self._send(form)

    @work(thread=True, group="act")
    def _send(self, form: dict) -> None:
        result, problem = self._call(lambda s: s.mailbox.send(
            from_=self.human, to=form["to"], subject=form["subject"], body=form["body"], reply_to=form["reply_to"]))
        if problem is None and result["refused"]:
            refused = "; ".join(f"{d['recipient']}: {d['reason']}" for d in result["deliveries"]
                                if d["status"] == "refused")
            self.call_from_thread(self.notify, f"Refused: {refused}", severity="warning")
            return
        self._report(problem, f"Sent {form['subject']!r} to {', '.join(form['to'])}")

    def action_cancel(self) -> None:
        if not self._need_human():
            return
        message_id = self._selected_message()
        send = self._send_by_id(message_id) if message_id else None
        if send is None:
            self.notify("Select a scheduled message you sent (Traffic) to cancel it.", severity="warning")
            return
        self._cancel(send["ids"])

    @work(thread=True, group="act")
    def _cancel(self, ids: list[str]) -> None:
        result, problem = self._call(lambda s: s.mailbox.cancel(sender=self.human, ids=ids))
        self._report(problem, f"Cancelled {len(ids)} message(s)")

    def _own_mail(self) -> str | None:
        if not self._need_human():
            return None
        if self.inbox_agent != self.human or self.query_one("#tabs", TabbedContent).active != "inbox":
            self.notify(f"Ack, dismiss and archive act on your own inbox: press 3 (Inbox of {self.human}).",
                        severity="warning")
            if self.inbox_agent != self.human:
                self.open_inbox(self.human)
            return None
        return self._selected("inbox-table")

    def action_ack(self) -> None:
        self._handle("ack")

    def action_dismiss_mail(self) -> None:
        self._handle("dismiss")

    def action_archive(self) -> None:
        self._handle("archive")

    def _handle(self, verb: str) -> None:
        message_id = self._own_mail()
        if message_id is not None:
            self._do_handle(verb, message_id)

    @work(thread=True, group="act")
    def _do_handle(self, verb: str, message_id: str) -> None:
        result, problem = self._call(lambda s: getattr(s.mailbox, verb)(agent=self.human, ids=[message_id]))
        self._report(problem, f"{verb}: done")
        if problem is None:
            self.load_inbox(self.human)

    def _report(self, problem: errors.AgentMailError | None, success: str) -> None:
        if problem is None:
            self.call_from_thread(self.notify, success)
        else:
            fields = "; ".join(f"{p['field']}: {p['message']}" if p.get("field") else p["message"]
                               for p in problem.problems())
            self.call_from_thread(self.notify, fields, severity="error", timeout=10)

    # -- charts -----------------------------------------------------------------------------------------
    def _draw_charts(self) -> None:
        from textual_plotext import PlotextPlot

        hourly, backlog = self.snapshot.get("hourly"), self.snapshot.get("backlog")
        if hourly:
            plot = self.query_one("#hourly", PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            xs = list(range(-len(hourly["hours"]) + 1, 1))
            for name, counts in list(hourly["series"].items())[:6]:
                plt.plot(xs, counts, label=name, marker="braille")
            if not hourly["series"]:
                plt.plot(xs, [0] * len(xs), label="no mail", marker="braille")
            plt.title(f"Sends per hour, last 24 h, by {self.chart_by} (g: switch)")
            plt.xlabel("hours ago")
            plot.refresh()
        if backlog:
            plot = self.query_one("#backlog", PlotextPlot)
            plt = plot.plt
            plt.clear_data()
            plt.clear_figure()
            xs = list(range(-len(backlog["moments"]) + 1, 1))
            plt.plot(xs, backlog["unacked"], label="unacked", marker="braille")
            plt.plot(xs, backlog["unread"], label="unread", marker="braille")
            plt.title("Direct mail waiting (unread, unacked), hourly over the last day")
            plt.xlabel("hours ago")
            plot.refresh()


# -- text of rows and details ------------------------------------------------------------------------------
def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _recipients(send: dict) -> str:
    if send["recipients"] == ["*"]:
        return "* everyone"
    if len(send["recipients"]) > 2:
        return f"{send['recipients'][0]} +{len(send['recipients']) - 1}"
    return ", ".join(send["recipients"])


def _state_summary(send: dict) -> Text:
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


def _describe_send(send: dict) -> Text:
    text = Text()
    text.append(f"{send['subject']}\n", style="bold")
    text.append(f"from {send['sender']} · {send['deliver_at'] or send['created']} · id {send['id']}\n", style="dim")
    if send["broadcast"] is not None:
        b = send["broadcast"]
        text.append(f"to everyone: read by {b['read']} of {b['of']}, acted on by {b['acked']}\n")
    else:
        text.append("to " + ", ".join(f"{r} ({send['states'].get(r, '?')})" for r in send["recipients"]) + "\n")
    if send["reply_to"]:
        text.append(f"in reply to {send['reply_to']}\n", style="dim")
    if send["refs"]:
        text.append("refs: " + ", ".join(map(str, send["refs"])) + "\n")
    if send["attachments"]:
        text.append("attachments: " + ", ".join(f"{a['name']} ({a['size']} B)" for a in send["attachments"])
                    + "  (w: save)\n")
    text.append("\n" + (send["body"] or ""))
    return text


def _own_state(message: dict, agent: str) -> str:
    if message["sender"] == agent:
        return "sent"
    for column, word in (("archived_at", "archived"), ("acked_at", "acked"), ("read_at", "read")):
        if message.get(column):
            return word
    return "unread"


def _describe_message(message: dict) -> Text:
    send = {**message, "recipients": [message["recipient"]], "states": {}, "broadcast": None,
            "attachments": message.get("attachments", [])}
    return _describe_send(send)
