"""Every registered harness's record (agent_mail.harnesses), checked the same way: registering a harness is what puts
it under these tests. What each record says is proven against the real harness in tests/harnesses/; here, that it
says all the layers ask, and that a harness's module is loaded only where that harness is used."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agent_mail import harnesses
from agent_mail.harnesses import record
from tests.lib.cli import process_env

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("name", harnesses.NAMES)
def test_a_harness_record_says_what_every_layer_asks(name):
    kind = harnesses.of(name)
    assert kind.name == name and kind.title and kind.program and kind is harnesses.get(name)
    assert kind.wake in (record.HOOK, record.WAKER, record.RUN) and kind.wakes_idle == (kind.wake != record.RUN)
    # liveness: how soon a live session hears of mail, in words that name the harness
    assert (kind.woken is None) == (kind.wake == record.RUN)
    assert kind.woken is None or (kind.woken.startswith("woken") and f"a live {kind.title} session" in kind.woken)
    assert kind.told.startswith("told at its next") and f"a live {kind.title} session" in kind.told
    # the hooks' input and output
    assert kind.read_input({"session_id": "s", "hook_event_name": "Stop"})["session_id"] == "s"
    assert "a note" in json.dumps(kind.context_output(kind.context_event, "a note"))
    assert "a refusal" in json.dumps(kind.denial("a refusal")) and kind.stop_decision in ("block", "deny")
    assert kind.quiet is None or json.dumps(kind.quiet) == "{}"
    assert kind.tool_named("read") != kind.tool_named("send") and kind.tool_named("read").endswith("read")
    assert kind.edit_tools and set(kind.patch_tools) <= set(kind.edit_tools)
    # setup
    if kind.set_up_at is None:  # set up where a file in the directory says so, or where its record says
        path, marks = kind.marker
        assert path and marks
    assert kind.notes and all(isinstance(note, str) and note for note in kind.notes)
    assert callable(kind.plans) and callable(kind.hook_entry)


def test_a_record_is_frozen_and_an_unknown_name_has_none():
    kind = harnesses.of(harnesses.NAMES[0])
    with pytest.raises(AttributeError):
        kind.told = "anything"
    assert harnesses.get("no-such-harness") is None
    with pytest.raises(KeyError):
        harnesses.of("no-such-harness")


def _loaded(code: str, stdin: str = "", env: dict | None = None) -> list[str]:
    """The harness modules a Python process running `code` loaded (it prints nothing else)."""
    probe = code + "\nimport sys\nprint(sorted(m for m in sys.modules if m.startswith('agent_mail.harnesses.')))"
    done = subprocess.run([sys.executable, "-c", probe], input=stdin, capture_output=True, text=True,
                          env=env or process_env())
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_the_command_lines_start_loads_no_harness_module():
    assert _loaded("import agent_mail.cli.main") == []


@pytest.mark.parametrize("name", harnesses.NAMES)
def test_a_hook_loads_its_own_harness_module_and_no_other(name, tmp_path):
    """A hook runs on every tool call: it loads the record of its harness, never the other harnesses' modules (but
    the one a fork is built on: Kilo Code's record is OpenCode's support, by parameter)."""
    module = "agent_mail.harnesses." + name.replace("-", "_")
    built_on = {"kilo": ["agent_mail.harnesses.opencode"]}.get(name, [])
    code = ("import io, sys\nfrom agent_mail.cli import main\nsys.stdout = io.StringIO()\n"
            f"code = main.main(['hook', {name!r}, 'context', '--agent', 'proj:coder'])\n"
            "sys.stdout = sys.__stdout__\nassert code == 0, code")
    found = _loaded(code, stdin=json.dumps({"session_id": "s1", "hook_event_name": "SessionStart"}),
                    env=process_env(AGENT_MAIL_DB=str(tmp_path / "mail.db")))
    assert found == sorted(["agent_mail.harnesses.record", module, *built_on])
