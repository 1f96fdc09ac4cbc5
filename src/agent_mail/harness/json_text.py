"""Edit a JSON (or JSONC) settings file as text: only what changed is rewritten, the rest kept byte for byte.

setup merges its entries into files people write and commit: their indentation, inline arrays, key order,
final newline and (in JSONC, which OpenCode reads) comments and trailing commas stay as they were. `edited(text,
new)` parses `text` with the span of every value, then walks the old and new documents together: an equal value
keeps its text; an object or array that changed keeps its own text with members (or elements) taken out or added,
in the style around them (the indentation of their neighbours, one line each, or inline in an inline container);
anything else is written anew in the file's indentation. Adding a member and taking it out again are exact
inverses, so `setup` then `setup --remove` gives back the bytes it found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


class JSONTextError(ValueError):
    """The text is not JSON (or JSONC, where comments and trailing commas are allowed): `position` says where."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} at character {position}")
        self.position = position


@dataclass
class Node:
    """A value in the text: its span [start, end), the value, and for a container its items."""

    start: int
    end: int
    value: object
    items: list = field(default_factory=list)  # Item for an object's members and an array's elements


@dataclass
class Item:
    """An object's member ("key": value, `key` set) or an array's element: its span and its value's node."""

    start: int
    end: int
    node: Node
    key: str | None = None


_WHITESPACE = " \t\r\n"


class _Parser:
    def __init__(self, text: str, comments: bool):
        self.text = text
        self.comments = comments
        self.at = 0

    def fail(self, message: str):
        raise JSONTextError(message, self.at)

    def skip(self) -> None:
        text, n = self.text, len(self.text)
        while self.at < n:
            char = text[self.at]
            if char in _WHITESPACE:
                self.at += 1
            elif self.comments and text.startswith("//", self.at):
                newline = text.find("\n", self.at)
                self.at = n if newline < 0 else newline + 1
            elif self.comments and text.startswith("/*", self.at):
                close = text.find("*/", self.at + 2)
                if close < 0:
                    self.fail("unterminated comment")
                self.at = close + 2
            else:
                return

    def value(self) -> Node:
        self.skip()
        if self.at >= len(self.text):
            self.fail("expected a value")
        char = self.text[self.at]
        if char == "{":
            return self.container("}", True)
        if char == "[":
            return self.container("]", False)
        if char == '"':
            start = self.at
            value = self.string()
            return Node(start, self.at, value)
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in _WHITESPACE + ",]}/":
            self.at += 1
        word = self.text[start:self.at]
        try:
            value = json.loads(word)
        except ValueError:
            self.at = start
            self.fail(f"unexpected {word[:20]!r}" if word else f"unexpected {char!r}")
        if isinstance(value, (dict, list, str)):
            self.at = start
            self.fail(f"unexpected {word[:20]!r}")
        return Node(start, self.at, value)

    def string(self) -> str:
        start = self.at
        self.at += 1
        text, n = self.text, len(self.text)
        while self.at < n:
            char = text[self.at]
            if char == "\\":
                self.at += 2
            elif char == '"':
                self.at += 1
                try:
                    return json.loads(text[start:self.at])
                except ValueError:
                    self.at = start
                    self.fail("a bad string")
            else:
                self.at += 1
        self.at = start
        self.fail("unterminated string")
        return ""  # unreachable

    def container(self, close: str, is_object: bool) -> Node:
        start = self.at
        self.at += 1
        items: list[Item] = []
        result: dict | list = {} if is_object else []
        while True:
            self.skip()
            if self.at < len(self.text) and self.text[self.at] == close:
                self.at += 1
                return Node(start, self.at, result, items)
            if items:
                if self.at >= len(self.text) or self.text[self.at] != ",":
                    self.fail(f"expected ',' or '{close}'")
                self.at += 1
                self.skip()
                if self.comments and self.at < len(self.text) and self.text[self.at] == close:
                    continue  # a trailing comma (JSONC)
            item_start = self.at
            key = None
            if is_object:
                if self.at >= len(self.text) or self.text[self.at] != '"':
                    self.fail("expected a member name in double quotes")
                key = self.string()
                self.skip()
                if self.at >= len(self.text) or self.text[self.at] != ":":
                    self.fail("expected ':'")
                self.at += 1
            node = self.value()
            items.append(Item(item_start, node.end, node, key))
            if is_object:
                result[key] = node.value
            else:
                result.append(node.value)


def parse(text: str, comments: bool = False) -> Node:
    """The document in `text` with the span of every value; `comments` allows JSONC's comments and trailing
    commas. JSONTextError when it is not one value."""
    parser = _Parser(text, comments)
    node = parser.value()
    parser.skip()
    if parser.at != len(text):
        parser.fail("extra text after the value")
    return node


