"""JSON output, byte for byte what `json.dumps(value, indent=2, ensure_ascii=False)` produces, except that the
characters a terminal could take as a command are escaped too: DEL and the C1 controls U+0080-U+009F (U+009B is
an 8-bit CSI to many terminals) as `\\u0080`..., and the line and paragraph separators U+2028 and U+2029. JSON
readers decode them to the same strings; a person or a model shown the text sees the escape, never a command.

Why not json.dumps itself: `import json` pulls in `re` and `enum` and costs about 8 ms,
a quarter of a whole `agent-mail read`. Strings are escaped by the same C function
json.dumps uses (`_json.encode_basestring`), then the few characters above by `str.translate`, only in a string
that holds one (ASCII text is known at once to hold none but DEL); this module only lays out containers.
A property test compares the two on arbitrary documents. Decoding a small document on a hot path (a
hook's input, before every tool call) uses `loads`, the same C scanner json.loads runs, without the json
module; a document it does not take whole is handed to json.loads, so errors read exactly as json's.
"""

from __future__ import annotations

try:
    from _json import encode_basestring as _json_quote
except ImportError:  # an interpreter without the C accelerator
    from json.encoder import py_encode_basestring as _json_quote

# What json.dumps(ensure_ascii=False) leaves as it is and this module escapes (see the module's docstring).
RAW_ESCAPED = {c: f"\\u{c:04x}" for c in (0x7f, *range(0x80, 0xa0), 0x2028, 0x2029)}
_RAW_CHARS = tuple(map(chr, RAW_ESCAPED))


def _quote(value: str) -> str:
    """json.dumps's string, with RAW_ESCAPED's characters escaped too."""
    text = _json_quote(value)
    if text.isascii():  # a flag of the string: no scan
        return text if "\x7f" not in text else text.replace("\x7f", "\\u007f")
    return text if text.isprintable() else text.translate(RAW_ESCAPED)


def _filled(template: str, values) -> str:
    """`template` % the values quoted as _quote does, for a flat object of strings (the hot path of a large
    watch: json's C function for each value, and one look at the whole object for what it leaves)."""
    quoted = tuple(map(_json_quote, values))
    text = template % quoted
    if text.isascii():
        return text if "\x7f" not in text else text.replace("\x7f", "\\u007f")
    if "".join(quoted).isprintable():
        return text
    return template % tuple(q if q.isprintable() else q.translate(RAW_ESCAPED) for q in quoted)


def escaped(text: str) -> str:
    """JSON text (or any text) with RAW_ESCAPED's characters escaped: in JSON they can only stand inside a string,
    where the escape reads back as the same character."""
    if text.isascii():
        return text if "\x7f" not in text else text.replace("\x7f", "\\u007f")
    # A search per character is a fast scan of the text (about 1 ms for 2 MB, all 35 together); translate()
    # looks each character up (about 50 ms for 2 MB): only for text that holds one.
    if any(char in text for char in _RAW_CHARS):
        return text.translate(RAW_ESCAPED)
    return text

_INFINITY = float("inf")
_WHITESPACE = " \t\n\r"  # what json skips around a document
_SCANNER: list = []
_LEAN_KEYS = ("id", "sender", "subject", "type", "created")
_TEMPLATES: dict[tuple, str] = {}  # (level, keys...) -> layout of a flat object of strings


class _Decoding:
    """What json.JSONDecoder() hands its C scanner: the defaults of json.loads."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": -_INFINITY, "Infinity": _INFINITY, "NaN": float("nan")}.__getitem__


def loads(text: str):
    """json.loads(text), the same values, without importing json (its `re` and `enum`) when `text` is one
    well-formed document; otherwise json.loads itself decides (and raises its own error)."""
    if not _SCANNER:
        try:
            from _json import make_scanner
        except ImportError:  # an interpreter without the C accelerator
            _SCANNER.append(None)
        else:
            _SCANNER.append(make_scanner(_Decoding()))
    document = text.strip(_WHITESPACE)
    if _SCANNER[0] is not None and document:
        try:
            value, end = _SCANNER[0](document, 0)
        except Exception:  # noqa: BLE001 - malformed: json.loads below raises json's own error
            pass
        else:
            if end == len(document):
                return value
    import json

    return json.loads(text)


def quoted(value) -> str:
    """json.dumps(value, ensure_ascii=False) for a string (or None, shown as null), RAW_ESCAPED's escaped too."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return _quote(value)
    import json

    return escaped(json.dumps(value, ensure_ascii=False))


