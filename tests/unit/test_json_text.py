"""harness/json_text: a settings file edited as text keeps every byte it does not change, and adding an entry
then taking it out again gives back the bytes it started from (JSON and JSONC)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_mail.harness.json_text import JSONTextError, edited, indent_unit, parse

pytestmark = pytest.mark.fast

OURS = {"type": "local", "command": ["python", "-m", "agent_mail", "mcp"], "enabled": True}

CASES = [
    '{\n    "a": 1,\n    "b": [1, 2]\n}\n',
    "{}",
    "{}\n",
    '{\n  "dualOutput": {},\n  "z": 1\n}\n',
    '{"a": {"x": 1}, "b": [1, 2, 3]}',
    '{\n\t"a": 1,\n\t"allow": ["x", "y"]\n}',
    '// top\n{\n  // the model\n  "model": "m", /* inline */\n  "mcp": {\n    "other": {"type": "local"}, // theirs\n'
    '  },\n}\n',
    '{\n  "mcp": {\n    "other": 1 // no comma after me\n  }\n}',
    '{\n  "hooks": {\n    "Stop": [\n      {"hooks": [{"command": "theirs"}]}\n    ]\n  }\n}\n',
]


def _with_ours(document: dict) -> dict:
    changed = json.loads(json.dumps(document))
    changed.setdefault("mcp", {})
    if isinstance(changed["mcp"], dict):
        changed["mcp"]["agent-mail"] = OURS
    changed.setdefault("hooks", {}).setdefault("Stop", []).append({"hooks": [{"command": "ours"}]})
    changed["allow"] = [*changed.get("allow", []), "mcp__agent-mail"]
    return changed


@pytest.mark.parametrize("text", CASES)
def test_adding_then_taking_out_gives_back_the_same_bytes(text):
    comments = "//" in text
    before = parse(text, comments).value
    after = edited(text, _with_ours(before), comments)
    assert parse(after, comments).value == _with_ours(before)
    assert indent_unit(after) == indent_unit(text) or "\n" not in text
    assert edited(after, before, comments) == text


def test_an_equal_document_changes_no_byte():
    text = '{ "a" :1,\n   "b":[ 1,2 ] }'
    assert edited(text, {"a": 1, "b": [1, 2]}) == text


def test_comments_and_trailing_commas_only_where_allowed():
    with pytest.raises(JSONTextError):
        parse('{"a": 1, // no\n}')
    assert parse('{"a": 1, // yes\n}', comments=True).value == {"a": 1}
    for broken in ('{"a": 1', '{"a" 1}', '[1 2]', '{"a": 1} x', '{"a": /* open', "{'a': 1}", '{"a": tru}'):
        with pytest.raises(JSONTextError):
            parse(broken, comments=True)


_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                     max_size=3), max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(document=st.dictionaries(st.text(max_size=4), _values, max_size=4), indent=st.sampled_from([None, 2, 4, "\t"]),
       newline=st.booleans())
def test_any_document_in_any_style_round_trips(document, indent, newline):
    document.pop("mcp", None), document.pop("hooks", None), document.pop("allow", None)
    text = json.dumps(document, indent=indent, ensure_ascii=False) + ("\n" if newline else "")
    after = edited(text, _with_ours(document))
    assert parse(after).value == _with_ours(document)
    assert edited(after, document) == text
