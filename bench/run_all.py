"""Every benchmark, this project beside the reference CLI (agent-mail-cli 0.5.1), in one run.

    python bench/run_all.py [--quick]

Builds (or reuses) the two throwaway virtual environments under bench/.cache, then runs
bench_cli (cold start), bench_scale (per-agent commands, status, cleanup and growth at
200,000 messages spread or with a broadcast backlog, and at 1,000,000), bench_concurrency,
bench_fanout, bench_watch and bench_herd (100 blocked watches beside the reference, then 1,000 of ours), and prints one
table of both figures and their ratio; then bench_hooks (the harness hooks' cost beside our
own `read`, and idle-wake latency, through the real Claude Code when it is installed), bench_floor (read, send and
the after-tool hook as multiples of `python -I -S -c pass`, in the same rounds),
bench_postgres (the team mailbox on PostgreSQL beside SQLite: per-agent commands and status at
200,000 messages, wake across two hosts, 16 senders x 8 readers over two hosts, idle watches),
bench_dashboard (the dashboard's idle cost and update latency beside 100 watches and a send every
100 ms, on both backends, and the fleet's figures without it), and bench_server (commands through
`agent-mail serve` on loopback beside SQLite, PostgreSQL direct and the reference; the client path's
imports; wake through two replicas; 16 senders x 8 readers through two replicas beside PostgreSQL direct),
bench_server_waits (1,000 waits on one server process over PostgreSQL: its connections, idle CPU, one
broadcast's wake) and bench_server_hooks (the hooks through a server beside the same hooks on the mailbox); then,
each as its own command, bench_console, bench_webhooks and the idle-wake benches of OpenCode, Pi and Mistral Vibe.
--quick uses fewer rounds, no million-message mailbox and a herd of 20, for a smoke run;
the recorded numbers in docs/benchmarks.md come from the full run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cli  # noqa: E402
import bench_concurrency  # noqa: E402
import bench_dashboard  # noqa: E402
import bench_fanout  # noqa: E402
import bench_floor  # noqa: E402
import bench_herd  # noqa: E402
import bench_harness_hooks  # noqa: E402
import bench_hooks  # noqa: E402
import bench_postgres  # noqa: E402
import bench_scale  # noqa: E402
import bench_server  # noqa: E402
import bench_server_hooks  # noqa: E402
import bench_server_waits  # noqa: E402
import bench_watch  # noqa: E402
from common import implementations, report, table  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller mailbox")
    args = parser.parse_args()
    clis = implementations()
    started = time.time()
    rounds = 5 if args.quick else 15
    rows = []
    rows += bench_cli.cold_start_rows(clis, rounds)
    rows += bench_scale.rows(clis, rounds=3 if args.quick else 7, million=not args.quick)
    rows += bench_concurrency.rows(clis, senders=8, readers=4, sends=5 if args.quick else 25)
    rows += bench_fanout.rows(clis, rounds=rounds, recipients=50)
    rows += bench_watch.rows(clis, rounds=5 if args.quick else 30, idle_seconds=5 if args.quick else 30)
    rows += bench_herd.rows(clis, watches=20 if args.quick else 100, idle_seconds=5 if args.quick else 30,
                            also=0 if args.quick else 1000)
    report(f"agent-mail benchmarks, {time.time() - started:.0f} s", rows)
    # The harness hooks have no peer to run beside: their table compares with our own CLI.
    print("\n# harness hooks (bench_hooks: beside our own read, same run)\n")
    print(table(bench_hooks.rows(clis, rounds=11 if args.quick else 31, wakes=3 if args.quick else 10),
                bench_hooks.HEADERS))
    print("\n# read, send and the after-tool hook beside the interpreter's floor (bench_floor: same run)\n")
    print(table(bench_floor.rows({"agent-mail": clis["agent-mail"]}, rounds=21 if args.quick else 101),
                bench_floor.HEADERS))
    print("\n# every harness's hooks, as each harness runs them (bench_harness_hooks: beside our own read)\n")
    print(table(bench_harness_hooks.rows(clis["agent-mail"], rounds=7 if args.quick else 21,
                                         harnesses=list(bench_harness_hooks.FILES)), bench_harness_hooks.HEADERS))
    # The team mailbox: PostgreSQL beside SQLite (and the reference where it can run), same run.
    print("\n# team mailbox on PostgreSQL (bench_postgres)\n")
    print(table(bench_postgres.rows(clis, quick=args.quick), bench_postgres.HEADERS))
    # The supervisor's dashboard: no peer has a live view to run beside; the fleet without it is the baseline.
    print("\n# the supervisor's dashboard beside a busy fleet (bench_dashboard)\n")
    print(table(bench_dashboard.rows(clis, watches=20 if args.quick else 100, idle_seconds=5 if args.quick else 30,
                                     busy_seconds=5 if args.quick else 20), bench_dashboard.HEADERS))
    # The mailbox as a service: through `agent-mail serve` beside SQLite, PostgreSQL direct and the reference.
    print("\n# the mailbox through agent-mail serve (bench_server)\n")
    print(table(bench_server.rows(clis, quick=args.quick), bench_server.HEADERS))
    print("\n# 1,000 waits on one server process over PostgreSQL (bench_server_waits)\n")
    print(table(bench_server_waits.rows(clis, waits=100 if args.quick else 1000, watches=10 if args.quick else 100,
                                        idle_seconds=5 if args.quick else 30), bench_server_waits.HEADERS))
    print("\n# the hooks through agent-mail serve (bench_server_hooks)\n")
    print(table(bench_server_hooks.run(rounds=5 if args.quick else 31, wakes=3 if args.quick else 10, db=None),
                bench_server_hooks.HEADERS))
    # The benches that print their own figures, each run as its own command (as docs/benchmarks.md gives it).
    here = os.path.dirname(os.path.abspath(__file__))
    for title, script, words in (
            ("the web console: 100 idle consoles, send to update (bench_console)", "bench_console.py",
             ["--idle-seconds", "5" if args.quick else "20"]),
            ("the web console on PostgreSQL (bench_console --postgres)", "bench_console.py",
             ["--postgres", "--idle-seconds", "5" if args.quick else "20"]),
            ("webhooks: send to POST (bench_webhooks)", "bench_webhooks.py", ["--sends", "10" if args.quick else "50"]),
            ("waking an idle OpenCode session (bench_wake_opencode)", "bench_wake_opencode.py",
             ["--wakes", "3" if args.quick else "12"]),
            ("waking an idle Pi session (bench_wake_pi)", "bench_wake_pi.py", ["--wakes", "3" if args.quick else "12"]),
            ("waking Mistral Vibe under run (bench_wake_vibe)", "bench_wake_vibe.py",
             ["--wakes", "3" if args.quick else "12"])):
        print(f"\n# {title}\n", flush=True)
        done = subprocess.run([sys.executable, os.path.join(here, script), *words])
        if done.returncode:
            print(f"({script} exited {done.returncode}: a harness or server it needs may be missing)")


if __name__ == "__main__":
    main()
