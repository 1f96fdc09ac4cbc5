"""The real OpenCode, set up by `agent-mail setup opencode`, against a scripted model.

OpenCode is the npm package opencode-ai (`.ci/run` installs the pinned version under .cache/node, with the
@opencode-ai/plugin package OpenCode would otherwise npm-install into each project's .opencode/ at its first start:
`offline_plugin_dependency` links it in, so no test waits on npm). The model is tests/lib/fake_model.py speaking the
OpenAI Chat Completions API on 127.0.0.1, named in the project's opencode.json as a provider of its own, which the test
writes first (as a person would), so setup must merge into it. HOME is a throwaway directory; updates, model lists,
LSP downloads and sharing are off. Skipped with the reason where OpenCode is not installed; required in CI.

`opencode run` (one prompt, then exit) proves context, told once, the MCP tools and the guard (by the scenarios Kilo
Code's test runs too: tests/lib/opencode_family.py); the interactive TUI in tmux proves what needs an idle session: the
held stop, the idle wake and the end of the session with OpenCode.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from agent_mail.harness import json_text
from tests.lib.cli import am_process, process_env
from tests.lib.tools import NODE_BIN, find
from tests.lib import opencode_family as family
from tests.lib.waiting import until
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import HELD, URGENT, Terminal, mail_during_the_turn, private_tmp, send_urgent_mail, status_of

AGENT = "proj:coder"
OPENCODE = find("opencode")
VERSION = "1.18.33"  # .ci/run's pin: OpenCode adds @opencode-ai/plugin at its own version to each project's .opencode
pytestmark = pytest.mark.requires("opencode")
pytest.importorskip("mcp", reason="the mcp extra is not installed")
WOKEN = "agent-mail: new mail arrived while you were idle"


def offline_plugin_dependency(config) -> None:
    """What OpenCode's start would npm-install into each of its config directories (the project's .opencode, the
    user's ~/.config/opencode): its plugin package at its version, linked from the copy .ci/run installed. OpenCode
    installs only when the directory's node_modules is missing or its package-lock.json lacks a dependency of its
    package.json (seen in 1.18.33), so nothing is fetched."""
    shared = os.path.join(os.path.dirname(NODE_BIN), "@opencode-ai")
    modules = config / "node_modules"
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "@opencode-ai").symlink_to(shared, target_is_directory=True)
    dependencies = {"@opencode-ai/plugin": VERSION}
    (config / "package.json").write_text(json.dumps({"dependencies": dependencies}))
    (config / "package-lock.json").write_text(json.dumps(
        {"lockfileVersion": 3, "packages": {"": {"dependencies": dependencies}}}))


@pytest.fixture
def model():
    with FakeModel() as running:
        yield running


@pytest.fixture
def project(tmp_path, mailbox_path, model):
    directory = tmp_path / "project"
    directory.mkdir()
    mine = {"$schema": "https://opencode.ai/config.json", "model": "scripted/scripted", "autoupdate": False,
            "provider": {"scripted": {"npm": "@ai-sdk/openai-compatible", "name": "Scripted",
                                      "options": {"baseURL": f"{model.url}/v1", "apiKey": "x"},
                                      "models": {"scripted": {"name": "Scripted"}}}}}
    # JSONC, as OpenCode reads it: setup keeps the comments (issue 33) and OpenCode then runs with the merged file.
    (directory / "opencode.json").write_text("// the scripted model of the tests\n" + json.dumps(mine, indent=2)
                                             .replace('\n  "model"', '\n  /* theirs */ "model"', 1))
    offline_plugin_dependency(directory / ".opencode")
    offline_plugin_dependency(tmp_path / "opencode-home" / ".config" / "opencode")
    done = am_process("setup", "opencode", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    text = (directory / "opencode.json").read_text()
    settings = json_text.parse(text, comments=True).value
    assert {k: v for k, v in settings.items() if k != "mcp"} == mine  # merged, not overwritten
    assert text.startswith("// the scripted model of the tests\n") and "/* theirs */" in text
    assert settings["mcp"]["agent-mail"]["type"] == "local"
    return directory


def _env(project) -> dict:
    home = project.parent / "opencode-home"
    home.mkdir(exist_ok=True)
    # PWD too: OpenCode reads opencode.json from $PWD, not from the directory it runs in
    env = process_env(HOME=str(home), PWD=str(project), TMPDIR=private_tmp(home), OPENCODE_DISABLE_AUTOUPDATE="1",
                      OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_LSP_DOWNLOAD="1", OPENCODE_DISABLE_SHARE="1",
                      # a guard: were an install attempted, it fails at once instead of retrying for 75 s
                      npm_config_registry="http://127.0.0.1:9/", npm_config_fetch_retries="0")
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    return env


def _run(project, prompt: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([OPENCODE, "run", prompt], cwd=str(project), env=_env(project), capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_mail_reaches_opencode_once_and_its_mcp_tools_run(project, model):
    family.mail_reaches_the_model_once_and_the_mcp_tools_run(lambda prompt: _run(project, prompt), model, AGENT,
                                                             "a live OpenCode session")


def test_mail_after_a_tool_reaches_opencode_once_and_is_not_marked_read(project, model):
    family.mail_after_a_tool_is_told_once_and_not_marked_read(lambda prompt: _run(project, prompt), model, project,
                                                              AGENT)


def test_a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project, model):
    family.a_reserved_file_is_not_written_while_a_free_one_is(lambda prompt: _run(project, prompt), model, project)


@pytest.mark.requires("tmux")
def test_an_idle_opencode_is_woken_by_mail_its_stop_held_once_and_it_ends_with_opencode(project, model):
    """Interactive `opencode` in tmux. Mail that lands during the first turn holds its stop once (sent back as the next
    prompt); idle afterwards, the session is reachable and mail wakes it (a new turn with the envelopes, told once);
    after /exit the session no longer counts as live and its waiter is gone."""
    model.script = mail_during_the_turn(family.main, lambda request: request["messages"],
                                        lambda: send_urgent_mail(AGENT))
    command = _tui_command(project)
    with Terminal(project.parent, f"agent-mail-opencode-{os.getpid()}", project, command) as terminal:
        terminal.wait_for(lambda: "Ask anything" in terminal.screen(), 60, "opencode did not reach its prompt")
        terminal.type("Do the task.", "Enter")
        held = terminal.wait_for(lambda: [r for r in family.loop(model) if HELD in json.dumps(r["messages"])], 60,
                                 "the stop was not held")
        assert URGENT in json.dumps(held[0]["messages"])
        terminal.wait_for(lambda: "I will handle it next." in terminal.screen(), 60, "the held turn did not end")
        row = terminal.wait_for(lambda: (lambda r: r["watch_state"] == "armed" and r)(status_of(AGENT)), 30,
                                "no waiter armed while idle")
        assert row["reachable"] and "a live OpenCode session" in row["reached_by"] and row["sessions"] == 1
        turns = len(family.loop(model))
        model.script = lambda request: [{"type": "text", "text": "woken and on it"}] if family.main(request) else None
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Rebase the branch",
                          env=process_env()).returncode == 0
        terminal.wait_for(lambda: len(family.loop(model)) > turns, 30, "the idle session was not woken")
        woken = json.dumps(family.loop(model)[turns]["messages"])
        assert WOKEN in woken and woken.count("Rebase the branch") == 1 and woken.count(URGENT) == 1
        terminal.wait_for(lambda: "woken and on it" in terminal.screen(), 60, "the woken turn did not end")
        opencode = int(subprocess.run([*terminal.tmux, "list-panes", "-t", terminal.name, "-F", "#{pane_pid}"],
                                      capture_output=True, text=True).stdout.split()[0])
        waiters = terminal.wait_for(lambda: _waiters(opencode), 30, "no waiter re-armed after the wake")
        terminal.type("/exit", "Enter")
        terminal.wait_for(lambda: status_of(AGENT)["sessions"] == 0, 30, "the session still counts as live after /exit")
        terminal.wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in waiters), 30,
                          "a waiter outlived OpenCode")
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 2  # told, never consumed


def _waiters(parent: int) -> list[int]:
    """The `hook opencode wait` processes OpenCode (process `parent`) runs."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                ppid = int(handle.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"opencode" in words and b"wait" in words:
            found.append(int(entry))
    return found


