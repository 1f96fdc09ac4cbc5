"""The real Claude Code CLI, set up by `agent-mail setup claude-code`, against a scripted model.

Claude Code is the npm package @anthropic-ai/claude-code (`.ci/run` installs the pinned version under
.cache/node); the model is tests/lib/fake_model.py on 127.0.0.1, which records what Claude Code sends it: the
context the hooks added, the tools it lists, the tool results. Skipped with the reason where Claude Code
is not installed; required in CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import threading

import pytest

from agent_mail import spec
from tests.lib.cli import am_process, process_env
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import URGENT, Terminal, private_tmp, send_urgent_mail
from tests.lib.tools import find
from tests.lib.waiting import armed, disarmed, until

AGENT = "proj:coder"


CLAUDE = find("claude")
pytestmark = pytest.mark.requires("claude")
pytest.importorskip("mcp", reason="the mcp extra is not installed")


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    directory.mkdir()
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    done = am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def _env(model: FakeModel, home) -> dict:
    env = process_env(HOME=str(home), ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="sk-ant-test",
                      DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                      ENABLE_TOOL_SEARCH="false", DISABLE_AUTOUPDATER="1", TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    return env


def _run(project, model, prompt: str, timeout: float = 120) -> dict:
    proc = subprocess.run([CLAUDE, "-p", prompt, "--output-format", "json"], cwd=str(project),
                          env=_env(model, project.parent / "home"), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _has_tool_result(request: dict) -> bool:
    last = request["messages"][-1]
    return isinstance(last.get("content"), list) and any(b.get("type") == "tool_result" for b in last["content"])


def _main_loop(request: dict) -> bool:
    """A request of the session's own turn (Claude Code also makes small side requests, without tools)."""
    return bool(request.get("tools"))


def test_mail_reaches_the_context_and_the_mcp_tools_answer_without_a_prompt(project):
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login; the clock is mocked wrong.", env=process_env()).returncode == 0

    def script(request):
        if not _main_loop(request):
            return None
        if _has_tool_result(request):
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "name": "mcp__agent-mail__read", "input": {}}]

    with FakeModel(script) as model:
        result = _run(project, model, "Check your mail.")
    loop = [r for r in model.requests if _main_loop(r)]
    first = json.dumps(loop[0])
    # SessionStart's context: the envelope, never the body.
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "clock is mocked" not in first
    tools = {t["name"]: t for t in loop[0]["tools"]}
    assert {"mcp__agent-mail__read", "mcp__agent-mail__send", "mcp__agent-mail__watch"} <= set(tools)
    # Told as another agent's words, not the user's: in the note and in the tool that returns mail.
    assert spec.MAIL_IS_DATA in first and spec.MAIL_IS_DATA in tools["mcp__agent-mail__read"]["description"]
    # The tool ran (no permission prompt, no denial) and its result, the message, went to the model.
    assert result["permission_denials"] == []
    answered = next(r for r in loop if _has_tool_result(r))
    assert "clock is mocked wrong" in json.dumps(answered["messages"][-1])
    state = json.loads(am_process("read", AGENT, "--no-mark-read").stdout)
    assert state["count"] == 0  # read through MCP: delivered, marked read



def test_with_copilot_set_up_too_claude_code_starts_the_shared_mcp_entry(project):
    """Copilot CLI set up in the same directory: .mcp.json's agent-mail entry is Copilot's (Copilot CLI cannot start
    Claude Code's), and Claude Code starts it: its read tool runs."""
    assert am_process("setup", "copilot", "--agent", AGENT, "--dir", str(project)).returncode == 0
    assert json.loads((project / ".mcp.json").read_text())["mcpServers"]["agent-mail"]["tools"] == ["*"]
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Shared entry",
                      "--body", "read through the shared entry", env=process_env()).returncode == 0

    def script(request):
        if not _main_loop(request):
            return None
        if _has_tool_result(request):
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "name": "mcp__agent-mail__read", "input": {}}]

    with FakeModel(script) as model:
        result = _run(project, model, "Check your mail.")
    assert result["permission_denials"] == []
    answered = next(r for r in model.requests if _main_loop(r) and _has_tool_result(r))
    assert "read through the shared entry" in json.dumps(answered["messages"][-1])

