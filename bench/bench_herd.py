"""A whole team on one mailbox: N blocked watches, this project beside the reference CLI, in one run.

    python bench/bench_herd.py [--watches 100] [--idle-seconds 10] [--also 300]

For each implementation, with its own mailbox, N `watch` processes block on N identities
(herd:w000, ...). Readiness: each has an armed session row. Then:
- idle CPU: on-CPU time of all N from /proc/PID/schedstat (nanoseconds) over --idle-seconds, in
  total and per watch;
- direct message: one message to herd:w000; how many of the other N-1 watches woke for it
  (their voluntary context switches moved), beside how many moved in an idle window of the
  same length (timers), so what the message itself woke is the difference;
- wake-all: one broadcast; time from its commit until each watch has printed its result and
  exited; the last and the median.
--also runs this project alone with a bigger herd (1,000 by default; the reference beside it would take
a fifth of a core and gigabytes on a shared machine, so its figures are the N-watch row's): idle over
--idle-seconds once settled, then over a whole cycle of a watch's periodic refresh (HELD_REFRESH_SECONDS
and 10 s more), so each watch's one idle wake-up in it is counted.
The commit is timed where it happens: the reference's send is a plain INSERT, so the
benchmark commits that INSERT itself; this project's send also wakes the recipients' watches
after committing, so a helper process sends through this project's own code and reports the
moment send returned (CLOCK_MONOTONIC, comparable across processes), while the benchmark
is already watching for the results.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import selectors
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, implementations, report  # noqa: E402

SENDER = "herd:boss"
HELD_REFRESH_SECONDS = 300.0  # agent_mail.model's: how often a watch that holds its presence wakes while idle
OURS_SEND = r"""
import sys, time
from agent_mail.operations.mail import open_mailbox
with open_mailbox() as mailbox:
    mailbox.send(from_=sys.argv[1], to=[sys.argv[2]], subject="wake")
print(time.perf_counter())
"""


def agents(n: int) -> list[str]:
    return [f"herd:w{i:03d}" for i in range(n)]


def process_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds, voluntary context switches) of a process. CPU time from schedstat (nanoseconds):
    the tick counts in /proc/PID/stat (10 ms each) are far too coarse for processes that sleep."""
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            cpu = int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    switches = 0
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("voluntary_ctxt_switches"):
                switches = int(line.split()[1])
    return cpu, switches


def _armed(db: str) -> set[str]:
    try:
        con = sqlite3.connect(db, timeout=10)
        try:
            return {r[0] for r in con.execute("SELECT agent FROM watch_sessions WHERE state = 'armed'")}
        finally:
            con.close()
    except sqlite3.OperationalError:
        return set()


