"""The Charts screen: sends per hour over the last day (by project or identity), and the backlog of direct
mail waiting."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import TabPane


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
