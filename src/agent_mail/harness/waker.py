"""The idle wake of Qwen Code and Codex: a waker of ours, detached from the hook that starts it, which waits like
Claude Code's asyncRewake waiter (agent_mail.harness.hooks.wait, run by hooks.wake_once: armed, so `status` shows
the session reachable; one per session, a newer one ending the older) and, when mail the session was not told of
arrives, hands the session the note through the harness's own primitive:

- Qwen Code: a `{"type": "submit", "text": ...}` line appended to its dual-output input file (`--input-file F`, or
  `dualOutput.inputFile` in its settings, which `agent-mail setup qwen` writes as one file per Qwen process). Qwen
  Code polls the file every 500 ms and submits the line as a prompt when idle (queued until then when busy).
- Codex: `codex queue --thread SESSION_ID --message TEXT` (the same binary as the session's), which queues a user
  message that starts a turn when the thread is idle. Codex's shared app-server takes it at once (about 0.3 s); a
  session's own process, without the app-server, looks at its queue only every ~10 s. So `setup codex` keeps the
  app-server and sets `thread_unload_delay_secs = 2`: the app-server fires SessionEnd 2 s after the terminal left,
  and a session that `/exit`ed stops counting as live about 2.5 s later.

What is handed over is the note itself (the envelopes: ids, senders, subjects; never a body), marked told in the
same transaction that delivers it: if it cannot be delivered it was not told, and the prompt hook that runs for the
woken prompt finds nothing new, so the session is told once. A flood folds into one wake: a waker wakes its session
once and ends, as Claude Code's does; what lands during the woken turn is told by that turn's hooks (after a tool,
or a held stop), and the turn's Stop starts the next waker. A delivery that failed told nothing and is tried again.
A waker ends with the harness's process (checked every few seconds), when the session ends (SessionEnd ends its
waiter) or when a newer waker replaces it; between its waits (55 minutes each) it stays armed. Stdio goes to
/dev/null and it runs in a session of its own: the hook returns as soon as the waker is armed (or found the session
not idle), and the harness never waits for its end. Armed before the hook returns, it is armed before the next turn
starts (the harnesses start it once the Stop's hooks returned), whose prompt hook then stands it down.
"""

from __future__ import annotations

import json
import os
import re

from agent_mail import errors, model
from agent_mail.harnesses.record import WOKEN_FRAME as FRAME
from agent_mail.files import pid_alive
from agent_mail.parts.liveness import harness_pid

RETRY_SECONDS = 5.0  # after a delivery that failed (nothing was told), the next try
ARMED_SECONDS = 10.0  # the longest the hook waits for its waker to arm (a mailbox busy that long: it returns anyway)


def start(harness: str, document: dict, wait_once) -> int:
    """The `wait` hook of Qwen Code and Codex: start the session's waker, detached, and return (0) once it is armed,
    or has found the session not idle, not while it waits. Both harnesses start the next turn only once the Stop's
    hooks have returned, so the next turn's prompt hook comes after the arming and stands the waker down: a waker
    that armed after that prompt (a prompt queued during a turn is submitted as soon as the turn ends, and a held
    stop's reason at once) would be taken for an idle session's all through the turn. Quiet when the session
    cannot be woken (no harness process known; Qwen Code without an input file). `wait_once(deliver, pid, armed,
    again)`: one wait of the waiter (harness.hooks), True when it woke the session; it calls `armed()` once it is
    armed (or will not be); `again`: not the waker's first wait, so a turn's mark found now stands it down."""
    from agent_mail.files import wait_readable

    pid = harness_pid()
    if pid is None or not interactive(harness, pid):
        return errors.EXIT_OK
    deliver = qwen_delivery(pid) if harness == "qwen" else codex_delivery(pid, document)
    if deliver is None:
        return errors.EXIT_OK
    told, tell = os.pipe()
    first = os.fork()
    if first:
        os.close(tell)
        os.waitpid(first, 0)
        wait_readable([told], ARMED_SECONDS)  # its end closed: armed, or nothing to wait for (or the waker gone)
        os.close(told)
        return errors.EXIT_OK
    try:  # the first child: a session of its own, then the waker as its child, which init adopts
        os.close(told)
        os.setsid()
        if os.fork():
            os._exit(0)
        if tell < 3:  # the hook was started with a standard stream closed: the pipe's end must outlive stdio's
            import fcntl

            tell = fcntl.fcntl(tell, fcntl.F_DUPFD_CLOEXEC, 3)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, tell)  # the harness's pipes too: it must not wait for the waker's end
        os.closerange(tell + 1, 1024)
        untold = [tell]

        def armed() -> None:  # the hook is told once: its pipe's end closed (its number is then free for others)
            if untold:
                os.close(untold.pop())
        import signal

        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # replaced, or its session ended: gone at once
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        forget(deliver)  # the input files of Qwen Code processes that are gone
        serve(wait_once, pid, deliver, armed)
    finally:
        os._exit(0)


