"""The README's quick start and tour, run as written (issue 32): in a fresh clone of the repository (no file the
tracked tree lacks, so a ref the tour points at must be made by the tour) with an empty home and no AGENT_MAIL_DB,
each command's answer held to what the page says it prints: its exit code, the keys and the values the samples
and comments show (ids and times vary).

Installing is left out: the quick start's `python3 -m venv .venv && . .venv/bin/activate && pip install .` would
fetch a build backend from a package index, so `agent-mail` is this Python's `-m agent_mail` of the code under
test (PYTHONPATH), as in every other test; the commands after the install run as the page gives them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.lib.cli import SRC
from tests.lib.tools import ROOT

pytestmark = [pytest.mark.timeout(180), pytest.mark.requires("git"),
              pytest.mark.local_only("runs the README in a clone of its own, on a mailbox in its own home")]

README = os.path.join(ROOT, "README.md")
INSTALL = ["python3 -m venv .venv", ". .venv/bin/activate", "pip install ."]


def _page() -> str:
    with open(README, encoding="utf-8") as handle:
        return handle.read()


def _block(after: str, kind: str = "sh") -> str:
    """The first ```KIND block after the text `after`."""
    page = _page()
    assert after in page, f"the README no longer says {after!r}"
    found = re.search(rf"```{kind}\n(.*?)```", page[page.index(after):], re.S)
    assert found, f"no ```{kind} block after {after!r}"
    return found.group(1)


def _said(text: str) -> str:
    """The README's prose from `text` on, its line breaks made spaces (a sample may wrap)."""
    page = _page()
    return " ".join(page[page.index(text):].split())


class Checkout:
    """A fresh clone of the repository and an empty home, where `agent-mail` runs the code under test."""

    def __init__(self, tmp_path):
        if not os.path.exists(os.path.join(ROOT, ".git")):
            pytest.skip("the tests run outside a git checkout: there is no repository to clone")
        self.dir, self.home = str(tmp_path / "agent-mail"), str(tmp_path / "home")
        os.mkdir(self.home)
        cloned = subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", ROOT, self.dir], capture_output=True,
                                text=True, timeout=120)
        assert cloned.returncode == 0, cloned.stderr
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_MAIL_")}
        self.env.update(HOME=self.home, PYTHONPATH=SRC)

    def run(self, line: str) -> subprocess.CompletedProcess:
        """One command line of the page: `agent-mail ...` as this Python's module, anything else by the shell."""
        words = shlex.split(line, comments=True)
        if words[0] == "agent-mail":
            argv = [sys.executable, "-m", "agent_mail", *words[1:]]
            return subprocess.run(argv, cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=60)
        return subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=self.dir, env=self.env,
                              capture_output=True, text=True, timeout=60)


def _answer(proc: subprocess.CompletedProcess, exit_code: int = 0):
    assert proc.returncode == exit_code, (proc.args, proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout if exit_code == 0 else proc.stderr)


def _quick_start(checkout: Checkout) -> str:
    """The quick start's commands after the install, each held to the page; the id of the message it read."""
    [line] = [line for line in _block("## Quick start").splitlines() if line.strip()]
    steps = [step.strip() for step in line.split(" && ")]
    assert steps[:3] == INSTALL, steps  # the install, left out (see the module's docstring)
    sent, read = steps[3:]
    receipt = _answer(checkout.run(sent))
    assert [(d["recipient"], d["status"]) for d in receipt["deliveries"]] == [("deploy:worker", "delivered")]
    assert '"status": "delivered"' in _said("The `send` prints its receipt")
    answer = _answer(checkout.run(read))
    [message] = answer["messages"]
    assert message["subject"] == shlex.split(sent)[shlex.split(sent).index("--subject") + 1]
    promised = re.search(r'"next": (\[.*?\])', _said("The `send` prints its receipt")).group(1)
    assert answer["next"] == [step.replace("ID", message["id"]) for step in json.loads(promised)]
    version = _answer(checkout.run("agent-mail --version"))
    assert '`agent-mail --version` prints `{"name": "agent-mail", "version": ...}`' in _said("The `send` prints")
    assert version["name"] == "agent-mail" and set(version) == {"name", "version"}
    return message["id"]


