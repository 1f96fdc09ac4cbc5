"""The real Kilo Code CLI, set up by `agent-mail setup kilo`, against a scripted model.

Kilo Code CLI is the npm package @kilocode/cli (`.ci/run` installs the pinned version under .cache/node), built on
OpenCode: setup gives it OpenCode's plugin (in .kilo/plugin/) and the MCP server in the project's kilo.json. The model
is tests/lib/fake_model.py speaking the OpenAI Chat Completions API on 127.0.0.1, named in kilo.json as a provider of
its own, which the test writes first (with comments: Kilo reads JSONC), so setup must merge into it. HOME is a throwaway
directory; updates, model lists, LSP downloads, sharing, telemetry and npm are off. Skipped with the reason where Kilo
is not installed; required in CI.

`kilo run` (one prompt, then exit) proves context, told once, the MCP tools and the guard, by the scenarios OpenCode's
test runs too (tests/lib/opencode_family.py); the interactive TUI in tmux proves what needs an idle session: the held
stop, the idle wake, and the end of the session with Kilo's process, on the mailbox and through an agent-mail server.
Kilo's TUI runs plugins in a worker thread, which sees no exit: the session's end comes from its process's end.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess

import pytest

from agent_mail.harness import json_text
from tests.lib import opencode_family as family
from tests.lib.cli import am_process, process_env
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import HELD, URGENT, Terminal, mail_during_the_turn, private_tmp, send_urgent_mail, status_of
from tests.lib.tools import find

AGENT = "proj:coder"
KILO = find("kilo")
pytestmark = pytest.mark.requires("kilo")
pytest.importorskip("mcp", reason="the mcp extra is not installed")
WOKEN = "agent-mail: new mail arrived while you were idle"
LIVE = "a live Kilo Code session"
# What ends the waiter once Kilo's process is gone is its watch of that process, not its refresh, which comes every
# 5 s (model.REFRESH_SECONDS): the identity stops being reachable well before that.
ENDED_WITHIN_SECONDS = 4


@pytest.fixture
def model():
    with FakeModel() as running:
        yield running


def _project(tmp_path, model, mailbox: str | None = None):
    """A project whose kilo.json (JSONC) names the scripted model, then set up by `agent-mail setup kilo` (for the
    mailbox `mailbox`: the test's, or an agent-mail server's URL)."""
    directory = tmp_path / "project"
    directory.mkdir()
    mine = {"$schema": "https://app.kilo.ai/config.json", "model": "scripted/scripted", "autoupdate": False,
            "provider": {"scripted": {"npm": "@ai-sdk/openai-compatible", "name": "Scripted",
                                      "options": {"baseURL": f"{model.url}/v1", "apiKey": "x"},
                                      "models": {"scripted": {"name": "Scripted"}}}}}
    (directory / "kilo.json").write_text("// the scripted model of the tests\n" + json.dumps(mine, indent=2)
                                         .replace('\n  "model"', '\n  /* theirs */ "model"', 1))
    env = process_env() if mailbox is None else process_env(AGENT_MAIL_DB=mailbox)
    done = am_process("setup", "kilo", "--agent", AGENT, "--dir", str(directory), env=env)
    assert done.returncode == 0, done.stderr
    text = (directory / "kilo.json").read_text()
    settings = json_text.parse(text, comments=True).value
    assert {k: v for k, v in settings.items() if k != "mcp"} == mine  # merged, not overwritten
    assert text.startswith("// the scripted model of the tests\n") and "/* theirs */" in text
    assert (directory / ".kilo" / "plugin" / "agent-mail.js").exists()
    return directory


@pytest.fixture
def project(tmp_path, model):
    return _project(tmp_path, model)


def _env(project, **more: str) -> dict:
    home = project.parent / "kilo-home"
    home.mkdir(exist_ok=True)
    # PWD too: as OpenCode, Kilo looks for its project config from $PWD
    env = process_env(HOME=str(home), PWD=str(project), TMPDIR=private_tmp(home), KILO_DISABLE_AUTOUPDATE="1",
                      KILO_DISABLE_MODELS_FETCH="1", KILO_DISABLE_LSP_DOWNLOAD="1", KILO_DISABLE_SHARE="1",
                      KILO_TELEMETRY_LEVEL="off", **more,
                      # Kilo tries to npm-install @kilocode/plugin into .kilo/ in the background (it has no 7.7.7 on
                      # the registry, and the agent-mail plugin needs none): no network for it
                      npm_config_registry="http://127.0.0.1:9/", npm_config_fetch_retries="0")
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    return env


def _run(project, prompt: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([KILO, "run", prompt], cwd=str(project), env=_env(project), capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_mail_reaches_kilo_once_and_its_mcp_tools_run(project, model):
    family.mail_reaches_the_model_once_and_the_mcp_tools_run(lambda prompt: _run(project, prompt), model, AGENT, LIVE)


def test_mail_after_a_tool_reaches_kilo_once_and_is_not_marked_read(project, model):
    family.mail_after_a_tool_is_told_once_and_not_marked_read(lambda prompt: _run(project, prompt), model, project,
                                                              AGENT)


def test_a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project, model):
    family.a_reserved_file_is_not_written_while_a_free_one_is(lambda prompt: _run(project, prompt), model, project)


def _tui(project, name: str, **more: str) -> Terminal:
    """Interactive `kilo` in tmux, under a shell that stays when Kilo exits: nothing but Kilo's own end (no hang-up
    of the terminal) tells its waiter that the session is over."""
    env = _env(project, **more)
    passed = [k for k in env if k.startswith(("KILO_", "AGENT_MAIL_TOKEN", "npm_config_"))
              or k in ("HOME", "PWD", "TMPDIR", "PYTHONPATH", "PATH")]
    command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), KILO])
    return Terminal(project.parent, f"agent-mail-kilo-{name}-{os.getpid()}", project,
                    f"sh -c {shlex.quote(command + '; echo kilo-ended; exec sleep 600')}")


def _armed_and_idle(terminal) -> dict:
    row = terminal.wait_for(lambda: (lambda r: r["watch_state"] == "armed" and r)(status_of(AGENT)), 30,
                            "no waiter armed while idle")
    assert row["reachable"] and LIVE in row["reached_by"] and row["reached_by"].startswith("woken now")
    assert row["sessions"] == 1
    return row


@pytest.mark.requires("tmux")
def test_an_idle_kilo_is_woken_by_mail_its_stop_held_once_and_it_ends_with_kilo(project, model):
    """Mail that lands during the first turn holds its stop once (sent back as the next prompt); idle afterwards, the
    session is reachable and mail wakes it (a new turn with the envelopes, told once). After /exit (the shell it ran
    in stays, so no hang-up reaches anything) the session no longer counts as live, its waiter is gone and the
    identity is not reachable (what `send --require-reachable` asks), soon after Kilo's process ends."""
    model.script = mail_during_the_turn(family.main, lambda request: request["messages"],
                                        lambda: send_urgent_mail(AGENT))
    with _tui(project, "local") as terminal:
        terminal.wait_for(lambda: "Ask anything" in terminal.screen(), 90, "kilo did not reach its prompt")
        terminal.type("Do the task.", "Enter")
        held = terminal.wait_for(lambda: [r for r in family.loop(model) if HELD in json.dumps(r["messages"])], 60,
                                 "the stop was not held")
        assert URGENT in json.dumps(held[0]["messages"])
        terminal.wait_for(lambda: "I will handle it next." in terminal.screen(), 60, "the held turn did not end")
        _armed_and_idle(terminal)
        turns = len(family.loop(model))
        model.script = lambda request: [{"type": "text", "text": "woken and on it"}] if family.main(request) else None
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Rebase the branch",
                          env=process_env()).returncode == 0
        terminal.wait_for(lambda: len(family.loop(model)) > turns, 30, "the idle session was not woken")
        woken = json.dumps(family.loop(model)[turns]["messages"])
        assert WOKEN in woken and woken.count("Rebase the branch") == 1 and woken.count(URGENT) == 1
        terminal.wait_for(lambda: "woken and on it" in terminal.screen(), 60, "the woken turn did not end")
        waiters = terminal.wait_for(lambda: family.waiters(project, "kilo"), 30, "no waiter re-armed after the wake")
        kilo = _parent(waiters[0])
        terminal.type("/exit", "Enter")
        terminal.wait_for(lambda: not _running(kilo), 30, "kilo did not exit")
        terminal.wait_for(lambda: not status_of(AGENT)["reachable"], ENDED_WITHIN_SECONDS,
                          "the identity stayed reachable after kilo's exit")
        assert status_of(AGENT)["sessions"] == 0
        terminal.wait_for(lambda: not any(map(_running, waiters)), ENDED_WITHIN_SECONDS, "a waiter outlived kilo")
        assert "kilo-ended" in terminal.screen()  # the terminal was never hung up
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 2  # told, never consumed


