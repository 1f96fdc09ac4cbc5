"""The real Qwen Code, set up by `agent-mail setup qwen`, against a scripted model.

Qwen Code is the npm package @qwen-code/qwen-code (`.ci/run` installs the pinned version under .cache/node); the
model is tests/lib/fake_model.py speaking the OpenAI Chat Completions API on 127.0.0.1 (OPENAI_BASE_URL, --auth-type
openai), with a throwaway HOME whose settings switch off updates and usage statistics. The test writes its own
project settings first (as a person would), so setup must merge into them. Skipped with the reason where Qwen Code
is not installed; required in CI.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess

import pytest

from tests.lib.cli import am_process, process_env
from tests.lib.tools import find
from tests.lib.waiting import until
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import (URGENT, WOKEN, ChatHarness, Terminal,
                                 a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written, chat_tools,
                                 mail_after_a_tool_is_told_once_and_not_marked_read,
                                 mail_during_a_turn_holds_the_stop_once, mail_reaches_once_and_the_mcp_tools_run,
                                 private_tmp, send_urgent_mail, status_of, tool_results, wakers,
                                 what_the_read_tool_showed_is_not_told_again)

AGENT = "proj:coder"
QWEN = find("qwen")
SLOW_DONE = "the slow step is done"
pytestmark = pytest.mark.requires("qwen")
pytest.importorskip("mcp", reason="the mcp extra is not installed")


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    (directory / ".qwen").mkdir(parents=True)
    (directory / ".qwen" / "settings.json").write_text(json.dumps({"model": {"name": "scripted"}}))
    home = tmp_path / "qwen-home"
    (home / ".qwen").mkdir(parents=True)
    (home / ".qwen" / "settings.json").write_text(json.dumps({
        "general": {"enableAutoUpdate": False}, "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False}}))
    done = am_process("setup", "qwen", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    settings = json.loads((directory / ".qwen" / "settings.json").read_text())
    assert settings["model"] == {"name": "scripted"}  # merged, not overwritten
    return directory


def _run(project, model: FakeModel, prompt: str) -> subprocess.CompletedProcess:
    home = project.parent / "qwen-home"
    env = process_env(HOME=str(home), OPENAI_API_KEY="x", OPENAI_BASE_URL=f"{model.url}/v1", OPENAI_MODEL="scripted",
                      QWEN_USAGE_STATISTICS_ENABLED="false", TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    proc = subprocess.run([QWEN, "-p", prompt, "--auth-type", "openai", "--approval-mode", "yolo"],
                          cwd=str(project), env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _main(request: dict) -> bool:
    """A request of the session's own loop (it offers the tools, under Qwen Code's own system prompt), not a side
    call (a title, a summary, the memory-extraction subagent an interactive session runs after a turn)."""
    messages = request.get("messages") or [{}]
    return "write_file" in chat_tools(request) and "You are Qwen Code" in json.dumps(messages[0])


QWEN_CODE = ChatHarness(_run, _main, lambda request, name: f"mcp__agent-mail__{name}",
                        lambda path, text: ("write_file", {"file_path": str(path), "content": text}),
                        live="a live Qwen Code session", agent=AGENT)


def test_mail_reaches_qwen_once_and_its_mcp_tools_run(project):
    mail_reaches_once_and_the_mcp_tools_run(project, QWEN_CODE)


def test_mail_after_a_tool_reaches_qwen_once_and_is_not_marked_read(project):
    mail_after_a_tool_is_told_once_and_not_marked_read(project, QWEN_CODE)


def test_what_the_read_tool_showed_is_not_told_again(project):
    what_the_read_tool_showed_is_not_told_again(project, QWEN_CODE)


def test_mail_during_a_qwen_turn_holds_the_stop_once(project):
    mail_during_a_turn_holds_the_stop_once(project, QWEN_CODE)


def test_a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project):
    a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project, QWEN_CODE)


@pytest.mark.requires("tmux")
def test_an_idle_interactive_qwen_session_is_woken_by_mail_once_and_its_waker_ends_with_it(project):
    """Interactive `qwen` in tmux: its session is live from the start (once the person approved the workspace's
    MCP server, as Qwen Code asks); idle after a turn, its waker is armed (status: reachable, armed). Mail sent
    from another process wakes it: the model gets a new request holding the envelope once, nobody having typed.
    After /quit the session no longer counts as live and its waker is gone."""
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}]) as model:
        with _interactive(project, model) as terminal:
            terminal.type("hello", "Enter")
            terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the turn did not end")
            row = terminal.wait_for(lambda: (lambda r: r["sessions"] == 1 and r["watch_state"] == "armed" and r)(
                status_of(AGENT)), 30, "the idle session's waker did not arm")
            assert row["reachable"] and row["reached_by"].startswith("woken within about a second (a live Qwen Code")
            # one per session: the Stop's waker replaced the start's
            terminal.wait_for(lambda: len(wakers(project, "qwen")) == 1, 10, "two wakers for one session")
            turns = len([r for r in model.requests if _main(r)])
            send_urgent_mail(AGENT)
            woken = model.wait_for(lambda r: _main(r) and URGENT in json.dumps(r["messages"]), 30)
            assert woken is not None, terminal.screen()
            said = json.dumps(woken["messages"])
            assert said.count(URGENT) == 1 and WOKEN in said
            assert len([r for r in model.requests if _main(r)]) == turns + 1  # nobody typed: the waker's turn
            terminal.wait_for(lambda: terminal.screen().count("ok from the model") >= 2, 60, "the woken turn")
            # The woken turn's Stop started the next waker: armed again, one waker.
            terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed"
                              and len(wakers(project, "qwen")) == 1, 30,
                              "the waker did not arm again after the woken turn")
            terminal.type("/quit", "Enter")
            terminal.wait_for(lambda: status_of(AGENT)["sessions"] == 0, 30,
                              "the session still counts as live after /quit")
            terminal.wait_for(lambda: not wakers(project, "qwen"), 30, "the waker outlived its session")
    assert not status_of(AGENT)["reachable"]
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # told, never consumed
    inputs = list((project / ".qwen" / "agent-mail").glob("wake-*.jsonl"))  # one per Qwen Code process
    assert len(inputs) == 1 and inputs[0].read_text().count(URGENT) == 1


def _interactive(project, model: FakeModel, *options: str) -> Terminal:
    """Interactive `qwen` in tmux, at its prompt: the person approved the workspace's MCP server once."""
    home = project.parent / "qwen-home"
    env = process_env(HOME=str(home), OPENAI_API_KEY="x", OPENAI_BASE_URL=f"{model.url}/v1",
                      OPENAI_MODEL="scripted", QWEN_USAGE_STATISTICS_ENABLED="false", TMPDIR=private_tmp(home))
    passed = [k for k in env if k.startswith(("OPENAI_", "QWEN_"))
              or k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH", "AGENT_MAIL_TOKEN")]
    command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), QWEN, "--auth-type",
                          "openai", *options])

    class AtItsPrompt(Terminal):
        def __enter__(self) -> Terminal:
            super().__enter__()
            try:
                if "--approval-mode" not in options:  # yolo asks nothing
                    self.wait_for(lambda: "Approve this server" in self.screen(), 60, "no MCP approval asked")
                    self.type("1", "Enter")  # the person approves the workspace's MCP server once
                self.wait_for(lambda: "Type your message" in self.screen(), 60, "qwen did not reach its prompt")
            except BaseException:
                self.__exit__(None, None, None)
                raise
            return self

    return AtItsPrompt(project.parent, f"agent-mail-qwen-{os.getpid()}", project, command)


