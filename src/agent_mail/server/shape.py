"""The shape of a request's JSON body, bounded as its bytes arrive (before it is parsed): at most ITEMS_MAX values
and DEPTH_MAX levels of nesting.

A body's size alone does not bound what parsing it costs: 34 MB of `[1,1,1,...]` is 17 million list slots, about
half a gigabyte resident for one request, where a 34 MB send of attachments is one string. Shape counts the
values outside strings (a comma or an opening bracket is one more) as each chunk comes, skipping the strings
with a regular expression, so a body holding more than any call takes is refused after a fraction of a megabyte,
naming the member of the object it was in (`to`), and never built. Each chunk is looked at once, in C for the
strings and the runs between them; the Python work is a step per string and per bracket, both bounded by the
count it checks.
"""

from __future__ import annotations

import re

from agent_mail import errors

# Values in one request: far more than any call takes (500 recipients, 20 attachments, a commit's paths to check
# against reservations), far fewer than would weigh on the server (a list slot is 8 bytes, a small object ~50).
ITEMS_MAX = 100_000
DEPTH_MAX = 32  # levels of nesting: a call's values go 3 deep, an MCP message's 5
KEY_MAX_BYTES = 64  # a member's name kept to say which one held too much (longer: not one of ours)

_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.S)  # a string's bytes up to its closing quote
_BRACKETS = re.compile(rb"[\[\]{}]")


class Shape:
    """Feed it a JSON body's chunks as they come (`feed`): errors.InvalidInput as soon as the body holds more
    than `items` values or nests deeper than `depth`, naming the top-level member whose value it was in."""

    def __init__(self, items: int = ITEMS_MAX, depth: int = DEPTH_MAX):
        self.items_max, self.depth_max = items, depth
        self.items = 0
        self.depth = 0
        self.in_string = False
        self.escaped = False  # a chunk ended on a backslash inside a string: the next byte is escaped
        self.text: bytearray | None = None  # the bytes of a string begun at the top level (a member's name?)
        self.candidate: bytes | None = None  # such a string, closed: a member's name if a colon follows
        self.field: str | None = None  # the top-level member whose value is being read

    def feed(self, chunk: bytes) -> None:
        i, end = 0, len(chunk)
        while i < end:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                    i += 1
                    continue
                close = _STRING_REST.match(chunk, i).end()
                if self.text is not None and len(self.text) <= KEY_MAX_BYTES:
                    self.text += chunk[i:min(close, i + KEY_MAX_BYTES + 1)]
                if close == end:
                    return
                if chunk[close] == 0x5C:  # a backslash, the chunk's last byte
                    self.escaped = True
                    return
                self.in_string, i = False, close + 1
                if self.text is not None:
                    self.candidate = bytes(self.text) if len(self.text) <= KEY_MAX_BYTES else None
                    self.text = None
                continue
            quote = chunk.find(b'"', i)
            stop = end if quote < 0 else quote
            self._between(chunk[i:stop])
            if quote < 0:
                return
            self.in_string, i = True, quote + 1
            self.text = bytearray() if self.depth == 1 else None

    def _between(self, run: bytes) -> None:
        """A run of the body outside strings: its values counted, its brackets followed."""
        if self.candidate is not None:
            shown = run.lstrip()
            if shown:
                if shown[:1] == b":":
                    self.field = self.candidate.decode("utf-8", "replace")
                self.candidate = None
        opens, deepest = run.count(b"[") + run.count(b"{"), self.depth
        if opens or b"]" in run or b"}" in run:  # a step per bracket: a run is one chunk's at most
            for bracket in _BRACKETS.finditer(run):
                self.depth += 1 if bracket.group() in (b"[", b"{") else -1
                deepest = max(deepest, self.depth)
                if self.depth > self.depth_max:
                    raise self._refusal(f"nests deeper than {self.depth_max} levels, deeper than any call's values",
                                        deepest)
                if self.depth < 0:
                    raise errors.InvalidInput([(None, "the request body is not JSON (a bracket closes what was "
                                                      "never opened); nothing was done.")])
        self.items += run.count(b",") + opens
        if self.items > self.items_max:
            raise self._refusal(f"holds more than {self.items_max} values, more than any call takes", deepest)

    def _refusal(self, why: str, deepest: int) -> errors.InvalidInput:
        """The refusal, naming the top-level member when the run that crossed the bound was inside its value (a
        run begins after a string, so one member's at most)."""
        if self.field is not None and deepest >= 2:
            return errors.InvalidInput([(self.field, f"{why}; nothing was done, and the rest of the request was not "
                                                     "read.")])
        return errors.InvalidInput([(None, f"the request body {why}; nothing was done, and the rest of it was not "
                                           "read.")])
