"""The dashboard's Textual application: Fleet, Traffic, Inbox and Charts over one mailbox.

Imported only by `agent-mail dashboard` (Textual is the `tui` extra). The application holds the keys,
the settings the screens share and the human's actions; each screen is a pane of its own (fleet.py,
traffic.py, inbox.py, charts.py) laying out what agent_mail.dashboard.data reads, and the forms are in
screens.py, the looks in dashboard.tcss. The Feeder (feeder.py) reads in the background and posts what
it read; reads and actions on demand run on a connection of their own (on_demand.py). Looking marks
nothing read; the human's own actions go through the same service calls as the CLI.
"""

from __future__ import annotations

import gc
from typing import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Header, Static, TabbedContent

from agent_mail.dashboard import data
from agent_mail.dashboard.charts import ChartsPane
from agent_mail.dashboard.feeder import Feeder, FeedProblem, FeedRead, Wanted
from agent_mail.dashboard.fleet import FleetPane
from agent_mail.dashboard.inbox import InboxPane
from agent_mail.dashboard.on_demand import OnDemand
from agent_mail.dashboard.screens import Ask, Compose, Help
from agent_mail.dashboard.text import visible
from agent_mail.dashboard.traffic import TrafficPane


def stop_on_signals(stop: Callable[[int], None]) -> Callable[[], None]:
    """Have SIGHUP (the terminal went away) and SIGTERM call `stop(number)` through the running loop, and
    return what undoes that. Raised from a plain signal handler, the CLI's stop could land inside a handler
    that reports errors and carries on: a dashboard left drawing into a closed terminal."""
    import asyncio
    import signal

    loop, caught = asyncio.get_running_loop(), []
    for number in (signal.SIGHUP, signal.SIGTERM):
        try:
            loop.add_signal_handler(number, stop, number)
            caught.append(number)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no such signal
            pass

    def release() -> None:
        for number in caught:
            try:
                loop.remove_signal_handler(number)
            except (RuntimeError, ValueError):
                pass

    return release


