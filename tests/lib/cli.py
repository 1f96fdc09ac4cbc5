"""Running the command line: in this process (run_inprocess, what the `am` fixture gives) or as a real process
(am_process, with process_env); json_of reads a command's answer; as_a_user makes a child bound by file modes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass

from agent_mail.cli import main

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def assert_ok(self) -> None:
        """Assert the command succeeded: exit 0, nothing on stderr, a JSON document on stdout.
        For calls made only for their effect; `.json` asserts the same and returns the document."""
        assert self.code == 0, f"exit {self.code}: {self.err}"
        assert self.err == "", self.err
        try:
            json.loads(self.out)
        except ValueError as exc:
            raise AssertionError(f"stdout is not JSON ({exc}): {self.out!r}") from None

    @property
    def json(self):
        self.assert_ok()
        return json.loads(self.out)

    @property
    def error(self):
        assert self.code != 0, f"expected failure, got: {self.out}"
        assert self.out == "", f"stdout must be empty on failure: {self.out}"
        assert "Traceback" not in self.err
        return json.loads(self.err)


def run_inprocess(*argv: str, stdin: bytes | None = None) -> Result:
    """Run `agent-mail ARGS` in this process (what the `am` fixture gives): its exit code, stdout and stderr."""
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        code = main.main(list(argv))
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved
    out.flush()
    err.flush()
    return Result(code, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8"))


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


def json_of(proc: subprocess.CompletedProcess):
    """The JSON document a command that succeeded printed (a process run by am_process, Server.direct,
    Server.client...); a failure is shown with its stderr."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def without_dac_override() -> None:
    """A preexec_fn for root: drop the capabilities that let root read and write any file (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) from the program about to run, so file modes bind it as they bind any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from what exec grants
            raise OSError(ctypes.get_errno(), "prctl")


def as_a_user() -> dict:
    """subprocess arguments that make a child bound by file modes as an ordinary user is, whoever runs the
    suite (CI runs it as root): for root, a preexec_fn dropping the capabilities that override them."""
    return {"preexec_fn": without_dac_override} if os.geteuid() == 0 else {}
