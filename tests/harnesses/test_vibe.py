"""The real Mistral Vibe, set up by `agent-mail setup vibe`, against a scripted model.

Vibe is PyPI's mistral-vibe (`.ci/run` installs the pinned version in a virtual environment of its own under
.cache/vibe: it needs Python 3.12 or newer); the model is tests/lib/fake_model.py speaking the OpenAI Chat
Completions API on 127.0.0.1, named by the test HOME's ~/.vibe/config.toml as a generic provider, with update
checks, telemetry and connectors off. The test HOME's ~/.vibe/hooks.toml holds a hook of the person's own first,
so setup must merge into it and --remove give it back byte for byte. Skipped with the reason where Vibe is not
installed; required in CI.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from tests.lib.cli import am_process, json_of, process_env
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import HELD, URGENT, Terminal, chat_tools, mail_during_the_turn, private_tmp, \
    send_urgent_mail, status_of
from tests.lib.tools import find
from tests.lib.waiting import until

from agent_mail.harness import run as running
from agent_mail.files import pid_alive
from agent_mail.harness import ends

AGENT = "proj:coder"
VIBE = find("vibe")
TRIGGER = running.trigger_text(AGENT)
# The person's own hooks file before setup: a comment, a hook of theirs, no newline at the end.
THEIRS = '# my hooks\n[[hooks]]\nname = "mine"\ntype = "post_agent"\ncommand = "true"   # kept as it is'


def _home() -> str:
    return os.path.join(os.environ["HOME"], ".vibe")


def _setup(project, *more: str, **env: str) -> dict:
    return json_of(am_process("setup", "vibe", "--agent", AGENT, "--dir", str(project), *more,
                              env=process_env(**env)))


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    directory.mkdir()
    os.makedirs(_home(), exist_ok=True)
    with open(os.path.join(_home(), "hooks.toml"), "w") as handle:
        handle.write(THEIRS)
    _setup(directory)
    return directory


def _configured(model: FakeModel) -> None:
    """~/.vibe/config.toml: the scripted model as a generic OpenAI-style provider; nothing else reached."""
    with open(os.path.join(_home(), "config.toml"), "w") as handle:
        handle.write(f'active_model = "scripted"\nenable_update_checks = false\nenable_telemetry = false\n'
                     f'enable_connectors = false\nshow_greeting = false\n\n[[providers]]\nname = "scripted"\n'
                     f'api_base = "{model.url}/v1"\napi_key_env_var = ""\nbackend = "generic"\n\n[[models]]\n'
                     f'name = "scripted"\nprovider = "scripted"\nalias = "scripted"\n')


def _env(**more: str) -> dict:
    env = process_env(TMPDIR=private_tmp(os.environ["HOME"]), PYTHON_KEYRING_BACKEND="keyring.backends.null.Keyring")
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    env.update(more)
    return env


def _run(project, model: FakeModel, prompt: str, **env: str) -> subprocess.CompletedProcess:
    _configured(model)
    proc = subprocess.run([VIBE, "-p", prompt, "--auto-approve"], cwd=str(project), env=_env(**env),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _main(request: dict) -> bool:
    """A request of the session's own loop (it offers the tools), not a side call (a title)."""
    return "bash" in chat_tools(request)


def _tool_results(request: dict) -> list[str]:
    return [m.get("content") or "" for m in request.get("messages", []) if m.get("role") == "tool"]


def _bash(command: str) -> list[dict]:
    return [{"type": "tool_use", "name": "bash", "input": {"command": command}}]


def _unread() -> int:
    return json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"]


requires_vibe = pytest.mark.requires("vibe")


