"""JSON output, byte for byte what `json.dumps(value, indent=2, ensure_ascii=False)` produces.

Why not json.dumps itself: `import json` pulls in `re` and `enum` and costs about 8 ms,
a quarter of a whole `agent-mail read`. Strings are escaped by the same C function
json.dumps uses (`_json.encode_basestring`); this module only lays out containers.
A property test compares the two on arbitrary documents. Decoding, which only some
commands need, still uses the json module, imported where it is needed.
"""

from __future__ import annotations

try:
    from _json import encode_basestring as _quote
except ImportError:  # an interpreter without the C accelerator
    from json.encoder import py_encode_basestring as _quote

_INFINITY = float("inf")


def dumps(value: object) -> str:
    """`value` as indented JSON text (2 spaces), non-ASCII kept as is."""
    parts: list[str] = []
    _encode(value, 0, parts.append)
    return "".join(parts)


def _encode(value: object, level: int, out) -> None:
    if isinstance(value, str):
        out(_quote(value))
    elif value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif isinstance(value, int):
        out(int.__repr__(value))
    elif isinstance(value, float):
        if value != value or value in (_INFINITY, -_INFINITY):
            raise ValueError(f"{value!r} has no JSON form")
        out(float.__repr__(value))
    elif isinstance(value, dict):
        if not value:
            out("{}")
            return
        inner = "\n" + "  " * (level + 1)
        separator = "{"
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"JSON object keys must be strings, not {type(key).__name__}")
            out(separator + inner + _quote(key) + ": ")
            _encode(item, level + 1, out)
            separator = ","
        out("\n" + "  " * level + "}")
    elif isinstance(value, (list, tuple)):
        if not value:
            out("[]")
            return
        inner = "\n" + "  " * (level + 1)
        separator = "["
        for item in value:
            out(separator + inner)
            _encode(item, level + 1, out)
            separator = ","
        out("\n" + "  " * level + "]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON serialisable")
