"""The supervisor's dashboard beside a busy fleet: what it costs idle, how soon a send appears on its
screen, and whether the fleet's watches notice it. SQLite and PostgreSQL, in one run.

    python bench/bench_dashboard.py [--watches 100] [--idle-seconds 30] [--busy-seconds 20] [--no-postgres]

For each backend, with a mailbox of its own: N `watch` processes block on N identities (herd:w000...),
and a real `agent-mail dashboard` runs in a real terminal (a tmux pane, 140x40) on the Traffic tab.
- idle: the dashboard's on-CPU time (every thread, /proc/PID/task/*/schedstat; on PostgreSQL also its
  server backends) over --idle-seconds, as a share of one core; the herd's beside it, with and without
  the dashboard;
- busy: a sender process sends one message every 100 ms between identities nobody watches, each with
  its own subject, and reports the moment each send returned (CLOCK_MONOTONIC, one clock for every
  process); the same traffic runs once before the dashboard opens, for the fleet's figures without it.
  With the dashboard, the benchmark reads the pane (`tmux capture-pane`, every ~10 ms) and notes when each subject
  first shows. Latency is the difference (the pane read adds up to ~10 ms); p50, p90, worst, and any
  never seen. The dashboard's CPU over the same window;
- the fleet: the watches' wake-ups per second (their voluntary context switches), idle and through the
  traffic, without and with the dashboard (their own timers: a watch on SQLite refreshes its session
  every 5 s); and, during the traffic, the wake latency of a direct message to a blocked watch (commit
  to the watch's exit), without and with the dashboard, p50 of 10 each.
The reference CLI has no live view (a supervisor re-runs `status`), so there is no reference column:
each figure stands beside the same fleet without the dashboard, and the issue's targets (< 1 % of a
core idle, a send on screen within a second). PostgreSQL's server allows 100 connections here; each
blocked watch holds one, so its herd is smaller (the row says how many). On PostgreSQL every window
is at least 60 s: a watch there refreshes its row every 30 s, a herd armed together does so together,
and a shorter window would count either none of those wake-ups or all of them.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_herd import process_stat  # noqa: E402
from common import cli_env, implementations, machine, percentile, table  # noqa: E402

PG_URL = os.environ.get("AGENT_MAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
HEADERS = ("measure", "SQLite", "PostgreSQL", "target")
APP_NAME = "agent-mail-bench-dashboard"
SENDER = r"""
import sys, time
from agent_mail.operations.mail import open_mailbox
count, every, tag = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
with open_mailbox() as mailbox:
    start = time.monotonic()
    for n in range(count):
        time.sleep(max(0.0, start + n * every - time.monotonic()))
        mailbox.send(from_=f"busy:s{n % 7}", to=[f"busy:r{n % 11}"], subject=f"{tag}{n:04d}x")
        print(f"{tag}{n:04d}x {time.monotonic()}", flush=True)
"""
DIRECT = r"""
import sys, time
from agent_mail.operations.mail import open_mailbox
with open_mailbox() as mailbox:
    mailbox.send(from_="busy:boss", to=[sys.argv[1]], subject="wake")
    print(time.monotonic(), flush=True)
"""


def _with_extras(cli: str) -> str:
    """The benchmark venv's python, with the dashboard's and PostgreSQL's libraries beside our package."""
    python = os.path.join(os.path.dirname(cli), "python")
    if subprocess.run([python, "-c", "import textual, textual_plotext, psycopg"], capture_output=True).returncode:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "textual>=8,<9", "textual-plotext>=1,<2", "psycopg[binary]>=3.3,<4"], check=True,
                       env=cli_env(None))
    return python