# -- setup: the user's hooks file, scoped, given back exactly -------------------------------------------------------
def test_setup_merges_a_block_for_its_directory_refuses_nesting_and_remove_gives_back_the_exact_bytes(tmp_path,
                                                                                                     mailbox_path):
    hooks = os.path.join(_home(), "hooks.toml")
    os.makedirs(_home())
    with open(hooks, "w") as handle:
        handle.write(THEIRS)
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir(), second.mkdir(), (first / "inner").mkdir()
    done = _setup(first)
    assert [f["action"] for f in done["files"]] == ["update", "create"] and not done["wakes_idle_session"]
    assert any("agent-mail run -- vibe" in note for note in done["notes"])
    text = open(hooks).read()
    assert text.startswith(THEIRS + "\n") and text.count("[[hooks]]") == 4
    assert _setup(first)["files"][0]["action"] == "unchanged"  # a second run changes no byte
    _setup(second)
    assert text in open(hooks).read()  # the first block kept, the second one added after it
    nested = am_process("setup", "vibe", "--agent", AGENT, "--dir", str(first / "inner"))
    assert nested.returncode == 2 and "nest" in json.loads(nested.stderr)["error"]
    # run types only where the hooks will read the line: the directory set up, or below it
    from agent_mail.harness import setup

    assert setup.set_up_for("vibe", str(first / "inner")) == "vibe" and setup.set_up_for("vibe", str(tmp_path)) is None
    # A hook outside its directory does nothing (and starts no Python): the command is scoped by the shell.
    command = next(line for line in open(hooks).read().splitlines() if "hook vibe context" in line)
    import tomllib

    context = next(h["command"] for h in tomllib.loads(open(hooks).read())["hooks"]
                   if h["name"].startswith("agent-mail-context") and str(first) in h["command"])
    outside = subprocess.run(["sh", "-c", context], cwd=str(tmp_path), input=b"{}", capture_output=True)
    assert outside.returncode == 0 and outside.stdout == outside.stderr == b"", command
    _setup(second, "--remove")
    _setup(first, "--remove")
    assert open(hooks).read() == THEIRS  # the exact bytes, no newline added at the end
    assert not (first / ".agent-mail-db").exists()
    # Without the kept original too: setup's own edit takes out exactly what it put in.
    with open(hooks, "w") as handle:
        handle.write(THEIRS + "\n\n# more of mine\n")
    _setup(first, XDG_STATE_HOME=str(tmp_path / "state-a"))
    _setup(first, "--remove", XDG_STATE_HOME=str(tmp_path / "state-b"))
    assert open(hooks).read() == THEIRS + "\n\n# more of mine\n"


def test_a_hooks_file_that_is_not_toml_is_refused_and_nothing_is_written(tmp_path, mailbox_path):
    os.makedirs(_home())
    with open(os.path.join(_home(), "hooks.toml"), "w") as handle:
        handle.write("[[hooks]\nname = ")
    done = am_process("setup", "vibe", "--agent", AGENT, "--dir", str(tmp_path))
    assert done.returncode == 2 and "is not valid TOML" in json.loads(done.stderr)["error"]
    assert open(os.path.join(_home(), "hooks.toml")).read() == "[[hooks]\nname = " and not os.path.exists(
        tmp_path / ".agent-mail-db")


# -- the real Vibe ----------------------------------------------------------------------------------------------------
@requires_vibe
def test_mail_is_told_after_tool_calls_once_never_marked_read(project):
    """Mail waiting when the session starts is told after its first tool call (Vibe has no session start); mail that
    lands later after the next tool call; each once, framed as mail from another agent, never its body."""
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0
    during = []

    def script(request):
        if not _main(request):
            return None
        results = len(_tool_results(request))
        if results == 0:
            return _bash("echo one")
        if results == 1:
            send_urgent_mail(AGENT)
            return _bash("echo two")
        if results == 2:
            during.append(status_of(AGENT))  # while the session lives, idle between tools: no wake of its own
            return _bash("echo three")
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        proc = _run(project, model, "Do the task.")
    assert "done" in proc.stdout
    loop = [r for r in model.requests if _main(r)]
    first, second, third = _tool_results(loop[-1])
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "test_login" not in first
    assert "Mail is from other agents, not your user" in first and "agent-mail read proj:coder" in first
    assert URGENT in second and "Fix the flaky test" not in second and URGENT not in third
    said = json.dumps(loop[-1]["messages"])
    assert said.count(URGENT) == 1 and said.count("Fix the flaky test") == 1 and HELD not in said
    assert during[0]["reachable"] and during[0]["reached_by"].startswith("told at its next tool call")
    assert "a live Mistral Vibe session" in during[0]["reached_by"]
    assert not status_of(AGENT)["reachable"]  # its process ended: no longer live
    assert _unread() == 2  # told, never consumed


@requires_vibe
def test_mail_during_a_turn_holds_the_stop_once(project):
    """A tool call first (the session is known), then mail lands while the model answers: the turn's end (post_agent)
    is sent back once with the envelope; the next end passes."""
    def script(request):
        if _main(request) and not _tool_results(request):
            return _bash("true")
        return held(request)

    held = mail_during_the_turn(_main, lambda request: request["messages"], lambda: send_urgent_mail(AGENT))
    with FakeModel(script) as model:
        proc = _run(project, model, "Do the task.")
    loop = [r for r in model.requests if _main(r)]
    back = [r for r in loop if HELD in json.dumps(r["messages"])]
    assert len(back) == 1 and json.dumps(back[0]["messages"]).count(URGENT) == 1
    assert "it is mail for you, not an error" in json.dumps(back[0]["messages"])
    assert "I will handle it next." in proc.stdout
    assert _unread() == 1


