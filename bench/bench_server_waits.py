"""1,000 concurrent waits on one `agent-mail serve` process over PostgreSQL (issue 21).

    python bench/bench_server_waits.py [--waits 1000] [--watches 100] [--idle-seconds 30] [--here]

A load generator in this process holds WAITS - WATCHES waits as raw HTTP requests (asyncio, one socket each), and
WATCHES real `agent-mail watch` processes hold the rest through the server (AGENT_MAIL_DB=http://...), each on an
identity of its own. Once every session is armed and the server has settled, it reports:
- the database connections the server process holds (its rows in pg_stat_activity, found by the local ports of
  its sockets to PostgreSQL), and its threads: neither grows with the waits (target: the pool + 1 LISTEN);
- the on-CPU time of the server process and of its PostgreSQL backends over IDLE_SECONDS while nothing happens,
  as a share of one core (target < 1 %);
- one broadcast: from the moment its send committed until the last of the waits was answered (a raw request's
  response read whole, a watch process's result printed: its first output), and the median (target: the last
  within 500 ms); the last raw request and the last watch process apart.
The mailbox lives in a database of its own, created here (CREATE DATABASE) on a PostgreSQL server of the
benchmark's own (bench/pgcluster.py: on a shared server, other users' DDL and NOTIFY wake the server's idle
backends, which would be counted as ours), or on the server AGENT_MAIL_BENCH_PG names when it is set, and
dropped after. --here runs this tree with this interpreter (which must have the `server` and `postgres`
extras: without uvloop uvicorn falls back to asyncio's own loop, and answers a broadcast's thousand waits
slower); otherwise the project's benchmark venv (bench/common.py) gets them installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # for tests.lib
from bench_herd import process_stat  # noqa: E402
from common import ROOT, cli_env, implementations, table  # noqa: E402
from tests.lib.serving import database_ports  # noqa: E402

PG_URL = os.environ.get("AGENT_MAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
HEADERS = ("measure", "agent-mail serve on PostgreSQL", "target")
POOL_SIZE = 8  # agent_mail.server.app.POOL_SIZE
SEND = r"""
import sys, time
from agent_mail.operations.mail import open_mailbox
with open_mailbox() as mailbox:
    mailbox.send(from_="bench:lead", to=["*"], subject="everyone")