def _cpu(pid: int) -> float:
    """On-CPU seconds of every thread of a process."""
    total = 0.0
    for path in glob.glob(f"/proc/{pid}/task/*/schedstat"):
        try:
            with open(path) as handle:
                total += int(handle.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    return total


def _status(cli: str, location: str) -> dict:
    done = subprocess.run([cli, "status"], env=cli_env(location), capture_output=True, text=True, check=True)
    return {a["agent"]: a for a in json.loads(done.stdout)["agents"]}


class Fleet:
    """N blocked watches and, when asked, a dashboard in a tmux pane, on one mailbox."""

    def __init__(self, cli: str, python: str, location: str, watches: int, tmp: str):
        self.cli, self.python, self.location, self.tmp = cli, python, location, tmp
        self.names = [f"herd:w{i:03d}" for i in range(watches)]
        self.procs: dict[str, subprocess.Popen] = {}
        self.tmux = ["tmux", "-S", os.path.join(tmp, f"tmux-{os.getpid()}.sock")]
        self.dashboard_pid: int | None = None

    # -- the herd
    def start_watch(self, name: str) -> None:
        self.procs[name] = subprocess.Popen([self.cli, "watch", name, "--timeout-minutes", "60"],
                                            env=cli_env(self.location), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE)

    def arm(self, names: list[str]) -> None:
        for name in names:
            self.start_watch(name)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            exited = [n for n in names if self.procs[n].poll() is not None]
            if exited:
                raise RuntimeError(f"watch exited early: {self.procs[exited[0]].communicate()}")
            agents = _status(self.cli, self.location)
            if all(agents.get(n, {}).get("watch_state") == "armed" for n in names):
                time.sleep(1.0)  # from writing the session row to blocking
                return
            time.sleep(0.5)
        raise RuntimeError("the herd never armed")

    def switches(self) -> dict[str, int]:
        return {n: process_stat(p.pid)[1] for n, p in self.procs.items() if p.poll() is None}

    def herd_cpu(self) -> float:
        return sum(process_stat(p.pid)[0] for p in self.procs.values() if p.poll() is None)

    def wake_one(self, name: str) -> float:
        """ms from a direct message's commit until the blocked watch on `name` printed it and exited."""
        helper = subprocess.Popen([self.python, "-c", DIRECT, name], env=cli_env(self.location),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs[name].communicate(timeout=60)
        returned = time.monotonic()
        out, err = helper.communicate(timeout=60)
        if helper.returncode:
            raise RuntimeError(f"send failed: {err}")
        # take delivery, so the identity's next watch blocks again
        subprocess.run([self.cli, "read", name], env=cli_env(self.location), check=True, stdout=subprocess.DEVNULL)
        return (returned - float(out.split()[-1])) * 1000

    # -- the dashboard
    def open_dashboard(self) -> None:
        env = cli_env(self.location)
        env.update(TERM="xterm-256color", PGAPPNAME=APP_NAME)
        command = ["env"] + [f"{k}={v}" for k, v in env.items() if k in (
            "AGENT_MAIL_DB", "PGAPPNAME", "PATH", "HOME", "TERM")] + [self.python, "-m", "agent_mail", "dashboard"]
        subprocess.run([*self.tmux, "new-session", "-d", "-s", "bench", "-x", "140", "-y", "40",
                        "exec " + shlex.join(command)], check=True, env=env)
        self.dashboard_pid = int(subprocess.run([*self.tmux, "display", "-p", "-t", "bench", "#{pane_pid}"],
                                                capture_output=True, text=True, check=True).stdout)
        self._until(lambda screen: "identities" in screen, 60, "the dashboard never drew its fleet")
        subprocess.run([*self.tmux, "send-keys", "-t", "bench", "2"], check=True)
        self._until(lambda screen: re.search(r"age +from +to +subject", screen), 30, "the Traffic tab never showed")
        time.sleep(2.0)  # settled: first paint and first refresh done

    def screen(self) -> str:
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", "bench"], capture_output=True,
                              text=True).stdout

    def _until(self, seen, seconds: float, what: str) -> None:
        deadline = time.monotonic() + seconds
        while not seen(self.screen()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}:\n{self.screen()}")
            time.sleep(0.1)

    def dashboard_cpu(self) -> float:
        """The dashboard's CPU seconds, and on PostgreSQL its server backends'."""
        total = _cpu(self.dashboard_pid)
        if self.location.startswith("postgresql"):
            import psycopg

            with psycopg.connect(PG_URL, autocommit=True) as db:
                pids = [r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                                 (APP_NAME,))]
            total += sum(process_stat(pid)[0] for pid in pids)
        return total

    def stop(self) -> None:
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.communicate()


def _wakes(before: dict[str, int], after: dict[str, int], seconds: float) -> float:
    """The herd's wake-ups per second (voluntary context switches of the watches alive in both counts)."""
    return sum(after[n] - before[n] for n in after if n in before) / seconds


def _share(before: float, after: float, seconds: float) -> float:
    return (after - before) / seconds * 100