@requires_vibe
def test_mail_waiting_in_a_turn_without_tools_is_told_at_its_end(project):
    """No tool call, no session start: the first turn's end tells the inbox, once (held with it)."""
    send_urgent_mail(AGENT)

    def script(request):
        if not _main(request):
            return None
        if HELD in json.dumps(request["messages"]):
            return [{"type": "text", "text": "I will handle it next."}]
        return [{"type": "text", "text": "All done."}]

    with FakeModel(script) as model:
        proc = _run(project, model, "Hello.")
    back = [r for r in model.requests if _main(r) and HELD in json.dumps(r["messages"])]
    assert len(back) == 1 and "you are proj:coder" in json.dumps(back[0]["messages"])
    assert "I will handle it next." in proc.stdout and _unread() == 1


@requires_vibe
def test_a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project):
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def script(request):
        if not _main(request):
            return None
        results = len(_tool_results(request))
        if results == 0:
            return [{"type": "tool_use", "name": "write_file", "input": {"path": str(held), "content": "x\n"}}]
        if results == 1:
            return [{"type": "tool_use", "name": "write_file", "input": {"path": str(free), "content": "new\n"}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        _run(project, model, "Write the files.")
    assert not held.exists()
    assert free.read_text() == "new\n"
    refused = _tool_results([r for r in model.requests if _main(r)][-1])[0]
    assert "held by proj:holder" in refused and "parser rewrite" in refused
    assert "agent-mail send --from proj:coder --to proj:holder" in refused


# -- woken under `agent-mail run` ---------------------------------------------------------------------------------
def _prompts(model) -> list[str]:
    """The newest user message of each of the session's own requests."""
    said = []
    for request in [r for r in model.requests if _main(r)]:
        users = [m for m in request.get("messages", []) if m.get("role") == "user"]
        said.append(json.dumps(users[-1].get("content")) if users else "")
    return said


def _under_run(project, model, name: str, **more: str) -> Terminal:
    _configured(model)
    env = _env(AGENT_MAIL_RUN_LOG=str(project.parent / "run.log"), **more)
    passed = [k for k in env if k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH", "PYTHON_KEYRING_BACKEND",
                                      "AGENT_MAIL_RUN_LOG", "AGENT_MAIL_TOKEN") or k in more]
    command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), sys.executable, "-m",
                          "agent_mail", "run", "--agent", AGENT, "--", VIBE])
    return Terminal(project.parent, name, project, command)


def _at_prompt(terminal) -> bool:
    lines = [line.rstrip() for line in terminal.screen().splitlines()]
    return ">" in lines and not any("to interrupt" in line for line in lines)


@requires_vibe
@pytest.mark.requires("tmux")
def test_an_idle_vibe_under_run_is_woken_by_mail_told_once_and_nothing_is_marked_read(project):
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}] if _main(request) else None) \
            as model:
        with _under_run(project, model, f"agent-mail-vibe-{os.getpid()}") as terminal:
            terminal.wait_for(lambda: _at_prompt(terminal), 90, "vibe did not reach its prompt")
            until(lambda: status_of(AGENT)["reached_by"].startswith("woken now (an armed watch"), 30,
                  lambda: f"run did not arm its wait at the empty prompt: {status_of(AGENT)}")
            send_urgent_mail(AGENT)
            terminal.wait_for(lambda: TRIGGER in "".join(_prompts(model)), 60, "the idle session was not woken")
            assert TRIGGER in _prompts(model)[0] and URGENT not in _prompts(model)[0]  # one line, never the mail
            # No tool call in that turn: its end tells the envelope, once, as mail.
            terminal.wait_for(lambda: any(URGENT in p for p in _prompts(model)), 60, "the woken turn told nothing")
            terminal.wait_for(lambda: _at_prompt(terminal) and "ok from the model" in terminal.screen(), 60,
                              "the woken turn did not end")
            until(lambda: status_of(AGENT)["sessions"] == 1, 30, "the session is not known to the mailbox")
            until(lambda: status_of(AGENT)["reached_by"].startswith("woken now (an armed watch"), 30,
                  lambda: f"idle again, not woken now: {status_of(AGENT)}")
            # A second wake: the session is known now, and told only what is new.
            turns = len(_prompts(model))
            assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Second thing",
                              "--body", "secret body").returncode == 0
            terminal.wait_for(lambda: any("Second thing" in p for p in _prompts(model)[turns:]), 60,
                              "the second mail did not wake the session")
            terminal.wait_for(lambda: _at_prompt(terminal), 60, "the second woken turn did not end")
            loop = [r for r in model.requests if _main(r)]
            said = json.dumps(loop[-1]["messages"])
            assert said.count(URGENT) == 1 and said.count("Second thing") == 1 and "secret body" not in said
            assert "Mail is from other agents, not your user" in said
            # Text at the prompt: nothing is typed over it, and status stops saying "woken now"; cleared, it wakes.
            turns = len(_prompts(model))
            terminal.type("h", "e", "l", "l", "o")
            decisions = project.parent / "run.log"
            decisions.write_text("")
            assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Third thing").returncode == 0
            until(lambda: "empty prompt is not showing" in decisions.read_text(), 30, "run did not hold the wake")
            until(lambda: status_of(AGENT)["reached_by"].startswith("told at its next tool call"), 30,
                  lambda: f"status while text is unsent: {status_of(AGENT)['reached_by']}")
            assert len(_prompts(model)) == turns and "> hello" in terminal.screen()
            terminal.type(*["BSpace"] * 5)
            terminal.wait_for(lambda: any("Third thing" in p for p in _prompts(model)[turns:]), 60,
                              "no wake once the prompt was cleared")
            assert TRIGGER in _prompts(model)[turns]
    assert _unread() == 3  # told, never consumed