@pytest.mark.requires("tmux")
def test_a_kilo_idle_before_its_first_prompt_listens_and_mail_opens_a_session_with_it(project, model):
    """Issue 33 #7, as for OpenCode (the same plugin): before the first prompt, when no session exists yet, the
    plugin's own waiter makes the identity listening ("woken now"), and mail opens a session, shown in the TUI, whose
    first request tells the envelope once; then that session's waiter takes over."""
    model.script = lambda request: [{"type": "text", "text": "woken and on it"}] if family.main(request) else None
    with _tui(project, "start") as terminal:
        terminal.wait_for(lambda: "Ask anything" in terminal.screen(), 90, "kilo did not reach its prompt")
        row = _armed_and_idle(terminal)
        assert not family.loop(model)  # nobody typed
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Before any prompt",
                          env=process_env()).returncode == 0
        terminal.wait_for(lambda: family.loop(model), 30, "the idle Kilo was not woken")
        woken = json.dumps(family.loop(model)[0]["messages"])
        assert WOKEN in woken and woken.count("Before any prompt") == 1 and f"you are {AGENT}" in woken
        terminal.wait_for(lambda: "woken and on it" in terminal.screen(), 60, "the woken session is not shown")
        assert _armed_and_idle(terminal)["sessions"] == row["sessions"] == 1
        assert len(family.loop(model)) == 1


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as handle:
        return int(handle.read().rsplit(b")", 1)[1].split()[1])


