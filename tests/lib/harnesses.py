"""What the end-to-end tests of the real harness CLIs share. The CLIs themselves are found by lib/tools.py's
find()/require() (an AGENT_MAIL_<NAME> override, the pinned copy `.ci/run` installs under .cache/node, or one on
PATH), and a module that drives one is marked requires("claude") etc.: skipped with the reason where it is
missing, failed under CI, where it is required."""

from __future__ import annotations

import json
import os

HELD = "This arrived while you worked"  # what the stop guard's reason says


def private_tmp(home) -> str:
    """A temporary directory inside the test's own (TMPDIR for a harness), so what a harness leaves in its
    temporary directory (sockets, notes, error reports) goes with the test's."""
    path = os.path.join(str(home), "tmp")
    os.makedirs(path, exist_ok=True)
    return path


URGENT = "Stop the deploy"  # the subject of the mail that lands during a turn


def send_urgent_mail(agent: str) -> None:
    """Mail for `agent` from another process, as a colleague would send it mid-turn."""
    from tests.lib.cli import am_process, process_env

    done = am_process("send", "--from", "boss:lead", "--to", agent, "--subject", URGENT, env=process_env())
    assert done.returncode == 0, done.stderr


def status_of(agent: str) -> dict:
    """`agent-mail status --agent AGENT`'s row, from another process."""
    from tests.lib.cli import am_process

    return json.loads(am_process("status", "--agent", agent).stdout)["agents"][0]


def chat_tools(request: dict) -> list[str]:
    """The names of the tools a Chat Completions request offers the model."""
    return [t.get("function", {}).get("name") for t in request.get("tools") or []]


def mail_during_the_turn(is_turn, history, send):
    """A model script for the stop guard: in the session's first turn, mail lands (send()) while the model
    answers "All done."; once the stop guard sends the turn back (its reason in the history), the model
    answers "I will handle it next." is_turn(request): a request of the session's own loop; history(request):
    the part of it holding the conversation."""
    sent = []

    def script(request):
        if not is_turn(request):
            return None
        if HELD in json.dumps(history(request)):
            return [{"type": "text", "text": "I will handle it next."}]
        if not sent:
            send()
            sent.append(True)
        return [{"type": "text", "text": "All done."}]

    return script


def wakers(project, harness: str) -> set[int]:
    """The processes of `agent-mail hook HARNESS wait` running in `project`: the session's detached idle waker
    (agent_mail.harness.waker), which keeps the hook's command line and directory."""
    found = set()
    mark = f"\0hook\0{harness}\0wait\0".encode()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if entry.isdigit() and mark in handle.read() and os.readlink(f"/proc/{entry}/cwd") == str(project):
                    found.add(int(entry))
        except OSError:
            continue
    return found


WOKEN = "new mail arrived while you were idle"  # how the waker's prompt begins


class Terminal:
    """A harness run interactively in a tmux session of its own (its own server socket under `directory`), as a
    person runs it: keys typed, the screen read. Killed, with its server, on leaving the `with`."""

    def __init__(self, directory, name: str, cwd, command: str):
        self.tmux = ["tmux", "-S", os.path.join(str(directory), "tmux.sock")]
        self.name, self.cwd, self.command = name, str(cwd), command

    def __enter__(self) -> Terminal:
        import subprocess

        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "160", "-y", "45", "-c", self.cwd,
                        self.command], check=True)
        return self

    def __exit__(self, *exc) -> None:
        import subprocess

        subprocess.run([*self.tmux, "kill-session", "-t", self.name], capture_output=True)
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)

    def screen(self) -> str:
        import subprocess

        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True).stdout

    def type(self, *keys: str) -> None:
        """Each key (or text) sent, a moment apart, as typed."""
        import subprocess
        import time

        for key in keys:
            subprocess.run([*self.tmux, "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.3)

    def wait_for(self, predicate, seconds: float, why: str):
        from tests.lib.waiting import until

        return until(predicate, seconds, lambda: f"{why}:\n{self.screen()}", interval=0.2)
