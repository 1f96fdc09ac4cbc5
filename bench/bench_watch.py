"""Wake latency and idle cost of `watch`, this project beside the reference CLI, in one run.

    python bench/bench_watch.py [--rounds 30] [--idle-seconds 30]

For each implementation, with its own mailbox:
- wake latency: a watch is armed (readiness = its own armed session row); after a random
  pause of 0 to 1 s (so polling is caught at a random phase) a message is committed the
  way each implementation's send commits it (bench_herd.start_commit: the reference's
  INSERT done here, this project's send run by a helper that reports when it returned),
  and the time runs from that commit until the watch process has printed its result and
  exited.
- end to end: the same, but the message is sent by spawning the implementation's own
  `agent-mail send`, timed from the spawn.
- idle CPU: a watch blocked for --idle-seconds, its on-CPU time from /proc/PID/schedstat.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_herd import process_stat, start_commit  # noqa: E402
from common import cli_env, implementations, report, summary  # noqa: E402

AGENT = "bench:watcher"


def _start_watch(cli: str, db: str) -> subprocess.Popen:
    return subprocess.Popen([cli, "watch", AGENT, "--timeout-minutes", "5"], env=cli_env(db),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_armed(db: str, proc: subprocess.Popen, sessions_before: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"watch exited early: {proc.communicate()}")
        try:
            con = sqlite3.connect(db, timeout=5)
            try:
                n = con.execute("SELECT COUNT(*) FROM watch_sessions WHERE agent = ?", (AGENT,)).fetchone()[0]
            finally:
                con.close()
            if n > sessions_before:
                time.sleep(0.05)  # let it get from writing its row to actually blocking
                return
        except sqlite3.OperationalError:
            pass
        time.sleep(0.005)
    raise RuntimeError("watch never armed")


def _sessions(db: str) -> int:
    try:
        con = sqlite3.connect(db, timeout=5)
        try:
            return con.execute("SELECT COUNT(*) FROM watch_sessions WHERE agent = ?", (AGENT,)).fetchone()[0]
        finally:
            con.close()
    except sqlite3.OperationalError:
        return 0


def _mark_all_read(db: str) -> None:
    con = sqlite3.connect(db, timeout=10)
    con.execute("UPDATE messages SET read_at = ? WHERE read_at IS NULL", (dt.datetime.now().isoformat(),))
    con.commit()
    con.close()


def measure_wake(implementation: str, cli: str, db: str, rounds: int, via_cli: bool) -> list[float]:
    latencies = []
    for _ in range(rounds):
        before = _sessions(db)
        proc = _start_watch(cli, db)
        try:
            _wait_armed(db, proc, before)
            # A random moment, so an implementation that polls is caught at a random point of its cycle.
            time.sleep(random.random())
            if via_cli:
                started = time.perf_counter()
                subprocess.run([cli, "send", "--from", "bench:sender", "--to", AGENT, "--subject", "wake"],
                               env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
                proc.stdout.read()  # EOF: the watch printed its result and exited
                returned = time.perf_counter()
            else:
                committed = start_commit(implementation, cli, db, AGENT)
                proc.stdout.read()
                returned = time.perf_counter()
                started = committed()
            proc.wait(timeout=60)
            latencies.append((returned - started) * 1000)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        _mark_all_read(db)
    return latencies


def _cpu_seconds(pid: int) -> float:
    return process_stat(pid)[0]  # schedstat nanoseconds: ticks are too coarse for a sleeping process


def measure_idle(clis: dict[str, str], dbs: dict[str, str], seconds: float) -> dict[str, float]:
    """CPU of each implementation's watch blocked for `seconds`, all running side by side."""
    procs = {}
    try:
        for name, cli in clis.items():
            before = _sessions(dbs[name])
            procs[name] = _start_watch(cli, dbs[name])
            _wait_armed(dbs[name], procs[name], before)
        start = {name: _cpu_seconds(p.pid) for name, p in procs.items()}
        time.sleep(seconds)
        return {name: (_cpu_seconds(p.pid) - start[name]) / seconds * 100 for name, p in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.communicate()


def rows(clis: dict[str, str], rounds: int = 30, idle_seconds: float = 30.0) -> list[tuple]:
    """Measure; return table rows (measure, agent-mail, reference, ratio)."""
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {}
        for name, cli in clis.items():
            dbs[name] = os.path.join(tmp, name, "mail.db")
            subprocess.run([cli, "status"], env=cli_env(dbs[name]), check=True, stdout=subprocess.DEVNULL)
        results = {}
        for name, cli in clis.items():
            wake = measure_wake(name, cli, dbs[name], rounds, via_cli=False)
            e2e = measure_wake(name, cli, dbs[name], rounds, via_cli=True)
            results[name] = (summary(wake), summary(e2e))
        idle = measure_idle(clis, dbs, idle_seconds)
    table_rows = []
    labels = (("watch wake: commit -> returned, median ms", 0, 0), ("watch wake: commit -> returned, p90 ms", 0, 1),
              ("watch end to end: send spawned -> returned, median ms", 1, 0),
              ("watch end to end: send spawned -> returned, p90 ms", 1, 1))
    for label, which, stat in labels:
        ours, ref = results["agent-mail"][which][stat], results["reference"][which][stat]
        table_rows.append((label, f"{ours:.1f}", f"{ref:.1f}", f"{ours / ref:.3f}"))
    table_rows.append((f"idle watch CPU over {idle_seconds:.0f} s, % of one core", f"{idle['agent-mail']:.2f}",
                       f"{idle['reference']:.2f}",
                       f"{idle['agent-mail'] / idle['reference']:.3f}" if idle["reference"] else "n/a"))
    return table_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    result = rows(implementations(), args.rounds, args.idle_seconds)
    report(f"watch benchmark ({args.rounds} rounds)", result)


if __name__ == "__main__":
    main()
