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

from tests.lib.cli import am_process, process_env
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