@pytest.mark.requires("tmux")
def test_a_working_qwen_session_is_at_work_and_mail_during_a_tool_call_is_told_after_it(project):
    """Issue 33 #5: the waker armed when the last turn ended stands down when the next turn starts: 2 s into a 5 s
    tool call, status says the session is at work (not "woken within about a second"), and mail sent then is told
    after the tool call, in that turn, once; not as an idle wake after the turn. The turn's end arms the waker
    again."""
    # At least 5 s, and until the test has sent its mail (a loaded machine must not end the call before it). Not
    # `sleep 5; ...`: Qwen Code refuses a command that starts with a sleep of 2 s or more followed by another
    # ("Blocked: sleep 5 followed by: ..."), and the turn would end at once, its waker rightly armed.
    gate = os.path.join(str(project), "mail-sent")
    slow = f"for i in 1 2 3 4 5; do sleep 1; done; while [ ! -e {gate} ]; do sleep 0.1; done; echo {SLOW_DONE}"

    def script(request):
        if not _main(request):
            return None
        said = json.dumps(request["messages"])
        if "run the slow step" in said and not tool_results(request):
            return [{"type": "tool_use", "name": "run_shell_command",
                     "input": {"command": slow, "description": "the slow step"}}]
        return [{"type": "text", "text": "ok from the model"}]

    with FakeModel(script) as model, _interactive(project, model, "--approval-mode", "yolo") as terminal:
        terminal.type("hello", "Enter")
        terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the first turn did not end")
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed", 30, "the idle session's waker")
        terminal.type("run the slow step", "Enter")
        assert model.wait_for(lambda r: _main(r) and "run the slow step" in json.dumps(r["messages"]), 60)
        row = until(lambda: (lambda r: "at work" in r["reached_by"] and r)(status_of(AGENT)), 3,
                    lambda: f"the working session is not said to be at work: {status_of(AGENT)}")
        assert row["reachable"] and row["watch_state"] != "armed" and not wakers(project, "qwen")
        assert row["reached_by"].startswith("told at its next prompt or tool call (a live Qwen Code session")
        send_urgent_mail(AGENT)  # during the tool call
        open(gate, "w").close()  # the call may end now
        # The request that carries the call's result (it ran to its end: it was not refused) carries the mail too.
        after = model.wait_for(lambda r: _main(r) and SLOW_DONE in json.dumps(r["messages"]), 30)
        assert after is not None, terminal.screen()
        assert URGENT in json.dumps(after["messages"])
        terminal.wait_for(lambda: terminal.screen().count("ok from the model") >= 2, 60, "the turn did not end")
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed" and len(wakers(project, "qwen")) == 1,
                          30, "the waker did not arm again after the turn")
        loop = [r for r in model.requests if _main(r)]
        assert not any(WOKEN in json.dumps(r["messages"]) for r in loop)  # told in the turn, not as an idle wake
        assert json.dumps(loop[-1]["messages"]).count(URGENT) == 1


