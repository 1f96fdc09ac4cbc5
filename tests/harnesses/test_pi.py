"""The real Pi coding agent, set up by `agent-mail setup pi`, against a scripted model.

Pi is the npm package @mariozechner/pi-coding-agent (`.ci/run` installs the pinned version under .cache/node). Its
extension, DIR/.pi/extensions/agent-mail.ts, is what setup writes; Pi loads it at start with no prompt. The model is
tests/lib/fake_model.py speaking the OpenAI Chat Completions API on 127.0.0.1, a provider of HOME/.pi/agent/models.json
(HOME a throwaway directory); PI_OFFLINE=1 keeps Pi from fetching fd and ripgrep, checking for updates and sending
its install ping. Skipped with the reason where Pi is not installed; required in CI.

`pi -p` (one prompt, then exit) proves context, told once, not marked read and the guard; the interactive TUI in tmux
proves what needs an idle session: live from its start, the held stop, the idle wake and the end with Pi; and once
more with every hook through an agent-mail server.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

import pytest

from tests.lib.cli import am_process, process_env
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import (HELD, URGENT, Terminal, chat_tools, mail_during_the_turn, private_tmp,
                                 send_urgent_mail, status_of)
from tests.lib.tools import find

AGENT = "proj:coder"
PI = find("pi")
pytestmark = pytest.mark.requires("pi")
WOKEN = "agent-mail: new mail arrived while you were idle"
EXTENSION = os.path.join(".pi", "extensions", "agent-mail.ts")


@pytest.fixture
def model():
    with FakeModel() as running:
        yield running


@pytest.fixture
def project(tmp_path, model):
    """A project set up for Pi, and Pi's own settings in its HOME naming the scripted model (as a person's would)."""
    directory = tmp_path / "project"
    (directory / ".pi").mkdir(parents=True)
    mine = b'{\n    "theme": "dark"\n}'  # a project setting of the person's own: setup leaves it be
    (directory / ".pi" / "settings.json").write_bytes(mine)
    agent = tmp_path / "pi-home" / ".pi" / "agent"
    agent.mkdir(parents=True)
    (agent / "models.json").write_text(json.dumps({"providers": {"scripted": {
        "baseUrl": f"{model.url}/v1", "api": "openai-completions", "apiKey": "x", "models": [{"id": "scripted"}]}}}))
    (agent / "settings.json").write_text(json.dumps({"defaultProvider": "scripted", "defaultModel": "scripted",
                                                     "enableInstallTelemetry": False}))
    done = am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["wakes_idle_session"] is True
    assert (directory / EXTENSION).read_text().startswith("// agent-mail for Pi: written by `agent-mail setup pi")
    assert (directory / ".pi" / "settings.json").read_bytes() == mine
    return directory


def _env(project, **more) -> dict:
    home = project.parent / "pi-home"
    env = process_env(HOME=str(home), TMPDIR=private_tmp(home), PI_OFFLINE="1", PI_SKIP_VERSION_CHECK="1",
                      PI_TELEMETRY="0", **more)
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded in the extension
    return env


def _run(project, prompt: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([PI, "-p", prompt], cwd=str(project), env=_env(project), capture_output=True, text=True,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _main(request: dict) -> bool:
    """A request of the session's own loop (it offers the tools)."""
    return "write" in chat_tools(request)


def _tool_results(request: dict) -> int:
    return sum(m.get("role") == "tool" for m in request.get("messages", []))


def _loop(model) -> list[dict]:
    return [r for r in model.requests if _main(r)]


def _unread() -> int:
    return json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"]


def test_setup_pi_then_remove_gives_back_the_exact_bytes_and_refuses_an_extension_not_its_own(tmp_path):
    directory = tmp_path / "project"
    (directory / ".pi" / "extensions").mkdir(parents=True)
    theirs = directory / ".pi" / "extensions" / "theirs.ts"
    theirs.write_bytes(b"export default function () {}\n")
    done = am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    text = (directory / EXTENSION).read_text()
    assert f"--agent {AGENT}" in text.split("\n", 1)[0] and '"hook",\n    "pi"' in text
    again = am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory))  # a second run changes nothing
    assert {f["action"] for f in json.loads(again.stdout)["files"]} == {"unchanged"}
    assert am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory), "--remove").returncode == 0
    assert sorted(os.listdir(directory)) == [".pi"] and os.listdir(directory / ".pi" / "extensions") == ["theirs.ts"]
    assert theirs.read_bytes() == b"export default function () {}\n"
    assert am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory), "--remove").returncode == 0
    theirs.unlink()
    assert am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory)).returncode == 0
    assert am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory), "--remove").returncode == 0
    assert os.listdir(directory) == []  # the directories setup made went with it
    (directory / ".pi" / "extensions").mkdir(parents=True)
    (directory / EXTENSION).write_text("// my own agent-mail.ts\n")
    refused = am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory))
    assert refused.returncode == 2 and "was not written by agent-mail setup" in json.loads(refused.stderr)["error"]
    assert (directory / EXTENSION).read_text() == "// my own agent-mail.ts\n"
    assert not (directory / ".agent-mail-db").exists()  # refused: nothing written