def indent_unit(text: str) -> str:
    """The file's indentation step: the leading whitespace of its least-indented indented line (2 spaces if none)."""
    best = None
    for line in text.splitlines():
        stripped = line.lstrip(" \t")
        if stripped and stripped != line and stripped[0] not in "/*":
            lead = line[: len(line) - len(stripped)]
            if best is None or len(lead) < len(best):
                best = lead
    return best or "  "


def dumped(value: object, unit: str, base: str, inline: bool) -> str:
    """`value` as JSON in the file's style: one line (inline), or indented by `unit` from the line at `base`."""
    if inline:
        return json.dumps(value, ensure_ascii=False)
    text = json.dumps(value, ensure_ascii=False, indent=len(unit) if unit.strip(" ") == "" else 1)
    if unit and unit.strip(" ") == "":
        lines = text.split("\n")
    else:  # tabs (or a mixed unit): re-indent by counting json's one-space steps
        lines = []
        for line in text.split("\n"):
            stripped = line.lstrip(" ")
            lines.append(unit * (len(line) - len(stripped)) + stripped)
    return "\n".join([lines[0]] + [base + line for line in lines[1:]])


def _line_start(text: str, at: int) -> int:
    return text.rfind("\n", 0, at) + 1


def _indent_of(text: str, at: int) -> str:
    start = _line_start(text, at)
    lead = text[start:at]
    return lead if lead.strip(" \t") == "" else ""


