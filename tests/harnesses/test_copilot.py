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
from tests.lib.harnesses import (HELD, URGENT, Terminal, chat_tools, mail_during_the_turn, private_tmp,
                                 send_urgent_mail, status_of)

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


def _tool_results(request: dict) -> int:
    return sum(m.get("role") == "tool" for m in request.get("messages", []))

def test_mail_reaches_copilot_once_and_its_mcp_tools_run(project):
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0

    during = []

    def script(request):
        if not _main(request):
            return None
        if _tool_results(request):
            return [{"type": "text", "text": "done"}]
        during.append(status_of(AGENT))  # while the session lives
        return [{"type": "tool_use", "name": _mcp(request, "read"), "input": {}}]

    with FakeModel(script) as model:
        _run(project, model, "Check your mail.")
    assert during[0]["reachable"] and "a live Copilot CLI session" in during[0]["reached_by"]
    assert not status_of(AGENT)["reachable"]  # its sessionEnd: no longer live
    loop = [r for r in model.requests if _main(r)]
    assert _mcp(loop[0], "read") and _mcp(loop[0], "send") and _mcp(loop[0], "reserve")
    first = json.dumps(loop[0]["messages"])
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "test_login" not in first
    last = json.dumps(loop[-1]["messages"])
    assert "test_login" in last  # the read tool ran, and its result reached the model
    # told once: no hook told it again after the start (nor after the read, whose result showed it)
    assert last.count("you are proj:coder") == 1 and "new message" not in last
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 0


def test_mail_after_a_tool_reaches_copilot_once_and_is_not_marked_read(project):
    sent = []

    def script(request):
        if not _main(request):
            return None
        results = _tool_results(request)
        if results == 0:
            return [{"type": "tool_use", "name": "create",
                     "input": {"path": str(project / "a.txt"), "file_text": "a\n"}}]
        if results == 1 and not sent:
            send_urgent_mail(AGENT)
            sent.append(True)
            return [{"type": "tool_use", "name": "create",
                     "input": {"path": str(project / "b.txt"), "file_text": "b\n"}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        _run(project, model, "Write two files.")
    last = json.dumps([r for r in model.requests if _main(r)][-1]["messages"])
    assert last.count(URGENT) == 1  # told after the tool, once, though hooks ran again since
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1



def test_what_the_read_tool_showed_is_not_told_again(project):
    """Mail that lands just before the model calls the read tool is shown by the tool's result: the hooks after it
    (PostToolUse, the next prompt) do not tell it again."""
    def script(request):
        if not _main(request):
            return None
        if _tool_results(request):
            return [{"type": "text", "text": "done"}]
        send_urgent_mail(AGENT)
        return [{"type": "tool_use", "name": _mcp(request, "read"), "input": {}}]

    with FakeModel(script) as model:
        _run(project, model, "Check your mail.")
    last = json.dumps([r for r in model.requests if _main(r)][-1]["messages"])
    assert URGENT in last and "new message" not in last

def test_mail_during_a_copilot_turn_holds_the_stop_once(project):
    script = mail_during_the_turn(_main, lambda request: request["messages"], lambda: send_urgent_mail(AGENT))
    with FakeModel(script) as model:
        proc = _run(project, model, "Do the task.")
    loop = [r for r in model.requests if _main(r)]
    held = [r for r in loop if HELD in json.dumps(r["messages"])]
    assert len(held) == 1 and URGENT in json.dumps(held[0]["messages"])
    assert "it is mail for you, not an error" in json.dumps(held[0]["messages"])
    assert "I will handle it next." in proc.stdout
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # told, not consumed


def test_a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project):
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"  # new files: create refuses an existing one
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def script(request):
        if not _main(request):
            return None
        results = _tool_results(request)
        if results == 0:
            return [{"type": "tool_use", "name": "create", "input": {"path": str(held), "file_text": "x\n"}}]
        if results == 1:
            return [{"type": "tool_use", "name": "create", "input": {"path": str(free), "file_text": "new\n"}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        _run(project, model, "Write the files.")
    assert not held.exists()
    assert free.read_text() == "new\n"
    said = json.dumps([r for r in model.requests if _main(r)][-1]["messages"])
    assert "held by proj:holder" in said and "parser rewrite" in said
    assert "agent-mail send --from proj:coder --to proj:holder" in said


@pytest.mark.requires("tmux")
def test_an_interactive_copilot_session_is_reachable_while_idle_told_at_its_next_prompt_and_ends_with_it(project):
    """Interactive `copilot` in tmux: its session is live from its first prompt (Copilot CLI fires sessionStart
    then); idle between turns it stays reachable; mail sent while it is idle is told in its next prompt's request,
    once; after /exit the session no longer counts as live."""
    home = project.parent / "copilot-home"
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}]) as model:
        env = process_env(HOME=str(home), COPILOT_OFFLINE="true", COPILOT_AUTO_UPDATE="false",
                          COPILOT_PROVIDER_BASE_URL=f"{model.url}/v1", COPILOT_PROVIDER_API_KEY="x",
                          COPILOT_MODEL="scripted", COPILOT_CACHE_HOME=CACHE, TMPDIR=private_tmp(home))
        passed = [k for k in env if k.startswith("COPILOT_") or k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH")]
        command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), COPILOT])
        with Terminal(project.parent, f"agent-mail-copilot-{os.getpid()}", project, command) as terminal:
            terminal.wait_for(lambda: "/ commands" in terminal.screen(), 60, "copilot did not reach its prompt")
            terminal.type("hello", "Enter")
            terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the turn did not end")
            turns = len([r for r in model.requests if _main(r)])
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
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # told, never consumed
