"""The harness hooks, file reservations and the git guard through `agent-mail serve` (issues 21 and 22), as real
processes on both backings: each hook event through the server prints what it prints on the mailbox itself for
the same mailbox state; the waiter blocks through the server, counts as live while its harness runs and stops
counting when it dies; a token acts only as the identities it names; the pre-tool hook and a real `git commit`
are refused with the holder named; a server that is down lets the commit through, saying so. One real Claude
Code session whose hooks go through the server is told of mail by its PostToolUse hook."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.lib.cli import am_process, json_of, process_env
from tests.lib.serving import Server
from tests.lib.tools import require
from tests.lib.waiting import armed, disarmed, presences, until

pytestmark = [pytest.mark.backends, pytest.mark.timeout(180)]

AGENT = "proj:coder"
HOLDER = "proj:holder"
# Each harness's names for the events setup registers: start, prompt, after a tool, stop, end.
NAMES = {"claude-code": ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd"),
         "codex": ("SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd"),
         "gemini": ("SessionStart", "BeforeAgent", "AfterTool", "AfterAgent", "SessionEnd")}


def _dead_pid() -> int:
    """A process id whose process has ended: a local session that counts as no live harness."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _send(subject: str, to: str = AGENT) -> str:
    done = am_process("send", "--from", "boss:lead", "--to", to, "--subject", subject, "--body", "secret body")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["id"]


def _status(agent: str = AGENT) -> dict:
    return json_of(am_process("status", "--agent", agent))["agents"][0]


def _local(harness: str, event: str, document: dict, **env: str) -> subprocess.CompletedProcess:
    return am_process("hook", harness, event, "--agent", AGENT, input=json.dumps(document).encode(),
                      env=process_env(**env))


def _served(server: Server, token: str, harness: str, event: str, document: dict, agent: str = AGENT,
            **env: str) -> subprocess.CompletedProcess:
    return server.client(token, "hook", harness, event, "--agent", agent, input=json.dumps(document).encode(), **env)


@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini"])
def test_each_hook_event_through_the_server_prints_what_it_prints_locally(server, tmp_path, harness):
    token = server.token("--agent", AGENT)
    start, prompt, tool, stop, end = NAMES[harness]
    dead = str(_dead_pid())  # the local session's harness is gone: it does not count as another live session

    def both(event: str, name: str, **extra) -> bytes:
        local = _local(harness, event, {"session_id": "local", "hook_event_name": name, "cwd": str(tmp_path),
                                        **extra}, CLAUDE_PID=dead)
        served = _served(server, token, harness, event, {"session_id": "served", "hook_event_name": name,
                                                         "cwd": str(tmp_path), **extra})
        assert local.returncode == served.returncode == 0, (local.stderr, served.stderr)
        assert local.stderr == served.stderr == b""
        assert served.stdout == local.stdout  # byte for byte: the same mailbox state, the same words
        return served.stdout

    first = _send("first")
    started = json.loads(both("context", start))
    assert first in started["hookSpecificOutput"]["additionalContext"]
    assert "secret body" not in json.dumps(started)
    assert _status()["sessions"] >= 1  # the session through the server counts: status shows it
    for name, subject in ((prompt, "second"), (tool, "third")):
        sent = _send(subject)
        told = json.loads(both("context", name))["hookSpecificOutput"]
        assert told["hookEventName"] == name and sent in told["additionalContext"]
    assert both("context", tool) == (b"{}\n" if harness == "gemini" else b"")  # nothing new: quiet
    held = _send("fourth")
    stopped = json.loads(both("stop", stop, stop_hook_active=False))
    assert held in stopped["reason"] and stopped["decision"] == ("deny" if harness == "gemini" else "block")
    assert both("stop", stop, stop_hook_active=True) == (b"{}\n" if harness == "gemini" else b"")
    assert both("end", end) == (b"{}\n" if harness == "gemini" else b"")
    assert json_of(am_process("read", AGENT, "--no-mark-read"))["count"] == 4  # a hook never marks anything read


