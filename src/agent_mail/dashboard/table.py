"""The dashboard's tables: a DataTable that changes only what changed, and keeps the selected row selected."""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import DataTable


def _cells(value) -> int:
    return cell_len(value.plain if isinstance(value, Text) else str(value))


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

    def selected_key(self) -> str | None:
        """The key of the row under the cursor (None in an empty table)."""
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - no row under the cursor
            return None

    def keep_selected(self, key: str | None) -> None:
        """Put the cursor back on the row `key` after a sync moved it (nothing if that row is gone)."""
        if key is None:
            return
        try:
            index = self.get_row_index(key)
            if index != self.cursor_row:  # the row moved: the cursor follows it (staying put costs nothing)
                self.move_cursor(row=index, animate=False, scroll=False)
        except Exception:  # noqa: BLE001 - that row is gone (filtered out, cleaned up)
            pass
