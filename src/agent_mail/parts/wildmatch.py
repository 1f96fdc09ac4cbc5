"""Reservation patterns: git's wildmatch (gitignore syntax) relative to a repository's root.

Two questions are asked of a pattern. Does it cover this path? A pattern without a wildcard is compared as
text (the common case, and no import); one with a wildcard is matched by the maintained `pathspec` library,
imported only then. Do two patterns overlap, i.e. is there a file path both cover? No matching library
answers that, so each pattern is read here into a small automaton over the characters of a path and the two
are walked together (with a third that admits only well-formed paths): both directions at once, `**`,
character classes and directories included. Tests hold the two readings to each other.

A pattern covers the paths it matches and, when its last part is a plain name, a `**` or ends in `/`, everything
below (as ignoring a directory ignores what is in it): `src` and `docs/` and `src/**` cover what is under them,
while `*.py` covers Python files, not a directory that happens to be named `x.py`, and `src/*` the files right
in src (as .gitattributes reads it). A pattern without a `/` matches at any depth (`*.py`, `Makefile`); one with
a `/` anywhere, a trailing one included, from the root: gitignore leaves `docs/` unanchored, but an agent writing
it means the top-level docs (write `**/docs/` for any depth). `!` (negation) reserves nothing and is refused; so
is a leading `#` (a comment in a .gitignore).
"""

from __future__ import annotations

from agent_mail import errors, model