def _tour(checkout: Checkout) -> dict[str, tuple[str, object]]:
    """The tour's command lines run in order, each with its comment: {the command's first words: (its comment,
    its answer)}. A line that is only a comment continues the command above."""
    commands: list[list[str]] = []
    for line in _block("## A short tour").splitlines():
        command, _, comment = line.partition("  #")
        if command.strip():
            commands.append([command.strip(), comment.strip()])
        elif comment.strip():
            commands[-1][1] = f"{commands[-1][1]} {comment.strip()}".strip()
    answers: dict[str, tuple[str, object]] = {}
    read_id = None
    for command, comment in commands:
        if command.endswith(" ID"):  # the id the read before it printed, as the comment says
            assert "ID from the read" in comment and read_id is not None
            command = command[:-2] + read_id
        exit_code = int(comment[len("exit "):][0]) if comment.startswith("exit ") else 0
        proc = checkout.run(command)
        answer = _answer(proc, exit_code) if command.startswith("agent-mail") else proc
        if command.startswith("agent-mail read deploy:worker"):
            read_id = answer["messages"][0]["id"]
        answers[" ".join(shlex.split(command)[:3])] = (comment, answer)
    return answers


def test_the_quick_start_and_the_tour_run_as_written(tmp_path):
    checkout = Checkout(tmp_path)
    assert not os.path.exists(os.path.join(checkout.dir, "logs"))  # a fresh checkout: the tour makes its ref
    _quick_start(checkout)
    answers = _tour(checkout)

    comment, manual = answers["agent-mail describe"]
    assert {"commands", "exit_codes", "environment"} <= set(manual), sorted(manual)
    comment, receipt = answers["agent-mail send --from"]
    for word in ('"delivered"', "reachable"):
        assert word in comment
    assert [(d["status"], type(d["reachable"])) for d in receipt["deliveries"]] == [("delivered", bool)]

    # The watch answers as the page's sample says, but for its id and time.
    sample = json.loads(_block("What the tour's `watch` prints", "json"))
    comment, watched = answers["agent-mail watch deploy:worker"]
    assert set(watched) == set(sample)
    assert {k: watched[k] for k in sample if k != "messages"} == {k: v for k, v in sample.items() if k != "messages"}
    [shown], [got] = sample["messages"], watched["messages"]
    assert set(got) == set(shown)
    assert {k: got[k] for k in shown if k not in ("id", "created")} == \
        {k: v for k, v in shown.items() if k not in ("id", "created")}
    assert shown["id"].endswith("-...") and re.fullmatch(r"[0-9a-f-]{36}", got["id"]), got["id"]

    comment, read = answers["agent-mail read deploy:worker"]
    [message] = read["messages"]
    assert message["subject"] == "Fix X" and message["read_at"] is not None and len(message["refs"]) == 1

    comment, acked = answers["agent-mail ack deploy:worker"]
    assert acked["acked"] == [message["id"]] and acked["unread_left"] == 0 and acked["next"]
    for key in ("acked", "unread_left", "next"):
        assert f'"{key}"' in comment

    comment, status = answers["agent-mail status"]
    for key in ("unread", "unacked", "watch_state", "reachable", "reached_by", "last_active", "hosts"):
        assert key in comment and all(key in row for row in status["agents"]), key

    comment, found = answers["agent-mail search deploy OR rollback"]
    assert "**like this**" in comment and "**deploy**" in found["results"][0]["snippet"], found

    comment, reserved = answers["agent-mail reserve deploy:worker"]
    assert comment.startswith("granted") and reserved["granted"] == ["/src/**"] and reserved["conflicts"] == []

    comment, refused = answers["agent-mail read nobody"]
    promised = re.search(r'"error": "(.*?)\.\.\."', comment).group(1)
    assert refused["error"].startswith(promised) and refused["problems"], (promised, refused)
