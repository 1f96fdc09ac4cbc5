"""The idle waker of Qwen Code and Codex (agent_mail.harness.waker), without the harnesses: where it finds Qwen Code's
input file, which runs it skips, and, with a stand-in harness process, the whole round: started detached by the
`wait` hook, armed, one prompt appended when mail arrives (told once), gone with the harness. The real Qwen Code and
Codex are woken in tests/harnesses/test_qwen.py and tests/harnesses/test_codex.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.lib.cli import am_process, process_env, run_inprocess
from tests.lib.harnesses import wakers
from tests.lib.waiting import until
from agent_mail.harness import waker

AGENT = "proj:coder"


def _sleeper(*arguments: str, cwd=None, env=None) -> subprocess.Popen:
    """A process whose command line carries `arguments`, as a harness's does."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *arguments], cwd=cwd,
                               env=env, stdout=subprocess.DEVNULL)

    def started() -> bool:  # its own command line, not the forking parent's
        with open(f"/proc/{process.pid}/cmdline", "rb") as handle:
            return b"time.sleep(60)" in handle.read()
    until(started, 10, "the stand-in did not start")
    return process


@pytest.mark.fast
def test_the_qwen_input_file_is_found_as_qwen_code_finds_it(tmp_path):
    flagged = _sleeper("--input-file", "in/wake.jsonl", cwd=tmp_path)
    (tmp_path / "w" / ".qwen").mkdir(parents=True)
    (tmp_path / "w" / ".qwen" / "settings.json").write_text(json.dumps({"dualOutput": {
        "inputFile": "/x/wake-${QWEN_CODE_LAUNCHER_PID}-$OTHER-${UNSET_HERE}.jsonl"}}))
    env = {**os.environ, "QWEN_CODE_LAUNCHER_PID": "4242", "OTHER": "o"}
    env.pop("UNSET_HERE", None)
    configured = _sleeper(cwd=tmp_path / "w", env=env)
    bare = _sleeper(cwd=tmp_path)
    prompted = _sleeper("-p", "hi")
    try:
        assert waker.qwen_input_file(flagged.pid) == str(tmp_path / "in" / "wake.jsonl")  # the flag, from its dir
        assert waker.qwen_input_file(configured.pid) == "/x/wake-4242-o-${UNSET_HERE}.jsonl"  # expanded as Qwen does
        assert waker.qwen_input_file(bare.pid) is None and waker.qwen_delivery(bare.pid) is None
        assert waker.interactive("qwen", bare.pid)
        assert not waker.interactive("qwen", prompted.pid)
    finally:
        for process in (flagged, configured, bare, prompted):
            process.kill()
            process.wait()


@pytest.mark.fast
def test_a_qwen_delivery_appends_one_private_submit_line(tmp_path):
    process = _sleeper("--input-file", str(tmp_path / "d" / "in.jsonl"))
    try:
        deliver = waker.qwen_delivery(process.pid)
        deliver("agent-mail: 1 new message\n- m1 from a:b")
        deliver("second")
    finally:
        process.kill()
        process.wait()
    lines = (tmp_path / "d" / "in.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"type": "submit", "text": waker.FRAME + "\nagent-mail: 1 new message\n- m1 from a:b"},
        {"type": "submit", "text": waker.FRAME + "\nsecond"}]
    assert (tmp_path / "d" / "in.jsonl").stat().st_mode & 0o777 == 0o600


def _wakers() -> set[int]:
    found = set()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if entry.isdigit() and f"\0hook\0qwen\0wait\0--agent\0{AGENT}".encode() in handle.read():
                    found.add(int(entry))
        except OSError:
            continue
    return found


def _harness(tmp_path, inputs, session: str) -> subprocess.Popen:
    """A stand-in for Qwen Code (a process watching --input-file) that runs the `wait` hook as Qwen Code does,
    through `sh -c`, prints the hook's exit status, and lives on."""
    script = textwrap.dedent(f"""
        import json, subprocess, sys, time
        document = json.dumps({{"session_id": {session!r}, "hook_event_name": "SessionStart",
                               "cwd": {str(tmp_path)!r}}})
        done = subprocess.run(["sh", "-c", sys.executable + " -m agent_mail hook qwen wait --agent {AGENT}"],
                              input=document.encode(), capture_output=True, timeout=20)
        print(done.returncode, done.stdout.decode(), done.stderr.decode(), flush=True)
        time.sleep(60)
    """)
    return subprocess.Popen([sys.executable, "-c", script, "--input-file", str(inputs)], cwd=tmp_path,
                            env=process_env(), stdout=subprocess.PIPE, text=True)


def _armed() -> dict | None:
    row = json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]
    return row if row["watch_state"] == "armed" else None


