"""The team mailbox on PostgreSQL, beside this project on SQLite and the reference CLI, in one run.

    python bench/bench_postgres.py [--quick]

Needs a PostgreSQL server where it may create schemas (AGENT_MAIL_BENCH_PG, default
postgresql://postgres@127.0.0.1:5432/test) and, for the cross-host figures, root and iproute2 (two
network namespaces joined by veth links; tests/lib/twohosts.py). Figures:
- per-agent commands and `status` at 200,000 messages (bench_scale's "spread" shape, seeded into a
  SQLite file and moved onto PostgreSQL with `agent-mail copy`), each a whole process, median;
- wake across hosts: a `watch` process on host A, a send committed on host B (by this project's own
  code, which reports the moment send returned); from that commit until the watch has printed its
  result and exited (CLOCK_MONOTONIC is one clock for every namespace of a machine), p50 and p90;
  the same on one machine on SQLite beside it;
- 16 senders x 8 readers as processes (bench_concurrency's loop), spread over the two hosts: failed,
  lost, duplicated, throughput; SQLite on one machine beside it;
- 100 blocked watches idle, on a PostgreSQL server of the benchmark's own (bench/pgcluster.py, sized for them;
  the same number on SQLite beside them): the on-CPU time of the watch processes, and on PostgreSQL also of
  their server backends, over 30 s once settled and over the next 310 s (a whole cycle of a watch's
  periodic refresh, every 300 s), as a share of one core; the target, 0.2 % for 1,000, scaled to the herd.
The reference CLI is SQLite-only and single-machine: it appears in the per-agent rows. The first row is
the driver's own import time, the floor under every command run as a process on PostgreSQL.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # for tests.lib
import bench_concurrency  # noqa: E402
import bench_scale  # noqa: E402
from bench_herd import process_stat  # noqa: E402
from common import cli_env, implementations, summary, table  # noqa: E402
from seed import seed  # noqa: E402

PG_URL = os.environ.get("AGENT_MAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
HEADERS = ("measure", "agent-mail PostgreSQL", "agent-mail SQLite", "reference 0.5.1", "target")
WAKE_AGENT = "bench:watcher"
# Each command run again and again in one process, as the MCP server runs each tool call (a connection of its
# own per call, the driver already imported): the per-call cost without the process's start-up.
WARM = r"""
import contextlib, io, json, statistics, sys, time
from agent_mail.cli import main
rounds, commands = int(sys.argv[1]), json.loads(sys.argv[2])
result = {}
for label, argv in commands:
    samples = []
    for _ in range(rounds + 1):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            code = main.main(argv)
        samples.append((time.perf_counter() - started) * 1000)
        assert code == 0, (argv, code)
    result[label] = statistics.median(samples[1:])
print(json.dumps(result))
"""
COMMIT = r"""
import os, sys, time
from agent_mail.operations.mail import open_mailbox
with open_mailbox() as mailbox:
    mailbox.send(from_="bench:sender", to=[sys.argv[1]], subject="wake")
    print(time.monotonic(), flush=True)