def test_mail_during_a_turn_holds_the_stop_once(project):
    sent = threading.Event()

    def script(request):
        if not _main_loop(request):
            return None
        text = json.dumps(request["messages"])
        if "This arrived while you worked" in text:
            return [{"type": "text", "text": "I will handle it next."}]
        if _has_tool_result(request):
            if not sent.is_set():  # mail lands while the model writes its last answer
                send_urgent_mail(AGENT)
                sent.set()
            return [{"type": "text", "text": "All done."}]
        return [{"type": "tool_use", "name": "Bash", "input": {"command": "true", "description": "nothing"}}]

    with FakeModel(script) as model:
        result = _run(project, model, "Do the task.", timeout=180)
    loop = [r for r in model.requests if _main_loop(r)]
    held = [r for r in loop if "This arrived while you worked" in json.dumps(r["messages"])]
    assert held, "the stop was not held"
    assert URGENT in json.dumps(held[0]["messages"])
    # Held once: the next stop (stop_hook_active) went through, and the run ended.
    assert result["result"] == "I will handle it next."
    assert len([r for r in loop if json.dumps(r["messages"]).count("This arrived while you worked") > 0]) == 1
    # Nothing was marked read by telling.
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1


def test_claude_p_is_not_kept_waiting_by_the_waiter(project):
    """The asyncRewake waiter arms on Stop; under claude -p it must return at once, or the run would wait
    for it (up to its 55 minutes)."""
    with FakeModel() as model:
        result = _run(project, model, "Say ok.", timeout=90)
    assert result["result"] == "ok"
    status = json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]
    assert status["watch_state"] != "armed"


def test_setup_is_idempotent_and_removable(project):
    settings = project / ".claude" / "settings.local.json"
    servers = project / ".mcp.json"
    before = settings.read_bytes(), servers.read_bytes()
    again = json.loads(am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(project)).stdout)
    assert [f["action"] for f in again["files"]] == ["unchanged", "unchanged", "unchanged"]
    assert (settings.read_bytes(), servers.read_bytes()) == before
    removed = json.loads(am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(project),
                                    "--remove").stdout)
    assert [f["action"] for f in removed["files"]] == ["remove", "remove", "remove"]
    assert not servers.exists() and not settings.exists()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))


def _interactive_home(home, project) -> None:
    """A HOME in which an interactive `claude` opens straight to its prompt: onboarding done, the project
    trusted, the test key approved."""
    (home / ".claude.json").write_text(json.dumps({
        "hasCompletedOnboarding": True, "theme": "dark",
        "customApiKeyResponses": {"approved": ["sk-ant-test"], "rejected": []},
        "projects": {str(project): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
    }))


@pytest.mark.requires("tmux")
def test_an_idle_interactive_session_is_woken_by_a_send(project):
    import time

    home = project.parent / "home"
    _interactive_home(home, project)
    name = f"agent-mail-test-{os.getpid()}"
    tmux = ["tmux", "-S", str(project.parent / "tmux.sock")]  # a server of its own, its socket in the test's dir
    with FakeModel() as model:
        env = _env(model, home)
        command = " ".join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={v}" for k, v in env.items()
                                                             if k in ("HOME", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY",
                                                                      "DISABLE_TELEMETRY", "ENABLE_TOOL_SEARCH",
                                                                      "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                                                                      "DISABLE_AUTOUPDATER", "PYTHONPATH", "TMPDIR")]
                           + [CLAUDE])
        subprocess.run([*tmux, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", "-c", str(project), command],
                       check=True)
        try:
            def status():
                return json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]

            until(lambda: "❯" in subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True,
                                                text=True).stdout, 60, "claude did not reach its prompt")
            subprocess.run([*tmux, "send-keys", "-t", name, "hello"], check=True)
            time.sleep(0.3)
            subprocess.run([*tmux, "send-keys", "-t", name, "Enter"], check=True)
            # The turn ends; the Stop's waiter arms (the session start's stood down when the prompt came): the
            # identity shows as armed, a live session holds it.
            assert model.wait_for(lambda r: _main_loop(r) and "hello" in json.dumps(r["messages"]), timeout=60)
            until(lambda: status()["reached_by"].startswith("woken now (a live Claude Code"), 60,
                  lambda: f"the turn's end armed no waiter: {status()}")
            armed(AGENT, timeout=60)
            assert status()["sessions"] == 1
            # Issue 20 #1: the live session is reachable and says how.
            assert status()["reachable"] is True and status()["reached_by"].startswith("woken now (a live Claude Code")
            turns = len([r for r in model.requests if _main_loop(r)])
            assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Wake up, review PR 7",
                              env=process_env()).returncode == 0
            woken = model.wait_for(lambda r: _main_loop(r) and "Wake up, review PR 7" in json.dumps(r["messages"]),
                                   timeout=30)
            assert woken is not None, "the idle session was not woken"
            # Issue 20 #4: the wake reads as mail, not as a Stop hook error.
            woke = json.dumps(woken["messages"])
            assert "agent-mail: new mail arrived while you were idle" in woke and "blocking error" not in woke
            assert len([r for r in model.requests if _main_loop(r)]) == turns + 1
            # Woken once, then it re-arms for the next mail.
            armed(AGENT, timeout=60)
        finally:
            subprocess.run([*tmux, "kill-session", "-t", name], capture_output=True)
    # The waiter ends with its session (it checks the harness process every 5 s).
    disarmed(AGENT, timeout=30)