print(time.perf_counter())
"""


def _python(clis: dict[str, str] | None) -> str:
    """An interpreter that runs this project with the `server` and `postgres` extras: the benchmark venv's (of
    common.implementations(), given those extras here), or this one running this tree (None)."""
    if clis is None:
        return sys.executable
    python = os.path.join(os.path.dirname(clis["agent-mail"]), "python")
    if subprocess.run([python, "-c", "import psycopg, starlette, uvicorn, uvloop"],
                      capture_output=True).returncode:  # the `postgres` and `server` extras (pyproject.toml)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "psycopg[binary]>=3.3,<4", "starlette>=0.46,<2", "uvicorn>=0.34,<1",
                        "uvloop>=0.19,<1"], check=True, env=cli_env(None))
    return python


def _env(python: str, db: str, **extra: str) -> dict:
    env = cli_env(db)
    if python == sys.executable:  # this tree, not an installed copy
        env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


def _database_url(name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(PG_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def _backends(pid: int) -> list[tuple[int, str]]:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as db:
        return [(r[0], r[1]) for r in db.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE client_port = ANY(%s)",
            (sorted(database_ports(pid, db.info.port)),))]


def _armed(db: str) -> int:
    import psycopg

    with psycopg.connect(_database_url(db), autocommit=True) as con:
        return con.execute("SELECT COUNT(*) FROM agent_mail.watch_sessions WHERE state = 'armed'").fetchone()[0]


class LoadGenerator:
    """Raw HTTP waits on an event loop of their own (a thread): the moment each response was read whole."""

    def __init__(self, port: int, token: str, agents: list[str]):
        self.port, self.token, self.agents = port, token, agents
        self.answered: dict[str, tuple[int, float]] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.tasks: list = []

    def start(self) -> None:
        self.thread.start()
        for agent in self.agents:
            self.tasks.append(asyncio.run_coroutine_threadsafe(self._wait(agent), self.loop))

    async def _wait(self, agent: str) -> None:
        body = json.dumps({"agent": agent, "wait_seconds": 3000}).encode()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 20)
        except OSError:
            self.answered[agent] = (0, time.perf_counter())
            return
        writer.write(f"POST /v1/call/watch HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.token}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        try:
            answer = await reader.read()  # to EOF: the whole response
            status = int(answer.split(b" ", 2)[1]) if answer else 0
        except (OSError, ValueError, IndexError):
            status = 0
        self.answered[agent] = (status, time.perf_counter())
        writer.close()

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def measure(python: str, waits: int, watches: int, idle_seconds: float) -> dict:
    import psycopg

    name = f"bench_waits_{os.getpid()}"
    with psycopg.connect(PG_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = _database_url(name)
    server = load = None
    procs: list[subprocess.Popen] = []
    try:
        created = subprocess.run([python, "-m", "agent_mail", "token", "create", "--agent", "*"],
                                 env=_env(python, url), capture_output=True, check=True)
        token = json.loads(created.stdout)["token"]
        server = subprocess.Popen([python, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"],
                                  env=_env(python, url), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        address = json.loads(server.stderr.readline())["listening"]
        threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()  # its request log
        port = int(address.rsplit(":", 1)[1])
        raw = [f"load:w{i:04d}" for i in range(waits - watches)]
        load = LoadGenerator(port, token, raw)
        load.start()
        for i in range(watches):
            procs.append(subprocess.Popen([python, "-m", "agent_mail", "watch", f"proc:w{i:04d}", "--timeout-minutes",
                                           "60"], env=_env(python, address, AGENT_MAIL_TOKEN=token),
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 120 + waits * 0.1
        while _armed(name) < waits:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {_armed(name)} of {waits} waits armed")
            if any(p.poll() is not None for p in procs) or load.answered:
                raise RuntimeError("a wait ended before the broadcast")
            time.sleep(0.5)
        # Settled: every look done, and past the one flush of statistics a PostgreSQL backend makes about 10 s after
        # its last statement (PostgreSQL 15's idle stats interval), which is start-up work too.
        time.sleep(12.0)
        backends = _backends(server.pid)
        threads = len(os.listdir(f"/proc/{server.pid}/task"))
        pids = [server.pid] + [pid for pid, _ in backends]
        before = sum(process_stat(pid)[0] for pid in pids)
        started = time.monotonic()
        time.sleep(idle_seconds)
        idle = (sum(process_stat(pid)[0] for pid in pids) - before) / (time.monotonic() - started) * 100
        # One broadcast, from its commit until the last wait was answered.
        selector = selectors.DefaultSelector()
        for proc in procs:
            os.set_blocking(proc.stdout.fileno(), False)
            selector.register(proc.stdout, selectors.EVENT_READ, proc)
        sender = subprocess.run([python, "-c", SEND], env=_env(python, url), capture_output=True, text=True,
                                check=True)
        committed = float(sender.stdout.strip().splitlines()[-1])
        printed: list[float] = []
        deadline = time.monotonic() + 60
        while len(printed) < len(procs) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.5):
                # The watch's first output: it has its answer and printed it (its interpreter's exit comes after,
                # the client's own cost, not the server's).
                printed.append(time.perf_counter())
                selector.unregister(key.fileobj)
        selector.close()
        while len(load.answered) < len(raw) and time.monotonic() < deadline:
            time.sleep(0.01)
        for proc in procs:
            proc.wait(timeout=60)
        statuses = {status for status, _ in load.answered.values()}
        failed = [proc.returncode for proc in procs if proc.returncode]
        if len(printed) + len(load.answered) < waits or statuses - {200} or failed:
            raise RuntimeError(f"{len(printed) + len(load.answered)} of {waits} waits answered the broadcast "
                               f"(statuses {statuses}, watch exit codes {set(failed)})")
        latencies = sorted((at - committed) * 1000 for at in printed + [at for _, at in load.answered.values()])
        return {"connections": len(backends), "names": sorted({n for _, n in backends}), "threads": threads,
                "idle": idle, "last_ms": latencies[-1], "median_ms": latencies[len(latencies) // 2],
                "raw_last_ms": max(at - committed for _, at in load.answered.values()) * 1000 if raw else 0.0,
                "watch_last_ms": (max(printed) - committed) * 1000 if printed else 0.0}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()
        if load is not None:
            load.stop()
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        with psycopg.connect(PG_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rows(clis: dict[str, str] | None, waits: int = 1000, watches: int = 100, idle_seconds: float = 30.0) \
        -> list[tuple]:
    """The table's rows (run_all: rows(clis, ...); None: this tree with this interpreter)."""
    global PG_URL
    import pgcluster

    python = _python(clis)
    if "AGENT_MAIL_BENCH_PG" in os.environ or pgcluster.problem():
        found = measure(python, waits, min(watches, waits), idle_seconds)
    else:
        with pgcluster.Cluster(max_connections=100) as server:
            PG_URL = server
            found = measure(python, waits, min(watches, waits), idle_seconds)
    return [
        (f"{waits} waits on one server ({waits - watches} raw requests, {watches} watch processes): its database "
         f"connections ({', '.join(found['names'])})", found["connections"], f"<= {POOL_SIZE + 1}"),
        ("  the server process's threads", found["threads"], "not growing with the waits"),
        (f"  idle over {idle_seconds:.0f} s once settled, server + its PostgreSQL backends, % of one core",
         f"{found['idle']:.3f}", "< 1"),
        ("  one broadcast: commit to the last wait answered, ms (median)",
         f"{found['last_ms']:.0f} ({found['median_ms']:.0f})", "<= 500"),
        ("    the last raw request answered / the last watch process printed its result, ms",
         f"{found['raw_last_ms']:.0f} / {found['watch_last_ms']:.0f}", ""),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waits", type=int, default=1000)
    parser.add_argument("--watches", type=int, default=100, help="of the waits, how many are watch processes")
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--here", action="store_true", help="this tree with this interpreter, no benchmark venv")
    args = parser.parse_args()
    print(table(rows(None if args.here else implementations(), args.waits, args.watches, args.idle_seconds),
                HEADERS))


if __name__ == "__main__":
    main()
