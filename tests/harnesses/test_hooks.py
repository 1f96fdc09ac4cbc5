"""`agent-mail hook` against hook inputs shaped as Claude Code sends them (recorded from Claude Code
2.1.332), and `agent-mail setup` merge cases. The real harness runs in test_claude_code.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from agent_mail import harnesses
from tests.lib.cli import am_process, as_a_user, process_env
from tests.lib.waiting import armed, presences, until

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL
# Setup of the mailbox itself: the stdio MCP entries and hook files it writes (through a server it writes remote
# entries, which tests/functional/test_server_hooks.py and test_server_mcp.py check).
LOCAL_SETUP = pytest.mark.local_only("setup of the mailbox itself (through a server: test_server_hooks, _mcp)")

AGENT = "proj:coder"


def claude_input(event: str, session: str = "s-1", **extra) -> dict:
    """A hook input as Claude Code 2.1.332 writes it (fields as recorded from a real session)."""
    document = {"session_id": session, "transcript_path": f"/tmp/transcripts/{session}.jsonl", "cwd": "/tmp/project",
                "hook_event_name": event}
    if event == "SessionStart":
        document["source"] = "startup"
    if event in ("UserPromptSubmit", "PostToolUse", "Stop"):
        document.update({"prompt_id": "p-1", "permission_mode": "default"})
    if event == "UserPromptSubmit":
        document["prompt"] = "go on"
    if event == "PostToolUse":
        document.update({"tool_name": "Bash", "tool_input": {"command": "ls"}, "tool_response": {"stdout": ""},
                         "tool_use_id": "toolu_1", "duration_ms": 3})
    if event == "Stop":
        document.update({"stop_hook_active": False, "last_assistant_message": "done"})
    document.update(extra)
    return document


def hook(event: str, document: dict, *, env: dict | None = None, agent: str = AGENT, timeout: float = 60):
    return am_process("hook", "claude-code", event, "--agent", agent, input=json.dumps(document).encode(),
                      env=env or process_env(), timeout=timeout)


def context(event: str, session: str = "s-1") -> str | None:
    done = hook("context", claude_input(event, session))
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    if not done.stdout:
        return None
    output = json.loads(done.stdout)["hookSpecificOutput"]
    assert output["hookEventName"] == event
    return output["additionalContext"]


def send(subject: str, to: str = AGENT, *extra: str) -> str:
    done = am_process("send", "--from", "boss:lead", "--to", to, "--subject", subject, "--body", "secret body", *extra)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["id"]


def unread() -> int:
    return json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"]


def test_each_message_is_told_once_per_session_and_nothing_is_marked_read():
    first = send("before the session")
    start = context("SessionStart")
    assert "you are proj:coder" in start and "1 unread message waiting" in start
    assert first in start and "before the session" in start and "secret body" not in start
    assert "mcp__agent-mail__read" in start and f"agent-mail read {AGENT}" in start
    assert context("PostToolUse") is None  # nothing new: quiet
    second = send("during work")
    note = context("PostToolUse")
    assert second in note and first not in note and "2 unread in all" in note
    assert context("UserPromptSubmit") is None and context("PostToolUse") is None
    # Another session of the same identity is told on its own account.
    other = context("SessionStart", session="s-2")
    assert first in other and second in other
    assert unread() == 2  # telling never consumes


def test_broadcasts_delayed_mail_and_bounces_are_told_when_they_arrive():
    context("SessionStart")
    send("all hands", "*")
    note = context("PostToolUse")
    assert "all hands" in note and "(broadcast)" in note
    later = send("in a moment", AGENT, "--delay-minutes", "0.02")  # falls due 1.2 s after it was sent
    assert context("PostToolUse") is None  # not yet due: not shown
    note = until(lambda: context("PostToolUse"), 30, "the delayed mail was never told")  # once it falls due
    assert later in note
    # A refused send (the recipient is not listening) leaves a bounce for the sender, told to its session.
    refused = am_process("send", "--from", AGENT, "--to", "deaf:one", "--subject", "hello?", "--require-reachable")
    assert refused.returncode == 3, refused.stderr
    note = context("PostToolUse")
    assert note is not None and "bounce" in note and '"hello?" to deaf:one was refused' in note
    assert f"agent-mail notifications {AGENT} --dismiss" in note


def test_many_new_messages_are_listed_up_to_ten_and_counted():
    context("SessionStart")
    for i in range(14):
        send(f"m{i}")
    note = context("PostToolUse")
    assert "14 new messages" in note and "... and 4 more" in note
    assert note.count("\n- ") == 11


def test_the_stop_is_held_once_for_mail_the_session_was_not_told_of():
    context("SessionStart")
    assert hook("stop", claude_input("Stop")).stdout == b""  # nothing new: it stops
    message = send("urgent fix")
    done = hook("stop", claude_input("Stop"))
    held = json.loads(done.stdout)
    assert held["decision"] == "block" and message in held["reason"] and "This arrived while you worked" in \
        held["reason"]
    # The held stop's own next stop passes, and the mail is not told twice.
    assert hook("stop", claude_input("Stop", stop_hook_active=True)).stdout == b""
    assert hook("stop", claude_input("Stop")).stdout == b""
    # Mail already told through context does not hold a stop.
    send("seen already")
    assert context("PostToolUse") is not None
    assert hook("stop", claude_input("Stop")).stdout == b""


@pytest.mark.parametrize("harness", harnesses.NAMES)
def test_a_held_stop_shows_the_user_who_wrote_and_tells_the_model_it_is_mail(harness):
    """Issue 20 #4: the stop hold's systemMessage is the line each harness shows the user (who wrote, the
    subject); the reason, the model's next prompt, says it is mail, not an error."""
    def run(event: str, name: str, **extra) -> dict:
        document = {**claude_input(name, "framed"), "hook_event_name": name, **extra}
        done = am_process("hook", harness, event, "--agent", AGENT, input=json.dumps(document).encode())
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout or b"{}")

    run("context", "SessionStart")
    send("Stop the deploy")
    held = run("stop", "AfterAgent" if harness == "gemini" else "Stop", stop_hook_active=False)
    assert held["decision"] in ("block", "deny")
    shown = held["system_message" if harness == "vibe" else "systemMessage"]  # Mistral Vibe's words for it
    assert shown == f'agent-mail: mail for {AGENT} from boss:lead: "Stop the deploy"'
    assert "it is mail for you, not an error" in held["reason"] and "Stop the deploy" in held["reason"]