os._exit(0)
"""


def _with_driver(cli: str) -> str:
    """The project's benchmark venv with psycopg beside it (the `postgres` extra's driver)."""
    python = os.path.join(os.path.dirname(cli), "python")
    if subprocess.run([python, "-c", "import psycopg"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "psycopg[binary]>=3.3,<4"], check=True, env=cli_env(None))
    return python


def _schema_url(schema: str) -> str:
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"


def _drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as db:
        db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _count(location: str, sql: str, params=()) -> int:
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        with store.transaction():
            return store._value(sql, params)
    finally:
        store.close()


def _mark_all_read(location: str) -> None:
    from agent_mail import model
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        with store.transaction(write=True):
            store._x("UPDATE messages SET read_at = ? WHERE read_at IS NULL", (model.now_iso(),))
    finally:
        store.close()


# ---------------------------------------------------------------- per-agent commands at 200,000 messages


def scale_rows(clis: dict[str, str], rounds: int) -> list[tuple]:
    shape = bench_scale.SEEDS["spread"]
    ours = clis["agent-mail"]
    schema = f"bench_scale_{os.getpid()}"
    url = _schema_url(schema)
    results = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, cli in clis.items():
                results[name] = bench_scale.measure(cli, os.path.join(tmp, name, "mail.db"), shape, rounds, rounds,
                                                    cleanup=False)
            source = os.path.join(tmp, "to-move", "mail.db")
            subprocess.run([ours, "status"], env=cli_env(source), check=True, stdout=subprocess.DEVNULL)
            seed(source, shape["messages"], shape["agents"], broadcasts=shape["broadcasts"],
                 broadcast_readers=shape["broadcast_readers"])
            subprocess.run([ours, "copy", "--from", source], env=cli_env(url), check=True, stdout=subprocess.DEVNULL)
        subprocess.run([ours, "status"], env=cli_env(url), check=True, stdout=subprocess.DEVNULL)  # settle
        pg = {label: bench_scale.median_ms(ours, argv, url, rounds) for label, argv in bench_scale.PER_AGENT}
        pg["status"] = bench_scale.median_ms(ours, ["status"], url, rounds)
        import json

        commands = [*bench_scale.PER_AGENT, ("status", ["status"])]
        warm = subprocess.run([os.path.join(os.path.dirname(ours), "python"), "-c", WARM, str(rounds),
                               json.dumps(commands)], env=cli_env(url), capture_output=True, text=True, check=True)
        warm = json.loads(warm.stdout)
    finally:
        _drop(schema)
    rows = []
    for label, _ in bench_scale.PER_AGENT:
        rows.append((f"200k spread: {label}, ms", f"{pg[label]:.1f}", f"{results['agent-mail'][label]:.1f}",
                     f"{results['reference'][label]:.1f}", "<= 60"))
    rows.append(("200k spread: status, ms", f"{pg['status']:.1f}", f"{results['agent-mail']['status']:.1f}",
                 f"{results['reference']['status']:.1f}", "<= 200"))
    for label, _ in [*bench_scale.PER_AGENT, ("status", None)]:
        rows.append((f"200k spread: {label}, in one process (as MCP calls), ms", f"{warm[label]:.1f}", "", "", ""))
    return rows


def driver_rows(python: str, rounds: int) -> list[tuple]:
    """What importing the driver costs a process: the floor under every command on PostgreSQL."""
    def median_ms(code: str) -> float:
        samples = []
        for _ in range(rounds):
            started = time.perf_counter()
            subprocess.run([python, "-c", code], env=cli_env(None), check=True)
            samples.append((time.perf_counter() - started) * 1000)
        return summary(samples)[0]

    bare, driver = median_ms("pass"), median_ms("import psycopg")
    ours_sqlite = median_ms("import agent_mail.cli.main, agent_mail.operations.mail, sqlite3")
    return [("python -c 'import psycopg' minus a bare interpreter (the driver's import), ms", f"{driver - bare:.1f}",
             f"{ours_sqlite - bare:.1f} (our SQLite path's imports)", "", "")]


# ---------------------------------------------------------------- wake


def _wake_once(watch_cmd, watch_env, commit_cmd, commit_env, location: str) -> float:
    before = _count(location, "SELECT COUNT(*) FROM watch_sessions WHERE agent = ?", (WAKE_AGENT,))
    watch = subprocess.Popen(watch_cmd, env=watch_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while _count(location, "SELECT COUNT(*) FROM watch_sessions WHERE agent = ?", (WAKE_AGENT,)) <= before:
            if watch.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the watch never armed: {watch.communicate()}")
            time.sleep(0.005)
        time.sleep(0.05 + random.random() * 0.2)  # from writing its row to blocking, then a random moment
        commit = subprocess.Popen(commit_cmd, env=commit_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        watch.stdout.read()  # EOF: the watch printed its result and exited
        returned = time.monotonic()
        watch.wait(timeout=60)
        out, err = commit.communicate(timeout=60)
        if commit.returncode != 0:
            raise RuntimeError(f"the send failed: {err}")
        return (returned - float(out.split()[-1])) * 1000
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.communicate()
        _mark_all_read(location)  # the next round's watch must wait, not find this one's message


def wake_rows(ours: str, python: str, rounds: int, hosts) -> list[tuple]:
    commit = [python, "-c", COMMIT, WAKE_AGENT]
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "mail.db")
        subprocess.run([ours, "status"], env=cli_env(db), check=True, stdout=subprocess.DEVNULL)
        local = [_wake_once([ours, "watch", WAKE_AGENT], cli_env(db), commit, cli_env(db), db)
                 for _ in range(rounds)]
    a, b = hosts["a"], hosts["b"]
    subprocess.run(_in(a, [ours, "status"]), env=_env(a), check=True, stdout=subprocess.DEVNULL)
    across = [_wake_once(_in(a, [ours, "watch", WAKE_AGENT]), _env(a), _in(b, commit), _env(b), a.url)
              for _ in range(rounds)]
    (p50, p90), (l50, l90) = summary(across), summary(local)
    return [("wake, commit on host B -> watch on host A returned, p50 ms", f"{p50:.1f}", f"{l50:.1f} (one host)",
             "", "<= 15"),
            ("wake, p90 ms", f"{p90:.1f}", f"{l90:.1f} (one host)", "", "<= 40")]


def _in(host, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", host.netns, *argv]


def _env(host) -> dict:
    return {**cli_env(host.url), "HOME": os.path.join(host.root, "home")}


# ---------------------------------------------------------------- 16 senders x 8 readers


def concurrency_rows(ours: str, hosts, senders: int, readers: int, sends: int) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        local = bench_concurrency.run(ours, os.path.join(tmp, "mail.db"), senders, readers, sends)
    a, b = hosts["a"], hosts["b"]
    placed = {role: [a, b] for role in ("sender", "reader")}
    across = bench_concurrency.run(ours, a.url, senders, readers, sends,
                                   prefix=lambda role, i: ["ip", "netns", "exec", placed[role][i % 2].netns],
                                   env_for=lambda role, i: _env(placed[role][i % 2]))
    label = f"{senders} senders x {readers} readers over two hosts ({senders * sends} sends)"
    rows = [(f"{label}: {key}", str(across[key]), str(local[key]), "", "0") for key in ("failed", "lost",
                                                                                       "duplicated")]
    rows.append((f"{label}: throughput, sends/s", f"{across['throughput']:.1f}", f"{local['throughput']:.1f}",
                 "", "recorded"))
    for example in across["examples"] + local["examples"]:
        print(f"  failure example: {example}", file=sys.stderr)
    return rows


# ---------------------------------------------------------------- idle watches


def _idle_share(ours: str, location: str, watches: int, windows: tuple[float, ...], server: str | None) -> tuple:
    """(watches run, load average, the herd's share of one core over each window in turn). `server`: the
    PostgreSQL URL whose backends serve the herd (their CPU counted with the watches'), None on SQLite."""
    agents = [f"herd:w{i:03d}" for i in range(watches)]
    subprocess.run([ours, "status"], env=cli_env(location), check=True, stdout=subprocess.DEVNULL)
    procs = [subprocess.Popen([ours, "watch", agent], env=cli_env(location), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for agent in agents]
    try:
        deadline = time.monotonic() + 120 + watches * 0.2
        while _count(location, "SELECT COUNT(*) FROM watch_sessions WHERE state = 'armed'") < watches:
            if time.monotonic() > deadline:
                raise RuntimeError("the herd never armed")
            time.sleep(0.2)
        # Settled: past each watch's start-up, and past the one flush of statistics a PostgreSQL backend makes
        # about 10 s after its last statement (PostgreSQL 15's idle stats interval), which is start-up work too.
        time.sleep(SETTLE_SECONDS if server is not None else 1.0)
        pids = [p.pid for p in procs]
        if server is not None:
            import psycopg

            # The server backends of this herd's watches only (each connection names its session).
            with psycopg.connect(server, autocommit=True) as db:
                sessions = [r[0] for r in db.execute(f'SELECT id FROM "{_schema_of(location)}".watch_sessions '
                                                     "WHERE state = 'armed'")]
                pids += [r[0] for r in db.execute("SELECT pid FROM pg_stat_activity WHERE application_name = "
                                                  "ANY(%s)", ([f"agent-mail watch {s}" for s in sessions],))]
            if len(pids) != 2 * watches:
                raise RuntimeError(f"{len(pids) - watches} server backends found for {watches} watches")
        shares = []
        load = os.getloadavg()[0]
        for seconds in windows:
            before = sum(process_stat(pid)[0] for pid in pids)
            time.sleep(seconds)
            after = sum(process_stat(pid)[0] for pid in pids)
            shares.append((after - before) / seconds * 100)
        return (watches, load, *shares)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)


def _schema_of(location: str) -> str:
    return location.rsplit("schema=", 1)[1]


# A watch that holds its presence (its connection; on SQLite its pipe's lock) wakes every this many seconds while
# idle (agent_mail.model.HELD_REFRESH_SECONDS): the second window holds every watch's one wake-up.
CYCLE_SECONDS = 300.0 + 10.0
SETTLE_SECONDS = 12.0


def idle_rows(ours: str, watches: int, seconds: float, cycle: bool = True) -> list[tuple]:
    """The herd idle on a PostgreSQL server of the benchmark's own (bench/pgcluster.py: nobody else's work
    wakes its backends, and max_connections fits the herd: a direct watch holds a connection), and on SQLite."""
    import pgcluster

    windows = (seconds, CYCLE_SECONDS) if cycle else (seconds,)
    reason = pgcluster.problem()
    if reason:
        print(f"  idle herd on PostgreSQL skipped: {reason}", file=sys.stderr)
        return []
    with pgcluster.Cluster(max_connections=watches + 30) as server:
        pg = _idle_share(ours, f"{server}?schema=bench_idle", watches, windows, server=server)
    with tempfile.TemporaryDirectory() as tmp:
        local = _idle_share(ours, os.path.join(tmp, "mail.db"), watches, windows, server=None)
    found = [(f"{watches} blocked watches idle over {seconds:.0f} s once settled, % of one core (PostgreSQL, a "
              f"server of its own: with their backends; load {pg[1]:.2f} / {local[1]:.2f})", f"{pg[2]:.3f}",
              f"{local[2]:.3f}", "", f"< {0.2 * watches / 1000:.3f}")]
    if cycle:
        found.append((f"  the same over the next {CYCLE_SECONDS:.0f} s (each watch's periodic wake-up once)",
                      f"{pg[3]:.3f}", f"{local[3]:.3f}", "", f"< {0.2 * watches / 1000:.3f}"))
    return found


def rows(clis: dict[str, str], quick: bool = False) -> list[tuple]:
    from tests.lib.twohosts import TwoHosts, namespaces_problem

    ours = clis["agent-mail"]
    python = _with_driver(ours)
    table_rows = driver_rows(python, 5 if quick else 21)
    table_rows += scale_rows(clis, rounds=3 if quick else 7)
    table_rows += idle_rows(ours, watches=20 if quick else 100, seconds=5 if quick else 30)
    problem = namespaces_problem()
    if problem:
        print(f"  cross-host figures skipped: {problem}", file=sys.stderr)
        return table_rows
    schema = f"bench_hosts_{os.getpid()}"
    try:
        with tempfile.TemporaryDirectory() as tmp, TwoHosts(tmp, PG_URL, schema) as hosts:
            table_rows += wake_rows(ours, python, 5 if quick else 30, hosts)
            table_rows += concurrency_rows(ours, hosts, 16, 8, 3 if quick else 10)
    finally:
        _drop(schema)
    return table_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, a smaller herd")
    parser.add_argument("--idle-only", type=int, metavar="WATCHES",
                        help="only the idle herd, of this many watches (30 s once settled, then a refresh cycle)")
    parser.add_argument("--no-cycle", action="store_true", help="with --idle-only: skip the 310-s cycle window")
    args = parser.parse_args()
    if args.idle_only:
        ours = implementations()["agent-mail"]
        _with_driver(ours)
        print(table(idle_rows(ours, args.idle_only, 30, cycle=not args.no_cycle),
                    HEADERS))
        return
    print(table(rows(implementations(), args.quick), HEADERS))


if __name__ == "__main__":
    main()