def _traffic(fleet: Fleet, busy_seconds: float, wake_names: list[str], screen: bool) -> dict:
    """A send every 100 ms between identities nobody watches, for `busy_seconds`; meanwhile direct messages
    wake the watches of `wake_names` one by one (their latency), and with `screen` the pane is read for each
    send's subject. The other watches' wake-ups per second, and the dashboard's CPU, over the window."""
    count = int(busy_seconds * 10)
    tag = "q" if screen else "p"  # each phase's subjects its own
    sender = subprocess.Popen([fleet.python, "-c", SENDER, str(count), "0.1", tag], env=cli_env(fleet.location),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wakes: list[float] = []

    def wake_some() -> None:
        time.sleep(1.0)
        for name in wake_names:
            wakes.append(fleet.wake_one(name))
            time.sleep(0.3)

    waker = threading.Thread(target=wake_some)
    waker.start()
    others = [n for n in fleet.names if n not in wake_names]
    cpu = fleet.dashboard_cpu() if screen else 0.0
    switches, started = fleet.switches(), time.monotonic()
    seen: dict[str, float] = {}
    while sender.poll() is None:
        if screen:
            text = fleet.screen()
            now = time.monotonic()
            for subject in re.findall(r"q\d{4}x", text):
                seen.setdefault(subject, now)
        time.sleep(0.01)
    if screen:  # the last sends: a moment more to show up
        deadline = time.monotonic() + 3
        while len(seen) < count and time.monotonic() < deadline:
            now = time.monotonic()
            for subject in re.findall(r"q\d{4}x", fleet.screen()):
                seen.setdefault(subject, now)
            time.sleep(0.01)
    elapsed = time.monotonic() - started
    after = fleet.switches()
    result = {"herd_wakes": _wakes({n: switches[n] for n in others if n in switches}, after, elapsed)}
    if screen:
        result["busy"] = _share(cpu, fleet.dashboard_cpu(), elapsed)
    waker.join()
    out, err = sender.communicate(timeout=60)
    if sender.returncode:
        raise RuntimeError(f"the sender failed: {err}")
    result["wake"] = statistics.median(wakes)
    if screen:
        committed = dict((line.split()[0], float(line.split()[1])) for line in out.splitlines())
        latencies = sorted((seen[s] - t) * 1000 for s, t in committed.items() if s in seen)
        result["sends"], result["missed"] = len(committed), len(committed) - len(latencies)
        result["p50"], result["p90"] = statistics.median(latencies), percentile(latencies, 0.9)
        result["worst"] = latencies[-1]
    return result


def run_one(cli: str, python: str, location: str, watches: int, idle_seconds: float, busy_seconds: float,
            tmp: str) -> dict:
    # A little history first, so the fleet and the feed have rows to draw.
    subprocess.run([python, "-c", SENDER, "200", "0", "old"],
                   env=cli_env(location), check=True, stdout=subprocess.DEVNULL)
    fleet = Fleet(cli, python, location, watches, tmp)
    result: dict = {"watches": watches}
    first, second = fleet.names[:10], fleet.names[10:20]
    try:
        fleet.arm(fleet.names)
        # Without the dashboard: the herd idle (its own timers), then through the traffic.
        cpu, switches, started = fleet.herd_cpu(), fleet.switches(), time.monotonic()
        time.sleep(idle_seconds)
        elapsed = time.monotonic() - started
        result["herd_idle"] = _share(cpu, fleet.herd_cpu(), elapsed)
        result["woken_plain"] = _wakes(switches, fleet.switches(), elapsed)
        plain = _traffic(fleet, busy_seconds, first, screen=False)
        result["traffic_plain"], result["wake_plain"] = plain["herd_wakes"], plain["wake"]
        fleet.arm(first)
        # The dashboard open, idle.
        fleet.open_dashboard()
        cpu, herd, switches, started = fleet.dashboard_cpu(), fleet.herd_cpu(), fleet.switches(), time.monotonic()
        time.sleep(idle_seconds)
        elapsed = time.monotonic() - started
        result["idle"] = _share(cpu, fleet.dashboard_cpu(), elapsed)
        result["herd_with"] = _share(herd, fleet.herd_cpu(), elapsed)
        result["woken_idle"] = _wakes(switches, fleet.switches(), elapsed)
        # The dashboard drawing the traffic.
        busy = _traffic(fleet, busy_seconds, second, screen=True)
        result.update({k: busy[k] for k in ("busy", "sends", "missed", "p50", "p90", "worst")})
        result["traffic_with"], result["wake_with"] = busy["herd_wakes"], busy["wake"]
        return result
    finally:
        fleet.stop()


def _pg_room() -> int | None:
    """How many watches the server has connections for (None: no server to run against)."""
    try:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True, connect_timeout=3) as db:
            room = int(db.execute("SHOW max_connections").fetchone()[0])
            used = int(db.execute("SELECT count(*) FROM pg_stat_activity").fetchone()[0])
    except Exception as exc:  # noqa: BLE001 - any reason the server cannot be reached means: skip it
        print(f"  PostgreSQL skipped: {exc}", file=sys.stderr)
        return None
    return room - used - 20