def test_the_claude_code_waiter_is_framed_as_mail_not_a_stop_hook_error(tmp_path):
    """Issue 20 #4: Claude Code frames an asyncRewake wake as "Stop hook blocking error from command ..." to the
    model and "Stop hook feedback" to the user unless the hook's settings give rewakeMessage / rewakeSummary."""
    assert am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(tmp_path)).returncode == 0
    settings = json.loads((tmp_path / ".claude" / "settings.local.json").read_text())
    waiter = next(h for group in settings["hooks"]["Stop"] for h in group["hooks"] if h.get("asyncRewake"))
    assert waiter["rewakeMessage"].startswith("agent-mail: new mail arrived while you were idle")
    assert "not an error" in waiter["rewakeMessage"]
    assert waiter["rewakeSummary"] == f"agent-mail: new mail for {AGENT}"


def test_a_second_session_with_the_same_identity_is_warned_and_counted():
    env = process_env(CLAUDE_PID=str(os.getpid()))
    assert hook("context", claude_input("SessionStart", "s-a"), env=env).returncode == 0
    done = hook("context", claude_input("SessionStart", "s-b"), env=env)
    note = json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert "1 other live session uses the identity proj:coder" in note
    assert json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]["sessions"] == 2
    hook("end", claude_input("SessionEnd", "s-a"), env=env)
    assert json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]["sessions"] == 1
    # A session whose harness process is gone no longer counts.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    hook("context", claude_input("SessionStart", "s-c"), env=process_env(CLAUDE_PID=dead.stdout.strip()))
    assert json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]["sessions"] == 1


def test_a_hook_acts_only_for_its_own_identity():
    """A hook given another --agent (a session id it does not own) cannot end that identity's session."""
    assert context("SessionStart", "mine") is not None
    done = hook("end", claude_input("SessionEnd", "mine"), agent="proj:intruder")
    assert done.returncode == 0, done.stderr
    rows = json.loads(am_process("status", "--agent", AGENT).stdout)["agents"]
    assert rows[0]["sessions"] == 1  # still live: only its own end hook ends it
    assert hook("end", claude_input("SessionEnd", "mine")).returncode == 0
    assert json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]["sessions"] == 0


def _status(agent: str = AGENT) -> dict:
    return json.loads(am_process("status", "--agent", agent).stdout)["agents"][0]


def _require_reachable(to: str = AGENT) -> subprocess.CompletedProcess:
    return am_process("send", "--from", "team:carl", "--to", to, "--subject", "still there?", "--require-reachable")


@pytest.mark.local_only("reads the dashboard's fleet in-process from the mailbox itself")
@pytest.mark.parametrize("harness", harnesses.NAMES)
def test_a_live_harness_session_is_reachable_while_it_works_and_says_how(harness):
    """Issue 20 #1: a session at work (no watch armed: its last one was released) will be told at its next tool
    call or stop, so it is listening: status, the send receipt, --require-reachable and the dashboard agree, in
    words that say how; once the session ends, it is not."""
    env = process_env(CLAUDE_PID=str(os.getpid()))
    document = json.dumps(claude_input("SessionStart", "live")).encode()
    assert am_process("hook", harness, "context", "--agent", AGENT, input=document, env=env).returncode == 0
    row = _status()
    assert row["watch_state"] != "armed" and row["sessions"] == 1  # at work: no watch armed
    assert row["reachable"] is True
    words = f"a live {harnesses.of(harness).title} session"
    assert words in row["reached_by"] and row["reached_by"].startswith("told at its next")
    done = _require_reachable()
    assert done.returncode == 0, done.stderr
    delivery = json.loads(done.stdout)["deliveries"][0]
    assert delivery["status"] == "delivered" and delivery["reachable"] is True and words in delivery["reached_by"]
    from agent_mail.operations import mail
    from agent_mail.dashboard.data import Supervisor

    with mail.open_mailbox() as mailbox:
        fleet = {r["agent"]: r for r in Supervisor(mailbox).fleet()}
    assert fleet[AGENT]["listening"] is True and words in fleet[AGENT]["reached_by"]
    # The session ends: nobody will tell the model any more.
    end = json.dumps(claude_input("SessionEnd", "live")).encode()
    assert am_process("hook", harness, "end", "--agent", AGENT, input=end, env=env).returncode == 0
    assert _status()["reachable"] is False and _status()["reached_by"].startswith("not listening (")
    assert _require_reachable().returncode == 3


def test_cleanup_sweeps_harness_sessions_last_seen_before_its_cutoff():
    context("SessionStart", session="old")
    assert json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]["sessions"] == 1
    swept = json.loads(am_process("cleanup", "--older-than", "0").stdout)
    assert swept["sessions_deleted"] >= 1
    assert json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]["sessions"] == 0
    # A session swept while it still runs is told the inbox afresh, as a new one.
    assert "you are proj:coder" in context("PostToolUse", session="old")


def _waiter(session: str = "s-1", **env) -> subprocess.Popen:
    document = json.dumps(claude_input("Stop", session)).encode()
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "hook", "claude-code", "wait", "--agent", AGENT],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=process_env(**{"CLAUDE_CODE_ENTRYPOINT": "cli", "CLAUDE_CODE_SESSION_ATTENDED": "1",
                                               **env}))
    proc.stdin.write(document)
    proc.stdin.close()
    return proc


def _woken_now(waiter: subprocess.Popen) -> dict:
    """The status row once it says the session is woken now (its waiter armed). Through a server the waiter first
    glances (armed for a moment, to name the waiter it replaces and look at once), then waits: a status read between
    the two says "told at its next prompt", which promises less than happens, never more."""
    armed(AGENT, procs=[waiter])

    def woken() -> dict | None:
        row = _status()
        return row if row["reached_by"].startswith("woken now") else None
    return until(woken, what=lambda: _status()["reached_by"])


def test_the_waiter_exits_2_with_the_envelopes_when_new_mail_lands():
    context("SessionStart")
    send("already told")
    context("PostToolUse")
    waiter = _waiter(CLAUDE_PID=str(os.getpid()))
    try:
        armed(AGENT, procs=[waiter])  # it counts as a watch
        assert waiter.poll() is None  # mail it was told of does not wake it
        message = send("wake up")
        assert waiter.wait(timeout=20) == 2
        note = waiter.stderr.read().decode()
        assert message in note and "already told" not in note and waiter.stdout.read() == b""
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert context("PostToolUse") is None  # told by the wake: not again
    assert presences(AGENT)[AGENT]["watch_state"] != "armed"


def test_a_newer_waiter_replaces_the_older_so_one_wake_per_mail():
    context("SessionStart")
    older = _waiter(CLAUDE_PID=str(os.getpid()))
    try:
        _woken_now(older)
        newer = _waiter(CLAUDE_PID=str(os.getpid()))
        try:
            assert older.wait(timeout=20) == 0  # ended quietly: no wake, and no hook failure to show
            assert older.stderr.read() == b""
            send("just one wake")
            assert newer.wait(timeout=20) == 2
        finally:
            if newer.poll() is None:
                newer.kill()
                newer.wait()
    finally:
        if older.poll() is None:
            older.kill()
            older.wait()