def _any_tool_result(request: dict) -> bool:
    """A tool result anywhere in the turn (Claude Code may put a system message after it)."""
    return any(isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
               for m in request["messages"])


@pytest.mark.requires("tmux")
def test_mail_a_watch_tool_result_showed_is_not_told_again(project):
    """Issue 20 #2: the model calls mcp__agent-mail__watch {"wait_seconds": 60}; mail arrives; the next
    request carries the envelope once, in the tool result, not again as PostToolUse context; and no later
    turn gets it again from the waiter ("Stop hook feedback")."""
    import time

    subject = "Review PR 9 before noon"
    home = project.parent / "home"
    _interactive_home(home, project)
    name = f"agent-mail-watch-{os.getpid()}"
    tmux = ["tmux", "-S", str(project.parent / "tmux.sock")]

    def script(request):
        if not _main_loop(request):
            return None
        said = json.dumps(request["messages"])
        if "next task" in said:
            return [{"type": "text", "text": "Nothing new."}]
        if _any_tool_result(request):
            return [{"type": "text", "text": "Got it."}]
        return [{"type": "tool_use", "name": "mcp__agent-mail__watch", "input": {"wait_seconds": 60}}]

    def say(text: str) -> None:
        subprocess.run([*tmux, "send-keys", "-t", name, text], check=True)
        time.sleep(0.3)
        subprocess.run([*tmux, "send-keys", "-t", name, "Enter"], check=True)

    with FakeModel(script) as model:
        env = _env(model, home)
        command = " ".join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={v}" for k, v in env.items()
                                                             if k in ("HOME", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY",
                                                                      "DISABLE_TELEMETRY", "ENABLE_TOOL_SEARCH",
                                                                      "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                                                                      "DISABLE_AUTOUPDATER", "PYTHONPATH", "TMPDIR")]
                           + [CLAUDE])
        subprocess.run([*tmux, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", "-c", str(project), command],
                       check=True)
        try:
            until(lambda: "❯" in subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True,
                                                text=True).stdout, 60, "claude did not reach its prompt")
            say("check your mail")
            # The watch tool call is blocked: the identity shows as armed (the session start's waiter stood down
            # when the prompt came, before the model was asked). Then the mail comes.
            assert model.wait_for(lambda r: _main_loop(r) and "check your mail" in json.dumps(r["messages"]), 60)
            armed(AGENT, timeout=60)  # the watch tool never armed
            assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", subject,
                              env=process_env()).returncode == 0
            answered = model.wait_for(lambda r: _main_loop(r) and _any_tool_result(r), timeout=60)
            assert answered is not None, "the watch tool result never reached the model"
            results = [b for m in answered["messages"] if isinstance(m.get("content"), list) for b in m["content"]
                       if b.get("type") == "tool_result"]
            assert len(results) == 1 and subject in json.dumps(results), "the tool result did not show the mail"
            assert json.dumps(answered["messages"]).count(subject) == 1, "told twice: the tool result and again"
            # The turn ended ("Got it."); the waiter armed for the next mail, and nothing wakes the session.
            until(lambda: len([r for r in model.requests if _main_loop(r)]) == 2, 60, "the turn never ended")
            armed(AGENT, timeout=60)  # the waiter, armed after the turn
            time.sleep(3)
            assert len([r for r in model.requests if _main_loop(r)]) == 2, "the session was woken for told mail"
            say("next task")
            later = model.wait_for(lambda r: _main_loop(r) and "next task" in json.dumps(r["messages"]), timeout=60)
            assert later is not None, "the next prompt never reached the model"
            assert json.dumps(later["messages"]).count(subject) == 1, "a later turn was told the mail again"
        finally:
            subprocess.run([*tmux, "kill-session", "-t", name], capture_output=True)