class _Editor:
    def __init__(self, text: str, unit: str):
        self.text = text
        self.unit = unit

    def render(self, node: Node, new: object) -> str:
        old = node.value
        if type(old) is type(new) and old == new:
            return self.text[node.start:node.end]
        if isinstance(old, dict) and isinstance(new, dict):
            return self.container(node, new, True)
        if isinstance(old, list) and isinstance(new, list):
            return self.container(node, new, False)
        base = _indent_of(self.text, node.start) or self._base_of(node)
        return dumped(new, self.unit, base, self._inline(node))

    def _base_of(self, node: Node) -> str:
        """The indentation of the line a value starts on (a member's value follows its key on that line)."""
        start = _line_start(self.text, node.start)
        line = self.text[start:node.start]
        return line[: len(line) - len(line.lstrip(" \t"))]

    def _inline(self, node: Node) -> bool:
        """A container written on one line (or within an inline one) stays on one line."""
        return "\n" not in self.text[node.start:node.end] and node.end - node.start > 2 and \
            isinstance(node.value, (dict, list))

    def container(self, node: Node, new: dict | list, is_object: bool) -> str:
        text = self.text
        items = node.items
        # What each old item becomes: kept (its value rendered in place) or gone; then what is added at the end.
        if is_object:
            assert isinstance(new, dict)
            plan = [(item, new[item.key]) if item.key in new else (item, _GONE) for item in items]
            added = [(key, value) for key, value in new.items() if key not in {i.key for i in items}]
        else:
            assert isinstance(new, list)
            plan, added = self._aligned(items, new)
        inline = "\n" not in text[node.start:node.end] and bool(items)  # an empty one opens onto lines of its own
        kept = [index for index, (_, value) in enumerate(plan) if value is not _GONE]
        skip = None  # the comma after the last kept item, when every item after it goes and none had a comma after it
        if kept and kept[-1] < len(items) - 1 and self._after_comma(items[-1]) is None:
            after = self._after_comma(items[kept[-1]])
            skip = None if after is None else after - 1

        def segment(a: int, b: int) -> str:
            if skip is not None and a <= skip < b:
                return text[a:skip] + text[skip + 1:b]
            return text[a:b]

        pieces: list[str] = []
        at = node.start
        for index, (item, value) in enumerate(plan):
            if value is _GONE:
                cut_start, cut_end = self._cut(node, index, inline, bool(kept) and kept[-1] > index)
                pieces.append(segment(at, cut_start))
                at = max(at, cut_end)
                continue
            pieces.append(segment(at, item.node.start))
            pieces.append(self.render(item.node, value))
            at = item.node.end
        tail = segment(at, node.end)
        rebuilt = "".join(pieces)
        if not kept and not added:
            # Every item taken out: a container left with only blank space inside is written empty.
            if (rebuilt[1:] + tail[:-1]).strip(_WHITESPACE + ",") == "":
                return text[node.start] + text[node.end - 1]
            return rebuilt + tail
        if not added:
            return rebuilt + tail
        if not kept:  # the container held nothing (or nothing kept): what is added opens onto lines of its own
            return (rebuilt + tail[:-1]).rstrip(_WHITESPACE) + self._added(node, None, added, tail[-1], inline,
                                                                            is_object)
        return rebuilt + self._added(node, items[kept[-1]], added, tail, inline, is_object)

    def _aligned(self, items: list[Item], new: list) -> tuple[list, list]:
        """Old elements matched to new ones in order: equal ones kept, the rest changed in place, taken out, or
        added at the end (what setup does to a list: its entries taken out, then appended)."""
        from difflib import SequenceMatcher

        def key(value):
            return json.dumps(value, sort_keys=True, ensure_ascii=False)

        old_keys = [key(item.node.value) for item in items]
        new_keys = [key(value) for value in new]
        plan: list = []
        added: list = []
        for tag, i1, i2, j1, j2 in SequenceMatcher(a=old_keys, b=new_keys, autojunk=False).get_opcodes():
            if tag == "equal":
                plan += [(items[i], new[j]) for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
            elif tag == "delete":
                plan += [(items[i], _GONE) for i in range(i1, i2)]
            elif tag == "insert":
                if i1 != len(items):
                    return self._rewritten(items, new)
                added += [(None, new[j]) for j in range(j1, j2)]
            else:  # replace: changed in place, pair by pair, the rest taken out or added at the end
                pairs = min(i2 - i1, j2 - j1)
                plan += [(items[i1 + k], new[j1 + k]) for k in range(pairs)]
                plan += [(items[i], _GONE) for i in range(i1 + pairs, i2)]
                if j1 + pairs < j2:
                    if i2 != len(items):
                        return self._rewritten(items, new)
                    added += [(None, new[j]) for j in range(j1 + pairs, j2)]
        return plan, added

    @staticmethod
    def _rewritten(items: list[Item], new: list) -> tuple[list, list]:
        """An insertion in the middle: the elements are changed in place and the rest added at the end."""
        pairs = min(len(items), len(new))
        plan = [(items[k], new[k]) for k in range(pairs)] + [(item, _GONE) for item in items[pairs:]]
        return plan, [(None, value) for value in new[pairs:]]

    def _cut(self, node: Node, index: int, inline: bool, kept_after: bool) -> tuple[int, int]:
        """The span to take out with item `index`: the item, the comma after it, and (one to a line) its line."""
        text = self.text
        item = node.items[index]
        after = self._after_comma(item)  # just past the comma that follows it, or None
        if inline:
            if after is not None and kept_after:
                end = after
                while end < node.end - 1 and text[end] in " \t":
                    end += 1
                return item.start, end
            if index > 0:  # the last kept one before it keeps no comma: ", item" goes
                return node.items[index - 1].node.end, (after if after is not None else item.node.end)
            return item.start, (after if after is not None else item.node.end)
        end = after if after is not None else item.node.end
        line_end = text.find("\n", end)
        own_line = _line_start(text, item.start) if text[_line_start(text, item.start):item.start].strip(" \t") == "" \
            else None
        if own_line is not None and line_end >= 0 and text[end:line_end].strip(" \t\r") == "":
            return own_line, line_end + 1
        return item.start, end

    def _after_comma(self, item: Item) -> int | None:
        text = self.text
        probe = _Parser(text, True)
        probe.at = item.node.end
        probe.skip()
        if probe.at < len(text) and text[probe.at] == ",":
            return probe.at + 1
        return None

    def _added(self, node: Node, last: Item | None, added: list, tail: str, inline: bool, is_object: bool) -> str:
        """The text from the last kept item's end to the container's end, with `added` items appended."""
        text = self.text

        def item_text(key, value, base):
            body = dumped(value, self.unit, base, inline)
            return (json.dumps(key, ensure_ascii=False) + ": " + body) if is_object else body

        if inline:
            joined = ", ".join(item_text(k, v, "") for k, v in added)
            if last is None:
                return joined + tail
            return ", " + joined + tail
        if last is None:
            closing = _indent_of(text, node.end - 1) or self._base_of(node)
            base = closing + self.unit
            joined = (",\n" + base).join(item_text(k, v, base) for k, v in added)
            return "\n" + base + joined + "\n" + closing + tail
        base = _indent_of(text, last.start) or self._base_of(last.node)
        # After the last item's line (its comma, and a comment that ends the line, stay where they are), one line
        # each; a trailing comma (JSONC) stays the style.
        at = len(tail) - len(tail.lstrip(" \t"))
        trailing = tail[at:at + 1] == ","
        at += trailing
        line_end = tail.find("\n", at)
        rest = tail[at:line_end].strip(" \t\r") if line_end >= 0 else None
        if rest is not None and line_end < len(tail) - 1 and (not rest or rest.startswith("//") or (
                rest.startswith("/*") and rest.endswith("*/"))):
            lines = "".join("\n" + base + item_text(k, v, base) + ("," if n < len(added) - 1 or trailing else "")
                            for n, (k, v) in enumerate(added))
            return ("" if trailing else ",") + tail[:line_end] + lines + tail[line_end:]
        return "".join(",\n" + base + item_text(k, v, base) for k, v in added) + tail


_GONE = object()


def edited(text: str, new: object, comments: bool = False) -> str:
    """`text` (a JSON document, JSONC with `comments`) changed to hold `new`, rewriting only what changed."""
    root = parse(text, comments)
    return text[:root.start] + _Editor(text, indent_unit(text)).render(root, new) + text[root.end:]