def _waiter(server: Server, token: str, harness_pid: int, session: str = "served",
            harness: str = "claude-code") -> subprocess.Popen:
    document = json.dumps({"session_id": session, "hook_event_name": "Stop", "stop_hook_active": False}).encode()
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "hook", harness, "wait", "--agent", AGENT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token,
                                            CLAUDE_CODE_ENTRYPOINT="cli", CLAUDE_CODE_SESSION_ATTENDED="1",
                                            CLAUDE_PID=str(harness_pid)))
    proc.stdin.write(document)
    proc.stdin.close()
    return proc


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


@pytest.mark.parametrize("harness", ["claude-code", "gemini"])
def test_a_harness_killed_mid_turn_stops_counting_through_the_server_within_seconds(server, harness):
    """The server cannot see the agent's processes, and a harness killed in the middle of a turn runs no end hook
    and has no waiter of ours watching it. The session's first hook through the server starts a watcher on the
    agent's machine (agent_mail.harness.ends), which ends the session once the harness is gone: status and
    --require-reachable stop counting it within seconds, not after 10 minutes of silence. The watcher goes too."""
    from agent_mail.files import pid_alive
    from agent_mail.harness import ends

    token = server.token("--agent", AGENT)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    start, prompt = NAMES[harness][0], NAMES[harness][1]
    try:
        for event in (start, prompt):  # a turn under way: no waiter runs
            done = _served(server, token, harness, "context", {"session_id": "killed", "hook_event_name": event},
                           CLAUDE_PID=str(process.pid))
            assert done.returncode == 0, done.stderr
        row = _status()
        assert row["sessions"] == 1 and row["reachable"] and row["reached_by"].startswith("told at its next")
        assert [n for n in os.listdir(ends.ends_directory()) if n.startswith(f"{process.pid}-")]  # its watcher
        process.kill()
        process.wait()
        until(lambda: _status()["sessions"] == 0, 10, lambda: f"still counted after its harness died: {_status()}")
        refused = am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "anyone?",
                             "--require-reachable")
        assert refused.returncode == 3, refused.stdout
        until(lambda: not [n for n in os.listdir(ends.ends_directory()) if n.startswith(f"{process.pid}-")], 10,
              "the watcher's lock file outlived it")
        assert not pid_alive(process.pid)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_the_waiter_blocks_through_the_server_and_lives_and_dies_with_its_harness(server):
    token = server.token("--agent", AGENT)
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    dead = str(_dead_pid())
    start = {"session_id": "served", "hook_event_name": "SessionStart"}
    json_of(_served(server, token, "claude-code", "context", start))
    local = _local("claude-code", "context", {"session_id": "local", "hook_event_name": "SessionStart"},
                   CLAUDE_PID=dead)
    assert local.returncode == 0
    waiter = _waiter(server, token, harness.pid)
    try:
        armed(AGENT)  # held by the server like a watch: status shows it
        assert waiter.poll() is None
        sent = _send("wake up")
        assert waiter.wait(timeout=30) == 2
        note = waiter.stderr.read().decode()
        assert sent in note and waiter.stdout.read() == b""
        # What the waiter woke the session with is what the session is told locally for the same mail.
        told = _local("claude-code", "context", {"session_id": "local", "hook_event_name": "PostToolUse"},
                      CLAUDE_PID=dead)
        assert json.loads(told.stdout)["hookSpecificOutput"]["additionalContext"] + "\n" == note
        disarmed(AGENT)
        # Told by the wake: the session's next hook through the server is quiet.
        assert _served(server, token, "claude-code", "context", {"session_id": "served",
                                                                 "hook_event_name": "PostToolUse"}).stdout == b""
        # A newer waiter ends the older quietly; when the harness dies, the session ends and stops counting.
        before = presences(AGENT)[AGENT]["released_at"]
        older = _waiter(server, token, harness.pid)
        # Its long wait, not its first glance (armed and released at once): a newer waiter started during that
        # glance would find no older one named yet.
        until(lambda: (found := presences(AGENT)[AGENT])["watch_state"] == "armed" and found["released_at"] != before,
              30, "the older waiter's long wait never armed")
        newer = _waiter(server, token, harness.pid)
        try:
            assert older.wait(timeout=30) == 0 and older.stderr.read() == b""
            assert newer.poll() is None
            assert _status()["sessions"] == 1 and "Claude Code" in _status()["reached_by"]
            harness.kill()
            harness.wait()
            assert newer.wait(timeout=30) == 0 and newer.stderr.read() == b""
            disarmed(AGENT)
            assert _status()["sessions"] == 0  # ended through the server at once: not a day of false liveness
        finally:
            _stop(older, newer)
    finally:
        _stop(waiter, harness)


