"""The Charts screen: sends per hour over the last day (by project or identity), and the backlog of direct
mail waiting."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import TabPane

#: The hours marked on the time axis (both plots cover the last day).
HOUR_TICKS = (-24, -18, -12, -6, 0)


def whole_ticks(highest: int) -> list[int]:
    """Ticks from 0 up to `highest` or just above it, in whole steps of 1, 2 or 5 (times a power of ten), at
    most five of them: the counts are sends and messages, never a third of one."""
    scale = 1
    while True:
        for step in (scale, 2 * scale, 5 * scale):
            if highest <= 4 * step:
                top = -(-max(highest, 1) // step) * step
                return list(range(0, top + 1, step))
        scale *= 10


def _axes(plt, highest: int) -> None:
    """Whole-number counts up the side, hours ago along the bottom, the same day on both plots."""
    ticks = whole_ticks(highest)
    plt.ylim(0, ticks[-1])
    plt.yticks(ticks, [str(t) for t in ticks])
    plt.xlim(HOUR_TICKS[0], HOUR_TICKS[-1])
    plt.xticks(list(HOUR_TICKS), [str(-t) if t else "now" for t in HOUR_TICKS])
    plt.xlabel("hours ago")


class ChartsPane(TabPane):
    """Two plots, drawn from Supervisor.hourly and Supervisor.backlog."""

    def __init__(self):
        super().__init__("4 Charts", id="charts")

    def compose(self) -> ComposeResult:
        from textual_plotext import PlotextPlot

        yield PlotextPlot(id="hourly")
        yield PlotextPlot(id="backlog")

    def draw(self, hourly: dict | None, backlog: dict | None, chart_by: str) -> None:
        from textual_plotext import PlotextPlot

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
            plt.title(f"Sends per hour, last 24 h, by {chart_by} (g: switch)")
            _axes(plt, max((max(c) for c in list(hourly["series"].values())[:6]), default=0))
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
            _axes(plt, max(backlog["unacked"] + backlog["unread"], default=0))
            plot.refresh()