def test_the_waiter_never_blocks_a_run_nobody_waits_on_and_ends_with_its_harness():
    context("SessionStart")
    for env in ({"CLAUDE_CODE_ENTRYPOINT": "sdk-cli"}, {"CLAUDE_CODE_SESSION_ATTENDED": "0"}):
        started = time.monotonic()
        proc = _waiter(**env)
        assert proc.wait(timeout=20) == 0 and time.monotonic() - started < 15
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        waiter = _waiter(CLAUDE_PID=str(harness.pid))
        armed(AGENT)
        harness.kill()
        harness.wait()
        assert waiter.wait(timeout=20) == 0  # checked at its next refresh (5 s): no wake, no cost
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()


def _stopped(proc: subprocess.Popen) -> bool:
    return proc.poll() is not None


def test_a_waiter_ends_with_its_killed_harness_at_once_and_a_zombie_harness_is_not_reachable():
    """Issue 33 #6: the waiter sleeps on its harness's process (a pidfd, with the mailbox's wake-ups), so when the
    harness is killed it ends, and stops counting as an armed watch, at once (it used to look every 5 s), and a
    send that requires a reachable recipient refuses. The harness is left a zombie (its parent has not reaped it
    yet, as when a harness dies under a busy parent): it counts as gone, not as a live session."""
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    waiter = None
    try:
        env = process_env(CLAUDE_PID=str(harness.pid))
        document = json.dumps(claude_input("SessionStart")).encode()
        assert am_process("hook", "claude-code", "context", "--agent", AGENT, input=document, env=env).returncode == 0
        waiter = _waiter(CLAUDE_PID=str(harness.pid))
        assert _woken_now(waiter)["reached_by"].startswith("woken now (a live Claude Code session")
        harness.kill()  # not reaped: a zombie until harness.wait() below
        until(lambda: _require_reachable().returncode == 3, 3.0,
              lambda: f"still reachable after its harness was killed: {_status()}")
        until(lambda: _stopped(waiter), 3.0, "the waiter outlived its harness")
        assert waiter.returncode == 0 and waiter.stderr.read() == b""  # quietly: no wake, no hook failure
        row = _status()
        assert row["sessions"] == 0 and row["watch_state"] != "armed" and not row["reachable"]
    finally:
        for proc in (harness, waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.wait()


@pytest.mark.parametrize("harness", ["claude-code", "codex", "qwen", "opencode"])
def test_a_session_that_wakes_says_whether_it_is_idle_or_at_work(harness):
    """Issue 33 #7: before its first prompt a session of a harness that wakes has no waiter armed: it is idle and
    told at its next prompt (not "at work", not "woken"); its prompt makes it at work (told by its hooks)."""
    env = process_env(CLAUDE_PID=str(os.getpid()))
    for event, words in (("SessionStart", "idle with no"), ("UserPromptSubmit", "at work")):
        document = json.dumps(claude_input(event, "live")).encode()
        assert am_process("hook", harness, "context", "--agent", AGENT, input=document, env=env).returncode == 0
        row = _status()
        assert row["reachable"] and words in row["reached_by"] and row["reached_by"].startswith("told at its next")
        assert ("at work" in row["reached_by"]) is (event != "SessionStart")


def test_a_turns_start_stands_the_waiter_down_and_mail_is_told_after_the_next_tool():
    """Issue 33 #5: the waiter armed when a turn ended does not run on through the next turn: the turn's prompt
    stands it down (it exits quietly), status and a send's receipt say the session is at work, and mail that lands
    during the turn is told by the next tool call's hook, not as an idle wake."""
    context("SessionStart")
    waiter = _waiter(CLAUDE_PID=str(os.getpid()))
    try:
        _woken_now(waiter)
        assert context("UserPromptSubmit") is None  # the next turn starts
        assert waiter.wait(timeout=20) == 0 and waiter.stderr.read() == b""
        row = _status()
        assert row["watch_state"] != "armed" and row["reachable"]
        assert row["reached_by"].startswith("told at its next tool call or stop (a live Claude Code session, at work")
        done = am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "mid-turn", "--require-reachable")
        assert done.returncode == 0 and "at work" in json.loads(done.stdout)["deliveries"][0]["reached_by"]
        note = context("PostToolUse")
        assert note is not None and "mid-turn" in note
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    # The turn ends: its Stop's waiter arms again.
    assert hook("stop", claude_input("Stop")).stdout == b""
    again = _waiter(CLAUDE_PID=str(os.getpid()))
    try:
        _woken_now(again)
    finally:
        again.kill()
        again.wait()


def test_a_held_stop_stands_down_the_waiter_its_stop_started_in_either_order():
    """Issue 33 #5: a held stop sends the turn back, so the waiter the same Stop starts does not arm (or, armed
    first, is ended); the second stop's (stop_hook_active) arms."""
    context("SessionStart")
    send("first")
    assert json.loads(hook("stop", claude_input("Stop")).stdout)["decision"] == "block"
    late = _waiter(CLAUDE_PID=str(os.getpid()))  # started by the same Stop, after the hold
    assert late.wait(timeout=20) == 0 and late.stderr.read() == b""
    assert "at work" in _status()["reached_by"]
    assert hook("stop", claude_input("Stop", stop_hook_active=True)).stdout == b""
    for _ in range(3):  # the next turns: mail lands during each, and its Stop runs the guard and the waiter at once
        send("during the turn")
        waiter = _waiter(CLAUDE_PID=str(os.getpid()))
        try:
            held = bool(hook("stop", claude_input("Stop")).stdout)
            code = waiter.wait(timeout=20)
        finally:
            if waiter.poll() is None:
                waiter.kill()
                waiter.wait()
        # told once: held (the waiter, armed before or after, stands down quietly) or woken by the waiter
        assert (code, held) in ((0, True), (2, False)), (code, held)
        if held:
            assert hook("stop", claude_input("Stop", stop_hook_active=True)).stdout == b""
        assert context("PostToolUse") is None


@pytest.mark.parametrize("stdin, field", [(b"not json", "stdin"), (b"[1, 2]", "stdin"), (b"{}", "stdin"),
                                          (b'{"session_id": ""}', "stdin"), (b"\xff\xfe", "stdin")])
def test_bad_hook_input_is_a_clear_error_and_changes_nothing(stdin, field):
    done = am_process("hook", "claude-code", "context", "--agent", AGENT, input=stdin)
    assert done.returncode == 2 and done.stdout == b""
    error = json.loads(done.stderr)
    assert error["problems"][0]["field"] == field and "Traceback" not in done.stderr.decode()


def test_a_hook_run_by_hand_in_a_terminal_says_so_instead_of_waiting():
    import pty

    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "agent_mail", "hook", "claude-code", "context", "--agent", AGENT],
                              stdin=follower, capture_output=True, env=process_env(), timeout=30)
    finally:
        os.close(leader)
        os.close(follower)
    assert done.returncode == 2 and done.stdout == b""
    assert "is a terminal" in json.loads(done.stderr)["error"]