@pytest.mark.requires("tmux")
def test_a_killed_opencode_is_not_reachable_at_once(project, model):
    """Issue 33 #6: kill -9 of an idle OpenCode whose waiter is armed: the waiter ends with it (it sleeps on its
    harness's process; it ran on for 3-5 s), so a send that requires a reachable recipient refuses at once."""
    import signal

    model.script = lambda request: [{"type": "text", "text": "ok from the model"}] if family.main(request) else None
    command = _tui_command(project)
    with Terminal(project.parent, f"agent-mail-opencode-{os.getpid()}", project, command) as terminal:
        terminal.wait_for(lambda: "Ask anything" in terminal.screen(), 60, "opencode did not reach its prompt")
        terminal.type("hello", "Enter")
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed", 60, "no waiter armed while idle")
        opencode = int(subprocess.run([*terminal.tmux, "list-panes", "-t", terminal.name, "-F", "#{pane_pid}"],
                                      capture_output=True, text=True).stdout.split()[0])
        os.kill(opencode, signal.SIGKILL)
        until(_refused, 3.0, lambda: f"still reachable after kill -9: {status_of(AGENT)}")


def _tui_command(project) -> str:
    """The shell command that starts OpenCode's TUI in tmux with the test's environment only (no AGENT_MAIL_DB: the
    plugin names the mailbox itself)."""
    env = _env(project)
    passed = [k for k in env if k.startswith(("OPENCODE_", "npm_config_"))
              or k in ("HOME", "PWD", "TMPDIR", "PYTHONPATH", "PATH")]
    return shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), OPENCODE])


