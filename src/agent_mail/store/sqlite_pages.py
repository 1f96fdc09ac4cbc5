"""A SQLite file read page by page, without SQLite: what `doctor --repair` learns of a file SQLite will not read whole.

SQLite stops a scan at the first page it cannot read. A file cut short or overwritten in places still holds pages
past that point, and the b-tree pages that survive name the rowids of their rows (a leaf) or bound those of the
pages below them (an interior page). The repair resumes its scans at the rows of surviving leaves and counts what
the lost pages held from those bounds. Only rowid tables are walked: every mailbox table is one.

The file is read in a child process (`python -I` running this module, which imports the standard library only),
never in the caller's: on POSIX, closing any descriptor of a file drops every lock the process holds on it (SQLite's
"How to corrupt an SQLite database file", 2.2), so a raw read in a process holding a connection to the mailbox (a
server's, or the repair's own) would let another process's last connection take the file, checkpoint and delete the
WAL still in use. The child's descriptors are its own; closing them touches no lock of ours.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

_INTERIOR, _LEAF = 0x05, 0x0D  # a rowid table's b-tree pages
READ_SECONDS = 600  # the longest the child may take: a walk reads each page of one table once


def extent(path: str) -> dict | None:
    """{size_bytes, size_in_header_bytes, cut_short} of a SQLite file, from its header; None without a valid one
    (or when the child that reads it could not run)."""
    return _in_child("extent", path)


def table_keys(path: str, root: int) -> TableKeys:
    """Walk the b-tree of the rowid table rooted at page `root` through the pages that are still there."""
    found = _in_child("table_keys", path, str(root))
    if not isinstance(found, dict):
        return TableKeys()
    return TableKeys(highest=found["highest"], leaf_starts=found["leaf_starts"])


def _in_child(*argv: str) -> object:
    """What `python -I this_file ARGV` printed (JSON), or None. -I: neither the environment nor this file's folder
    (whose modules' names are the store's) on the child's path."""
    import json
    import subprocess

    if not sys.executable:
        return None
    try:
        done = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), *argv], capture_output=True,
                              timeout=READ_SECONDS, stdin=subprocess.DEVNULL)
        return json.loads(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def _read_extent(path: str) -> dict | None:
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


def _read_table_keys(path: str, root: int) -> TableKeys:
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


def _main(argv: list[str]) -> int:
    """The child's side: `extent PATH` or `table_keys PATH ROOT`, the answer as JSON on stdout."""
    import json

    if argv[:1] == ["extent"] and len(argv) == 2:
        answer: object = _read_extent(argv[1])
    elif argv[:1] == ["table_keys"] and len(argv) == 3 and argv[2].isdigit():
        keys = _read_table_keys(argv[1], int(argv[2]))
        answer = {"highest": keys.highest, "leaf_starts": keys.leaf_starts}
    else:
        return 2
    sys.stdout.write(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