class Rendered:
    """A JSON array of objects already laid out as text, each for nesting depth `level` (the depth
    of the array's members): `dumps` inserts them as they are when the array sits at that depth.

    A watch over a backlog lists tens of thousands of envelopes; SQLite lays each out while it
    reads the index (`sqlite_lean_layout`), which spares a Python object per value. To Python
    code it is the list of objects, decoded when first used.
    """

    __slots__ = ("members", "level", "_decoded")

    def __init__(self, members: list[str], level: int) -> None:
        self.members, self.level, self._decoded = members, level, None

    def decoded(self) -> list:
        if self._decoded is None:
            import json

            self._decoded = [json.loads(member) for member in self.members]
        return self._decoded

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self):
        return iter(self.decoded())

    def __getitem__(self, index):
        return self.decoded()[index]

    def __eq__(self, other: object) -> bool:
        return self.decoded() == (other.decoded() if isinstance(other, Rendered) else other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Rendered({self.decoded()!r})"


def lean_layout(level: int) -> tuple[str, ...]:
    """The fixed text around the five envelope values (id, sender, subject, type, created) of an object
    at nesting depth `level`, as `dumps` lays it out: six pieces for five values."""
    inner = ",\n" + "  " * (level + 1)
    keys = [_quote(key) + ": " for key in _LEAN_KEYS]
    return ("{" + inner[1:] + keys[0], *(inner + key for key in keys[1:]), "\n" + "  " * level + "}")


WATCH_LEVEL = 2  # where a watch result's envelopes sit: result["messages"][i]


def sqlite_lean_layout(level: int, alias: str = "m.") -> str:
    """SQL for SQLite laying out a message's envelope as `dumps` does at nesting depth `level` (`alias`: the
    messages table's, with its dot): json_quote escapes exactly what the json module does (quote, backslash,
    control characters; \\b \\f \\n \\r \\t short), and keeps other characters as they are (tests compare
    the two). The SQLite store reads it per row, or from the index that holds it at a watch's depth."""
    pieces = [f"'{piece}'" for piece in lean_layout(level)]
    values = [f"json_quote({alias}{key})" for key in _LEAN_KEYS]  # each key is its column's name
    return " || ".join(p for pair in zip(pieces[:-1], values, strict=True) for p in pair) + " || " + pieces[-1]


class OneLine(dict):
    """A document written as one line of JSON (a stream of updates, JSON Lines), not indented."""


def dumps(value: object, end: str = "") -> str:
    """`value` as indented JSON text (2 spaces), non-ASCII kept as is, followed by `end` (OneLine: one line)."""
    if isinstance(value, OneLine):
        import json

        return escaped(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) + end
    parts: list[str] = []
    _encode(value, 0, parts.append)
    parts.append(end)
    return "".join(parts)


def _encode(value: object, level: int, out) -> None:
    text = _scalar(value)
    if text is not None:
        out(text)
    elif type(value) is Rendered:
        if not value.members:
            out("[]")
        elif value.level == level + 1:
            inner = ",\n" + "  " * (level + 1)
            out("[" + inner[1:])
            # Megabytes for a large backlog: copied once here, not again (nor when nothing needs escaping).
            out(escaped(inner.join(value.members)))  # SQLite's json_quote leaves DEL and C1 as they are
            out("\n" + "  " * level + "]")
        else:
            _encode(value.decoded(), level, out)
    elif isinstance(value, dict):
        if not value:
            out("{}")
            return
        inner = ",\n" + "  " * (level + 1)
        close = "\n" + "  " * level + "}"
        # A flat object of strings (an envelope, thousands of them in one watch result): laid out from a
        # template made once per shape, one substitution per object.
        shape = (level, *value)
        template = _TEMPLATES.get(shape)
        if template is None and all(type(k) is str for k in value):
            template = _TEMPLATES[shape] = ("{" + inner[1:] + inner.join(
                _quote(k).replace("%", "%%") + ": %s" for k in value) + close)
        if template is not None:
            try:
                out(_filled(template, value.values()))
                return
            except TypeError:
                pass  # some value is not a string: lay it out member by member
        first = True
        for key, item in value.items():
            if type(key) is not str:
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            # Strings (most values) are laid out here, without a call per value: large results (a watch
            # over thousands of envelopes) spend their time in this loop.
            lead = ("{" + inner[1:]) if first else inner
            first = False
            if type(item) is str:
                out(lead + _quote(key) + ": " + _quote(item))
                continue
            out(lead + _quote(key) + ": ")
            _encode(item, level + 1, out)
        out(close)
    elif isinstance(value, (list, tuple)):
        if not value:
            out("[]")
            return
        inner = ",\n" + "  " * (level + 1)
        out("[" + inner[1:])
        first = True
        for item in value:
            if not first:
                out(inner)
            first = False
            if type(item) is dict and item:  # the flat-object fast path, without a call per item
                template = _TEMPLATES.get((level + 1, *item))
                if template is not None:
                    try:
                        out(_filled(template, item.values()))
                        continue
                    except TypeError:
                        pass
            _encode(item, level + 1, out)
        out("\n" + "  " * level + "]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _scalar(value: object) -> str | None:
    """The JSON text of a string, number, boolean or null; None for containers."""
    kind = type(value)
    if kind is str:
        return _quote(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value != value or value in (_INFINITY, -_INFINITY):
            raise ValueError(f"{value!r} has no JSON form")
        return float.__repr__(value)
    return None
