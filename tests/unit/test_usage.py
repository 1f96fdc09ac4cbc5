"""A person at a terminal gets a short usage text; a pipe (an agent) keeps the JSON manual."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest

from agent_mail import spec
from tests.lib.cli import process_env


def _at_a_terminal(*argv: str) -> tuple[int, str]:
    """Run agent-mail with its stdout on a pseudo-terminal; (exit status, what the terminal showed)."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", *argv], stdout=follower, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=process_env())
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


@pytest.mark.parametrize("argv", [(), ("--help",), ("-h",), ("help",)])
def test_a_person_at_a_terminal_gets_the_commands_in_one_line_each(argv):
    code, shown = _at_a_terminal(*argv)
    assert code == 0
    assert shown.startswith("agent-mail ") and "{" not in shown.splitlines()[0]
    for name in spec.COMMANDS:
        assert any(line.startswith(f"  {name} ") for line in shown.splitlines()), name
    assert "agent-mail describe" in shown
    assert len(shown.splitlines()) < 45 and max(map(len, shown.splitlines())) <= 100


@pytest.mark.parametrize("argv", [("send", "--help"), ("help", "send")])
def test_a_command_s_help_at_a_terminal_is_its_usage(argv):
    code, shown = _at_a_terminal(*argv)
    assert code == 0
    assert shown.startswith("agent-mail send: ")
    for arg in spec.COMMANDS["send"].args:
        if arg.kind != spec.REMOVED:
            assert f"  {arg.name}" in shown or f"  {arg.name.upper()}" in shown
    assert "Examples:" in shown and "agent-mail describe send" in shown


def test_a_pipe_keeps_the_json_manual(am):
    assert am("--help").json["name"] == "agent-mail"
    assert am("send", "--help").json["command"] == spec.COMMANDS["send"].describe()
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "--help"], capture_output=True, env=process_env(),
                          timeout=30)
    assert json.loads(proc.stdout)["commands"]