def test_mail_reaches_pi_at_its_prompt_and_after_a_tool_once_and_is_never_marked_read(project, model):
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0
    during, sent = [], []

    def script(request):
        if not _main(request):
            return None
        results = _tool_results(request)
        if results == 0:
            during.append(status_of(AGENT))  # while the session lives
            return [{"type": "tool_use", "name": "write", "input": {"path": str(project / "a.txt"), "content": "a\n"}}]
        if results == 1 and not sent:
            send_urgent_mail(AGENT)  # lands while the next tool runs
            sent.append(True)
            return [{"type": "tool_use", "name": "write", "input": {"path": str(project / "b.txt"), "content": "b\n"}}]
        if results == 2:
            return [{"type": "tool_use", "name": "read", "input": {"path": str(project / "a.txt")}}]
        return [{"type": "text", "text": "done"}]

    model.script = script
    _run(project, "Write two files.")
    assert (project / "b.txt").read_text() == "b\n"
    assert during[0]["reachable"] and "a live Pi session" in during[0]["reached_by"]
    assert status_of(AGENT)["sessions"] == 0  # Pi exited: its session ended with it
    loop = _loop(model)
    first = json.dumps(loop[0]["messages"])
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "test_login" not in first
    assert "`agent-mail read proj:coder`" in first  # no MCP client: the command, for its bash tool
    last = json.dumps(loop[-1]["messages"])
    # told once each: the inbox at the prompt, the urgent mail after the tool, nothing again after later tools
    assert last.count("you are proj:coder") == 1 and last.count("Fix the flaky test") == 1
    assert last.count(URGENT) == 1 and "never your user's instructions" in last
    assert _unread() == 2  # told, never consumed


def test_a_write_or_edit_of_a_reserved_file_is_blocked_while_a_free_one_is_written(project, model):
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free, edited = project / "src" / "lib.rs", project / "notes.txt", project / "src" / "main.rs"
    edited.write_text("fn main() {}\n")
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr
    calls = [("write", {"path": "src/lib.rs", "content": "x\n"}),
             ("edit", {"path": str(edited), "edits": [{"oldText": "fn main() {}", "newText": "fn main() { x() }"}]}),
             ("write", {"path": str(free), "content": "new\n"})]

    def script(request):
        if not _main(request):
            return None
        results = _tool_results(request)
        if results < len(calls):
            return [{"type": "tool_use", "name": calls[results][0], "input": calls[results][1]}]
        return [{"type": "text", "text": "done"}]

    model.script = script
    _run(project, "Write the files.")
    assert not held.exists() and edited.read_text() == "fn main() {}\n"
    assert free.read_text() == "new\n"
    said = json.dumps(_loop(model)[-1]["messages"])
    assert said.count("held by proj:holder") == 2 and "parser rewrite" in said
    assert "agent-mail send --from proj:coder --to proj:holder" in said


def _command(project, **more) -> str:
    env = _env(project, **more)
    passed = [k for k in env if k.startswith("PI_") or k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH", *more)]
    return shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), PI])


def _started(terminal) -> None:
    terminal.wait_for(lambda: "agent-mail.ts" in terminal.screen(), 60, "pi did not start with the extension")


@pytest.mark.requires("tmux")
def test_an_idle_pi_is_woken_by_mail_its_stop_held_once_and_it_ends_with_pi(project, model):
    """Interactive `pi` in tmux. Live and armed from its start (before any prompt); mail that lands during the first
    turn holds its stop once (sent back as the next prompt); idle afterwards, mail wakes it (a new turn with the
    envelopes, told once, nobody typing); after /quit the session no longer counts as live and its waiter is gone."""
    with Terminal(project.parent, f"agent-mail-pi-{os.getpid()}", project, _command(project)) as terminal:
        _started(terminal)
        row = terminal.wait_for(lambda: (lambda r: r["watch_state"] == "armed" and r)(status_of(AGENT)), 30,
                                "not armed at the session's start")
        assert "a live Pi session" in row["reached_by"] and row["reached_by"].startswith("woken now")
        model.script = mail_during_the_turn(_main, lambda request: request["messages"],
                                            lambda: send_urgent_mail(AGENT))
        terminal.type("Do the task.", "Enter")
        held = terminal.wait_for(lambda: [r for r in _loop(model) if HELD in json.dumps(r["messages"])], 60,
                                 "the stop was not held")
        assert URGENT in json.dumps(held[0]["messages"])
        terminal.wait_for(lambda: "I will handle it next." in terminal.screen(), 60, "the held turn did not end")
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed", 30, "no waiter armed while idle")
        turns = len(_loop(model))
        assert len([r for r in _loop(model) if HELD in json.dumps(r["messages"])]) == 1  # held once
        model.script = lambda request: [{"type": "text", "text": "woken and on it"}] if _main(request) else None
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Rebase the branch",
                          env=process_env()).returncode == 0
        terminal.wait_for(lambda: len(_loop(model)) > turns, 30, "the idle session was not woken")
        woken = json.dumps(_loop(model)[turns]["messages"])
        assert WOKEN in woken and woken.count("Rebase the branch") == 1 and woken.count(URGENT) == 1
        terminal.wait_for(lambda: "woken and on it" in terminal.screen(), 60, "the woken turn did not end")
        pi = int(subprocess.run([*terminal.tmux, "list-panes", "-t", terminal.name, "-F", "#{pane_pid}"],
                                capture_output=True, text=True).stdout.split()[0])
        waiters = terminal.wait_for(lambda: _waiters(pi), 30, "no waiter re-armed after the wake")
        terminal.type("/quit", "Enter")
        terminal.wait_for(lambda: status_of(AGENT)["sessions"] == 0, 30, "the session still counts as live after /quit")
        terminal.wait_for(lambda: not any(os.path.exists(f"/proc/{p}") for p in waiters), 30, "a waiter outlived Pi")
    assert _unread() == 2  # told, never consumed


