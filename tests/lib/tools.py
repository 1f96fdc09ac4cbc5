"""The tools the tests drive for real (tmux, the harness CLIs, PostgreSQL...): find() where one is, require() it
(the test skipped, saying what to install, where it is missing; failed under CI, which installs every one)."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.lib.postgres import TEST_PG_URL, postgres_bindir, postgres_problem

# ---- Tools the tests drive for real. `.ci/run` installs every one, and CI (CI set) runs every test that needs
# one: there a missing tool fails the test; elsewhere (a laptop) the test is skipped, saying what to install.

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODE_BIN = os.path.join(ROOT, ".cache", "node", "node_modules", ".bin")  # where .ci/run installs the harnesses
VIBE_BIN = os.path.join(ROOT, ".cache", "vibe", "bin")  # Mistral Vibe, in a virtual environment of its own

# tool: (AGENT_MAIL_... variable naming another copy, or None; commands to look for; how to install it)
TOOLS = {
    "tmux": (None, ("tmux",), "apt-get install tmux"),
    "mutt": (None, ("mutt",), "apt-get install mutt"),
    "vim": (None, ("vim", "vim.tiny"), "apt-get install vim-tiny"),
    "less": (None, ("less",), "apt-get install less"),
    "nginx": (None, ("nginx",), "apt-get install nginx-light"),
    "caddy": (None, ("caddy",), "apt-get install caddy"),
    "chromium": ("AGENT_MAIL_CHROMIUM", ("chromium-headless-shell", "chromium"),
                 "apt-get install chromium-headless-shell, or set AGENT_MAIL_CHROMIUM"),
    "claude": ("AGENT_MAIL_CLAUDE", ("claude",), "npm install @anthropic-ai/claude-code, or set AGENT_MAIL_CLAUDE"),
    "codex": ("AGENT_MAIL_CODEX", ("codex",), "npm install @openai/codex, or set AGENT_MAIL_CODEX"),
    "gemini": ("AGENT_MAIL_GEMINI", ("gemini",), "npm install @google/gemini-cli, or set AGENT_MAIL_GEMINI"),
    "qwen": ("AGENT_MAIL_QWEN", ("qwen",), "npm install @qwen-code/qwen-code, or set AGENT_MAIL_QWEN"),
    "copilot": ("AGENT_MAIL_COPILOT", ("copilot",), "npm install @github/copilot, or set AGENT_MAIL_COPILOT"),
    "opencode": ("AGENT_MAIL_OPENCODE", ("opencode",), "npm install opencode-ai, or set AGENT_MAIL_OPENCODE"),
    "kilo": ("AGENT_MAIL_KILO", ("kilo",), "npm install @kilocode/cli@7.7.7, or set AGENT_MAIL_KILO"),
    "pi": ("AGENT_MAIL_PI", ("pi",), "npm install @mariozechner/pi-coding-agent, or set AGENT_MAIL_PI"),
    "vibe": ("AGENT_MAIL_VIBE", ("vibe",), "python3.12 -m venv .cache/vibe && .cache/vibe/bin/pip install "
             "mistral-vibe==3.0.2, or set AGENT_MAIL_VIBE"),
    "runuser": (None, ("runuser",), "apt-get install util-linux"),
    "pg_ctlcluster": (None, ("pg_ctlcluster",), "apt-get install postgresql-common"),
    "sqlite3": (None, ("sqlite3",), "apt-get install sqlite3"),
    "pg_dump": (None, ("pg_dump",), "apt-get install postgresql-client"),
    "systemd-analyze": (None, ("systemd-analyze",), "apt-get install systemd"),
    "git": (None, ("git",), "apt-get install git"),
}


def unavailable(reason: str) -> None:
    """What a test does when something it needs is missing here: skip with the reason; under CI, which
    installs everything, fail with it."""
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def find(tool: str) -> str | None:
    """Where `tool` (a name in TOOLS) is: its AGENT_MAIL_... variable, the copy .ci/run installs under
    .cache/node (the harnesses) or .cache/vibe (Mistral Vibe), or PATH; None when it is nowhere."""
    variable, commands, _ = TOOLS[tool]
    for candidate in (os.environ.get(variable) if variable else None,
                      *(os.path.join(where, c) for where in (NODE_BIN, VIBE_BIN) for c in commands),
                      *(shutil.which(c) for c in commands)):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def require(tool: str) -> str:
    """The path of `tool`, or, where it is missing, the test skipped with the reason (failed under CI).
    "postgresql": the test PostgreSQL server (its URL); "postgresql-server": the directory of PostgreSQL's
    server programs (initdb, pg_ctl, postgres)."""
    if tool == "postgresql":
        problem = postgres_problem()
        if problem:
            unavailable(problem)
        return TEST_PG_URL
    if tool == "postgresql-server":
        found = postgres_bindir()
        if found is None:
            unavailable("PostgreSQL's server programs (initdb, pg_ctl, postgres) are not installed "
                        "(apt-get install postgresql)")
        return found
    path = find(tool)
    if path is None:
        unavailable(f"{tool} is not installed ({TOOLS[tool][2]})")
    return path
