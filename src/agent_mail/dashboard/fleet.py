"""The Fleet screen: one row per identity, problems first, under a line of counts and the filters in force."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static, TabPane

from agent_mail.dashboard import data
from agent_mail.dashboard.table import Table
from agent_mail.dashboard.text import fit

STATE_STYLE = {"armed": "bold green", "released": "yellow", "stale": "bold red", "never": "dim"}
PROBLEM_STYLE = {data.DEAF: "bold red", data.OVERDUE: "bold yellow", data.STALE: "red", data.BOUNCED: "magenta"}
SHORT = {data.DEAF: "deaf"}  # a problem's name beside others
SORTS = ("problems", "agent", "unread", "unacked", "oldest", "last seen", "last active")
STATES = (None, "armed", "released", "stale", "never")


def machines(hosts: list[str]) -> Text:
    """The machines an identity is on, in a cell: the latest (its first name), and how many more."""
    if not hosts:
        return Text("-", style="dim")
    return Text(fit(hosts[0].split(".", 1)[0], 14) + (f" +{len(hosts) - 1}" if len(hosts) > 1 else ""))


class FleetPane(TabPane):
    """The fleet as last read (`fleet`), shown through its own filter, watch-state filter and sort."""

    def __init__(self):
        super().__init__("1 Fleet", id="fleet")
        self.fleet: list[dict] = []
        self.filter_text = ""
        self.state_filter: str | None = None
        self.sort_by = SORTS[0]
        self._summary = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="summary", markup=False)
        yield Table(id="fleet-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one(Table).add_columns("identity", "watch", "sess", "unread", "unacked", "oldest", "seen",
                                          "problem", "active", "host")

    def next_sort(self) -> None:
        self.sort_by = SORTS[(SORTS.index(self.sort_by) + 1) % len(SORTS)]

    def next_state(self) -> None:
        self.state_filter = STATES[(STATES.index(self.state_filter) + 1) % len(STATES)]

    def projects(self) -> list[str]:
        return sorted({r["project"] for r in self.fleet})

    def selected(self) -> str | None:
        return self.query_one(Table).selected_key()

    def _visible(self, project: str | None) -> list[dict]:
        rows = self.fleet
        if project:
            rows = [r for r in rows if r["project"] == project]
        if self.state_filter:
            rows = [r for r in rows if r["watch_state"] == self.state_filter]
        if self.filter_text:
            needle = self.filter_text.lower()
            rows = [r for r in rows if needle in r["agent"].lower() or any(needle in p for p in r["problems"])
                    or any(needle in h.lower() for h in r.get("hosts") or ())]
        key = {
            "problems": None,
            "agent": lambda r: r["agent"],
            "unread": lambda r: (-r["unread"], r["agent"]),
            "unacked": lambda r: (-r["unacked"], r["agent"]),
            "oldest": lambda r: (-(r["oldest_unacked_age"] or -1), r["agent"]),
            "last seen": lambda r: (r["last_seen_age"] is None, r["last_seen_age"] or 0, r["agent"]),
            "last active": lambda r: (r.get("last_active_age") is None, r.get("last_active_age") or 0, r["agent"]),
        }[self.sort_by]
        return sorted(rows, key=key) if key else rows

    def draw(self, project: str | None, overdue_minutes: float) -> None:
        """Lay out `fleet` as filtered now (`project`: the dashboard's, shared with Traffic)."""
        table = self.query_one(Table)
        selected = table.selected_key()
        rows = []
        for r in self._visible(project):
            # Every problem by name, the worst first, each in its colour; several in their short names, which
            # fit an 80-column terminal ("deaf, overdue", not "deaf with mail +1").
            several = len(r["problems"]) > 1
            problem = Text(", ").join(Text(SHORT.get(p, p) if several else p, style=PROBLEM_STYLE.get(p, ""))
                                      for p in r["problems"]) if r["problems"] else Text("ok", style="dim")
            name = Text(fit(r["agent"], 24) + (" (h)" if r["human"] else ""), style="bold" if r["problems"] else "")
            rows.append((r["agent"], (name, Text(r["watch_state"], style=STATE_STYLE.get(r["watch_state"], "")),
                                      Text(str(r["sessions"])), Text(str(r["unread"])), Text(str(r["unacked"])),
                                      Text(data.short_age(r["oldest_unacked_age"])),
                                      Text(data.short_age(r["last_seen_age"])), problem,
                                      Text(data.short_age(r.get("last_active_age"))),
                                      machines(r.get("hosts") or []))))
        table.sync(rows)
        table.keep_selected(selected)
        everyone = self.fleet
        counts = {p: sum(p in r["problems"] for r in everyone) for p in data.PROBLEMS}
        armed = sum(r["watch_state"] == "armed" for r in everyone)
        filters = [f"sort {self.sort_by}", f"overdue > {overdue_minutes:g} min"]
        if project:
            filters.append(f"project {project}")
        if self.state_filter:
            filters.append(f"state {self.state_filter}")
        if self.filter_text:
            filters.append(f"filter {self.filter_text!r}")
        reserved = sum(r.get("reserved", 0) for r in everyone)
        dead = sum(r.get("reserved_dead", 0) for r in everyone)
        holds = (f" · {reserved} reservations" + (f" ({dead} of dead holders: block nobody)" if dead else "")
                 if reserved else "")  # shown only when there are any
        summary = (f"{len(everyone)} identities, {armed} armed · " + " · ".join(f"{n} {p}" for p, n in counts.items())
                   + holds + " · " + " · ".join(filters))
        if summary != self._summary:  # an unchanged line costs no layout
            self._summary = summary
            self.query_one("#summary", Static).update(summary)