class Dashboard(App):
    """The four screens as tabs, the keys, and what the screens share: the project shown, the overdue
    threshold, whose inbox is open, the human stepping in (--as)."""

    TITLE = "agent-mail"
    ENABLE_COMMAND_PALETTE = False  # every action has its key, listed by ?
    CSS_PATH = "dashboard.tcss"
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
        # Read-only (no --as), the keys above are neither offered nor run (check_action); these say why.
        Binding("c,r,b,k,a,d,x", "read_only", show=False),
        Binding("g", "chart_by", "By", show=False),
    ]
    #: The actions of the human stepping in (--as): not offered in the footer, nor run, without one.
    HUMAN_ACTIONS = frozenset({"send", "reply", "broadcast", "cancel", "ack", "dismiss_mail", "archive"})

    def __init__(self, *, human: str | None = None, project: str | None = None, first: dict | None = None,
                 live: bool = True, served: tuple[str, str] | None = None):
        super().__init__()
        self.human, self.live = human, live
        self.served = served  # (url, token): the mailbox is an agent-mail server's
        self.project = project
        self.pinned_project = project is not None
        self.overdue_minutes: float = data.DEFAULT_OVERDUE_MINUTES
        self.chart_by = "project"
        self.first: dict = first or {"fleet": [], "feed": []}
        self.inbox_agent: str | None = human
        #: The screen in view (None before the first is shown: everything), set on the app's thread.
        self.shown_tab: str | None = None
        self.feeder: Feeder | None = None
        self.on_demand = OnDemand(served)
        self.fleet_pane, self.traffic_pane = FleetPane(), TrafficPane()
        self.inbox_pane, self.charts_pane = InboxPane(), ChartsPane()
        self._behind: set[str] = set()  # screens whose table was not redrawn with the last snapshot
        self._problem = ""  # the banner's text: a storage problem being retried
        self._settled = False
        self._release_signals = lambda: None
        self.stopped_by: int | None = None  # the signal that ended the app, if one did
        self.sub_title = (f"as {human}" if human else "read-only (start with --as PROJECT:NAME to step in)") + (
            f" · project {project}" if project else "") + (f" · through {served[0]}" if served else "")

    # -- layout -------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("", id="problem", markup=False)
        with TabbedContent(id="tabs", initial="fleet"):
            yield self.fleet_pane
            yield self.traffic_pane
            yield self.inbox_pane
            yield self.charts_pane
        yield Footer()

    def on_mount(self) -> None:
        self.apply_snapshot(self.first)
        self.shown_tab = "fleet"  # TabbedContent's initial pane
        self.inbox_pane.show_title(self.inbox_agent, self.human)
        self.screen.set_focus(self.query_one("#fleet-table", DataTable))  # now: see on_tabbed_content_tab_activated
        if self.live:
            self.feeder = Feeder(self.post_message, self._wanted(), self.served)
            self.feeder.start()
        self._release_signals = stop_on_signals(self._stop_by_signal)

    def _stop_by_signal(self, number: int) -> None:
        self.stopped_by = number
        self.exit(return_code=128 + number)

    def on_unmount(self) -> None:
        self._release_signals()
        if self.feeder is not None:
            self.feeder.stopping.set()
            self.feeder.join(timeout=5)
        self.on_demand.close()

    def notify(self, message: str, *, title: str = "", severity="information", timeout: float | None = None,
               markup: bool = False) -> None:
        """As App.notify, in plain text: what is said may quote mail (a subject, a file's name, a problem)."""
        super().notify(visible(message), title=title, severity=severity, timeout=timeout, markup=markup)

    # -- the data coming in -------------------------------------------------------------------------------
    def _wanted(self) -> Wanted:
        return Wanted(tab=self.shown_tab, overdue_minutes=self.overdue_minutes, inbox_agent=self.inbox_agent,
                      chart_by=self.chart_by)

    def _tell_feeder(self, *, poke: bool) -> None:
        """Give the feeder what is in view now (and, with `poke`, have it read at once)."""
        if self.feeder is not None:
            self.feeder.wanted = self._wanted()
            if poke:
                self.feeder.poke.set()

    def on_feed_read(self, message: FeedRead) -> None:
        from textual.css.query import NoMatches

        try:
            self.apply_snapshot(message.snapshot)
        except NoMatches:  # a read that arrives as the app closes (its panes gone) or before they are composed:
            pass  # nothing to draw on; the next read draws what is in view

    def on_feed_problem(self, message: FeedProblem) -> None:
        from textual.css.query import NoMatches

        try:
            self.show_problem(message.text)
        except NoMatches:
            pass

    def show_problem(self, text: str | None) -> None:
        shown = f"{text} (retrying)" if text else ""
        if shown == self._problem:
            return
        self._problem = shown
        banner = self.query_one("#problem", Static)
        banner.update(shown)
        banner.set_class(bool(text), "shown")

    def apply_snapshot(self, snapshot: dict) -> None:
        """Take what was read (some of fleet, feed, inbox, hourly, backlog) and draw what is in view."""
        self.show_problem(None)
        if "fleet" in snapshot:
            self.fleet_pane.fleet = snapshot["fleet"]
        if "feed" in snapshot:
            self.traffic_pane.feed = snapshot["feed"]
        # Only the screen in view is drawn now; the other catches up when it is shown (drawing what nobody
        # sees is most of what an idle dashboard would cost).
        shown = self.shown_tab
        if shown in ("fleet", None):
            self._draw_fleet()
        if shown in ("traffic", None):
            self._draw_traffic()
        self._behind = {"fleet", "traffic"} - {shown}
        if not self._settled:
            # The objects made at start-up live as long as the app: keep them out of every later collection,
            # which would otherwise walk them all a few times a minute.
            self._settled = True
            gc.freeze()
        if "hourly" in snapshot:
            self.charts_pane.draw(snapshot["hourly"], snapshot.get("backlog"), self.chart_by)
        if "inbox" in snapshot:
            self.show_inbox(snapshot["inbox"])

    def show_inbox(self, result: dict) -> None:
        """Draw an inbox as read (Supervisor.inbox), unless another identity's has been asked for since."""
        if result["agent"] == self.inbox_agent:
            self.inbox_pane.draw(result, self.human)

    def _draw_fleet(self) -> None:
        self.fleet_pane.draw(self.project, self.overdue_minutes)

    def _draw_traffic(self) -> None:
        self.traffic_pane.draw(self.project)

    # -- reading on demand ----------------------------------------------------------------------------------
    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        key = event.row_key.value if event.row_key else None
        if event.data_table.id == "fleet-table" and key:
            self.open_inbox(key)
        elif event.data_table.id == "feed-table" and key:
            self.load_thread(key)

    def open_inbox(self, agent: str) -> None:
        self.inbox_agent = agent
        self._tell_feeder(poke=False)
        self.inbox_pane.show_title(agent, self.human)
        self.show_screen("inbox")
        self.load_inbox(agent)

    @work(thread=True, exclusive=True, group="inbox")
    def load_inbox(self, agent: str) -> None:
        result, problem = self.on_demand.call(lambda s: s.inbox(agent))
        if problem is not None:
            self.call_from_thread(self.notify, problem.message, severity="error")
            return
        self.call_from_thread(self.show_inbox, result)

    @work(thread=True, exclusive=True, group="thread")
    def load_thread(self, message_id: str) -> None:
        result, problem = self.on_demand.call(lambda s: s.thread(message_id))
        if problem is not None:
            self.call_from_thread(self.notify, problem.message, severity="error")
            return
        self.call_from_thread(self.traffic_pane.show_thread, result)

    @work(thread=True, group="charts")
    def _load_charts_now(self) -> None:
        chart_by = self.chart_by
        result, problem = self.on_demand.call(lambda s: {"hourly": s.hourly(by=chart_by), "backlog": s.backlog()})
        if problem is None:
            self.call_from_thread(self.apply_snapshot, result)

    # -- actions: looking -------------------------------------------------------------------------------
    def action_screen(self, name: str) -> None:
        self.show_screen(name)
        if name == "charts" and self.feeder is not None:
            self.feeder.poke.set()
        elif name == "charts" and not self.live:
            self._load_charts_now()

    def show_screen(self, name: str) -> None:
        """Make `name` the screen in view. The focus leaves the screen being hidden first: a focused widget
        that is hidden hands its focus to a sibling still displayed (Textual's blur on hide), here the detail
        view in the same pane, and focusing inside a pane activates that pane again: from Traffic or Inbox,
        `4` (whose screen has nothing to focus) would stay where it was."""
        tabs = self.query_one("#tabs", TabbedContent)
        if tabs.active != name:
            self.screen.set_focus(None)
            tabs.active = name

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        tabs = self.query_one("#tabs", TabbedContent)
        if event.pane.id != tabs.active:  # another screen was asked for since: that one's message follows
            return
        self.shown_tab = event.pane.id
        if event.pane.id in self._behind:  # what was last read at once, then what is there now
            self._behind.discard(event.pane.id)
            (self._draw_fleet if event.pane.id == "fleet" else self._draw_traffic)()
        self._tell_feeder(poke=True)
        tables = event.pane.query(DataTable)
        # Focused now, not later (Widget.focus waits for the next idle moment): a focus landing after another
        # key took the user elsewhere would bring this screen back.
        self.screen.set_focus(tables.first() if tables else None)

    def action_help(self) -> None:
        self.push_screen(Help(self.human))

    def action_filter(self) -> None:
        def done(value):
            if value is not None:
                self.fleet_pane.filter_text = value.strip()
                self._draw_fleet()

        self.action_screen("fleet")
        self.push_screen(Ask("Filter identities (text in the name or problem; empty: all):",
                             self.fleet_pane.filter_text), done)

    def action_sort(self) -> None:
        self.fleet_pane.next_sort()
        self._draw_fleet()

    def action_project(self) -> None:
        if self.pinned_project:
            self.notify(f"started with --project {self.project}", severity="warning")
            return
        projects = [None] + self.fleet_pane.projects()
        self.project = projects[(projects.index(self.project) + 1) % len(projects)] if self.project in projects \
            else None
        self._draw_fleet()
        self._draw_traffic()

    def action_state(self) -> None:
        self.fleet_pane.next_state()
        self._draw_fleet()

    def action_overdue(self, change: int) -> None:
        self.overdue_minutes = max(1, self.overdue_minutes + change)
        self._tell_feeder(poke=True)
        self._draw_fleet()

    def action_inbox(self) -> None:
        agent = self.fleet_pane.selected()
        if agent:
            self.open_inbox(agent)

    def action_thread(self) -> None:
        message_id = self.traffic_pane.selected()
        if message_id:
            self.load_thread(message_id)

    def action_chart_by(self) -> None:
        self.chart_by = "identity" if self.chart_by == "project" else "project"
        if self.feeder is not None:
            self._tell_feeder(poke=True)
        else:
            self._load_charts_now()

    def action_save(self) -> None:
        message_id = self._selected_message()
        if message_id is None:
            return
        send = self.traffic_pane.send_by_id(message_id)
        message = self.inbox_pane.message_by_id(message_id)
        attached = send["attachments"] if send else message["attachments"] if message else []
        if not attached:
            self.notify("The selected message has no attachments.", severity="warning")
            return

        def done(directory):
            if directory:
                # Saved as a party to the message (its sender sees it always), with the CLI's checks: no path
                # leaves the directory, nothing is overwritten, nothing is left half written.
                agent, directory = send["sender"] if send else self.inbox_agent, directory.strip()
                self._act(lambda s: s.call("attachments", {"agent": agent, "id": message_id, "save_to": directory}),
                          lambda result: f"Saved {', '.join(s['name'] for s in result['saved'])} in {directory}")

        self.push_screen(Ask(f"Save {len(attached)} attachment(s) into directory:", "."), done)

    def _selected_message(self) -> str | None:
        if self.query_one("#tabs", TabbedContent).active == "inbox":
            return self.inbox_pane.selected()
        return self.traffic_pane.selected()

    # -- actions: stepping in as the human -----------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Read-only, the human's actions are hidden and not run, and their keys say how to step in."""
        if action in self.HUMAN_ACTIONS:
            return self.human is not None
        if action == "read_only":
            return self.human is None
        return True

    def action_read_only(self) -> None:
        self.notify("Read-only: start the dashboard with --as PROJECT:NAME to send, reply and handle mail.",
                    severity="warning")

    def action_send(self) -> None:
        self.push_screen(Compose(f"Send as {self.human}"), self._sent)

    def action_broadcast(self) -> None:
        self.push_screen(Compose(f"Broadcast as {self.human} to everyone", to="*"), self._sent)

    def action_reply(self) -> None:
        message_id = self._selected_message()
        if message_id is None:
            self.notify("Select a message to reply to (Traffic or Inbox).", severity="warning")
            return
        send = self.traffic_pane.send_by_id(message_id) or self.inbox_pane.message_by_id(message_id)
        if send is None:
            return
        subject = visible(send["subject"])  # (what the human would send back is what they were shown)
        subject = subject if subject.lower().startswith("re:") else f"Re: {subject}"
        self.push_screen(Compose(f"Reply as {self.human}", to=send["sender"], subject=subject, reply_to=message_id),
                         self._sent)

    def _sent(self, form: dict | None) -> None:
        if form is None:
            return

        def said(result: dict) -> str | tuple[str, str]:
            if result["refused"]:
                return "Refused: " + "; ".join(f"{d['recipient']}: {d['reason']}" for d in result["deliveries"]
                                               if d["status"] == "refused"), "warning"
            return f"Sent {form['subject']!r} to {', '.join(form['to'])}"

        self._act(lambda s: s.call("send", {"from": self.human, "to": form["to"], "subject": form["subject"],
                                            "body": form["body"], "reply_to": form["reply_to"]}), said)

    def action_cancel(self) -> None:
        message_id = self._selected_message()
        send = self.traffic_pane.send_by_id(message_id) if message_id else None
        if send is None:
            self.notify("Select a scheduled message you sent (Traffic) to cancel it.", severity="warning")
            return
        ids = send["ids"]
        self._act(lambda s: s.call("cancel", {"sender": self.human, "ids": ids}),
                  lambda _: f"Cancelled {len(ids)} message(s)")

    def _own_mail(self) -> str | None:
        if self.inbox_agent != self.human or self.query_one("#tabs", TabbedContent).active != "inbox":
            self.notify(f"Ack, dismiss and archive act on your own inbox: press 3 (Inbox of {self.human}).",
                        severity="warning")
            if self.inbox_agent != self.human:
                self.open_inbox(self.human)
            return None
        return self.inbox_pane.selected()

    def action_ack(self) -> None:
        self._handle("ack")

    def action_dismiss_mail(self) -> None:
        self._handle("dismiss")

    def action_archive(self) -> None:
        self._handle("archive")

    def _handle(self, verb: str) -> None:
        message_id = self._own_mail()
        if message_id is not None:
            self._act(lambda s: s.call(verb, {"agent": self.human, "ids": [message_id]}),
                      lambda _: f"{verb}: done", then=lambda: self.load_inbox(self.human))

    @work(thread=True, group="act")
    def _act(self, what, said, then=None) -> None:
        """Run `what(supervisor)`, one of the human's actions, on the on-demand connection and notify how it
        went: `said(result)` (a text, or a text and a severity) when done, then `then()`; the problems if not."""
        result, problem = self.on_demand.call(what)
        if problem is not None:
            fields = "; ".join(f"{p['field']}: {p['message']}" if p.get("field") else p["message"]
                               for p in problem.problems())
            self.call_from_thread(self.notify, fields, severity="error", timeout=10)
            return
        saying = said(result)
        text, severity = saying if isinstance(saying, tuple) else (saying, "information")
        self.call_from_thread(self.notify, text, severity=severity)
        if then is not None:
            then()
