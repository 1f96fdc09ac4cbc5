"""The real GitHub Copilot CLI, set up by `agent-mail setup copilot`, against a scripted model.

Copilot CLI is the npm package @github/copilot (`.ci/run` installs the pinned version under .cache/node); the
model is tests/lib/fake_model.py speaking the OpenAI Chat Completions API on 127.0.0.1 (COPILOT_OFFLINE with
COPILOT_PROVIDER_BASE_URL), with a throwaway HOME whose ~/.copilot/config.json trusts the test's project folder
(the person's one-time answer: Copilot CLI runs a repository's hooks only in a trusted folder). Its first run
unpacks ~235 MB; COPILOT_CACHE_HOME points every test at one cache under .cache/copilot. The test writes its own
.mcp.json first, so setup must merge into it. Skipped with the reason where Copilot CLI is not installed; required
in CI.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.lib.cli import am_process, process_env
from tests.lib.tools import ROOT, find
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import (URGENT, ChatHarness, Terminal,
                                 a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written, chat_tools,
                                 mail_after_a_tool_is_told_once_and_not_marked_read,
                                 mail_during_a_turn_holds_the_stop_once, mail_reaches_once_and_the_mcp_tools_run,
                                 private_tmp, send_urgent_mail, status_of,
                                 what_the_read_tool_showed_is_not_told_again)

AGENT = "proj:coder"
COPILOT = find("copilot")
pytestmark = pytest.mark.requires("copilot")
pytest.importorskip("mcp", reason="the mcp extra is not installed")
CACHE = os.path.join(ROOT, ".cache", "copilot")


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    directory.mkdir()
    (directory / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"type": "stdio", "command": "true"}}}))
    home = tmp_path / "copilot-home"
    (home / ".copilot").mkdir(parents=True)
    (home / ".copilot" / "config.json").write_text(json.dumps({"trustedFolders": [str(directory)]}))
    done = am_process("setup", "copilot", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    servers = json.loads((directory / ".mcp.json").read_text())["mcpServers"]
    assert servers["other"] == {"type": "stdio", "command": "true"}  # merged, not overwritten
    return directory


def _run(project, model: FakeModel, prompt: str) -> subprocess.CompletedProcess:
    home = project.parent / "copilot-home"
    os.makedirs(CACHE, exist_ok=True)
    env = process_env(HOME=str(home), COPILOT_OFFLINE="true", COPILOT_AUTO_UPDATE="false",
                      COPILOT_PROVIDER_BASE_URL=f"{model.url}/v1", COPILOT_PROVIDER_API_KEY="x",
                      COPILOT_MODEL="scripted", COPILOT_CACHE_HOME=CACHE, TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    proc = subprocess.run([COPILOT, "-p", prompt, "--allow-all-tools"], cwd=str(project), env=env,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _main(request: dict) -> bool:
    """A request of the session's own loop (it offers the tools), not a side call (a title, a summary)."""
    return "create" in chat_tools(request)


def _mcp(request: dict, name: str) -> str:
    """How Copilot CLI names our MCP tool `name` to its model."""
    found = [t for t in chat_tools(request) if t and "agent-mail" in t and t.endswith(name)]
    assert found, chat_tools(request)
    return found[0]


COPILOT_CLI = ChatHarness(_run, _main, _mcp, lambda path, text: ("create", {"path": str(path), "file_text": text}),
                          live="a live Copilot CLI session", agent=AGENT)


def test_mail_reaches_copilot_once_and_its_mcp_tools_run(project):
    mail_reaches_once_and_the_mcp_tools_run(project, COPILOT_CLI)


def test_mail_after_a_tool_reaches_copilot_once_and_is_not_marked_read(project):
    mail_after_a_tool_is_told_once_and_not_marked_read(project, COPILOT_CLI)


def test_what_the_read_tool_showed_is_not_told_again(project):
    what_the_read_tool_showed_is_not_told_again(project, COPILOT_CLI)


def test_mail_during_a_copilot_turn_holds_the_stop_once(project):
    mail_during_a_turn_holds_the_stop_once(project, COPILOT_CLI)


def test_a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project):
    a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project, COPILOT_CLI)


@pytest.mark.requires("tmux")
def test_an_interactive_copilot_session_is_reachable_while_idle_told_at_its_next_prompt_and_ends_with_it(project):
    """Interactive `copilot` in tmux: its session is live from its first prompt (Copilot CLI 1.0.102 fires
    sessionStart then, with userPromptSubmitted, not when it opens: issue 33 #7), so before it status says not
    listening, and mail sent then waits and is told at that first prompt, once; idle between turns it stays
    reachable; mail sent while it is idle is told in its next prompt's request, once; after /exit the session no
    longer counts as live."""
    home = project.parent / "copilot-home"
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}]) as model:
        env = process_env(HOME=str(home), COPILOT_OFFLINE="true", COPILOT_AUTO_UPDATE="false",
                          COPILOT_PROVIDER_BASE_URL=f"{model.url}/v1", COPILOT_PROVIDER_API_KEY="x",
                          COPILOT_MODEL="scripted", COPILOT_CACHE_HOME=CACHE, TMPDIR=private_tmp(home))
        passed = [k for k in env if k.startswith("COPILOT_") or k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH")]
        command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), COPILOT])
        with Terminal(project.parent, f"agent-mail-copilot-{os.getpid()}", project, command) as terminal:
            terminal.wait_for(lambda: "/ commands" in terminal.screen(), 60, "copilot did not reach its prompt")
            row = status_of(AGENT)  # no hook has run: nothing says it listens, and nothing wakes it
            assert row["sessions"] == 0 and not row["reachable"] and row["reached_by"].startswith("not listening")
            assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Before the first prompt",
                              env=process_env()).returncode == 0
            terminal.type("hello", "Enter")
            terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the turn did not end")
            turns = len([r for r in model.requests if _main(r)])
            assert json.dumps([r for r in model.requests if _main(r)][0]["messages"]).count(
                "Before the first prompt") == 1  # told at the first prompt (its session start), once
            row = terminal.wait_for(lambda: (lambda r: r["sessions"] == 1 and r)(status_of(AGENT)), 10, "not live")
            assert row["reachable"] and "a live Copilot CLI session" in row["reached_by"]  # idle, between turns
            send_urgent_mail(AGENT)
            terminal.type("go on", "Enter")
            terminal.wait_for(lambda: len([r for r in model.requests if _main(r)]) > turns, 60, "no second turn")
            loop = [r for r in model.requests if _main(r)]
            assert URGENT not in json.dumps(loop[turns - 1]["messages"])
            assert json.dumps(loop[turns]["messages"]).count(URGENT) == 1
            terminal.type("/exit", "Enter")
            terminal.wait_for(lambda: status_of(AGENT)["sessions"] == 0, 30,
                              "the session still counts as live after /exit")
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 2  # told, never consumed