@pytest.mark.parametrize("argv, field", [(["hook", "vim", "context", "--agent", AGENT], "harness"),
                                         (["hook", "claude-code", "nap", "--agent", AGENT], "event"),
                                         (["hook", "claude-code", "context"], "--agent"),
                                         (["hook", "claude-code", "context", "--agent", "Bad"], "--agent")])
def test_bad_hook_arguments_name_the_field(argv, field):
    done = am_process(*argv, input=json.dumps(claude_input("PostToolUse")).encode(),
                      env={k: v for k, v in process_env().items() if k != "AGENT_MAIL_AGENT"})
    assert done.returncode == 2 and done.stdout == b""
    assert field in {p["field"] for p in json.loads(done.stderr)["problems"]}


# ---------------------------------------------------------------- setup


def setup(directory, *extra: str, **kwargs):
    return am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(directory), *extra, **kwargs)


@LOCAL_SETUP
def test_setup_merges_into_existing_settings_and_leaves_the_rest(tmp_path):
    settings = tmp_path / ".claude" / "settings.local.json"
    settings.parent.mkdir()
    mine = {"model": "opus", "env": {"FOO": "1"}, "permissions": {"allow": ["Bash(ls)"], "deny": ["Read(.env)"]},
            "hooks": {"PostToolUse": [{"matcher": "Edit", "hooks": [{"type": "command", "command": "fmt"}]}]}}
    settings.write_text(json.dumps(mine))
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    done = setup(tmp_path)
    assert done.returncode == 0, done.stderr
    merged = json.loads(settings.read_text())
    assert list(merged)[:4] == ["model", "env", "permissions", "hooks"]  # their order kept
    assert merged["env"]["FOO"] == "1" and merged["permissions"]["deny"] == ["Read(.env)"]
    assert merged["permissions"]["allow"] == ["Bash(ls)", "mcp__agent-mail"]
    assert merged["hooks"]["PostToolUse"][0] == mine["hooks"]["PostToolUse"][0]
    assert set(merged["hooks"]) == {"PostToolUse", "SessionStart", "UserPromptSubmit", "Stop", "SessionEnd",
                                    "PreToolUse"}
    waiter = merged["hooks"]["Stop"][0]["hooks"][1]
    assert waiter["asyncRewake"] is True and waiter["timeout"] >= 3300 and " wait " in waiter["command"]
    assert merged["hooks"]["SessionStart"][0]["hooks"][1] == waiter  # armed at the start too: idle before a prompt
    assert merged["enabledMcpjsonServers"] == ["agent-mail"]
    servers = json.loads((tmp_path / ".mcp.json").read_text())["mcpServers"]
    assert list(servers) == ["other", "agent-mail"]
    given = os.environ["AGENT_MAIL_DB"]
    recorded = given if "://" in given else os.path.realpath(given)
    # The file a team commits holds nothing personal: the interpreter, identity and mailbox are in the
    # personal settings' env, which the session (and the server it starts) inherits.
    assert servers["agent-mail"]["command"] == "sh" and "/" not in servers["agent-mail"]["args"][1].split(";")[-1]
    assert "AGENT_MAIL_DB" not in json.dumps(servers) and AGENT not in json.dumps(servers)
    assert merged["env"] == {"FOO": "1", "AGENT_MAIL_PYTHON": sys.executable, "AGENT_MAIL_AGENT": AGENT,
                             "AGENT_MAIL_DB": recorded}
    assert (tmp_path / ".agent-mail-db").read_text().splitlines()[-1] == recorded
    # Another identity replaces ours, not theirs; --remove takes out only ours.
    assert am_process("setup", "claude-code", "--agent", "proj:other", "--dir", str(tmp_path)).returncode == 0
    again = json.loads(settings.read_text())
    assert "proj:coder" not in json.dumps(again) and json.dumps(again).count("proj:other") == 11  # hooks, env, summary
    assert setup(tmp_path, "--remove").returncode == 0
    assert json.loads(settings.read_text()) == mine
    assert json.loads((tmp_path / ".mcp.json").read_text()) == {"mcpServers": {"other": {"command": "x"}}}
    assert not (tmp_path / ".agent-mail-db").exists()


@LOCAL_SETUP
def test_setup_dry_run_shows_the_diff_and_writes_nothing(tmp_path):
    done = setup(tmp_path, "--dry-run")
    result = json.loads(done.stdout)
    assert result["dry_run"] is True and [f["action"] for f in result["files"]] == ["create", "create", "create"]
    assert "+    \"agent-mail\": {" in result["files"][0]["diff"]
    assert list(tmp_path.iterdir()) == []


def test_setup_refuses_malformed_settings_and_writes_nothing(tmp_path):
    settings = tmp_path / ".claude" / "settings.local.json"
    settings.parent.mkdir()
    settings.write_text("{ this is not json")
    done = setup(tmp_path)
    assert done.returncode == 2 and done.stdout == b""
    error = json.loads(done.stderr)
    assert error["problems"][0]["field"] == str(settings) and "not valid JSON" in error["error"]
    assert settings.read_text() == "{ this is not json" and not (tmp_path / ".mcp.json").exists()


def test_setup_on_a_read_only_directory_changes_nothing(tmp_path):
    project = tmp_path / "project"  # the mailbox's own directory (under tmp_path) stays writable
    project.mkdir()
    project.chmod(0o555)
    try:
        done = setup(project, **as_a_user())  # as root (CI), without the capabilities that ignore file modes
        assert done.returncode == 1 and "Nothing was changed" in json.loads(done.stderr)["error"], done.stderr
    finally:
        project.chmod(0o755)
    assert list(project.iterdir()) == []


@LOCAL_SETUP
def test_setup_over_an_unreadable_settings_path_writes_nothing(tmp_path):
    (tmp_path / ".claude").write_text("a file where the settings directory would go")
    done = setup(tmp_path)
    assert done.returncode == 1 and "Nothing was written" in json.loads(done.stderr)["error"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".claude"]


def test_setup_that_fails_half_way_puts_back_what_it_wrote(tmp_path, monkeypatch, am):
    from agent_mail.harness import setup

    (tmp_path / ".mcp.json").write_text('{"mcpServers": {}}')
    real = setup.write

    def failing(path, text):
        if path.endswith("settings.local.json") and text is not None and " hook claude-code " in text:
            raise OSError(28, "No space left on device", path)
        real(path, text)

    monkeypatch.setattr(setup, "write", failing)
    result = am("setup", "claude-code", "--agent", AGENT, "--dir", str(tmp_path))
    error = json.loads(result.err)  # the result was printed, then the write failed: the exit status decides
    assert result.code == 1 and "Nothing was changed" in error["error"] and error["output_discarded"] is True
    assert (tmp_path / ".mcp.json").read_text() == '{"mcpServers": {}}'  # written first, then put back
    assert not (tmp_path / ".claude" / "settings.local.json").exists()


