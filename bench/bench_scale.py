"""Per-agent work at team scale, this project beside the reference CLI, in one run.

    python bench/bench_scale.py [--rounds 7] [--skip-million]

Three mailboxes per implementation, each created by the implementation itself and then seeded
with direct SQL into the tables both share (bench/seed.py; the indexes are the
implementation's own, so they are filled as the rows go in; no statistics are gathered, as in a
mailbox that grew in use):
- "spread": 200,000 messages, 200 identities, 1 % broadcasts each read by 90 % of them;
- "backlog": 200,000 messages, 200 identities, 2 % broadcasts nobody has read (about 4,100
  unread per identity);
- "million": 1,000,000 messages, 1,000 identities, the backlog shape (about 20,000 unread each).
For one identity (proj5:agent25) each command runs as a whole process, spawn to exit, and the
median is kept: `read AGENT --no-mark-read` (the default page of the whole backlog, marking nothing),
`read AGENT` (the default page, marking it read), `read AGENT --all --limit
50`, `watch AGENT --once`, `status --agent AGENT`, `ack AGENT --all`; then `status`, and on the
million `cleanup --older-than 30 --dry-run` (the seed is older: it would delete every message),
and the mailbox's bytes per message.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, implementations, report, summary  # noqa: E402
from seed import seed  # noqa: E402

AGENT = "proj5:agent25"
SEEDS = {
    "spread": {"messages": 200_000, "agents": 200, "broadcasts": 0.01, "broadcast_readers": 0.9},
    "backlog": {"messages": 200_000, "agents": 200, "broadcasts": 0.02, "broadcast_readers": 0.0},
    "million": {"messages": 1_000_000, "agents": 1000, "broadcasts": 0.02, "broadcast_readers": 0.0},
}
PER_AGENT = (
    ("read AGENT --no-mark-read", ["read", AGENT, "--no-mark-read"]),
    ("read AGENT", ["read", AGENT]),
    ("read AGENT --all --limit 50", ["read", AGENT, "--all", "--limit", "50"]),
    ("watch AGENT --once", ["watch", AGENT, "--once"]),
    ("status --agent AGENT", ["status", "--agent", AGENT]),
    ("ack AGENT --all", ["ack", AGENT, "--all"]),
)


def median_ms(cli: str, argv: list[str], db: str, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        done = subprocess.run([cli, *argv], env=cli_env(db), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples.append((time.perf_counter() - started) * 1000)
        if done.returncode != 0:
            raise RuntimeError(f"{argv} failed: {done.stderr.decode()}")
    return summary(samples)[0]


def measure(cli: str, db: str, shape: dict, rounds: int, slow_rounds: int, cleanup: bool) -> dict:
    subprocess.run([cli, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
    seed(db, shape["messages"], shape["agents"], broadcasts=shape["broadcasts"],
         broadcast_readers=shape["broadcast_readers"])
    subprocess.run([cli, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)  # settle
    result = {label: median_ms(cli, argv, db, rounds) for label, argv in PER_AGENT}
    result["status"] = median_ms(cli, ["status"], db, slow_rounds)
    if cleanup:
        result["cleanup"] = median_ms(cli, ["cleanup", "--older-than", "30", "--dry-run"], db, slow_rounds)
    result["bytes"] = os.path.getsize(db) / shape["messages"]
    return result


def rows(clis: dict[str, str], rounds: int = 7, million: bool = True) -> list[tuple]:
    table = []
    for name, shape in SEEDS.items():
        if name == "million" and not million:
            continue
        results = {}
        with tempfile.TemporaryDirectory() as tmp:
            for implementation, cli in clis.items():
                db = os.path.join(tmp, implementation, "mail.db")
                fast = implementation == "agent-mail"
                # The reference's status takes seconds at this size: fewer rounds of it.
                results[implementation] = measure(cli, db, shape, rounds if fast or name != "million" else 3,
                                                  rounds if fast else (1 if name == "million" else 3),
                                                  cleanup=name == "million")
        ours, ref = results["agent-mail"], results["reference"]
        size = f"{shape['messages'] // 1000}k/{shape['agents']} {name}"
        keys = [label for label, _ in PER_AGENT] + ["status"] + (["cleanup"] if name == "million" else [])
        for key in keys:
            label = "cleanup --older-than 30 --dry-run" if key == "cleanup" else key
            table.append((f"{size}: {label}, ms", f"{ours[key]:.1f}", f"{ref[key]:.1f}", f"{ours[key] / ref[key]:.3f}"))
        table.append((f"{size}: bytes per message", f"{ours['bytes']:.0f}", f"{ref['bytes']:.0f}",
                       f"{ours['bytes'] / ref['bytes']:.3f}"))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--skip-million", action="store_true")
    args = parser.parse_args()
    report(f"scale benchmark ({args.rounds} rounds)", rows(implementations(), args.rounds, not args.skip_million))


if __name__ == "__main__":
    main()