_WILD = frozenset("*?[\\")


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be reserved, or None."""
    if not pattern or not pattern.strip():
        return "is empty; give a path or a pattern such as src/** or *.py."
    if pattern.startswith("!"):
        return (f"{pattern!r}: negation (!) is not a reservation (it would reserve nothing); reserve the paths you "
                "want instead, or write \\! for a name that begins with !.")
    if pattern.startswith("#"):
        return f"{pattern!r} would be a comment in gitignore syntax; write \\# for a name that begins with #."
    if "\x00" in pattern or "\n" in pattern or "\r" in pattern:
        return f"{pattern!r} holds a NUL or a line break."
    shown = model.name_problem(pattern)  # others are shown it: the refused, the dashboard, the guards
    if shown:
        return f"{pattern!r} {shown}"
    if pattern.strip("/") == "":
        return f"{pattern!r} names the root itself; to reserve everything, use **."
    parts = pattern.strip("/").split("/")
    if any(p in (".", "..") for p in parts) or "" in parts:
        return f"{pattern!r} has an empty, '.' or '..' part; give it relative to the repository's root."
    return None


def check_patterns(patterns: list[str], field: str = "patterns") -> None:
    problems = [(field, p) for p in (pattern_problem(x) for x in patterns) if p]
    if problems:
        raise errors.InvalidInput(problems)


def is_literal(pattern: str) -> bool:
    return not (_WILD & set(pattern))


def canonical(pattern: str) -> str:
    """The pattern as reservations read it: one with a slash anywhere anchored at the root (a leading `/`)."""
    body = pattern.rstrip("/")
    if "/" in pattern and not pattern.startswith("/"):
        return "/" + pattern
    if body != pattern and "/" not in body:
        return "/" + pattern
    return pattern


def _covers_below(pattern: str) -> bool:
    """Whether the pattern covers what lies below what it matches (a plain last part, `**`, or a trailing /)."""
    if pattern.endswith("/"):
        return True
    last = pattern.rsplit("/", 1)[-1]
    return last == "**" or is_literal(last)


class Matcher:
    """Covers-this-path for one pattern (case folded when `fold`)."""

    __slots__ = ("pattern", "fold", "_literal", "_anchored", "_dir_only", "_regex", "_below")

    def __init__(self, pattern: str, fold: bool = False):
        self.pattern = canonical(pattern.lower() if fold else pattern)
        self.fold = fold
        self._below = _covers_below(self.pattern)
        body = self.pattern.rstrip("/")
        self._dir_only = body != self.pattern
        self._anchored = "/" in body
        self._literal = body.lstrip("/") if is_literal(self.pattern) else None
        if self._literal is None and self._anchored and body.endswith("/**") and is_literal(body[:-3]):
            self._literal, self._dir_only = body[:-3].lstrip("/"), True  # /src/** is what lies below /src
        self._regex = None

    def covers(self, path: str) -> bool:
        if self.fold:
            path = path.lower()
        literal = self._literal
        if literal is not None:
            if self._anchored:
                if path.startswith(literal):
                    rest = path[len(literal):]
                    return rest.startswith("/") or (rest == "" and not self._dir_only)
                return False
            parts = path.split("/")
            last = len(parts) - 1
            return any(p == literal and (i < last or not self._dir_only) for i, p in enumerate(parts))
        if self._regex is None:
            self._regex = _compiled(self.pattern)
        if self._below:
            return self._regex.match(path) is not None
        return self._regex.fullmatch(path) is not None


def sieve(matchers: list[Matcher]):
    """A test true of every path any of `matchers` covers (and of few others), or None when there is none: each
    pattern's longest run of plain characters must appear in the path, so a path that holds none of them costs
    one search, not one match per pattern (and needs no pathspec)."""
    import re

    runs = []
    for matcher in matchers:
        run = max(_plain_runs(matcher.pattern), key=len, default="")
        if not run:
            return None
        runs.append(re.escape(run))
    return re.compile("|".join(sorted(set(runs), key=len, reverse=True))).search


def _plain_runs(pattern: str) -> list[str]:
    runs, current, i = [], [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            current.append(pattern[i + 1])
            i += 2
            continue
        if c in "*?[/":
            runs.append("".join(current))
            current = []
            if c == "[":  # skip the class
                found = _class(pattern, i)
                i = found[1] if found else i + 1
                continue
        else:
            current.append(c)
        i += 1
    runs.append("".join(current))
    return runs


def _compiled(pattern: str):
    import warnings

    with warnings.catch_warnings():  # GitWildMatchPattern is git's wildmatch exactly; 1.x nags about its name
        warnings.simplefilter("ignore", DeprecationWarning)
        from pathspec.patterns.gitwildmatch import GitWildMatchPattern

        return GitWildMatchPattern(pattern).regex


# -- overlap: automata over path characters ------------------------------------------------------------------
# A character test is ("lit", c), ("any",) (anything but /), ("slash",), ("every",) (anything, / included) or
# ("class", negated, ((lo, hi), ...)) (one character but /, in or out of the ranges).


def _class(text: str, start: int):
    """The bracket expression at text[start] ('['): (test, index after it), or None if it is not closed."""
    i = start + 1
    negated = i < len(text) and text[i] in "!^"
    if negated:
        i += 1
    ranges, first = [], True
    while i < len(text):
        c = text[i]
        if c == "]" and not first:
            return ("class", negated, tuple(ranges)), i + 1
        first = False
        if c == "\\" and i + 1 < len(text):
            i += 1
            c = text[i]
        if i + 2 < len(text) and text[i + 1] == "-" and text[i + 2] != "]":
            hi_at = i + 2
            hi = text[hi_at]
            if hi == "\\" and hi_at + 1 < len(text):
                hi_at += 1
                hi = text[hi_at]
            ranges.append((c, hi))
            i = hi_at + 1
            continue
        if c == "[" and text[i + 1:i + 2] == ":":  # [:alpha:] and kin: read as "any character" (conservative)
            end = text.find(":]", i + 2)
            if end != -1:
                ranges.append(("\x01", "\U0010ffff"))
                i = end + 2
                continue
        ranges.append((c, c))
        i += 1
    return None


def _segment(text: str) -> list:
    """One segment's tokens: tests and ("star",)."""
    tokens, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            tokens.append(("lit", text[i + 1]))
            i += 2
        elif c == "*":
            while i < len(text) and text[i] == "*":
                i += 1
            tokens.append(("star",))
        elif c == "?":
            tokens.append(("any",))
            i += 1
        elif c == "[":
            found = _class(text, i)
            if found is None:
                tokens.append(("lit", "["))
                i += 1
            else:
                tokens.append(found[0])
                i = found[1]
        else:
            tokens.append(("lit", c))
            i += 1
    return tokens