def test_setup_quotes_paths_with_spaces_and_quotes_in_hook_commands(tmp_path, monkeypatch):
    odd = tmp_path / "it's a \"box\" dir" / "mail.db"
    env = process_env(AGENT_MAIL_DB=str(odd))
    assert am_process("status", env=env).returncode == 0
    project = tmp_path / "my project"
    project.mkdir()
    assert am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(project), env=env).returncode == 0
    settings = json.loads((project / ".claude" / "settings.local.json").read_text())
    command = settings["hooks"]["SessionStart"][0]["hooks"][0]["command"]
    send_env = process_env(AGENT_MAIL_DB=str(odd))
    sent = am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "through the shell", env=send_env)
    assert sent.returncode == 0, sent.stderr
    # Run the command as the harness does (sh -c), with no AGENT_MAIL_DB of its own.
    bare = {k: v for k, v in process_env().items() if k != "AGENT_MAIL_DB"}
    done = subprocess.run(["sh", "-c", command], input=json.dumps(claude_input("SessionStart")).encode(),
                          capture_output=True, env=bare, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "through the shell" in json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]


SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                      "agent-mail")


def test_setup_writes_hooks_that_run_the_script_and_takes_out_those_of_older_setups(tmp_path):
    """A hook runs on every tool call: setup writes it as this interpreter running the agent-mail script (`-m
    agent_mail` costs runpy's millisecond more a start). The hooks older setups wrote as `-m agent_mail` are
    still ours: a new setup replaces them in place and --remove takes them out; a user's own `agent-mail hook`
    (no path) stays."""
    mailbox = os.environ["AGENT_MAIL_DB"]
    older = f"AGENT_MAIL_DB={mailbox} {sys.executable} -m agent_mail hook claude-code"
    mine = {"type": "command", "command": "agent-mail hook claude-code context --agent proj:mine"}
    before = {"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [
        mine, {"type": "command", "command": f"{older} context --agent {AGENT}"}]}],
        "SessionEnd": [{"hooks": [{"type": "command", "command": f"{older} end --agent {AGENT}"}]}]}}
    settings = tmp_path / ".claude" / "settings.local.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps(before, indent=2))
    assert am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert json.loads(settings.read_text()) == {"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [mine]}]}}
    settings.write_text(json.dumps(before, indent=2))
    done = subprocess.run([sys.executable, SCRIPT, "setup", "claude-code", "--agent", AGENT, "--dir", str(tmp_path)],
                          env=process_env(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    hooks = json.loads(settings.read_text())["hooks"]
    assert hooks["PostToolUse"][0]["hooks"][0] == mine  # theirs first, ours replaced in place
    commands = [h["command"] for groups in hooks.values() for group in groups for h in group["hooks"] if h != mine]
    assert len(commands) == 8 and not [c for c in commands if "-m agent_mail" in c]
    for command in commands:
        words = shlex.split(command)
        assert words[1:4] == [sys.executable, SCRIPT, "hook"], command
    bare = {k: v for k, v in process_env().items() if k != "AGENT_MAIL_DB"}
    send("told through the script")
    done = subprocess.run(["sh", "-c", hooks["SessionStart"][0]["hooks"][0]["command"]], env=bare,
                          input=json.dumps(claude_input("SessionStart")).encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "told through the script" in json.loads(done.stdout)["hookSpecificOutput"]["additionalContext"]
    assert am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert json.loads(settings.read_text()) == {"hooks": {"PostToolUse": [{"matcher": "*", "hooks": [mine]}]}}


@pytest.mark.sqlite_only  # PostgreSQL's driver brings more of its own
@pytest.mark.local_only("what the local hook imports (through a server: tests/functional/test_server_hooks.py)")
def test_the_hook_after_every_tool_imports_only_what_it_needs():
    """The after-tool hook runs on every tool call: no json, re or enum (its input decoded by the C scanner), no
    pure-Python datetime, sqlite3 package or contextlib, no runpy (run as the script)."""
    context("SessionStart")
    code = ("import sys; from agent_mail.cli.main import main; code = main(sys.argv[1:]); "
            "print(code, sorted({'re', 'enum', 'json', 'typing', 'datetime', 'sqlite3', 'contextlib', 'runpy', 'math', "
            "'subprocess'} & set(sys.modules)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, "hook", "claude-code", "context", "--agent", AGENT],
                          input=json.dumps(claude_input("PostToolUse")).encode(), env=process_env(),
                          capture_output=True, timeout=60)
    assert done.stderr.decode().strip().splitlines()[-1] == "0 []", done.stderr


# ---------------------------------------------------------------- Codex and Gemini CLI


def test_codex_hooks_answer_in_its_schema():
    """Codex's hook input and output mirror Claude Code's (SessionStart / UserPromptSubmit / PostToolUse
    context, Stop with decision block); it has no asyncRewake, so its waiter never waits."""
    run = lambda event, doc: am_process("hook", "codex", event, "--agent", AGENT,  # noqa: E731
                                        input=json.dumps(doc).encode())
    assert run("context", claude_input("SessionStart", "cx")).returncode == 0
    send("for codex")
    note = json.loads(run("context", claude_input("PostToolUse", "cx")).stdout)["hookSpecificOutput"]
    assert note["hookEventName"] == "PostToolUse" and "for codex" in note["additionalContext"]
    assert "the agent-mail MCP tool read" in note["additionalContext"]
    send("late")
    held = json.loads(run("stop", claude_input("Stop", "cx")).stdout)
    assert held["decision"] == "block" and "late" in held["reason"]
    started = time.monotonic()
    assert run("wait", claude_input("Stop", "cx")).returncode == 0 and time.monotonic() - started < 15


def test_gemini_hooks_answer_in_its_schema():
    """Gemini CLI: BeforeAgent / AfterTool carry the context, AfterAgent is the stop (decision deny sends the
    reason back as a prompt), stdout is always JSON ({} when quiet)."""
    def run(event, name, **extra):
        document = {"session_id": "gm", "transcript_path": "/tmp/t.json", "cwd": "/tmp", "hook_event_name": name,
                    "timestamp": "2026-12-02T10:00:00Z", **extra}
        done = am_process("hook", "gemini", event, "--agent", AGENT, input=json.dumps(document).encode())
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert "you are proj:coder" in run("context", "SessionStart", source="startup")["hookSpecificOutput"][
        "additionalContext"]
    assert run("context", "AfterTool", tool_name="read_file", tool_input={}, tool_response={}) == {}
    send("for gemini")
    note = run("context", "BeforeAgent", prompt="go")["hookSpecificOutput"]
    assert note["hookEventName"] == "BeforeAgent" and "for gemini" in note["additionalContext"]
    send("late one")
    held = run("stop", "AfterAgent", prompt="go", prompt_response="done", stop_hook_active=False)
    assert held["decision"] == "deny" and "late one" in held["reason"]
    assert run("stop", "AfterAgent", prompt="go", prompt_response="ok", stop_hook_active=True) == {}


@LOCAL_SETUP
def test_setup_codex_writes_its_toml_and_hooks_and_takes_out_only_its_own(tmp_path):
    import tomllib

    config = tmp_path / ".codex" / "config.toml"
    config.parent.mkdir()
    original = 'model = "o3"\n\n[mcp_servers.other]\ncommand = "x"\n'
    config.write_text(original)
    done = am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path))
    result = json.loads(done.stdout)
    assert [f["action"] for f in result["files"]] == ["update", "create", "create"]
    assert result["wakes_idle_session"] is True  # issue 28: its waker, through `codex queue`
    assert any("An idle session is woken when mail arrives" in note and "codex queue" in note
               for note in result["notes"])
    parsed = tomllib.loads(config.read_text())
    assert parsed["model"] == "o3" and parsed["mcp_servers"]["other"] == {"command": "x"}
    assert parsed["mcp_servers"]["agent-mail"]["args"][-3:] == ["mcp", "--agent", AGENT]
    # Issue 28: Codex's shared app-server takes `codex queue` at once; it outlives /exit, and ends the session (its
    # SessionEnd) when it unloads the thread, this many seconds after the terminal left (issue 20 #3).
    assert parsed["thread_unload_delay_secs"] == 2 and "features" not in parsed
    assert config.read_text().startswith("# agent-mail setup: begin, top of the file")  # a root key: before tables
    hooks = json.loads((tmp_path / ".codex" / "hooks.json").read_text())["hooks"]
    # Issue 20 #3: Codex 0.171 fires SessionEnd (under `codex exec` too): the session ends when Codex says so.
    assert set(hooks) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "Stop", "SessionEnd", "PreToolUse"}
    assert hooks["PreToolUse"][0]["matcher"] == "apply_patch|Bash"  # its edits (pre-tool-use.command.input)
    assert " hook codex stop " in hooks["Stop"][0]["hooks"][0]["command"] + " "
    assert " hook codex end " in hooks["SessionEnd"][0]["hooks"][0]["command"] + " "
    # Issue 28: the session's idle waker is started at its start and after each turn.
    for event in ("SessionStart", "Stop"):
        assert " hook codex wait " in hooks[event][0]["hooks"][-1]["command"] + " "
    again = json.loads(am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path)).stdout)
    assert [f["action"] for f in again["files"]] == ["unchanged", "unchanged", "unchanged"]
    assert am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert config.read_text() == original and not (tmp_path / ".codex" / "hooks.json").exists()
    # The user's own unload delay is theirs: left as it is (a second one would not be TOML).
    config.write_text("thread_unload_delay_secs = 30\n" + original)
    assert am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path)).returncode == 0
    assert tomllib.loads(config.read_text())["thread_unload_delay_secs"] == 30
    assert am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert config.read_text() == "thread_unload_delay_secs = 30\n" + original
    config.write_text(original)
    # A table of that name the user wrote is not overwritten; malformed TOML is refused. Nothing written.
    config.write_text(original + '\n[mcp_servers.agent-mail]\ncommand = "mine"\n')
    refused = am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path))
    assert refused.returncode == 2 and "already defines mcp_servers.agent-mail" in json.loads(refused.stderr)["error"]
    config.write_text("model = \n")
    refused = am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path))
    assert refused.returncode == 2 and "not valid TOML" in json.loads(refused.stderr)["error"]
    assert config.read_text() == "model = \n" and not (tmp_path / ".codex" / "hooks.json").exists()


