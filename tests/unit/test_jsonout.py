"""jsonout must produce exactly what json.dumps(indent=2, ensure_ascii=False) produces, but for the characters a
terminal could take as a command (DEL, C1, U+2028, U+2029), which it escapes."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_mail import jsonout
from tests.lib.fuzz import examples

# Written out here rather than taken from jsonout: what a terminal could take as a command (DEL, the C1 controls:
# U+009B is an 8-bit CSI) and the line and paragraph separators, escaped where json.dumps keeps them as they are.
_RAW = [0x7f, *range(0x80, 0xa0), 0x2028, 0x2029]
_ESCAPED = {c: "\\u%04x" % c for c in _RAW}


def reference(document, **options) -> str:
    return json.dumps(document, ensure_ascii=False, **options).translate(_ESCAPED)


_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9f)),
    st.text(alphabet=st.sampled_from("a é\x1b\x7f\x85\x9b\u2028\u2029\u200d😀\"\\")),
    st.binary(max_size=20).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
_DOCUMENTS = st.recursive(
    _SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(st.text(max_size=8), children,
                                                                                max_size=5)),
    max_leaves=40,
)


@settings(max_examples=examples(500), deadline=None)
@given(_DOCUMENTS)
def test_same_text_as_json_dumps(document):
    text = jsonout.dumps(document)
    assert text == reference(document, indent=2)
    assert not any(chr(c) in text for c in _RAW)  # nothing a terminal would take as a command
    assert json.loads(text) == json.loads(json.dumps(document))  # and it reads back as the same document
    assert jsonout.dumps(jsonout.OneLine(x=document)) == reference({"x": document}, separators=(",", ":"))
    if isinstance(document, str):
        assert jsonout.quoted(document) == reference(document)


def test_what_a_terminal_takes_as_a_command_is_escaped():
    """U+009B is an 8-bit CSI to many terminals; json.dumps(ensure_ascii=False) writes it as it is."""
    text = jsonout.dumps({"subject": "a\x9b2Jb\x1b]0;x\x07\x7f\u2028é"})
    assert text == '{\n  "subject": "a\\u009b2Jb\\u001b]0;x\\u0007\\u007f\\u2028é"\n}'
    assert set(jsonout.RAW_ESCAPED) == set(_RAW)


@pytest.mark.fast
def test_tuples_are_arrays():
    assert jsonout.dumps({"a": (1, "x")}) == json.dumps({"a": [1, "x"]}, indent=2)


@pytest.mark.fast
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {1: "x"}, object(), {"a": {1, 2}}])
def test_what_json_cannot_express_is_an_error(bad):
    with pytest.raises((TypeError, ValueError)):
        jsonout.dumps(bad)


def _decoded(decode, text: str):
    try:
        return "ok", repr(decode(text))
    except ValueError as exc:  # json.JSONDecodeError
        return type(exc).__name__, str(exc)


@settings(max_examples=examples(500), deadline=None)
@given(st.one_of(_DOCUMENTS.map(json.dumps), _DOCUMENTS.map(lambda d: f" \n{json.dumps(d, indent=1)}\t"),
                 st.text(max_size=40), _DOCUMENTS.map(json.dumps).flatmap(
                     lambda text: st.integers(0, len(text)).map(lambda cut: text[:cut]))))
def test_loads_reads_as_json_loads(text):
    """The hooks' decoder: the same values, and for a broken document json's own error, word for word."""
    assert _decoded(jsonout.loads, text) == _decoded(json.loads, text)


@pytest.mark.fast
@pytest.mark.parametrize("value", ["plain", "quote \" and \\ and \n and é", None])
def test_quoted_is_json_dumps(value):
    assert jsonout.quoted(value) == json.dumps(value, ensure_ascii=False)
