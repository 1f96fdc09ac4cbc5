"""The code passes the project's linter (configured in pyproject.toml), as part of the one test command."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.lib.tools import ROOT


def test_ruff_finds_nothing():
    if shutil.which("ruff") is None and subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                       capture_output=True).returncode != 0:
        pytest.skip("ruff is not installed (it comes with the [test] extra)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "src", "tests", "bench"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