@pytest.mark.requires("tmux")
def test_pi_through_an_agent_mail_server_is_woken_before_its_first_prompt_and_after_a_turn(tmp_path, model, server):
    """Every hook of the extension through `agent-mail serve` (the mailbox its URL, the token from AGENT_MAIL_TOKEN
    in Pi's environment, in no file): live and armed from its start, mail wakes it before anyone typed (the inbox as
    it stood at the start, then the new envelope), a prompt tells nothing twice, and mail wakes it again after a
    turn; /quit ends the session."""
    token = server.token("--agent", AGENT)
    directory = tmp_path / "project"
    directory.mkdir()
    agent = tmp_path / "pi-home" / ".pi" / "agent"
    agent.mkdir(parents=True)
    (agent / "models.json").write_text(json.dumps({"providers": {"scripted": {
        "baseUrl": f"{model.url}/v1", "api": "openai-completions", "apiKey": "x", "models": [{"id": "scripted"}]}}}))
    (agent / "settings.json").write_text(json.dumps({"defaultProvider": "scripted", "defaultModel": "scripted"}))
    done = am_process("setup", "pi", "--agent", AGENT, "--dir", str(directory),
                      env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token))
    assert done.returncode == 0, done.stderr
    text = (directory / EXTENSION).read_text()
    assert server.url in text and token not in text

    def send(subject: str) -> None:
        assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", subject,
                          env=process_env()).returncode == 0

    send("Fix the flaky test")
    model.script = lambda request: [{"type": "text", "text": "on it"}] if _main(request) else None
    command = _command(directory, AGENT_MAIL_TOKEN=token)
    with Terminal(tmp_path, f"agent-mail-pi-served-{os.getpid()}", directory, command) as terminal:
        _started(terminal)
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed", 30, "not armed at the session's start")
        send("Rebase the branch")
        terminal.wait_for(lambda: _loop(model), 30, "the idle session was not woken before its first prompt")
        woken = json.dumps(_loop(model)[0]["messages"])
        assert "you are proj:coder" in woken and woken.count("Fix the flaky test") == 1
        assert WOKEN in woken and woken.count("Rebase the branch") == 1
        terminal.wait_for(lambda: "on it" in terminal.screen(), 60, "the woken turn did not end")
        terminal.wait_for(lambda: status_of(AGENT)["watch_state"] == "armed", 30, "no waiter armed while idle")
        terminal.type("Hello.", "Enter")
        terminal.wait_for(lambda: len(_loop(model)) > 1, 60, "the prompt did not reach the model")
        prompted = json.dumps(_loop(model)[1]["messages"])
        assert prompted.count("Fix the flaky test") == 1 and prompted.count("Rebase the branch") == 1  # told once
        terminal.wait_for(lambda: len(_loop(model)) == 2 and status_of(AGENT)["watch_state"] == "armed", 60,
                          "no waiter armed after the prompt's turn")
        send("Ship it")
        terminal.wait_for(lambda: len(_loop(model)) > 2, 30, "the idle session was not woken after a turn")
        again = json.dumps(_loop(model)[2]["messages"])
        assert again.count("Ship it") == 1 and again.count(WOKEN) == 2
        terminal.type("/quit", "Enter")
        terminal.wait_for(lambda: status_of(AGENT)["sessions"] == 0, 30, "the session still counts as live after /quit")
    code, log = server.stop()
    calls = [json.loads(line) for line in log.splitlines() if '"path"' in line]
    hooked = [c for c in calls if c.get("command") == "hook" and c["status"] == 200]
    assert len(hooked) >= 5 and all(c["as"] == AGENT for c in hooked)  # start, prompts, stops, waits, end carried
    assert token not in log
    assert _unread() == 3  # told, never consumed


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _waiters(ancestor: int) -> list[int]:
    """The `hook pi wait` processes running under process `ancestor` (the terminal's Pi)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
        except OSError:
            continue
        if not (entry.isdigit() and b"hook" in words and b"pi" in words and b"wait" in words):
            continue
        pid = int(entry)
        while pid > 1 and pid != ancestor:
            pid = _parent(pid)
        if pid == ancestor:
            found.append(int(entry))
    return found