def test_the_waker_is_detached_armed_wakes_once_and_ends_with_its_harness(tmp_path):
    """The `wait` hook returns at once, quietly; its waker arms (status: armed, reachable); a send from another
    process appends one prompt holding the envelope (not the body), told once, and the waker ends (the woken turn's
    Stop starts the next). A waker whose harness dies goes with it."""
    inputs = tmp_path / "in.jsonl"
    harness = _harness(tmp_path, inputs, "s-1")
    try:
        assert harness.stdout.readline().split() == ["0"]
        row = until(_armed, 30, "the waker did not arm")
        assert row["reachable"] and row["sessions"] == 1 and len(_wakers()) == 1
        done = am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Wake up", "--body", "secret body")
        assert done.returncode == 0, done.stderr
        until(lambda: inputs.exists() and inputs.read_text().endswith("\n"), 30, "no prompt appended")
        until(lambda: not _wakers(), 30, "the waker did not end after its wake")
        prompts = [json.loads(line) for line in inputs.read_text().splitlines()]
        assert len(prompts) == 1 and "Wake up" in prompts[0]["text"] and "secret body" not in prompts[0]["text"]
        # Told: the session's next prompt hook has nothing new to say.
        again = am_process("hook", "qwen", "context", "--agent", AGENT, input=json.dumps(
            {"session_id": "s-1", "hook_event_name": "UserPromptSubmit"}).encode(),
            env=process_env(CLAUDE_PID=str(harness.pid)))
        assert again.returncode == 0 and again.stdout == b""
    finally:
        harness.kill()
        harness.wait()
    doomed = _harness(tmp_path, inputs, "s-2")
    try:
        assert doomed.stdout.readline().split() == ["0"]
        until(lambda: _armed() and len(_wakers()) == 1, 30, "the second waker did not arm")
    finally:
        doomed.kill()
        doomed.wait()
    until(lambda: not _wakers(), 30, "the waker outlived its harness")
    until(lambda: not _armed(), 30, "still armed after the harness died")


def test_the_stop_s_wait_hook_returns_once_its_waker_is_armed_so_the_next_turn_stands_it_down(tmp_path):
    """Issue 33 #5: Qwen Code and Codex start their next turn only once the Stop's hooks have returned, and the
    `wait` hook returns only once its waker is armed (or has found the session not idle): so the next turn's prompt
    hook always comes after the arming and stands the waker down. A waker that armed after that prompt (a prompt
    queued during the turn is submitted as soon as it ends) would say "woken" all through the turn that follows."""
    harness = _sleeper("--input-file", str(tmp_path / "in.jsonl"), cwd=tmp_path)
    env = process_env(CLAUDE_PID=str(harness.pid))

    def hook(event: str, name: str) -> subprocess.CompletedProcess:
        document = {"session_id": "s-1", "hook_event_name": name, "cwd": str(tmp_path)}
        if name == "Stop":
            document["stop_hook_active"] = False
        done = am_process("hook", "qwen", event, "--agent", AGENT, input=json.dumps(document).encode(), env=env,
                          cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return done

    def status() -> dict:
        return json.loads(run_inprocess("status", "--agent", AGENT).out)["agents"][0]
    try:
        hook("context", "SessionStart")
        hook("context", "UserPromptSubmit")  # the first turn
        hook("stop", "Stop")  # it ends: the Stop's hooks
        hook("wait", "Stop")
        assert status()["watch_state"] == "armed"  # at once: the hook returned once its waker was armed
        assert len(wakers(tmp_path, "qwen")) == 1
        hook("context", "UserPromptSubmit")  # the next turn, at once
        until(lambda: not wakers(tmp_path, "qwen"), 30, "the waker did not stand down at the turn's start")
        # (through a server, its request there ends when the server sees it hung up: within its 5 s checks)
        until(lambda: (lambda r: r["watch_state"] != "armed" and "at work" in r["reached_by"])(status()), 15,
              lambda: f"not said to be at work: {status()}")
    finally:
        harness.kill()
        harness.wait()
    until(lambda: not wakers(tmp_path, "qwen"), 30, "the waker outlived its harness")


def test_a_waker_armed_again_is_stood_down_by_a_turn_that_started_since_its_last_wait(mailbox_path, monkeypatch):
    """Issue 33 #5: a waker arms again when its wait ran out (or, through a server, after the short request that
    armed it first): a turn that started in between left its mark (at work), which stands it down, where its first
    arming, right after its Stop, takes the mark of the turn that Stop ends (its stop hook not run yet)."""
    from agent_mail.operations import mail, telling
    from agent_mail.operations.results import no_emit

    monkeypatch.setenv("AGENT_MAIL_DB", str(mailbox_path))  # the mailbox itself (the server's steps are the same)
    with mail.open_mailbox() as mailbox:
        def session(event: str) -> telling.Session:
            return telling.Session(mailbox, "qwen", AGENT, {"session_id": "s-1", "hook_event_name": event,
                                                            "stop_hook_active": False})
        session("SessionStart").context(no_emit)
        session("UserPromptSubmit").context(no_emit)  # a turn: at work
        stopped = session("Stop")
        assert stopped.arm("1:1@here") is None  # the turn's Stop: its waker arms (before its stop hook ran)
        stopped.forget_waiter("1:1@here")  # its wait ran out
        session("UserPromptSubmit").context(no_emit)  # meanwhile the next turn started
        with pytest.raises(telling.Superseded):
            stopped.arm("1:1@here", again=True)
        row = json.loads(run_inprocess("status", "--agent", AGENT).out)["agents"][0]
        assert row["watch_state"] != "armed" and "at work" in row["reached_by"], row