def test_an_edit_of_a_reserved_file_is_denied_before_it_is_written(project):
    """Issue 22: the PreToolUse hook denies an Edit of a file another live identity holds; the model's next
    request carries who holds it and how to ask; an Edit of a free file goes through (edits accepted)."""
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"
    held.write_text("fn main() {}\n")
    free.write_text("old\n")
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def script(request):
        if not _main_loop(request):
            return None
        results = sum(1 for m in request["messages"] if isinstance(m.get("content"), list)
                      for b in m["content"] if b.get("type") == "tool_result")
        if results == 0:
            return [{"type": "tool_use", "name": "Edit", "input": {"file_path": str(held), "old_string": "main",
                                                                     "new_string": "start"}}]
        if results == 1:
            return [{"type": "tool_use", "name": "Edit", "input": {"file_path": str(free), "old_string": "old",
                                                                     "new_string": "new"}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        proc = subprocess.run([CLAUDE, "-p", "Rename main.", "--output-format", "json", "--permission-mode",
                               "acceptEdits"], cwd=str(project), env=_env(model, project.parent / "home"),
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert held.read_text() == "fn main() {}\n"  # unchanged
    assert free.read_text() == "new\n"  # the same session may edit what nobody holds
    after = [r for r in model.requests if _main_loop(r) and _has_tool_result(r)][0]
    result = [b for b in after["messages"][-1]["content"] if b.get("type") == "tool_result"][0]
    said = json.dumps(result["content"]) if not isinstance(result["content"], str) else result["content"]
    assert "held by proj:holder" in said and "parser rewrite" in said
    assert f"agent-mail send --from {AGENT} --to proj:holder --subject" in said


@pytest.mark.requires("tmux")
def test_a_killed_interactive_session_is_not_reachable_at_once(project):
    """Issue 33 #6: kill -9 of an idle Claude Code whose waiter is armed: the waiter ends with it (it sleeps on the
    harness's process), so a send that requires a reachable recipient refuses at once, not 2-4 s later."""
    import signal

    with FakeModel() as model, _at_its_prompt(project, model, "test") as terminal:
        terminal.type("hello", "Enter")
        armed(AGENT, timeout=60)
        claude = int(subprocess.run([*terminal.tmux, "display-message", "-p", "-t", terminal.name,
                                     "#{pane_pid}"], check=True, capture_output=True, text=True).stdout)
        os.kill(claude, signal.SIGKILL)
        until(lambda: _refused(), 3.0, lambda: f"still reachable after kill -9: {_status()}")


@contextlib.contextmanager
def _at_its_prompt(project, model, name: str):
    """An interactive Claude Code on `model`, in a tmux session of its own, once it shows its prompt."""
    home = project.parent / "home"
    _interactive_home(home, project)
    command = _claude_command(_env(model, home))
    with Terminal(project.parent, f"agent-mail-{name}-{os.getpid()}", project, command) as terminal:
        terminal.wait_for(lambda: "❯" in terminal.screen(), 60, "claude did not reach its prompt")
        yield terminal


def _claude_command(env: dict) -> str:
    """The shell command that starts the interactive Claude Code in tmux with the test's environment only."""
    return shlex.join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={v}" for k, v in env.items() if k in (
        "HOME", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "DISABLE_TELEMETRY", "ENABLE_TOOL_SEARCH",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_AUTOUPDATER", "PYTHONPATH", "TMPDIR")] + [CLAUDE])


def _status() -> dict:
    return json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]


def _refused() -> bool:
    """Whether a send that requires a reachable recipient refuses (asked once status says not reachable: a send
    that went through would be mail that wakes the session)."""
    if _status()["reachable"]:
        return False
    done = am_process("send", "--from", "team:carl", "--to", AGENT, "--subject", "still there?", "--require-reachable")
    assert done.returncode == 3, done.stdout + done.stderr
    return True


@pytest.mark.requires("tmux")
def test_a_session_idle_before_its_first_prompt_is_woken_by_a_send(project):
    """Issue 33 #7: Claude Code started and idle at its prompt, nobody having typed: its SessionStart hook armed the
    asyncRewake waiter (as a Stop does), so status says "woken now" (not "at work", not "told at its next prompt"),
    and mail sent from another process starts a turn that tells it, once."""
    with FakeModel() as model, _at_its_prompt(project, model, "first") as terminal:
        row = until(lambda: (lambda r: r["sessions"] == 1 and r["watch_state"] == "armed" and r)(_status()), 30,
                    lambda: f"the session start armed no waiter: {_status()}")
        assert row["reachable"] and row["reached_by"].startswith("woken now (a live Claude Code"), row
        assert not [r for r in model.requests if _main_loop(r)]  # nobody typed: no turn yet
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Before any prompt",
                          env=process_env()).returncode == 0
        woken = model.wait_for(lambda r: _main_loop(r) and "Before any prompt" in json.dumps(r["messages"]),
                               timeout=30)
        assert woken is not None, f"the idle session was not woken:\n{terminal.screen()}"
        said = json.dumps(woken["messages"])
        assert "agent-mail: new mail arrived while you were idle" in said and said.count("Before any prompt") == 1
        assert len([r for r in model.requests if _main_loop(r)]) == 1  # the wake's turn, nobody typed
        armed(AGENT, timeout=60)  # the woken turn's Stop armed the next waiter