class _Automaton:
    """An NFA with epsilon moves: edges[state] = [(test or None, next)]."""

    def __init__(self):
        self.edges: list[list] = [[]]
        self.accept: set[int] = set()

    def new(self) -> int:
        self.edges.append([])
        return len(self.edges) - 1

    def add(self, a: int, test, b: int) -> None:
        self.edges[a].append((test, b))

    def closure(self, states) -> frozenset:
        seen, todo = set(states), list(states)
        while todo:
            s = todo.pop()
            for test, nxt in self.edges[s]:
                if test is None and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)


def _automaton(pattern: str) -> _Automaton:
    """What `pattern` covers, as an automaton over the characters of a file path."""
    pattern = canonical(pattern)
    below_too = _covers_below(pattern)
    body = pattern.rstrip("/")
    dir_only = body != pattern
    if "/" not in body:
        body = "**/" + body
    segments = body.lstrip("/").split("/")
    a = _Automaton()
    state = 0
    for index, seg in enumerate(segments):
        last = index == len(segments) - 1
        if seg == "**":
            if last:  # everything inside: "/" (already taken) then one or more characters
                loop = a.new()
                a.add(state, ("every",), loop)
                a.add(loop, ("every",), loop)
                a.accept.add(loop)
                return a
            # zero or more whole directories, each followed by "/"
            inside = a.new()
            a.add(state, ("any",), inside)
            a.add(inside, ("any",), inside)
            a.add(inside, ("slash",), state)
            continue
        for token in _segment(seg):
            if token[0] == "star":
                a.add(state, ("any",), state)
            else:
                nxt = a.new()
                a.add(state, token, nxt)
                state = nxt
        if not last:
            nxt = a.new()
            a.add(state, ("slash",), nxt)
            state = nxt
    if not dir_only:
        a.accept.add(state)
    if not below_too:
        return a
    # anything below it (and for a directory only that)
    below = a.new()
    a.add(state, ("slash",), below)
    inner = a.new()
    a.add(below, ("every",), inner)
    a.add(inner, ("every",), inner)
    a.accept.add(inner)
    return a


def _well_formed() -> _Automaton:
    """Relative file paths: non-empty segments joined by single slashes."""
    a = _Automaton()
    inside = a.new()
    a.add(0, ("any",), inside)
    a.add(inside, ("any",), inside)
    a.add(inside, ("slash",), 0)
    a.accept.add(inside)
    return a


def _passes(test, c: str) -> bool:
    kind = test[0]
    if kind == "lit":
        return c == test[1]
    if kind == "slash":
        return c == "/"
    if kind == "every":
        return True
    if c == "/":
        return False
    if kind == "any":
        return True
    inside = any(lo <= c <= hi for lo, hi in test[2])
    return inside != test[1]


def _alphabet(automata) -> list[str]:
    """One character standing for each class of characters no test tells apart."""
    bounds = {0, ord("/"), ord("/") + 1}
    for a in automata:
        for edges in a.edges:
            for test, _ in edges:
                if test is None:
                    continue
                if test[0] == "lit":
                    bounds.update((ord(test[1]), ord(test[1]) + 1))
                elif test[0] == "class":
                    for lo, hi in test[2]:
                        bounds.update((ord(lo), ord(hi) + 1))
    return [chr(b) for b in sorted(bounds) if b <= 0x10FFFF and not 0xD800 <= b <= 0xDFFF]


def overlap(first: str, second: str, fold: bool = False) -> bool:
    """Whether some file path is covered by both patterns (decided both ways at once)."""
    if fold:
        first, second = first.lower(), second.lower()
    if first == second:
        return True
    automata = (_automaton(first), _automaton(second), _well_formed())
    alphabet = _alphabet(automata)
    start = tuple(a.closure({0}) for a in automata)
    seen, todo = {start}, [start]
    while todo:
        current = todo.pop()
        if all(states & a.accept for states, a in zip(current, automata, strict=True)):
            return True
        for c in alphabet:
            nxt = []
            for states, a in zip(current, automata, strict=True):
                moved = {b for s in states for test, b in a.edges[s] if test is not None and _passes(test, c)}
                if not moved:
                    break
                nxt.append(a.closure(moved))
            else:
                key = tuple(nxt)
                if key not in seen:
                    seen.add(key)
                    todo.append(key)
    return False