def test_copilot_hooks_read_its_camel_case_input_and_answer_in_its_schema(tmp_path):
    """Copilot CLI 1.0.102: camelCase input without an event name; the context is a TOP-LEVEL additionalContext,
    the held agentStop {decision: block}, the pre-edit refusal a top-level permissionDecision."""
    def run(event, **extra):
        document = {"sessionId": "cp", "timestamp": 1796368642935, "cwd": str(tmp_path), **extra}
        done = am_process("hook", "copilot", event, "--agent", AGENT, input=json.dumps(document).encode())
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout or b"null")

    assert "you are proj:coder" in run("context", source="new", initialPrompt="hi")["additionalContext"]
    assert run("context", toolName="view", toolArgs={"path": "x"}, toolResult={"resultType": "success"}) is None
    send("for copilot")
    assert "for copilot" in run("context", prompt="go")["additionalContext"]
    send("late one")
    held = run("stop", stopReason="end_turn", stop_hook_active=False)
    assert held["decision"] == "block" and "late one" in held["reason"]
    assert run("stop", stopReason="end_turn", stop_hook_active=True) is None
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=tmp_path, check=True)
    assert am_process("reserve", "proj:holder", "src/**", cwd=str(tmp_path)).returncode == 0
    denied = run("pretool", toolName="create", toolArgs=json.dumps({"path": str(tmp_path / "src" / "a.rs"),
                                                                     "file_text": "x"}))
    assert denied["permissionDecision"] == "deny" and "held by proj:holder" in denied["permissionDecisionReason"]
    assert run("pretool", toolName="create", toolArgs={"path": str(tmp_path / "b.txt"), "file_text": "x"}) is None


@pytest.mark.parametrize("harness", ["qwen", "copilot"])
def test_setup_qwen_and_copilot_merge_into_their_files_and_remove_exactly(tmp_path, harness):
    if harness == "qwen":
        path, mine = tmp_path / ".qwen" / "settings.json", {"model": {"name": "x"}, "tools": {"visible": ["a"]},
                                                             "hooks": {"Stop": [{"hooks": [{"type": "command",
                                                                                            "command": "echo"}]}]}}
    else:
        path, mine = tmp_path / ".mcp.json", {"mcpServers": {"other": {"type": "stdio", "command": "x"}}}
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(mine))
    assert json.loads(am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path), "--dry-run").stdout)[
        "dry_run"] and json.loads(path.read_text()) == mine
    done = am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    merged = json.loads(path.read_text())
    if harness == "qwen":
        assert merged["model"] == {"name": "x"} and merged["mcpServers"]["agent-mail"]["trust"] is True
        assert merged["tools"]["visible"][0] == "a" and "mcp__agent-mail__read" in merged["tools"]["visible"]
        assert set(merged["hooks"]) == {"SessionStart", "UserPromptSubmit", "PostToolUse", "PreToolUse", "Stop",
                                        "SessionEnd"}
        assert merged["hooks"]["Stop"][0] == mine["hooks"]["Stop"][0]
        assert " hook qwen wait " in merged["hooks"]["Stop"][1]["hooks"][-1]["command"] + " "
        # Issue 28: the input file the session's waker wakes it through, one per Qwen Code process.
        assert merged["dualOutput"] == {"inputFile": str(tmp_path / ".qwen" / "agent-mail" /
                                                         "wake-${QWEN_CODE_LAUNCHER_PID}.jsonl")}
    else:
        assert list(merged["mcpServers"]) == ["other", "agent-mail"]
        assert merged["mcpServers"]["agent-mail"]["tools"] == ["*"]
        hooks = json.loads((tmp_path / ".github" / "hooks" / "agent-mail.json").read_text())
        assert hooks["version"] == 1 and set(hooks["hooks"]) == {
            "sessionStart", "userPromptSubmitted", "postToolUse", "preToolUse", "agentStop", "sessionEnd"}
    again = json.loads(am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path)).stdout)
    assert {f["action"] for f in again["files"]} == {"unchanged"}
    assert am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert json.loads(path.read_text()) == mine
    assert not (tmp_path / ".github").exists()
    if harness == "qwen":  # an input file of the person's own is theirs: kept, and the waker writes to it
        path.write_text(json.dumps({**mine, "dualOutput": {"inputFile": "/srv/mine.jsonl", "jsonFile": "/srv/o"}}))
        assert am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path)).returncode == 0
        assert json.loads(path.read_text())["dualOutput"] == {"inputFile": "/srv/mine.jsonl", "jsonFile": "/srv/o"}
        assert am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
        assert json.loads(path.read_text())["dualOutput"] == {"inputFile": "/srv/mine.jsonl", "jsonFile": "/srv/o"}