def _refused() -> bool:
    """Whether a send that requires a reachable recipient refuses (asked once status says not reachable: a send
    that went through would be mail that wakes the session)."""
    if status_of(AGENT)["reachable"]:
        return False
    done = am_process("send", "--from", "team:carl", "--to", AGENT, "--subject", "still there?", "--require-reachable")
    assert done.returncode == 3, done.stdout + done.stderr
    return True


@pytest.mark.requires("tmux")
def test_an_opencode_idle_before_its_first_prompt_listens_and_mail_opens_a_session_with_it(project, model):
    """Issue 33 #7: OpenCode's TUI opens a session only with the first prompt, but its plugin loads at the start: the
    plugin arms a waiter of the process's own, so the identity is listening ("woken now") while nobody has typed, and
    mail then opens a session, shown in the TUI, whose first request tells the envelope, once. From then on it is
    that session's (one live session; its own waiter armed when the turn ends); /exit ends it."""
    model.script = lambda request: [{"type": "text", "text": "woken and on it"}] if family.main(request) else None
    command = _tui_command(project)
    with Terminal(project.parent, f"agent-mail-opencode-start-{os.getpid()}", project, command) as terminal:
        terminal.wait_for(lambda: "Ask anything" in terminal.screen(), 60, "opencode did not reach its prompt")
        row = until(lambda: (lambda r: r["watch_state"] == "armed" and r)(status_of(AGENT)), 30,
                    lambda: f"nothing listens before the first prompt: {status_of(AGENT)}")
        assert row["reachable"] and row["reached_by"].startswith("woken now (a live OpenCode session") \
            and row["sessions"] == 1, row
        assert not family.loop(model)  # nobody typed
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Before any prompt",
                          env=process_env()).returncode == 0
        terminal.wait_for(lambda: family.loop(model), 30, "the idle OpenCode was not woken")
        woken = json.dumps(family.loop(model)[0]["messages"])
        assert WOKEN in woken and woken.count("Before any prompt") == 1 and "you are proj:coder" in woken
        terminal.wait_for(lambda: "woken and on it" in terminal.screen(), 60, "the woken session is not shown")
        row = terminal.wait_for(lambda: (lambda r: r["watch_state"] == "armed" and r)(status_of(AGENT)), 30,
                                "no waiter armed after the woken turn")
        assert row["sessions"] == 1 and row["reached_by"].startswith("woken now (a live OpenCode session")
        assert len(family.loop(model)) == 1
        terminal.type("/exit", "Enter")
        terminal.wait_for(lambda: status_of(AGENT)["sessions"] == 0, 30, "still live after /exit")