class Herd:
    """N watch processes of one implementation on one mailbox."""

    def __init__(self, cli: str, db: str, n: int):
        self.cli, self.db, self.names = cli, db, agents(n)
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for name in self.names:
            self.procs[name] = subprocess.Popen([self.cli, "watch", name, "--timeout-minutes", "60"],
                                                env=cli_env(self.db), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60 + len(self.names) * 0.5
        while time.monotonic() < deadline:
            exited = [n for n, p in self.procs.items() if p.poll() is not None]
            if exited:
                raise RuntimeError(f"watch exited early: {self.procs[exited[0]].communicate()}")
            if set(self.names) <= _armed(self.db):
                time.sleep(1.0)  # from writing the session row to actually blocking
                return
            time.sleep(0.2)
        raise RuntimeError("the herd never armed")

    def stats(self) -> dict[str, tuple[float, int]]:
        return {name: process_stat(proc.pid) for name, proc in self.procs.items() if proc.returncode is None}

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.communicate()


def start_commit(implementation: str, cli: str, db: str, recipient: str):
    """Commit a message to `recipient` as the implementation's send does, without waiting on anything but
    the commit itself; returns a function that gives the moment it committed (call it after observing)."""
    if implementation == "agent-mail":
        python = os.path.join(os.path.dirname(cli), "python")
        helper = subprocess.Popen([python, "-c", OURS_SEND, SENDER, recipient], env=cli_env(db),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        def committed() -> float:
            out, err = helper.communicate(timeout=60)
            if helper.returncode:
                raise RuntimeError(f"send failed: {err}")
            return float(out.strip().splitlines()[-1])
        return committed
    con = sqlite3.connect(db, timeout=10, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO messages (id, sender, recipient, subject, body, type, created) "
                    "VALUES (?, ?, ?, 'wake', '', ?, ?)",
                    (str(uuid.uuid4()), SENDER, recipient, "broadcast" if recipient == "*" else "direct",
                     dt.datetime.now(dt.timezone.utc).isoformat()))
        con.execute("COMMIT")
        moment = time.perf_counter()
    finally:
        con.close()
    return lambda: moment


def idle_cpu(herd: Herd, seconds: float) -> tuple[float, float]:
    """(% of one core for all watches together, % per watch) while nothing happens."""
    before = herd.stats()
    started = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - started
    after = herd.stats()
    total = sum(after[n][0] - before[n][0] for n in herd.names) / elapsed * 100
    return total, total / len(herd.names)


def woken_by_direct(implementation: str, herd: Herd) -> tuple[int, int]:
    """(other watches woken while one direct message was delivered, other watches woken in an idle window
    of the same length)."""
    target, others = herd.names[0], herd.names[1:]
    before = herd.stats()
    started = time.monotonic()
    committed = start_commit(implementation, herd.cli, herd.db, target)
    herd.procs[target].communicate(timeout=60)
    committed()
    time.sleep(0.1)
    window = time.monotonic() - started
    after = herd.stats()
    woken = sum(after[n][1] != before[n][1] for n in others if n in after)
    before = herd.stats()
    time.sleep(window)
    after = herd.stats()
    idle = sum(after[n][1] != before[n][1] for n in others if n in after)
    return woken, idle


def wake_all(implementation: str, herd: Herd) -> tuple[float, float]:
    """(ms from a broadcast's commit until the last watch printed and exited, the median)."""
    selector = selectors.DefaultSelector()
    waiting = {name: proc for name, proc in herd.procs.items() if proc.poll() is None}
    for name, proc in waiting.items():
        os.set_blocking(proc.stdout.fileno(), False)
        selector.register(proc.stdout, selectors.EVENT_READ, name)
    committed_at = start_commit(implementation, herd.cli, herd.db, "*")
    finished: dict[str, float] = {}
    deadline = time.monotonic() + 60
    while len(finished) < len(waiting) and time.monotonic() < deadline:
        for key, _ in selector.select(timeout=1.0):
            if not key.fileobj.read():  # EOF: the watch printed its result and exited
                finished[key.data] = time.perf_counter()
                selector.unregister(key.fileobj)
    selector.close()
    if len(finished) < len(waiting):
        raise RuntimeError(f"{len(waiting) - len(finished)} watches never woke for the broadcast")
    committed = committed_at()
    latencies = sorted((t - committed) * 1000 for t in finished.values())
    return latencies[-1], latencies[len(latencies) // 2]


def run_one(implementation: str, cli: str, tmp: str, n: int, idle_seconds: float, wake: bool = True,
            cycle: float = 0.0) -> dict:
    """The herd's idle share over `idle_seconds` once settled, and, with `cycle`, over a following window of
    that many seconds (a whole cycle of the watches' periodic refresh: each one's wake-up counted once)."""
    db = os.path.join(tmp, f"{implementation}-{n}", "mail.db")
    subprocess.run([cli, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
    herd = Herd(cli, db, n)
    try:
        herd.start()
        total, per_watch = idle_cpu(herd, idle_seconds)
        result = {"total": total, "per_watch": per_watch, "load": os.getloadavg()[0]}
        if cycle:
            result["cycle_total"], _ = idle_cpu(herd, cycle)
        if wake:
            result["woken"], result["idle_woken"] = woken_by_direct(implementation, herd)
            result["last"], result["median"] = wake_all(implementation, herd)
        return result
    finally:
        herd.stop()


def rows(clis: dict[str, str], watches: int = 100, idle_seconds: float = 10.0, also: int = 300) -> list[tuple]:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in clis.items():
            results[name] = run_one(name, cli, tmp, watches, idle_seconds)
        # A whole cycle of the periodic refresh of a watch that holds its presence, and some: every watch's one
        # wake-up in it counted once (the 30-s window after settling may hold none of them).
        big = run_one("agent-mail", clis["agent-mail"], tmp, also, idle_seconds, wake=False,
                      cycle=HELD_REFRESH_SECONDS + 10) if also else None
    ours, ref = results["agent-mail"], results["reference"]

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}" if b else "n/a"

    table = [
        (f"{watches} blocked watches, idle CPU in total, % of one core", f"{ours['total']:.2f}", f"{ref['total']:.2f}",
         ratio(ours["total"], ref["total"])),
        (f"{watches} blocked watches, idle CPU per watch, % of one core", f"{ours['per_watch']:.3f}",
         f"{ref['per_watch']:.3f}", ratio(ours["per_watch"], ref["per_watch"])),
        (f"one direct message: other watches woken (of {watches - 1})", str(ours["woken"]), str(ref["woken"]), ""),
        ("  the same, idle window of that length (timers)", str(ours["idle_woken"]), str(ref["idle_woken"]), ""),
        (f"one broadcast wakes all {watches - 1}: last returned, ms after commit", f"{ours['last']:.0f}",
         f"{ref['last']:.0f}", ratio(ours["last"], ref["last"])),
        (f"one broadcast wakes all {watches - 1}: median returned, ms after commit", f"{ours['median']:.0f}",
         f"{ref['median']:.0f}", ratio(ours["median"], ref["median"])),
    ]
    if big:
        table += [
            (f"{also} blocked watches, idle CPU in total over {idle_seconds:.0f} s once settled, % of one core",
             f"{big['total']:.3f}", "", ""),
            (f"{also} blocked watches, idle CPU per watch, % of one core", f"{big['per_watch']:.4f}", "", ""),
            (f"{also} blocked watches, idle CPU in total over the next {HELD_REFRESH_SECONDS + 10:.0f} s (every "
             "watch's periodic wake-up once), % of one core", f"{big['cycle_total']:.3f}", "", ""),
            (f"  load average (1 min) while the {also} settled", f"{big['load']:.2f}", "", ""),
        ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watches", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--also", type=int, default=1000, help="this project alone with this many watches (0: skip)")
    args = parser.parse_args()
    report(f"herd benchmark ({args.watches} watches)", rows(implementations(), args.watches, args.idle_seconds,
                                                           args.also))


if __name__ == "__main__":
    main()