@LOCAL_SETUP
def test_setup_opencode_merges_into_opencode_json_writes_its_plugin_and_removes_exactly(tmp_path):
    """The project's opencode.json (its provider settings written first) keeps every key; the MCP server goes under
    mcp.agent-mail; the plugin runs `hook opencode` with this identity and mailbox; --dry-run writes nothing; a second
    run changes nothing; --remove takes out only ours; a plugin file of that name not ours is refused, untouched."""
    config = tmp_path / "opencode.json"
    mine = {"$schema": "https://opencode.ai/config.json", "model": "scripted/scripted",
            "provider": {"scripted": {"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": "http://x/v1"}}},
            "mcp": {"other": {"type": "local", "command": ["x"]}}}
    config.write_text(json.dumps(mine))
    plan = json.loads(am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path), "--dry-run").stdout)
    assert plan["dry_run"] and json.loads(config.read_text()) == mine
    assert not (tmp_path / ".opencode").exists()
    assert [f["action"] for f in plan["files"]] == ["update", "create", "create"]
    done = am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["wakes_idle_session"] is True and any("opencode.json" in note for note in result["notes"])
    merged = json.loads(config.read_text())
    assert {k: v for k, v in merged.items() if k != "mcp"} == {k: v for k, v in mine.items() if k != "mcp"}
    assert list(merged["mcp"]) == ["other", "agent-mail"] and merged["mcp"]["other"] == mine["mcp"]["other"]
    entry = merged["mcp"]["agent-mail"]
    assert entry["type"] == "local" and entry["command"][-3:] == ["mcp", "--agent", AGENT]
    assert entry["environment"]["AGENT_MAIL_DB"] == os.environ["AGENT_MAIL_DB"]
    plugin = (tmp_path / ".opencode" / "plugin" / "agent-mail.js").read_text()
    assert '"hook", "opencode"]' in plugin and json.dumps(AGENT) in plugin and "promptAsync" in plugin
    again = json.loads(am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path)).stdout)
    assert {f["action"] for f in again["files"]} == {"unchanged"}
    other = json.loads(am_process("setup", "opencode", "--agent", "proj:other", "--dir", str(tmp_path)).stdout)
    assert [f["action"] for f in other["files"]] == ["update", "update", "unchanged"]
    assert am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert json.loads(config.read_text()) == mine and not (tmp_path / ".opencode").exists()
    # Someone else's plugin of that name: refused, nothing written.
    (tmp_path / ".opencode" / "plugin").mkdir(parents=True)
    (tmp_path / ".opencode" / "plugin" / "agent-mail.js").write_text("export default async () => ({});\n")
    refused = am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path))
    assert refused.returncode == 2 and "agent-mail.js" in json.loads(refused.stderr)["problems"][0]["field"]
    assert json.loads(config.read_text()) == mine
    # Through an agent-mail server: the server's /mcp, the token read from the environment by OpenCode, in no file.
    (tmp_path / "served").mkdir()
    served = am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path / "served"),
                        env=process_env(AGENT_MAIL_DB="https://mail.example.com:8025/"))
    assert served.returncode == 0, served.stderr
    remote = json.loads((tmp_path / "served" / "opencode.json").read_text())["mcp"]["agent-mail"]
    assert remote == {"type": "remote", "url": "https://mail.example.com:8025/mcp",
                      "headers": {"Authorization": "Bearer {env:AGENT_MAIL_TOKEN}"}, "enabled": True}
    assert '"AGENT_MAIL_DB": "https://mail.example.com:8025"' in (
        tmp_path / "served" / ".opencode" / "plugin" / "agent-mail.js").read_text()
    # An mcp that is not an object: refused, naming it.
    config.write_text(json.dumps({"mcp": []}))
    (tmp_path / ".opencode" / "plugin" / "agent-mail.js").unlink()
    refused = am_process("setup", "opencode", "--agent", AGENT, "--dir", str(tmp_path))
    assert refused.returncode == 2 and json.loads(refused.stderr)["problems"][0]["field"] == "mcp"
    assert json.loads(config.read_text()) == {"mcp": []}


def test_the_opencode_guard_reads_the_plugins_tool_arguments(tmp_path):
    """OpenCode's tools name the file filePath (write, edit, multiedit) or carry a patch (apply_patch's patchText):
    an edit of a reserved file is denied, any other tool or a free file passes in silence."""
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=tmp_path, check=True)
    assert am_process("reserve", "proj:holder", "src/**", cwd=str(tmp_path)).returncode == 0

    def pretool(tool: str, arguments: dict) -> bytes:
        document = {"session_id": "oc", "hook_event_name": "PreToolUse", "cwd": str(tmp_path), "tool_name": tool,
                    "tool_input": arguments}
        done = am_process("hook", "opencode", "pretool", "--agent", AGENT, input=json.dumps(document).encode())
        assert done.returncode == 0, done.stderr
        return done.stdout

    held = str(tmp_path / "src" / "a.rs")
    for tool, arguments in (("write", {"filePath": held, "content": "x"}),
                            ("edit", {"filePath": held, "oldString": "a", "newString": "b"}),
                            ("multiedit", {"filePath": held, "edits": []}),
                            ("apply_patch", {"patchText": "*** Begin Patch\n*** Add File: src/b.rs\n+x\n"
                                                          "*** End Patch\n"})):
        denied = json.loads(pretool(tool, arguments))["hookSpecificOutput"]
        assert denied["permissionDecision"] == "deny" and "held by proj:holder" in denied["permissionDecisionReason"]
    assert pretool("write", {"filePath": str(tmp_path / "free.txt"), "content": "x"}) == b""
    assert pretool("read", {"filePath": held}) == b""