def interactive(harness: str, pid: int) -> bool:
    """Whether the harness process `pid` is an interactive session (one that can sit idle): not `qwen -p` nor
    `codex exec`/`codex review`, which end with their one turn and are not kept waiting for the waker."""
    arguments = [a.decode(errors="replace") for a in _proc(pid, "cmdline").split(b"\0")]
    if harness == "qwen":
        return not any(a in ("-p", "--prompt") or a.startswith("--prompt=") for a in arguments)
    return not any(a in ("exec", "e", "review") for a in arguments[1:2])


def serve(wait_once, pid: int, deliver, armed=lambda: None) -> None:
    """Wait until the session is woken once, while the harness process `pid` lives. `armed()`: called once the
    first wait is armed (or is not to be)."""
    import time

    try:
        again = False
        while pid_alive(pid):
            began = time.monotonic()
            try:
                woke = wait_once(deliver, pid, armed, again)
            except (errors.AgentMailError, OSError):
                armed()  # not armed (the mailbox failed): the hook need not wait for the retry
                time.sleep(RETRY_SECONDS)  # the mailbox or the delivery failed: nothing was told; try again
                continue
            finally:
                again = True  # from now on a turn's mark (at work, held) is a later turn's: it stands the waker down
            if woke or time.monotonic() - began < model.WATCH_MINUTES_DEFAULT * 60.0 - 5.0:
                return  # woken (the woken turn's Stop starts the next waker), or ended early: replaced, session over
        forget(deliver)
    finally:
        armed()


def forget(deliver) -> None:
    """The harness is gone: the input file setup's setting made for its process goes too, and with it those of
    other Qwen Code processes of the workspace that are gone (a session that ended left its file: its process was
    still there when its waker ended)."""
    from agent_mail.harnesses import qwen

    path = getattr(deliver, "path", None)
    directory = os.path.dirname(path) if path else ""
    if not path or not directory.endswith(os.sep + qwen.WAKE_DIRECTORY):
        return
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        found = re.fullmatch(r"wake-(\d+)\.jsonl", name)
        if found and not pid_alive(int(found.group(1))):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


# -- Qwen Code -----------------------------------------------------------------------------------------------------
def _proc(pid: int, name: str) -> bytes:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def qwen_input_file(pid: int) -> str | None:
    """The input file the Qwen Code process `pid` watches: its --input-file, else dualOutput.inputFile of its
    workspace's settings, else of the user's (Qwen Code's precedence), ${VAR} and $VAR expanded from its
    environment as Qwen Code does; None when it watches none."""
    arguments = [a.decode(errors="replace") for a in _proc(pid, "cmdline").split(b"\0")]
    environment = dict(item.decode(errors="replace").partition("=")[::2]
                       for item in _proc(pid, "environ").split(b"\0") if b"=" in item)
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None
    found = None
    for index, argument in enumerate(arguments):
        if argument == "--input-file" and index + 1 < len(arguments):
            found = arguments[index + 1]
        elif argument.startswith("--input-file="):
            found = argument.partition("=")[2]
    home = environment.get("HOME") or os.path.expanduser("~")
    for settings in (os.path.join(cwd, ".qwen", "settings.json"), os.path.join(home, ".qwen", "settings.json")):
        if found:
            break
        try:
            with open(settings, encoding="utf-8") as handle:
                dual = json.load(handle).get("dualOutput") or {}
            found = dual.get("inputFile") if isinstance(dual, dict) else None
        except (OSError, ValueError, AttributeError):
            continue
    if not isinstance(found, str) or not found.strip():
        return None
    found = re.sub(r"\$(?:\{(\w+)\}|(\w+))",
                   lambda m: environment.get(m.group(1) or m.group(2), m.group(0)), found)
    return os.path.join(cwd, found)


def qwen_delivery(pid: int):
    """How the note reaches the Qwen Code process `pid`: a submit line appended to its input file (made, private,
    if it is not there yet); None when it watches no input file."""
    path = qwen_input_file(pid)
    if path is None:
        return None

    def deliver(note: str) -> None:
        line = json.dumps({"type": "submit", "text": f"{FRAME}\n{note}"}, ensure_ascii=False) + "\n"
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode("utf-8"))  # one write: Qwen Code reads whole lines only
        finally:
            os.close(fd)
    deliver.path = path
    return deliver


# -- Codex ---------------------------------------------------------------------------------------------------------
def codex_delivery(pid: int, document: dict):
    """How the note reaches the Codex session of the hook's input: `codex queue` with the session's own binary
    (the harness process's), its thread the hook's session_id."""
    try:
        binary = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    if not os.path.basename(binary).startswith("codex"):
        return None
    thread = document["session_id"]
    cwd = document.get("cwd") if isinstance(document.get("cwd"), str) and os.path.isdir(document["cwd"]) else None

    def deliver(note: str) -> None:
        import subprocess

        try:
            done = subprocess.run([binary, "queue", "--thread", thread, "--message", f"{FRAME}\n{note}"], cwd=cwd,
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise errors.AgentMailError(f"codex queue failed: {exc}") from None
        if done.returncode:
            raise errors.AgentMailError(f"codex queue failed: {done.stderr.decode(errors='replace')[-300:]}")
    return deliver
