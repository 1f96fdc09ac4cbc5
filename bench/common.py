"""Shared benchmark plumbing: throwaway virtual environments for this project and the reference CLI.

The reference is the seed lineage's published CLI, `agent-mail-cli==0.5.1`. Both
packages are importable as `agent_mail`, so each lives in its own venv under
bench/.cache (ignored by git), built on first use and reused afterwards.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "bench", ".cache")
REFERENCE = "agent-mail-cli==0.5.1"


def cli_env(db: str | None) -> dict:
    """The environment a CLI under test runs in: this one, with AGENT_MAIL_DB set, and without
    PYTHONDONTWRITEBYTECODE (some shells and CI images set it; users' installs have their compiled
    modules, and without them every run would first compile its package, ~15-20 ms for either CLI)."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    if db is not None:
        env["AGENT_MAIL_DB"] = db
    return env


def _venv(name: str, requirement: str, reinstall: bool) -> str:
    path = os.path.join(CACHE, name)
    python = os.path.join(path, "bin", "python")
    marker = os.path.join(path, "installed.txt")
    fresh = not os.path.exists(marker) or open(marker).read() != requirement
    if fresh:
        venv.create(path, with_pip=True, clear=True)
    if fresh or reinstall:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--compile",
                        "--force-reinstall", "--no-deps", requirement], check=True, env=cli_env(None))
        with open(marker, "w") as handle:
            handle.write(requirement)
    return os.path.join(path, "bin", "agent-mail")


def implementations() -> dict[str, str]:
    """{"agent-mail": our CLI (reinstalled from this tree), "reference": agent-mail-cli 0.5.1's CLI}."""
    os.makedirs(CACHE, exist_ok=True)
    return {
        "agent-mail": _venv("ours", ROOT, reinstall=True),
        "reference": _venv("reference", REFERENCE, reinstall=False),
    }


def ours() -> str:
    """This project's CLI alone, reinstalled from this tree (for a bench with no reference to run beside)."""
    os.makedirs(CACHE, exist_ok=True)
    return _venv("ours", ROOT, reinstall=True)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def summary(values: list[float]) -> tuple[float, float]:
    return statistics.median(values), percentile(values, 0.9)


def table(rows: list[tuple], headers: tuple) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows, strict=True)]
    line = lambda cells: "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


HEADERS = ("measure", "agent-mail", "reference 0.5.1", "ratio")


def report(title: str, rows: list[tuple]) -> None:
    """Print one benchmark's table under a heading naming the machine."""
    print(f"# {title} ({machine()})\n")
    print(table(rows, HEADERS))


def machine() -> str:
    return f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, {sys.platform}"
