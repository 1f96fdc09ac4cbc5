"""The real Codex CLI, set up by `agent-mail setup codex`, against a scripted model.

Codex is the npm package @openai/codex (`.ci/run` installs the pinned version under .cache/node); the
model is tests/lib/fake_model.py speaking the OpenAI Responses API on 127.0.0.1, configured as a custom
provider in a throwaway CODEX_HOME. `codex exec --trust --dangerously-bypass-hook-trust` stands for a
user who trusted the project and reviewed its hooks once. Skipped with the reason where Codex is not
installed; required in CI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.lib.cli import am_process, process_env
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import HELD, URGENT, WOKEN, mail_during_the_turn, private_tmp, send_urgent_mail, wakers
from tests.lib.tools import find
from tests.lib.waiting import until

AGENT = "proj:coder"


CODEX = find("codex")
SLOW_DONE = "the slow step is done"
pytestmark = pytest.mark.requires("codex")
pytest.importorskip("mcp", reason="the mcp extra is not installed")


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    directory.mkdir()
    (tmp_path / "codex-home").mkdir()
    done = am_process("setup", "codex", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def _run(project, model: FakeModel, prompt: str) -> list[dict]:
    home = project.parent / "codex-home"
    (home / "config.toml").write_text(
        'model = "gpt-test"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\nname = "scripted"\n'
        f'base_url = "{model.url}/v1"\nenv_key = "SCRIPTED_KEY"\nwire_api = "responses"\n')
    env = process_env(CODEX_HOME=str(home), HOME=str(home), SCRIPTED_KEY="test", TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    proc = subprocess.run([CODEX, "exec", "--trust", "--dangerously-bypass-hook-trust", "--skip-git-repo-check",
                           "--json", prompt], cwd=str(project), env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _tool_results(request: dict) -> list:
    return [item for item in request.get("input", []) if isinstance(item, dict)
            and item.get("type") == "function_call_output"]


def _main(request: dict) -> bool:
    return any(tool.get("name") == "mcp__agent_mail" for tool in request.get("tools", []))


def test_mail_reaches_codex_and_its_mcp_tools_run_without_approval(project):
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0

    def script(request):
        if not _main(request):
            return None
        if _tool_results(request):
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "namespace": "mcp__agent_mail", "name": "read", "input": {}}]

    with FakeModel(script) as model:
        events = _run(project, model, "Check your mail.")
    loop = [r for r in model.requests if _main(r)]
    first = json.dumps(loop[0]["input"])
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "test_login" not in first
    calls = [e["item"] for e in events if e.get("type") == "item.completed"
             and e["item"].get("type") == "mcp_tool_call"]
    assert calls and calls[0]["server"] == "agent-mail" and calls[0]["error"] is None
    assert "test_login" in json.dumps(_tool_results(loop[-1]))
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 0


def test_mail_during_a_codex_turn_holds_the_stop_once(project):
    script = mail_during_the_turn(_main, lambda request: request["input"], lambda: send_urgent_mail(AGENT))
    with FakeModel(script) as model:
        events = _run(project, model, "Do the task.")
    loop = [r for r in model.requests if _main(r)]
    held = [r for r in loop if HELD in json.dumps(r["input"])]
    assert len(held) == 1 and URGENT in json.dumps(held[0]["input"])
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                and e["item"].get("type") == "agent_message"]
    assert messages[-1] == "I will handle it next."
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # told, not consumed
    # Issue 20 #4: the model is told it is mail, not an error. #3: Codex's SessionEnd ended the session, so
    # the identity has no live session once `codex exec` is over.
    assert "it is mail for you, not an error" in json.dumps(held[0]["input"])
    row = json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]
    assert row["sessions"] == 0 and row["reachable"] is False


def _descendants(pid: int) -> set[int]:
    """The processes below `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    children.setdefault(int(handle.read().rsplit(b")", 1)[1].split()[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie has ended)."""
    alive = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                if handle.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                    alive.add(pid)
        except (OSError, IndexError):
            continue
    return alive


def _daemon(pid: int) -> bool:
    """Whether `pid` is Codex's shared app-server daemon (or its updater), which outlives sessions by design."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"app-server" in handle.read()
    except OSError:
        return False


def _agent_mail_processes(project) -> set[int]:
    """The agent-mail processes running in `project` (a session's MCP server, its waker)."""
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                words = handle.read().split(b"\0")
            # `python -m agent_mail ...` (the MCP server) or `python /path/to/agent-mail ...` (a hook: the script)
            ours = b"agent_mail" in words[1:3] or any(w.endswith(b"/agent-mail") for w in words[1:2])
            if entry.isdigit() and ours and os.readlink(f"/proc/{entry}/cwd") == str(project):
                found.add(int(entry))
        except OSError:
            continue
    return _alive(found)


def _stop_daemon(home) -> None:
    """End a Codex app-server daemon (and its updater) that this test's CODEX_HOME started, by the ids it
    recorded, only if each is still a process running from that CODEX_HOME."""
    for name in ("daemon.pid", "daemon-updater.pid", "app-server.pid", "app-server-updater.pid"):
        try:
            pid = json.loads((home / "app-server-daemon" / name).read_text())["pid"]
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if str(home).encode() in handle.read():
                    os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, KeyError, TypeError):
            continue


@pytest.mark.requires("tmux")
def test_an_interactive_codex_session_is_woken_when_idle_and_ends_with_its_exit(project):
    """Interactive `codex` (hooks trusted in its review dialog, as a user does) runs the hooks and the MCP server
    in a shared app-server daemon it starts, which outlives /exit. Issue 28: idle after its turn, the session's
    waker is armed; mail sent from another process wakes it (`codex queue`, which the daemon takes at once): the
    model gets a new request holding the envelope once, nobody having typed. Issue 20 #3: at /exit the session
    stops counting as live within seconds (the daemon unloads the thread thread_unload_delay_secs, set by setup
    to 2, after the terminal left, and fires SessionEnd), and nothing of it is left running: neither the codex
    process, nor its MCP server, nor its waker (the daemon itself is Codex's, shared, and stays)."""
    def status() -> dict:
        return json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]

    def sessions() -> int:
        return status()["sessions"]

    with FakeModel() as model, _interactive(project, model) as terminal:
        pane, wait_for, keys, tmux, name = terminal.pane, terminal.wait_for, terminal.keys, terminal.tmux, terminal.name
        keys("hello")
        keys("Enter")
        wait_for(lambda: model.wait_for(_main, 0) is not None and sessions() == 1, 60,
                 "the turn did not reach the model with a live session")
        wait_for(lambda: status()["watch_state"] == "armed" and len(wakers(project, "codex")) == 1, 30,
                 "the idle session's waker did not arm")
        assert status()["reachable"] and status()["reached_by"].startswith("woken within a second (a live Codex")
        turns = len([r for r in model.requests if _main(r)])
        send_urgent_mail(AGENT)
        woken = model.wait_for(lambda r: _main(r) and URGENT in json.dumps(r["input"]), 60)
        assert woken is not None, pane()
        said = json.dumps(woken["input"])
        assert said.count(URGENT) == 1 and WOKEN in said
        assert len([r for r in model.requests if _main(r)]) == turns + 1  # nobody typed: the waker's turn
        # The woken turn's Stop started the next waker: armed again, one waker.
        wait_for(lambda: status()["watch_state"] == "armed" and len(wakers(project, "codex")) == 1, 30,
                 "the waker did not arm again after the woken turn")
        root = int(subprocess.run([*tmux, "display-message", "-p", "-t", name, "#{pane_pid}"], check=True,
                                  capture_output=True, text=True).stdout)
        below = {pid for pid in _descendants(root) if not _daemon(pid)}  # the terminal's codex
        ours = _agent_mail_processes(project)  # its MCP server and its waker, under the daemon
        assert ours and wakers(project, "codex") <= ours
        keys("/exit")
        keys("Enter")
        # Ended by SessionEnd when the daemon unloads the thread, 2 s after the terminal left (60 s by default).
        wait_for(lambda: sessions() == 0, 30, "the session still counts as live after /exit")
        until(lambda: not _alive(below | ours), 30, lambda: "processes of the session outlived it: " + "; ".join(
            open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:200]
            for pid in _alive(below | ours)), interval=0.2)
        assert not status()["reachable"]


def test_an_apply_patch_of_a_reserved_file_is_denied_before_it_is_written(project):
    """Issue 22: Codex's PreToolUse hook denies an apply_patch (run in its shell, reported as Bash) touching a file
    another live identity holds; the reason reaches the model; a patch of a free file goes through."""
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"
    held.write_text("fn main() {}\n")
    free.write_text("old\n")
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def patch(path: str, old: str, new: str) -> str:
        return (f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
                "EOF\n")

    def script(request):
        if not _main(request):
            return None
        results = len(_tool_results(request))
        if results == 0:
            return [{"type": "tool_use", "name": "exec_command", "input": {"cmd": patch("src/lib.rs", "fn main() {}",
                                                                                         "fn start() {}")}}]
        if results == 1:
            return [{"type": "tool_use", "name": "exec_command", "input": {"cmd": patch("notes.txt", "old", "new")}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        _run(project, model, "Rename main.")
    assert held.read_text() == "fn main() {}\n"
    assert free.read_text() == "new\n"
    said = json.dumps(_tool_results([r for r in model.requests if _main(r)][-1]))
    assert "held by proj:holder" in said and "parser rewrite" in said
    assert "agent-mail send --from proj:coder --to proj:holder" in said


class _Interactive:
    """Interactive `codex` in tmux, at its prompt (the project's hooks trusted in its review dialog, as a user
    does); on leaving, the terminal and the app-server daemon its CODEX_HOME started are stopped."""

    def __init__(self, project, model: FakeModel):
        self.project, self.model, self.home = project, model, project.parent / "codex-home"
        self.name = f"agent-mail-codex-{os.getpid()}"
        self.tmux = ["tmux", "-S", str(project.parent / "tmux.sock")]

    def pane(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True).stdout

    def wait_for(self, what, seconds: float, why: str):
        return until(what, seconds, lambda: f"{why}:\n{self.pane()}", interval=0.2)

    def keys(self, *typed: str) -> None:
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, *typed], check=True)
        time.sleep(0.3)

    def __enter__(self) -> _Interactive:
        (self.home / "config.toml").write_text(
            'model = "gpt-test"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\nname = "scripted"\n'
            f'base_url = "{self.model.url}/v1"\nenv_key = "SCRIPTED_KEY"\nwire_api = "responses"\n\n'
            f'[projects."{self.project}"]\ntrust_level = "trusted"\n')
        env = process_env(CODEX_HOME=str(self.home), HOME=str(self.home), SCRIPTED_KEY="test",
                          TMPDIR=private_tmp(self.home))
        command = " ".join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={env[k]}" for k in
                                                             ("CODEX_HOME", "HOME", "SCRIPTED_KEY", "TMPDIR",
                                                              "PYTHONPATH", "PATH", "AGENT_MAIL_TOKEN")
                                                             if k in env] + [CODEX])
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "200", "-y", "50", "-c",
                        str(self.project), command], check=True)
        try:
            self.wait_for(lambda: "Hooks need review" in self.pane(), 90,
                          "codex did not ask to review the project's hooks")
            self.keys("2")  # "Trust all and continue"
            self.keys("Enter")
            tried = [time.monotonic()]

            def at_prompt() -> bool:
                # Under load Codex can miss keys typed before its menu takes them: the menu is then still there
                # (choose again), or it took the Enter alone and opened its hooks review screen ("t" trusts them
                # all, Escape closes it), as a person would do; tried again only once the last try had 2 s.
                shown = self.pane()
                if "Ask Codex" in shown:
                    return True
                if time.monotonic() - tried[0] > 2:
                    if "t trust all" in shown:
                        self.keys("t")
                        self.keys("Escape")
                        tried[0] = time.monotonic()
                    elif "Trust all and continue" in shown:
                        self.keys("2")
                        self.keys("Enter")
                        tried[0] = time.monotonic()
                return False
            self.wait_for(at_prompt, 60, "codex did not reach its prompt")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run([*self.tmux, "kill-session", "-t", self.name], capture_output=True)
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
        _stop_daemon(self.home)
        for entry in os.listdir("/proc"):  # and any app-server its pid files no longer name: run from this home
            try:
                if entry.isdigit() and os.readlink(f"/proc/{entry}/exe").startswith(str(self.home) + os.sep):
                    os.kill(int(entry), signal.SIGTERM)
            except OSError:
                continue


def _interactive(project, model: FakeModel) -> _Interactive:
    return _Interactive(project, model)


def _status() -> dict:
    return json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]


@pytest.mark.requires("tmux")
def test_a_working_codex_session_is_at_work_and_mail_during_a_tool_call_is_told_after_it(project):
    """Issue 33 #5: the waker armed when the last turn ended stands down when the next turn starts: 2 s into a 5 s
    tool call, status says the session is at work (not "woken within a second"), and mail sent then is told after
    the tool call, in that turn, once; not as an idle wake (`codex queue`) after the turn."""
    # At least 5 s, and until the test has sent its mail (a loaded machine must not end the call before it).
    gate = os.path.join(str(project), "mail-sent")
    slow = f"sleep 5; while [ ! -e {gate} ]; do sleep 0.1; done; echo {SLOW_DONE}"

    def script(request):
        if not _main(request):
            return None
        said = json.dumps(request["input"])
        if "run the slow step" in said and not _tool_results(request):
            return [{"type": "tool_use", "name": "exec_command", "input": {"cmd": slow}}]
        return [{"type": "text", "text": "ok from the model"}]

    with FakeModel(script) as model, _interactive(project, model) as terminal:
        terminal.keys("hello")
        terminal.keys("Enter")
        terminal.wait_for(lambda: _status()["watch_state"] == "armed" and len(wakers(project, "codex")) == 1, 60,
                          "the idle session's waker did not arm after the first turn")
        terminal.keys("run the slow step")
        terminal.keys("Enter")
        assert model.wait_for(lambda r: _main(r) and "run the slow step" in json.dumps(r["input"]), 60)
        row = terminal.wait_for(lambda: (lambda r: "at work" in r["reached_by"] and r)(_status()), 3,
                                "the working session is not said to be at work")
        assert row["reachable"] and row["watch_state"] != "armed"
        assert row["reached_by"].startswith("told at its next prompt or tool call (a live Codex session")
        send_urgent_mail(AGENT)  # during the tool call
        open(gate, "w").close()  # the call may end now
        # The request that carries the call's result (it ran to its end: it was not refused) carries the mail too.
        after = model.wait_for(lambda r: _main(r) and SLOW_DONE in json.dumps(_tool_results(r)), 30)
        assert after is not None, terminal.pane()
        assert URGENT in json.dumps(after["input"])
        terminal.wait_for(lambda: _status()["watch_state"] == "armed" and len(wakers(project, "codex")) == 1, 60,
                          "the waker did not arm again after the turn")
        loop = [r for r in model.requests if _main(r)]
        assert not any(WOKEN in json.dumps(r["input"]) for r in loop)  # told in the turn, not as an idle wake
        assert json.dumps(loop[-1]["input"]).count(URGENT) == 1


@pytest.mark.requires("tmux")
def test_a_killed_codex_session_is_not_reachable_at_once(project):
    """Issue 33 #6: kill -9 of the Codex terminal, idle with its waker armed: a send that requires a reachable
    recipient refuses within seconds (Codex's app-server ends the session when its terminal is gone, and the
    waker ends with it)."""
    with FakeModel() as model, _interactive(project, model) as terminal:
        terminal.keys("hello")
        terminal.keys("Enter")
        terminal.wait_for(lambda: _status()["watch_state"] == "armed" and len(wakers(project, "codex")) == 1, 60,
                          "the idle session's waker did not arm")
        root = int(subprocess.run([*terminal.tmux, "display-message", "-p", "-t", terminal.name, "#{pane_pid}"],
                                  check=True, capture_output=True, text=True).stdout)
        for pid in {root} | {p for p in _descendants(root) if not _daemon(p)}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        until(_refused, 3.0, lambda: f"still reachable after kill -9: {_status()}")


def _refused() -> bool:
    """Whether a send that requires a reachable recipient refuses (it is asked once status says not reachable: a
    send that went through would be mail that wakes the session)."""
    if _status()["reachable"]:
        return False
    done = am_process("send", "--from", "team:carl", "--to", AGENT, "--subject", "still there?",
                      "--require-reachable")
    assert done.returncode == 3, done.stdout + done.stderr
    return True



@pytest.mark.requires("tmux")
def test_before_its_first_prompt_codex_is_not_said_to_listen_and_mail_then_is_told_at_that_prompt(project):
    """Issue 33 #7, as far as Codex 0.171 allows: it fires SessionStart with the first prompt, not when the session
    opens (openai/codex#15269), so no hook runs while it sits at its prompt untouched: status says not listening
    (nothing armed, nothing live; a send that requires a reachable recipient refuses), which is what happens: the
    mail waits. The first prompt's session start tells it, once, and the session is then live and its waker armed."""
    with FakeModel() as model, _interactive(project, model) as terminal:
        row = _status()
        assert row["sessions"] == 0 and not row["reachable"] and row["reached_by"].startswith("not listening"), row
        assert not wakers(project, "codex")
        send_urgent_mail(AGENT)
        assert not _status()["reachable"]  # mail does not make it listen
        terminal.keys("hello")
        terminal.keys("Enter")
        first = model.wait_for(lambda r: _main(r) and "hello" in json.dumps(r["input"]), 60)
        assert first is not None, terminal.pane()
        said = json.dumps(first["input"])
        assert said.count(URGENT) == 1 and "you are proj:coder" in said and WOKEN not in said
        terminal.wait_for(lambda: _status()["watch_state"] == "armed" and len(wakers(project, "codex")) == 1, 60,
                          "the waker did not arm after the first turn")
        assert _status()["reached_by"].startswith("woken within a second (a live Codex")