def rows(clis: dict[str, str], watches: int = 100, idle_seconds: float = 30.0, busy_seconds: float = 20.0,
         postgres: bool = True) -> list[tuple]:
    if not shutil.which("tmux"):
        print("  dashboard benchmark skipped: tmux is not installed (apt-get install tmux)", file=sys.stderr)
        return []
    ours = clis["agent-mail"]
    python = _with_extras(ours)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        results["SQLite"] = run_one(ours, python, os.path.join(tmp, "mail.db"), watches, idle_seconds,
                                    busy_seconds, tmp)
        room = _pg_room() if postgres else None
        if room:
            import psycopg

            schema = f"bench_dashboard_{os.getpid()}"
            try:
                # Windows of two whole cycles of a PostgreSQL watch's 30-s refresh: its herd, armed together,
                # refreshes together, and a shorter window holds either none of those wake-ups or all of them.
                results["PostgreSQL"] = run_one(ours, python, f"{PG_URL}?schema={schema}", min(watches, room),
                                                max(idle_seconds, 60.0), max(busy_seconds, 60.0), tmp)
            finally:
                with psycopg.connect(PG_URL, autocommit=True) as db:
                    db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    lite, pg = results["SQLite"], results.get("PostgreSQL")

    def both(key: str, form: str) -> tuple[str, str]:
        return form.format(lite[key]), form.format(pg[key]) if pg else "skipped"

    herd = f"{lite['watches']} watches" + (f" (PostgreSQL: {pg['watches']})" if pg and pg["watches"] !=
                                             lite["watches"] else "")
    return [
        (f"dashboard idle beside {herd}, % of one core", *both("idle", "{:.2f}"), "< 1"),
        ("dashboard with a send every 100 ms, % of one core", *both("busy", "{:.2f}"), ""),
        ("a send on the dashboard's screen, p50 ms after commit", *both("p50", "{:.0f}"), "< 1000"),
        ("  p90 ms", *both("p90", "{:.0f}"), "< 1000"),
        ("  worst ms", *both("worst", "{:.0f}"), "< 1000"),
        ("  sends never seen on screen (of each run's)", *(f"{r['missed']} of {r['sends']}" if r else "skipped"
                                                          for r in (lite, pg)), "0"),
        ("the herd idle without the dashboard, % of one core", *both("herd_idle", "{:.2f}"), ""),
        ("the herd idle with the dashboard open, % of one core", *both("herd_with", "{:.2f}"), "same"),
        ("the herd's wake-ups per second, idle, no dashboard (their timers)", *both("woken_plain", "{:.1f}"), ""),
        ("the herd's wake-ups per second, idle, dashboard open", *both("woken_idle", "{:.1f}"), "same"),
        ("the herd's wake-ups per second, traffic to others, no dashboard", *both("traffic_plain", "{:.1f}"), ""),
        ("the herd's wake-ups per second, traffic to others, dashboard open", *both("traffic_with", "{:.1f}"),
         "same"),
        ("a watch's wake in that traffic, p50 ms after commit, no dashboard", *both("wake_plain", "{:.1f}"), ""),
        ("a watch's wake in that traffic, p50 ms after commit, dashboard open", *both("wake_with", "{:.1f}"),
         "same"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watches", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--busy-seconds", type=float, default=20.0)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    print(f"# dashboard benchmark ({machine()})\n")
    print(table(rows(implementations(), args.watches, args.idle_seconds, args.busy_seconds,
                     not args.no_postgres), HEADERS))


if __name__ == "__main__":
    main()
