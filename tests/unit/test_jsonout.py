"""jsonout must produce exactly what json.dumps(indent=2, ensure_ascii=False) produces."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_mail import jsonout
from tests.lib.fuzz import examples

_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
    st.text(), st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9f)),
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
    assert jsonout.dumps(document) == json.dumps(document, indent=2, ensure_ascii=False)


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
