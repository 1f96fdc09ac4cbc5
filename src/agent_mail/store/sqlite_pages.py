"""A SQLite file read page by page, without SQLite: what `doctor --repair` learns of a file SQLite will not read whole.

SQLite stops a scan at the first page it cannot read. A file cut short or overwritten in places still holds pages
past that point, and the b-tree pages that survive name the rowids of their rows (a leaf) or bound those of the
pages below them (an interior page). The repair resumes its scans at the rows of surviving leaves and counts what
the lost pages held from those bounds. Only rowid tables are walked: every mailbox table is one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

_INTERIOR, _LEAF = 0x05, 0x0D  # a rowid table's b-tree pages


def extent(path: str) -> dict | None:
    """{size_bytes, size_in_header_bytes, cut_short} of a SQLite file, from its header; None without a valid one."""
    try:
        with open(path, "rb") as handle:
            header = handle.read(100)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\0"):
        return None
    pages = int.from_bytes(header[28:32], "big")
    if header[24:28] != header[92:96] or not pages:  # the count is valid only when the last writer wrote it
        return None
    expected = pages * _page_size(header)
    return {"size_bytes": size, "size_in_header_bytes": expected, "cut_short": size < expected}


@dataclass
class TableKeys:
    """What the surviving pages of one table's b-tree say about its rowids."""

    highest: int | None = None  # the highest rowid named anywhere (a row's, or a divider bounding a lost page)
    leaf_starts: list[int] = field(default_factory=list)  # the first rowid of each surviving leaf, ascending


def table_keys(path: str, root: int) -> TableKeys:
    """Walk the b-tree of the rowid table rooted at page `root` through the pages that are still there."""
    found = TableKeys()
    try:
        handle = open(path, "rb")
    except OSError:
        return found
    with handle:
        page_size = _page_size(handle.read(100))
        pages = os.fstat(handle.fileno()).st_size // page_size
        seen: set[int] = set()
        todo = [root]
        while todo:
            number = todo.pop()
            if not 1 <= number <= pages or number in seen:
                continue
            seen.add(number)
            handle.seek((number - 1) * page_size)
            _walk_page(handle.read(page_size), 100 if number == 1 else 0, found, todo)
    found.leaf_starts.sort()
    return found


def _walk_page(page: bytes, at: int, found: TableKeys, todo: list[int]) -> None:
    kind = page[at]
    if kind not in (_INTERIOR, _LEAF):
        return  # not a table b-tree page (overwritten, or another tree's): nothing it says can be trusted
    cells = int.from_bytes(page[at + 3:at + 5], "big")
    pointers = at + (12 if kind == _INTERIOR else 8)
    keys = []
    try:
        for i in range(cells):
            cell = int.from_bytes(page[pointers + 2 * i:pointers + 2 * i + 2], "big")
            if kind == _INTERIOR:
                todo.append(int.from_bytes(page[cell:cell + 4], "big"))
                key, _ = _varint(page, cell + 4)
            else:
                _, after_size = _varint(page, cell)
                key, _ = _varint(page, after_size)
            keys.append(key)
    except IndexError:
        pass  # a page damaged part of the way: what it named before the damage still counts
    if kind == _INTERIOR:
        todo.append(int.from_bytes(page[at + 8:at + 12], "big"))
    elif keys:
        found.leaf_starts.append(min(keys))
    if keys:
        found.highest = max(keys) if found.highest is None else max(found.highest, *keys)


def _page_size(header: bytes) -> int:
    value = int.from_bytes(header[16:18], "big")
    return 65536 if value == 1 else value or 4096


def _varint(data: bytes, at: int) -> tuple[int, int]:
    """SQLite's variable-length integer at `at` (a signed 64-bit one): (value, offset after it)."""
    value = 0
    for i in range(8):
        byte = data[at + i]
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    value = (value << 8) | data[at + 8]
    return (value - (1 << 64) if value >= 1 << 63 else value), at + 9
