"""Shared fixtures: every test gets its own mailbox; helpers run the CLI in-process or as a process."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from agent_mail import cli

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


@pytest.fixture(autouse=True)
def mailbox_path(tmp_path, monkeypatch):
    """Point AGENT_MAIL_DB at a fresh file, and HOME at a temp dir so the default is never touched."""
    path = tmp_path / "box" / "mail.db"
    monkeypatch.setenv("AGENT_MAIL_DB", str(path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return path


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self):
        assert self.code == 0, f"exit {self.code}: {self.err}"
        assert self.err == "", self.err
        return json.loads(self.out)

    @property
    def error(self):
        assert self.code != 0, f"expected failure, got: {self.out}"
        assert self.out == "", f"stdout must be empty on failure: {self.out}"
        assert "Traceback" not in self.err
        return json.loads(self.err)


def _run_inprocess(*argv: str, stdin: bytes | None = None) -> Result:
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        code = cli.main(list(argv))
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved
    out.flush()
    err.flush()
    return Result(code, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8"))


@pytest.fixture
def am():
    """Run `agent-mail ARGS` in-process: am("send", "--from", ...) -> Result."""
    return _run_inprocess


def process_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def am_process(*argv: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m agent_mail ARGS` as a real process."""
    env = kwargs.pop("env", None) or process_env()
    return subprocess.run([sys.executable, "-m", "agent_mail", *argv], capture_output=True, env=env,
                          timeout=timeout, **kwargs)


@pytest.fixture
def send(am):
    """send(frm, to, subject='s', *extra) -> receipt dict."""

    def _send(frm: str, to: str, subject: str = "hello", *extra: str) -> dict:
        return am("send", "--from", frm, "--to", to, "--subject", subject, *extra).json

    return _send


# CI runs the property tests with a fixed seed, so a run is reproducible; locally each run
# explores new examples. AGENT_MAIL_FUZZ_EXAMPLES raises the example counts for a long hunt.
from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    _settings.load_profile("ci")
FUZZ_EXAMPLES = int(os.environ.get("AGENT_MAIL_FUZZ_EXAMPLES", "0"))


def examples(default: int) -> int:
    """How many examples a property test runs: its default, or more when asked."""
    return max(default, FUZZ_EXAMPLES)
