"""Cold start, and the everyday commands on a large mailbox, this project beside the reference.

    python bench/bench_cli.py [--rounds 15] [--messages 200000] [--agents 200] [--cold-start-only]

- cold start: `read` and `send` as whole processes (spawn to exit) on a small mailbox.
- at scale: a mailbox seeded with --messages messages among --agents identities
  (bench/seed.py: direct SQL into the tables both implementations share), then
  `status`, `read AGENT --no-mark-read` and `watch AGENT --once` for one agent, as
  whole processes. The agent read is the one with the most unread mail.
- growth: the mailbox file's bytes per message at that size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, implementations, report, summary  # noqa: E402
from seed import seed  # noqa: E402


def _time(argv: list[str], db: str, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        done = subprocess.run(argv, env=cli_env(db), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0:
            raise RuntimeError(f"{argv} failed: {done.stderr.decode()}")
    return samples


def _row(label: str, ours: float, ref: float, unit: str = "ms") -> tuple:
    return (f"{label}, {unit}", f"{ours:.1f}", f"{ref:.1f}", f"{ours / ref:.3f}" if ref else "n/a")


def cold_start_rows(clis: dict[str, str], rounds: int) -> list[tuple]:
    """Whole-process `read` and `send`, the implementations interleaved run by run, so that a
    machine slowing down or speeding up part-way through affects both alike."""
    commands = {"read": ["read", "b:y"], "send": ["send", "--from", "a:x", "--to", "b:y", "--subject", "s",
                                                  "--body", "b"]}
    samples: dict[str, dict[str, list[float]]] = {name: {cmd: [] for cmd in commands} for name in clis}
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {name: os.path.join(tmp, name, "mail.db") for name in clis}
        for name, cli in clis.items():
            subprocess.run([cli, "send", "--from", "a:x", "--to", "b:y", "--subject", "warm"], env=cli_env(dbs[name]),
                           check=True, stdout=subprocess.DEVNULL)
        for _ in range(rounds * 2):
            for name, cli in clis.items():
                for cmd, argv in commands.items():
                    samples[name][cmd] += _time([cli, *argv], dbs[name], 1)
    medians = {name: {cmd: summary(v)[0] for cmd, v in per.items()} for name, per in samples.items()}
    return [_row(f"cold start: {cmd} (whole process, median)", medians["agent-mail"][cmd], medians["reference"][cmd])
            for cmd in commands]


def _busiest_agent(cli: str, db: str) -> str:
    out = subprocess.run([cli, "status"], env=cli_env(db), check=True, capture_output=True).stdout
    rows = json.loads(out)
    rows = rows["agents"] if isinstance(rows, dict) else rows
    return max(rows, key=lambda r: r["unread"])["agent"]


def scale_rows(clis: dict[str, str], rounds: int, messages: int, agents: int) -> list[tuple]:
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in clis.items():
            db = os.path.join(tmp, name, "mail.db")
            subprocess.run([cli, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
            seed(db, messages, agents)
            subprocess.run([cli, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)  # settle
            agent = _busiest_agent(cli, db)
            status_rounds = rounds if name == "agent-mail" else max(3, rounds // 5)
            results[name] = {
                "status": summary(_time([cli, "status"], db, status_rounds))[0],
                "read": summary(_time([cli, "read", agent, "--no-mark-read"], db, rounds))[0],
                "watch": summary(_time([cli, "watch", agent, "--once"], db, rounds))[0],
                "bytes": os.path.getsize(db) / messages,
                "agent": agent,
            }
    ours, ref = results["agent-mail"], results["reference"]
    size = f"{messages:,} messages, {agents} agents"
    return [
        _row(f"status over {size} (median)", ours["status"], ref["status"]),
        _row(f"read AGENT --no-mark-read at that size (median; {ours['agent']})", ours["read"], ref["read"]),
        _row("watch AGENT --once at that size (median)", ours["watch"], ref["watch"]),
        _row(f"mailbox growth at {messages:,} messages", ours["bytes"], ref["bytes"], "bytes per message"),
    ]


def rows(clis: dict[str, str], rounds: int = 15, messages: int = 200_000, agents: int = 200) -> list[tuple]:
    return cold_start_rows(clis, rounds) + scale_rows(clis, rounds, messages, agents)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--cold-start-only", action="store_true", help="only the cold-start rows (a minute or two)")
    args = parser.parse_args()
    if args.cold_start_only:
        result = cold_start_rows(implementations(), args.rounds)
    else:
        result = rows(implementations(), args.rounds, args.messages, args.agents)
    report(f"CLI benchmark ({args.rounds} rounds)", result)


if __name__ == "__main__":
    main()