def test_the_opencode_waiter_wakes_through_the_server_and_ends_with_opencode(server):
    """OpenCode's plugin runs the same waiter (`hook opencode wait`): through a server it blocks there, exits 2 with
    the note when mail arrives, and when OpenCode (its harness process) dies it ends the session and exits 0."""
    token = server.token("--agent", AGENT)
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    json_of(_served(server, token, "opencode", "context", {"session_id": "oc", "hook_event_name": "SessionStart"}))
    waiter = _waiter(server, token, harness.pid, "oc", "opencode")
    try:
        _long_wait_armed()
        sent = _send("wake up, opencode")
        assert waiter.wait(timeout=30) == 2
        note = waiter.stderr.read().decode()
        assert sent in note and "wake up, opencode" in note and waiter.stdout.read() == b""
        assert "OpenCode" in _status()["reached_by"]
        again = _waiter(server, token, harness.pid, "oc", "opencode")
        try:
            _long_wait_armed()
            harness.kill()
            harness.wait()
            assert again.wait(timeout=30) == 0 and again.stderr.read() == b""
            assert _status()["sessions"] == 0
        finally:
            _stop(again)
    finally:
        _stop(waiter, harness)


def _long_wait_armed() -> None:
    """Until the waiter's long wait is armed: it first glances (a session armed and released at once, a plain call
    that a server stopping then would fail), then waits (a new session, the one that outlives a restart)."""
    until(lambda: (found := presences(AGENT)[AGENT])["watch_state"] == "armed" and found["released_at"], 30,
          "the waiter's long wait never armed")


def test_the_waiter_outlives_a_server_restart(mailbox_path, tmp_path):
    first = Server(str(mailbox_path))
    token = first.token("--agent", AGENT)
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    json_of(_served(first, token, "claude-code", "context",
                    {"session_id": "served", "hook_event_name": "SessionStart"}))
    waiter = _waiter(first, token, harness.pid)
    again = None
    try:
        _long_wait_armed()
        first.stop()  # SIGTERM: the server ends the waits it holds (503); the waiter reconnects
        with open(tmp_path / "second.log", "wb") as log:
            again = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen",
                                      f"127.0.0.1:{first.port}"], env=process_env(AGENT_MAIL_DB=str(mailbox_path)),
                                     stdout=subprocess.DEVNULL, stderr=log)
        until(lambda: "listening" in (tmp_path / "second.log").read_text())
        armed(AGENT, procs=[waiter])  # armed again through the new server
        assert waiter.poll() is None
        sent = _send("after the restart")
        assert waiter.wait(timeout=30) == 2 and sent in waiter.stderr.read().decode()
    finally:
        _stop(waiter, harness)
        if again is not None:
            again.terminate()
            again.wait(timeout=20)


def test_a_waiter_started_while_the_server_is_away_waits_for_it(mailbox_path, tmp_path):
    """The waiter's first look rides out an outage as its long wait does: started while no server answers (a
    restart under way), it arms once the server is back and wakes on the mail, rather than exiting."""
    first = Server(str(mailbox_path))
    token = first.token("--agent", AGENT)
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    json_of(_served(first, token, "claude-code", "context",
                    {"session_id": "served", "hook_event_name": "SessionStart"}))
    first.stop()
    waiter = _waiter(first, token, harness.pid)
    again = None
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # no server: it keeps asking (its first look once failed
            waiter.wait(timeout=2)                        # at once, exit 1)
        with open(tmp_path / "second.log", "wb") as log:
            again = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen",
                                      f"127.0.0.1:{first.port}"], env=process_env(AGENT_MAIL_DB=str(mailbox_path)),
                                     stdout=subprocess.DEVNULL, stderr=log)
        _long_wait_armed()
        sent = _send("while it was away")
        assert waiter.wait(timeout=30) == 2 and sent in waiter.stderr.read().decode()
    finally:
        _stop(waiter, harness)
        if again is not None:
            again.terminate()
            again.wait(timeout=20)


