"""Fan-out: one message to 50 recipients, this project beside the reference CLI, in one run.

    python bench/bench_fanout.py [--rounds 15] [--recipients 50]

agent-mail: one `send` process with --to repeated 50 times (one transaction, 50 copies).
reference:  agent-mail-cli 0.5.1 takes one --to per send, so the same delivery is 50
            `send` processes, run one after another.
Both are timed as whole processes (spawn to exit), on a mailbox that already exists.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, implementations, report, summary  # noqa: E402


def time_ours(cli: str, db: str, recipients: list[str], rounds: int) -> list[float]:
    argv = [cli, "send", "--from", "bench:lead", "--subject", "fan-out", "--body", "Please review."]
    for recipient in recipients:
        argv += ["--to", recipient]
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        subprocess.run(argv, env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def time_reference(cli: str, db: str, recipients: list[str], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for recipient in recipients:
            subprocess.run([cli, "send", "--from", "bench:lead", "--to", recipient, "--subject", "fan-out",
                            "--body", "Please review."], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def rows(clis: dict[str, str], rounds: int = 15, recipients: int = 50) -> list[tuple]:
    """Measure; return table rows (measure, agent-mail, reference, ratio)."""
    names = [f"bench:r{i}" for i in range(recipients)]
    with tempfile.TemporaryDirectory() as tmp:
        results, counts = {}, {}
        for name, cli in clis.items():
            db = os.path.join(tmp, name, "mail.db")
            subprocess.run([cli, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
            timer = time_ours if name == "agent-mail" else time_reference
            results[name] = summary(timer(cli, db, names, rounds))
            con = sqlite3.connect(db)
            counts[name] = con.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
            con.close()
    ours, ref = results["agent-mail"], results["reference"]
    assert counts["agent-mail"] == counts["reference"] == rounds * recipients, counts
    return [
        (f"one message to {recipients} recipients, median ms", f"{ours[0]:.1f}", f"{ref[0]:.1f}",
         f"{ours[0] / ref[0]:.3f}"),
        (f"one message to {recipients} recipients, p90 ms", f"{ours[1]:.1f}", f"{ref[1]:.1f}",
         f"{ours[1] / ref[1]:.3f}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--recipients", type=int, default=50)
    args = parser.parse_args()
    result = rows(implementations(), args.rounds, args.recipients)
    report(f"fan-out benchmark ({args.rounds} rounds)", result)


if __name__ == "__main__":
    main()