# -- through an agent-mail server ---------------------------------------------------------------------------------
@requires_vibe
@pytest.mark.requires("tmux")
def test_through_a_server_vibe_is_told_after_tools_held_once_and_woken_under_run(tmp_path, server):
    """Set up with AGENT_MAIL_DB naming an agent-mail server: the hooks run as its clients (the token from the
    environment, no file holding it); the same context, held stop and wake under run."""
    project = tmp_path / "project"
    project.mkdir()
    done = _setup(project, AGENT_MAIL_DB=server.url)
    assert done["mailbox"] == server.url and done["token"]["variable"] == "AGENT_MAIL_TOKEN"
    token = server.token("--agent", AGENT)
    assert token not in open(os.path.join(_home(), "hooks.toml")).read()

    def script(request):
        if not _main(request):
            return None
        if HELD in json.dumps(request["messages"]):
            return [{"type": "text", "text": "I will handle it next."}]
        if not _tool_results(request):
            return _bash("echo one")
        if URGENT not in json.dumps(request["messages"]) and not script.sent:
            send_urgent_mail(AGENT)
            script.sent = True
        return [{"type": "text", "text": "All done."}]
    script.sent = False

    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.").returncode == 0
    with FakeModel(script) as model:
        proc = _run(project, model, "Do the task.", AGENT_MAIL_TOKEN=token)
    loop = [r for r in model.requests if _main(r)]
    assert "Fix the flaky test" in _tool_results(loop[-1])[0] and "test_login" not in json.dumps(loop[-1])
    back = [r for r in loop if HELD in json.dumps(r["messages"])]
    assert len(back) == 1 and json.dumps(back[0]["messages"]).count(URGENT) == 1
    assert "I will handle it next." in proc.stdout
    # No session-end hook, and the server cannot see Vibe's process: the hooks' watcher ends the session.
    until(lambda: status_of(AGENT)["sessions"] == 0, 10, lambda: f"still live after Vibe exited: {status_of(AGENT)}")
    left = [name for name in os.listdir(ends.ends_directory()) if not pid_alive(int(name.partition("-")[0]))]
    assert not left  # Vibe's watcher is gone, its lock file too (others' are of harnesses still running)
    assert _unread() == 2  # told, never consumed
    # Read now: through a server, run's helper arms the server's watch while nothing it reported is unread.
    assert am_process("read", AGENT).returncode == 0

    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}] if _main(request) else None) \
            as model:
        with _under_run(project, model, f"agent-mail-vibe-served-{os.getpid()}", AGENT_MAIL_DB=server.url,
                        AGENT_MAIL_TOKEN=token) as terminal:
            terminal.wait_for(lambda: _at_prompt(terminal), 90, "vibe did not reach its prompt")
            until(lambda: status_of(AGENT)["reached_by"].startswith("woken now (an armed watch"), 30,
                  lambda: f"run did not arm its wait through the server: {status_of(AGENT)}")
            assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Served wake",
                              "--body", "secret body").returncode == 0
            terminal.wait_for(lambda: any("Served wake" in p for p in _prompts(model)), 60,
                              "the idle session was not woken through the server")
            assert TRIGGER in _prompts(model)[0]
            said = json.dumps([r for r in model.requests if _main(r)][-1]["messages"])
            assert said.count("Served wake") == 1 and "secret body" not in said
    assert _unread() == 1  # told, never consumed
