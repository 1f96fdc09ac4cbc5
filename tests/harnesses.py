"""Finding the real harness CLIs the end-to-end tests drive: an AGENT_MAIL_<NAME> override, the pinned copy
`.ci/run` installs under .cache/node, or one on PATH. Missing: skipped with the reason, or an error under
CI, where they are required."""

from __future__ import annotations

import os
import shutil

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def harness(command: str, variable: str, package: str) -> tuple[str | None, pytest.MarkDecorator]:
    """(path of `command` or None, a skip mark to apply to the tests that need it)."""
    path = None
    for candidate in (os.environ.get(variable), os.path.join(ROOT, ".cache", "node", "node_modules", ".bin", command),
                      shutil.which(command)):
        if candidate and os.path.exists(candidate):
            path = candidate
            break
    if path is None and os.environ.get("CI"):
        raise RuntimeError(f"CI must run the {command} tests: .ci/run installs {package} under .cache/node")
    return path, pytest.mark.skipif(path is None, reason=f"{command} is not installed (npm install {package}, or "
                                                         f"set {variable})")


def private_tmp(home) -> str:
    """A temporary directory inside the test's own (TMPDIR for a harness), so what a harness leaves in its
    temporary directory (sockets, notes, error reports) goes with the test's."""
    path = os.path.join(str(home), "tmp")
    os.makedirs(path, exist_ok=True)
    return path