def test_a_token_not_naming_the_hooks_identity_is_refused_and_changes_nothing(server, tmp_path):
    other = server.token("--agent", "proj:other")
    _send("for the coder")
    for event, name in (("context", "SessionStart"), ("stop", "Stop"), ("end", "SessionEnd")):
        refused = _served(server, other, "claude-code", event, {"session_id": "s", "hook_event_name": name})
        assert refused.returncode == 4, refused.stderr
        error = json.loads(refused.stderr)
        assert AGENT in error["error"] and "acts as proj:other" in error["error"] and other not in error["error"]
        assert refused.stdout == b""
    waiter = _waiter(server, other, os.getpid())
    try:
        assert waiter.wait(timeout=30) == 4 and AGENT in waiter.stderr.read().decode()
    finally:
        _stop(waiter)
    assert _status()["sessions"] == 0 and _status()["watch_state"] == "never"  # no session, no watch
    missing = server.client(None, "hook", "claude-code", "context", "--agent", AGENT,
                            input=json.dumps({"session_id": "s", "hook_event_name": "SessionStart"}).encode())
    assert missing.returncode == 4 and "AGENT_MAIL_TOKEN" in json.loads(missing.stderr)["error"]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    for args in (["init", "-q", "-b", "main"], ["config", "user.email", "t@example.com"], ["config", "user.name", "T"],
                 ["remote", "add", "origin", "git@github.com:acme/widget.git"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    (root / "src" / "lib.rs").write_text("fn main() {}\n")
    (root / "README.md").write_text("hi\n")
    subprocess.run(["git", "add", "."], cwd=root, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-q", "-m", "first"], cwd=root, check=True, capture_output=True)
    monkeypatch.chdir(root)
    return root


def _edit(harness: str, path: str, cwd) -> dict:
    if harness == "codex":  # apply_patch: the files are named in the patch's headers
        return {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "apply_patch", "cwd": str(cwd),
                "tool_input": {"command": f"*** Begin Patch\n*** Update File: {path}\n@@\n-a\n+b\n*** End Patch"}}
    if harness == "gemini":
        return {"session_id": "s", "hook_event_name": "BeforeTool", "tool_name": "replace",
                "tool_input": {"file_path": path}, "cwd": str(cwd)}
    return {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Edit", "cwd": str(cwd),
            "tool_input": {"file_path": path, "old_string": "main", "new_string": "start"}}


@pytest.mark.parametrize("harness", ["claude-code", "codex", "gemini"])
def test_the_pre_tool_hook_denies_an_edit_of_a_held_file_through_the_server(server, repo, harness):
    token = server.token("--agent", AGENT)
    holder = server.token("--agent", HOLDER)
    json_of(server.client(holder, "reserve", HOLDER, "src/**", "--reason", "parser rewrite"))
    held = _edit(harness, str(repo / "src" / "lib.rs"), repo)
    served = _served(server, token, harness, "pretool", held)
    local = _local(harness, "pretool", held)
    assert served.returncode == local.returncode == 0 and served.stderr == b""
    assert served.stdout == local.stdout
    said = json.dumps(json.loads(served.stdout))
    assert f"held by {HOLDER}" in said and "parser rewrite" in said and f"--to {HOLDER}" in said
    # A relative path from a subdirectory, as the harness may give it: the same refusal.
    relative = _edit(harness, "lib.rs", repo / "src")
    assert _served(server, token, harness, "pretool", relative).stdout == local.stdout
    # A file nobody holds, and a read, pass silently (Gemini CLI: an empty object).
    quiet = b"{}\n" if harness == "gemini" else b""
    assert _served(server, token, harness, "pretool", _edit(harness, str(repo / "README.md"), repo)).stdout == quiet
    read = {**held, "tool_name": {"claude-code": "Read", "codex": "shell", "gemini": "read_file"}[harness]}
    assert _served(server, token, harness, "pretool", read).stdout == quiet
    # The holder itself may edit; a token that does not name the hook's identity is refused.
    assert _served(server, holder, harness, "pretool", held, agent=HOLDER).stdout == quiet
    refused = _served(server, holder, harness, "pretool", held)
    assert refused.returncode == 4 and AGENT in json.loads(refused.stderr)["error"]


def test_reservations_through_the_server_answer_as_directly_and_refuse_what_the_token_may_not(server, repo):
    mine, holder = server.token("--agent", AGENT), server.token("--agent", HOLDER)
    supervisor = server.token("--agent", "ops:lead", "--supervisor")
    granted = json_of(server.client(holder, "reserve", HOLDER, "./src/lib.rs", "--reason", "parser"))
    assert granted["granted"] == ["/src/lib.rs"] and granted["repo"] == "github.com/acme/widget"
    # A clash: exit 3, the conflicts as directly.
    clash, direct = server.client(mine, "reserve", AGENT, "src/**"), am_process("reserve", AGENT, "src/**")
    assert clash.returncode == direct.returncode == 3
    assert json.loads(clash.stdout)["conflicts"][0]["holder"] == HOLDER
    assert json.loads(clash.stdout)["conflicts"] == json.loads(direct.stdout)["conflicts"]
    os.chdir(repo / "src")  # paths from a subdirectory are located on the client's machine
    check = server.client(mine, "reservations", "--check", "--agent", AGENT, "lib.rs")
    direct = am_process("reservations", "--check", "--agent", AGENT, "lib.rs")
    assert check.returncode == direct.returncode == 3 and check.stdout == direct.stdout
    assert json_of(server.client(mine, "reservations", "--check", "--agent", AGENT, "../README.md"))["ok"] is True
    listed = server.client(supervisor, "reservations", "--path", "lib.rs")
    assert listed.stdout == am_process("reservations", "--path", "lib.rs").stdout
    assert json.loads(listed.stdout)["paths"][0]["held_by"][0]["agent"] == HOLDER
    # Who holds a file, and are they live: what any identity asks before an edit, with its own token.
    asked = server.client(mine, "reservations", "--path", "lib.rs")
    assert asked.returncode == 0 and asked.stdout == listed.stdout, asked.stderr
    # Refusals: as another identity (4), everyone's list without a supervisor (4), --force of a live holder (2),
    # a path outside the repository (2); each changes nothing.
    for token, argv, code, word in (
            (mine, ("reserve", HOLDER, "docs/**"), 4, HOLDER),
            (mine, ("release", HOLDER, "--all"), 4, HOLDER),
            (mine, ("reservations",), 4, "supervisor"),
            (mine, ("reservations", "--agent", HOLDER), 4, HOLDER),
            (mine, ("release", AGENT, "/src/lib.rs", "--force"), 2, "is live"),
            (mine, ("reservations", "--check", "--agent", AGENT, "/etc/passwd"), 2, "outside the repository")):
        refused = server.client(token, *argv)
        assert refused.returncode == code, (argv, refused.stderr)
        assert word in json.loads(refused.stderr)["error"] and refused.stdout == b""
    after = json_of(am_process("reservations"))
    assert [(r["agent"], r["pattern"]) for r in after["reservations"]] == [(HOLDER, "/src/lib.rs")]
    released = json_of(server.client(holder, "release", HOLDER, "lib.rs"))
    assert released["count"] == 0 and released["not_held"] == ["lib.rs"]  # a pattern is as reserved, not a path
    released = json_of(server.client(holder, "release", HOLDER, "./lib.rs"))
    assert [r["pattern"] for r in released["released"]] == ["/src/lib.rs"]
    assert json_of(am_process("reservations"))["count"] == 0
    # The server never looks at files of its own for a client: without the located repository, a key is needed.
    status, body = server.raw("/v1/call/reservations", b'{"agent": "proj:coder", "check": true, "paths": ["x"]}',
                              {"Authorization": f"Bearer {mine}", "Content-Type": "application/json"})
    assert status == 400 and "located" in json.loads(body)["error"]
    # A lone surrogate (JSON's escaped \udbff, which no command line can send) in any text is a 400 naming the
    # argument, never a 500, and nothing is stored.
    auth = {"Authorization": f"Bearer {mine}", "Content-Type": "application/json"}
    for path, body, field in (("/v1/call/reservations", {"agent": AGENT, "paths": ["x\udbff"]}, "paths"),
                              ("/v1/call/reserve", {"agent": AGENT, "patterns": ["x\udbff"]}, "patterns"),
                              ("/v1/call/release", {"agent": AGENT, "patterns": ["x\udbff"]}, "patterns"),
                              ("/v1/call/reserve", {"agent": AGENT, "patterns": ["/docs/**"], "reason": "\udbff"},
                               "reason"),
                              ("/v1/call/reservations", {"path": ["\udbff"]}, "path")):
        status, answer = server.raw(path, json.dumps(body).encode(), auth)
        assert status == 400 and field in {p["field"] for p in json.loads(answer)["problems"]}, (path, answer)
    assert json_of(am_process("reservations"))["count"] == 0


def _commit(root, env: dict, path: str = "src/lib.rs") -> subprocess.CompletedProcess:
    (root / path).write_text(f"changed {time.monotonic()}\n")
    subprocess.run(["git", "add", path], cwd=root, check=True, capture_output=True)
    return subprocess.run(["git", "commit", "-q", "-m", f"change {path}"], cwd=root, capture_output=True, text=True,
                          env=env)


def test_a_real_git_commit_through_the_server_is_refused_naming_the_holder_and_let_through_when_it_is_down(
        server, repo):
    mine, holder = server.token("--agent", AGENT), server.token("--agent", HOLDER)
    installed = server.client(mine, "guard", "install")  # install and uninstall are the checkout's own business
    assert json_of(installed)["hooks"][0]["action"] == "installed"
    json_of(server.client(holder, "reserve", HOLDER, "src/**", "--reason", "parser rewrite"))
    through = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=mine, AGENT_MAIL_AGENT=AGENT)
    refused = _commit(repo, through)
    assert refused.returncode != 0
    assert f"held by {HOLDER} (/src/**" in refused.stderr and '"parser rewrite"' in refused.stderr
    assert "--no-verify" in refused.stderr
    assert _commit(repo, {**through, "AGENT_MAIL_TOKEN": holder, "AGENT_MAIL_AGENT": HOLDER}).returncode == 0
    assert _commit(repo, through, "README.md").returncode == 0  # a file nobody holds
    # pre-push: the commits pushed touch the held file (the holder's commit): refused for us, not for the holder.
    bare = repo.parent / "bare.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True, capture_output=True)
    subprocess.run(["git", "remote", "add", "backup", str(bare)], cwd=repo, check=True, capture_output=True)
    pushed = subprocess.run(["git", "push", "-q", "backup", "main"], cwd=repo, capture_output=True, text=True,
                            env=through)
    assert pushed.returncode != 0 and f"held by {HOLDER}" in pushed.stderr and "git push --no-verify" in pushed.stderr
    assert subprocess.run(["git", "push", "-q", "backup", "main"], cwd=repo, capture_output=True, text=True,
                          env={**through, "AGENT_MAIL_TOKEN": holder, "AGENT_MAIL_AGENT": HOLDER}).returncode == 0
    server.stop()
    down = _commit(repo, through)
    assert down.returncode == 0, down.stderr  # let through, and said
    assert "cannot reach the mailbox" in down.stderr and server.url in down.stderr
    assert "Let through unchecked" in down.stderr
    strict = _commit(repo, {**through, "AGENT_MAIL_GUARD": "strict"})
    assert strict.returncode != 0 and "Refused" in strict.stderr


def test_a_commit_of_more_paths_than_one_request_carries_is_checked_whole_through_the_server(server, repo):
    mine, holder = server.token("--agent", AGENT), server.token("--agent", HOLDER)
    server.client(mine, "guard", "install")
    json_of(server.client(holder, "reserve", HOLDER, "zz/held.txt", "--reason", "mine"))
    # 100,001 files (more than a request's bound on its items, 100,000): the held one sorts last, in the last batch.
    many = repo / "many"
    many.mkdir()
    for i in range(100_000):
        (many / f"f{i}").write_bytes(b"")
    (repo / "zz").mkdir()
    (repo / "zz" / "held.txt").write_text("x\n")
    subprocess.run(["git", "add", "."], cwd=repo, check=True, capture_output=True)
    through = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=mine, AGENT_MAIL_AGENT=AGENT)
    refused = subprocess.run(["git", "commit", "-q", "-m", "many"], cwd=repo, capture_output=True, text=True,
                             env=through)
    assert refused.returncode != 0, refused.stderr
    assert f"held by {HOLDER} (/zz/held.txt" in refused.stderr, refused.stderr
    subprocess.run(["git", "rm", "-q", "--cached", "zz/held.txt"], cwd=repo, check=True, capture_output=True)
    done = subprocess.run(["git", "commit", "-q", "-m", "many"], cwd=repo, capture_output=True, text=True, env=through)
    assert done.returncode == 0, done.stderr  # nothing held among them: let through


# -- a real Claude Code session whose hooks go through the server ------------------------------------------------
def test_claude_code_through_the_server_is_told_of_mail_by_its_post_tool_hook(server, tmp_path):
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    from tests.lib.fake_model import FakeModel
    from tests.lib.harnesses import private_tmp

    claude = require("claude")
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir(exist_ok=True)
    assert am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(project)).returncode == 0
    settings = project / ".claude" / "settings.local.json"
    document = json.loads(settings.read_text())
    for groups in document["hooks"].values():  # every hook through the server (setup wrote the mailbox's path)
        for group in groups:
            for entry in group["hooks"]:
                entry["command"] = re.sub(r"^AGENT_MAIL_DB=\S+ ", f"AGENT_MAIL_DB={server.url} ", entry["command"])
                assert server.url in entry["command"]
    document["env"]["AGENT_MAIL_DB"] = server.url
    settings.write_text(json.dumps(document))
    token = server.token("--agent", AGENT)
    (project / "notes.txt").write_text("hello\n")
    sent: list[str] = []

    def script(request):
        if not request.get("tools"):
            return None
        results = sum(1 for m in request["messages"] if isinstance(m.get("content"), list)
                      for b in m["content"] if b.get("type") == "tool_result")
        if results == 0:
            sent.append(_send("Rebase onto main"))  # lands while the tool runs
            return [{"type": "tool_use", "name": "Read", "input": {"file_path": str(project / "notes.txt")}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        env = process_env(HOME=str(home), ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="sk-ant-test",
                          DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                          ENABLE_TOOL_SEARCH="false", DISABLE_AUTOUPDATER="1", TMPDIR=private_tmp(home),
                          AGENT_MAIL_TOKEN=token)
        env.pop("AGENT_MAIL_DB")
        proc = subprocess.run([claude, "-p", "Read the notes.", "--output-format", "json"], cwd=str(project),
                              env=env, capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = [r for r in model.requests if r.get("tools") and any(
        b.get("type") == "tool_result" for m in r["messages"] if isinstance(m.get("content"), list)
        for b in m["content"])][0]
    told = json.dumps(after)
    assert sent and sent[0] in told and "Rebase onto main" in told and "secret body" not in told
    code, log = server.stop()
    calls = [json.loads(line) for line in log.splitlines() if '"path"' in line]
    hooked = [c for c in calls if c.get("command") == "hook" and c["status"] == 200]
    assert len(hooked) >= 2 and all(c["as"] == AGENT for c in hooked)  # SessionStart, PostToolUse, ... carried
    assert token not in log


@pytest.mark.sqlite_only
@pytest.mark.parametrize("event, document", [
    ("pretool", {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Edit",
                 "tool_input": {"file_path": "src/lib.rs"}}),
    ("context", {"session_id": "s", "hook_event_name": "PostToolUse"})])
def test_a_hook_through_the_server_loads_the_standard_library_only(server, repo, event, document):
    token = server.token("--agent", AGENT)
    code = ("import sys; before = set(sys.modules); from agent_mail.cli.main import main; code = main(['hook', "
            f"'claude-code', {event!r}, '--agent', {AGENT!r}]); new = set(sys.modules) - before; "
            "print(code, sorted(m for m in {n.split('.')[0] for n in new} if m not in sys.stdlib_module_names and "
            "m != 'agent_mail'), sorted(m for m in new if m.startswith(('agent_mail.store.', "
            "'agent_mail.operations.mail', 'agent_mail.server.app', 'agent_mail.parts.wildmatch')) "
            "or m == 'agent_mail.operations.reservations'), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(repo),
                          input=json.dumps({**document, "cwd": str(repo)}),
                          env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token))
    assert proc.stderr.strip().splitlines()[-1] == "0 [] []", proc.stderr  # no driver, no mailbox, no matching here
