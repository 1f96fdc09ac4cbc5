"""jsonout must produce exactly what json.dumps(indent=2, ensure_ascii=False) produces."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_mail import jsonout
from conftest import examples

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


def test_tuples_are_arrays():
    assert jsonout.dumps({"a": (1, "x")}) == json.dumps({"a": [1, "x"]}, indent=2)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {1: "x"}, object(), {"a": {1, 2}}])
def test_what_json_cannot_express_is_an_error(bad):
    with pytest.raises((TypeError, ValueError)):
        jsonout.dumps(bad)