def test_setup_gemini_writes_one_settings_file(tmp_path):
    settings = tmp_path / ".gemini" / "settings.json"
    settings.parent.mkdir()
    settings.write_text(json.dumps({"theme": "Dracula", "mcpServers": {"other": {"command": "x"}}}))
    done = am_process("setup", "gemini", "--agent", AGENT, "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    merged = json.loads(settings.read_text())
    assert merged["theme"] == "Dracula" and list(merged["mcpServers"]) == ["other", "agent-mail"]
    assert merged["mcpServers"]["agent-mail"]["trust"] is True
    assert set(merged["hooks"]) == {"SessionStart", "BeforeAgent", "AfterTool", "AfterAgent", "SessionEnd",
                                    "BeforeTool"}
    assert merged["hooks"]["BeforeTool"][0]["matcher"] == "write_file|replace"
    assert merged["hooks"]["AfterAgent"][0]["hooks"][0]["name"] == "agent-mail-stop"
    assert am_process("setup", "gemini", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert json.loads(settings.read_text()) == {"theme": "Dracula", "mcpServers": {"other": {"command": "x"}}}


@LOCAL_SETUP
@pytest.mark.parametrize("harness", harnesses.NAMES)
def test_setup_then_remove_in_an_empty_directory_leaves_it_empty(tmp_path, harness):
    tmp_path = tmp_path / "project"  # beside the test's mailbox
    tmp_path.mkdir()
    done = am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    removed = json.loads(am_process("setup", harness, "--agent", AGENT, "--dir", str(tmp_path), "--remove").stdout)
    assert {f["action"] for f in removed["files"]} == {"remove"}, removed["files"]
    assert list(tmp_path.iterdir()) == []  # no empty file, no empty .claude/.codex/.gemini, no .agent-mail-db
    # A directory that holds something else stays, and so does the project file another harness still uses.
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "notes").write_text("mine")
    assert am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path)).returncode == 0
    assert am_process("setup", "gemini", "--agent", AGENT, "--dir", str(tmp_path)).returncode == 0
    assert am_process("setup", "codex", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".agent-mail-db", ".codex", ".gemini"]
    assert [p.name for p in (tmp_path / ".codex").iterdir()] == ["notes"]
    assert am_process("setup", "gemini", "--agent", AGENT, "--dir", str(tmp_path), "--remove").returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [".codex"]


def test_setup_refuses_a_mailbox_that_cannot_be_opened_and_writes_nothing(tmp_path):
    (tmp_path / "afile").write_text("a regular file where a directory would have to be")
    project = tmp_path / "project"
    project.mkdir()
    env = process_env(AGENT_MAIL_DB=str(tmp_path / "afile" / "mail.db"))
    done = am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(project), env=env)
    assert done.returncode == 2 and done.stdout == b""
    error = json.loads(done.stderr)
    assert error["problems"][0]["field"] == "AGENT_MAIL_DB" and "is a file, not a directory" in error["error"]
    assert list(project.iterdir()) == []
    # A mailbox not made yet is fine where it can be made, and setup does not make it.
    fresh = tmp_path / "new" / "dir" / "mail.db"
    done = am_process("setup", "codex", "--agent", AGENT, "--dir", str(project),
                      env=process_env(AGENT_MAIL_DB=str(fresh)))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "new").exists()


def test_a_plain_shell_in_the_project_finds_the_mailbox_setup_recorded(tmp_path):
    recorded = tmp_path / "team" / "mail.db"
    project = tmp_path / "project"
    (project / "src" / "deep").mkdir(parents=True)
    env = process_env(AGENT_MAIL_DB=str(recorded))
    assert am_process("status", env=env).returncode == 0
    assert am_process("setup", "claude-code", "--agent", AGENT, "--dir", str(project), env=env).returncode == 0
    bare = {k: v for k, v in process_env().items() if k != "AGENT_MAIL_DB"}
    bare["HOME"] = str(tmp_path / "home")  # the default mailbox, if it were used, is not the user's
    sent = am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "found by walking up",
                      cwd=str(project / "src" / "deep"), env=bare)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(am_process("read", AGENT, env=env).stdout)["messages"][0]["subject"] == "found by walking up"
    storage = json.loads(am_process("describe", cwd=str(project / "src"), env=bare).stdout)["storage"]
    assert storage["path"] == str(recorded) and storage["source"] == str(project / ".agent-mail-db")
    # AGENT_MAIL_DB still wins; outside the project the default is used.
    other = tmp_path / "other.db"
    storage = json.loads(am_process("describe", cwd=str(project),
                                    env={**bare, "AGENT_MAIL_DB": str(other)}).stdout)["storage"]
    assert storage["path"] == str(other) and storage["source"] == "AGENT_MAIL_DB"
    storage = json.loads(am_process("describe", cwd=str(tmp_path), env=bare).stdout)["storage"]
    assert storage["source"] == "default" and not (tmp_path / "home" / ".agent-mail").exists()
    # A project file that names nothing is a clear error.
    (project / ".agent-mail-db").write_text("# nothing\n")
    refused = am_process("read", AGENT, cwd=str(project), env=bare)
    assert refused.returncode == 2 and "names no mailbox" in json.loads(refused.stderr)["error"]


@LOCAL_SETUP
@pytest.mark.parametrize("first", ["claude-code", "copilot"])
def test_claude_code_and_copilot_share_mcp_json_in_either_order(tmp_path, first):
    """Both read DIR/.mcp.json; Copilot CLI cannot start Claude Code's shared entry (no AGENT_MAIL_PYTHON in its
    environment), Claude Code can start Copilot's: Copilot's entry stays while Copilot CLI is set up, and Claude's
    comes back when only Claude Code is left."""
    project = tmp_path / "project"
    project.mkdir()
    mcp = project / ".mcp.json"

    def setup(harness, *more):
        done = am_process("setup", harness, "--agent", AGENT, "--dir", str(project), *more)
        assert done.returncode == 0, done.stderr

    def entry():
        return json.loads(mcp.read_text())["mcpServers"]["agent-mail"] if mcp.exists() else None

    second = "copilot" if first == "claude-code" else "claude-code"
    setup(first)
    setup(second)
    assert entry()["tools"] == ["*"] and entry()["args"][-3:] == ["mcp", "--agent", AGENT]
    setup("claude-code")
    assert entry()["tools"] == ["*"]  # a second Claude setup leaves Copilot's entry
    setup("copilot", "--remove")
    assert "tools" not in entry() and entry()["command"] == "sh"  # Claude Code's shared entry is back
    setup("copilot")
    setup("claude-code", "--remove")
    assert entry()["tools"] == ["*"]
    setup("copilot", "--remove")
    assert list(project.iterdir()) == []