def _running(pid: int) -> bool:
    """Whether process `pid` runs (an ended one that nobody has reaped yet, a zombie, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


@pytest.mark.requires("tmux")
def test_kilo_through_an_agent_mail_server_is_told_woken_and_ends_when_killed(tmp_path, model, server):
    """Set up with an agent-mail server as its mailbox (the token only in Kilo's environment): the first prompt gets
    the inbox, an idle session is woken through the server's long request, and SIGKILL of Kilo ends the session there
    soon after (its waiter watches Kilo's process). Kilo refuses {env:...} in a project's config, so setup writes no
    MCP entry there and its notes give the one for the person's own config: put there, the MCP tools reach the
    server."""
    token = server.token("--agent", AGENT)
    project = _project(tmp_path, model, server.url)
    assert "mcp" not in json_text.parse((project / "kilo.json").read_text(), comments=True).value
    written = (project / "kilo.json").read_text() + (project / ".kilo" / "plugin" / "agent-mail.js").read_text()
    assert token not in written
    notes = json.loads(am_process("setup", "kilo", "--agent", AGENT, "--dir", str(project), "--dry-run",
                                  env=process_env(AGENT_MAIL_DB=server.url)).stdout)["notes"]
    said = next(note for note in notes if "~/.config/kilo/kilo.json" in note)
    user_config = project.parent / "kilo-home" / ".config" / "kilo" / "kilo.json"
    user_config.parent.mkdir(parents=True)
    user_config.write_text("{" + said[said.index('"mcp": '):said.index(" to your own")] + "}")  # as the note says
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test", "--body",
                      "It is test_login.", env=process_env()).returncode == 0

    def script(request):
        if not family.main(request):
            return None
        if family.tool_results(request):
            return [{"type": "text", "text": "read it"}]
        return [{"type": "tool_use", "name": "agent-mail_read", "input": {}}]

    model.script = script
    with _tui(project, "served", AGENT_MAIL_TOKEN=token) as terminal:
        terminal.wait_for(lambda: "Ask anything" in terminal.screen(), 90, "kilo did not reach its prompt")
        terminal.type("Check your mail.", "Enter")
        terminal.wait_for(lambda: "read it" in terminal.screen(), 60, "the turn did not end")
        first, last = (json.dumps(r["messages"]) for r in (family.loop(model)[0], family.loop(model)[-1]))
        assert f"you are {AGENT}" in first and "Fix the flaky test" in first and "test_login" not in first
        assert "test_login" in last  # the read tool, through the server, took delivery (the MCP entry of the note)
        _armed_and_idle(terminal)
        turns = len(family.loop(model))
        model.script = lambda request: [{"type": "text", "text": "woken and on it"}] if family.main(request) else None
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Rebase the branch",
                          env=process_env()).returncode == 0
        terminal.wait_for(lambda: len(family.loop(model)) > turns, 30, "the idle session was not woken")
        woken = json.dumps(family.loop(model)[turns]["messages"])
        assert WOKEN in woken and woken.count("Rebase the branch") == 1
        terminal.wait_for(lambda: "woken and on it" in terminal.screen(), 60, "the woken turn did not end")
        _armed_and_idle(terminal)
        waiters = family.waiters(project, "kilo")
        kilo = _parent(waiters[0])
        os.kill(kilo, signal.SIGKILL)
        terminal.wait_for(lambda: not status_of(AGENT)["reachable"], ENDED_WITHIN_SECONDS,
                          "the identity stayed reachable after kilo was killed")
        assert status_of(AGENT)["sessions"] == 0
        terminal.wait_for(lambda: not any(map(_running, waiters)), ENDED_WITHIN_SECONDS, "a waiter outlived kilo")
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # the wake consumed nothing