@pytest.mark.requires("tmux")
def test_a_killed_qwen_session_is_not_reachable_at_once(project):
    """Issue 33 #6: kill -9 of Qwen Code, idle with its waker armed: its waker ends with it (it sleeps on the
    process's pidfd), so a send that requires a reachable recipient refuses at once, not seconds later."""
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}]) as model, \
            _interactive(project, model) as terminal:
        terminal.type("hello", "Enter")
        terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the turn did not end")
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed", 30, "the idle session's waker")
        qwen = _harness_process(terminal)
        os.kill(qwen, signal.SIGKILL)
        until(_refused, 3.0, lambda: f"still reachable after kill -9: {status_of(AGENT)}")
        until(lambda: not wakers(project, "qwen"), 3.0, "the waker outlived its harness")


def _refused() -> bool:
    """Whether a send that requires a reachable recipient refuses (it is asked once status says not reachable: a
    send that went through would be mail that wakes the session)."""
    if status_of(AGENT)["reachable"]:
        return False
    done = am_process("send", "--from", "team:carl", "--to", AGENT, "--subject", "still there?",
                      "--require-reachable")
    assert done.returncode == 3, done.stdout + done.stderr
    return True


def _harness_process(terminal: Terminal) -> int:
    """The Qwen Code process in the terminal: the one whose hooks named it (the session's harness process)."""
    from agent_mail.operations import mail

    with mail.open_mailbox() as mailbox, mailbox.store.transaction():
        pids = {s["pid"] for s in mailbox.store.harness_sessions_of(AGENT)}  # those not ended
    assert len(pids) == 1, pids
    return pids.pop()
