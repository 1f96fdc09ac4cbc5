"""The mailbox through `agent-mail serve` (issue 21), beside the same commands on SQLite, straight on PostgreSQL
and the reference CLI, in one run.

    python bench/bench_server.py [--quick] [--rounds 15] [--wakes 30] [--sends 10]

Needs a PostgreSQL server where it may create a database (AGENT_MAIL_BENCH_PG, default
postgresql://postgres@127.0.0.1:5432/test): the run creates a database of its own and drops it after, so other
work on the shared database neither slows it nor is slowed by it. The servers are this project's benchmark
venv with the `server` and `postgres` extras (installed there on first use), serving a PostgreSQL mailbox.
Figures:
- cold start: `read`, `send` and `status --agent` as whole processes (spawn to exit) through a server on
  loopback (the client: the standard library only), beside the same command on a local SQLite file, straight
  on PostgreSQL, and the reference CLI on SQLite; every implementation and command interleaved run by run
  (bench_cli's method), medians. Targets: through a server <= 1.5x SQLite and <= 0.25x PostgreSQL direct.
- the client path's imports: modules outside the standard library that a `read` through a server loads (0).
- wake through two replicas: a `watch` process through replica A, armed (its session row written); after a
  random 0.05-0.25 s pause a send through replica B (POST /v1/call/send from this process); from the moment the
  send's answer reached its sender (the commit is before it, by the answer's trip over loopback) until the watch
  has printed its result and exited, p50 and p90. Target p50 <= 20 ms.
- 16 senders x 8 readers as processes (bench_concurrency's loop), through the two replicas (senders and readers
  alternating between them), beside the same straight on PostgreSQL: failed, lost, duplicated, throughput.
  Target: 0, 0, 0, and >= 4x the direct throughput.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit, urlunsplit

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_concurrency  # noqa: E402
from common import REFERENCE, cli_env, implementations, summary, table  # noqa: E402

PG_URL = os.environ.get("AGENT_MAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
HEADERS = ("measure", "through a server", "SQLite", "PostgreSQL direct", REFERENCE.replace("==", " "), "target")
WAKE_AGENT = "bench:watcher"
EXTRAS = ("psycopg[binary]>=3.3,<4", "starlette>=0.46,<2", "uvicorn>=0.34,<1")  # the postgres and server extras
# The modules a command through a server loads that are not the standard library's (the client path's promise).
IMPORTS = r"""
import sys
before = set(sys.modules)
from agent_mail.cli import main
code = main.main(sys.argv[1:])
new = {m.split('.')[0] for m in set(sys.modules) - before}
print(code, json.dumps(sorted(m for m in new if m not in sys.stdlib_module_names and m != 'agent_mail')),
      file=sys.stderr)
""".replace("import sys\n", "import json, sys\n", 1)


def _with_extras(cli: str) -> str:
    """The project's benchmark venv with the server and the driver beside it; its python."""
    python = os.path.join(os.path.dirname(cli), "python")
    if subprocess.run([python, "-c", "import psycopg, starlette, uvicorn"], capture_output=True).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *EXTRAS], check=True,
                       env=cli_env(None))
    return python


class Database:
    """A PostgreSQL database of the run's own, dropped at the end; url(schema): a mailbox in it."""

    def __init__(self):
        import psycopg

        self.name = f"agent_mail_bench_{os.getpid()}"
        with psycopg.connect(PG_URL, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            db.execute(f'CREATE DATABASE "{self.name}"')
        parts = urlsplit(PG_URL)
        self.base = urlunsplit(parts._replace(path=f"/{self.name}"))

    def url(self, schema: str) -> str:
        return f"{self.base}{'&' if '?' in self.base else '?'}schema={schema}"

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(PG_URL, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.drop()


class Served:
    """`agent-mail serve` (the benchmark venv's) on a free loopback port over `location`; its log drained."""

    def __init__(self, cli: str, location: str):
        self.proc = subprocess.Popen([cli, "serve", "--listen", "127.0.0.1:0"], env=cli_env(location),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        first = self.proc.stderr.readline()
        try:
            self.url = json.loads(first)["listening"]
        except (ValueError, KeyError):
            self.stop()
            raise RuntimeError(f"agent-mail serve did not start: {first!r}") from None
        self.port = int(self.url.rsplit(":", 1)[1])
        self._drain = threading.Thread(target=lambda: [None for _ in iter(self.proc.stderr.readline, b"")],
                                       daemon=True)
        self._drain.start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stderr.close()


def _token(cli: str, location: str, *scopes: str, supervisor: bool = False) -> str:
    argv = [cli, "token", "create", *(word for scope in scopes for word in ("--agent", scope)),
            *(["--supervisor"] if supervisor else [])]
    return json.loads(subprocess.run(argv, env=cli_env(location), check=True, capture_output=True).stdout)["token"]


def _client_env(url: str, token: str) -> dict:
    return {**cli_env(url), "AGENT_MAIL_TOKEN": token}


# ---------------------------------------------------------------- cold start


COMMANDS = {"read": ["read", "b:y"],
            "send": ["send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", "b"],
            "status --agent": ["status", "--agent", "b:y"]}


def cold_start_rows(clis: dict[str, str], db: Database, rounds: int) -> list[tuple]:
    import tempfile

    ours, reference = clis["agent-mail"], clis["reference"]
    server_box, direct_box = db.url("cold_served"), db.url("cold_direct")
    with tempfile.TemporaryDirectory() as tmp:
        setups = {"server": (ours, None), "sqlite": (ours, cli_env(os.path.join(tmp, "ours", "mail.db"))),
                  "postgresql": (ours, cli_env(direct_box)),
                  "reference": (reference, cli_env(os.path.join(tmp, "reference", "mail.db")))}
        subprocess.run([ours, "status"], env=cli_env(server_box), check=True, stdout=subprocess.DEVNULL)
        server = Served(ours, server_box)
        try:
            setups["server"] = (ours, _client_env(server.url, _token(ours, server_box, "a:x", "b:y")))
            for cli, env in setups.values():  # each mailbox made, and its first message, before timing
                subprocess.run([cli, "send", "--from", "a:x", "--to", "b:y", "--subject", "warm"], env=env, check=True,
                               stdout=subprocess.DEVNULL)
            samples = {name: {cmd: [] for cmd in COMMANDS} for name in setups}
            for _ in range(rounds):
                for name, (cli, env) in setups.items():
                    for cmd, argv in COMMANDS.items():
                        started = time.perf_counter()
                        done = subprocess.run([cli, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                        samples[name][cmd].append((time.perf_counter() - started) * 1000)
                        if done.returncode != 0:
                            raise RuntimeError(f"{name}: {argv} failed: {done.stderr.decode()}")
        finally:
            server.stop()
    rows = []
    for cmd in COMMANDS:
        median = {name: summary(samples[name][cmd])[0] for name in setups}
        served = median["server"]
        rows.append((f"cold start: {cmd} (whole process, median ms)", f"{served:.1f}", f"{median['sqlite']:.1f}",
                     f"{median['postgresql']:.1f}", f"{median['reference']:.1f}", ""))
        rows.append((f"  through a server / SQLite; / PostgreSQL direct ({cmd})", "",
                     f"{served / median['sqlite']:.2f}x", f"{served / median['postgresql']:.2f}x", "",
                     "<= 1.5x; <= 0.25x"))
    return rows


def import_rows(ours: str, db: Database) -> list[tuple]:
    """What the client path loads outside the standard library (a `read` through a server)."""
    location = db.url("imports")
    subprocess.run([ours, "status"], env=cli_env(location), check=True, stdout=subprocess.DEVNULL)
    server = Served(ours, location)
    try:
        python = os.path.join(os.path.dirname(ours), "python")
        done = subprocess.run([python, "-c", IMPORTS, "read", "a:x"], capture_output=True, text=True,
                              env=_client_env(server.url, _token(ours, location, "a:x")))
    finally:
        server.stop()
    code, _, loaded = done.stderr.strip().splitlines()[-1].partition(" ")
    if code != "0":
        raise RuntimeError(f"read through a server failed: {done.stderr}")
    outside = json.loads(loaded)
    return [("client path: modules outside the standard library a read loads", f"{len(outside)} {outside or ''}",
             "", "", "", "0")]


# ---------------------------------------------------------------- wake through two replicas


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


def _send_through(server: Served, token: str) -> float:
    """POST /v1/call/send to `server`; the moment its answer arrived (time.monotonic)."""
    body = json.dumps({"from": "bench:sender", "to": [WAKE_AGENT], "subject": "wake"}).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request("POST", "/v1/call/send", body=body, headers={"Authorization": f"Bearer {token}",
                                                                        "Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        answered = time.monotonic()
    finally:
        connection.close()
    if response.status != 200:
        raise RuntimeError(f"the send through {server.url} failed: {data[:300]!r}")
    return answered


def wake_rows(ours: str, db: Database, rounds: int) -> list[tuple]:
    location = db.url("wake")
    subprocess.run([ours, "status"], env=cli_env(location), check=True, stdout=subprocess.DEVNULL)
    a, b = Served(ours, location), Served(ours, location)
    samples = []
    try:
        token = _token(ours, location, WAKE_AGENT, "bench:sender")
        for _ in range(rounds):
            before = _count(location, "SELECT COUNT(*) FROM watch_sessions WHERE agent = ?", (WAKE_AGENT,))
            watch = subprocess.Popen([ours, "watch", WAKE_AGENT], env=_client_env(a.url, token),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                deadline = time.monotonic() + 30
                while _count(location, "SELECT COUNT(*) FROM watch_sessions WHERE agent = ?", (WAKE_AGENT,)) <= \
                        before:
                    if watch.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"the watch never armed: {watch.communicate()}")
                    time.sleep(0.005)
                time.sleep(0.05 + random.random() * 0.2)  # from writing its row to blocking, then a random moment
                answered = _send_through(b, token)
                watch.stdout.read()  # EOF: the watch printed its result and exited
                returned = time.monotonic()
                watch.wait(timeout=60)
                if watch.returncode != 0:
                    raise RuntimeError(f"the watch failed: {watch.stderr.read().decode()}")
                samples.append((returned - answered) * 1000)
            finally:
                if watch.poll() is None:
                    watch.kill()
                watch.communicate()
                _mark_all_read(location)
    finally:
        a.stop()
        b.stop()
    p50, p90 = summary(samples)
    return [("wake, send through replica B answered -> watch through replica A returned, p50 ms", f"{p50:.1f}", "",
             "", "", "<= 20"),
            ("wake through two replicas, p90 ms", f"{p90:.1f}", "", "", "", "recorded")]


# ---------------------------------------------------------------- 16 senders x 8 readers


def concurrency_rows(ours: str, db: Database, senders: int, readers: int, sends: int) -> list[tuple]:
    direct_box, served_box = db.url("crowd_direct"), db.url("crowd_served")
    direct = bench_concurrency.run(ours, direct_box, senders, readers, sends)
    subprocess.run([ours, "status"], env=cli_env(served_box), check=True, stdout=subprocess.DEVNULL)
    replicas = [Served(ours, served_box), Served(ours, served_box)]
    try:
        token = _token(ours, served_box, "src:*", "sink:*", supervisor=True)  # the loop starts with a `status`
        envs = [_client_env(server.url, token) for server in replicas]
        served = bench_concurrency.run(ours, replicas[0].url, senders, readers, sends,
                                       env_for=lambda role, i: envs[i % 2])
    finally:
        for server in replicas:
            server.stop()
    label = f"{senders} senders x {readers} readers ({senders * sends} sends)"
    rows = [(f"{label}: {key}", str(served[key]), "", str(direct[key]), "", "0")
            for key in ("failed", "lost", "duplicated")]
    rows.append((f"{label}: throughput, sends/s (through two replicas)", f"{served['throughput']:.1f}", "",
                 f"{direct['throughput']:.1f}", "", ">= 4x direct"))
    rows.append(("  through the replicas / PostgreSQL direct", f"{served['throughput'] / direct['throughput']:.2f}x",
                 "", "", "", ">= 4x"))
    for example in served["examples"] + direct["examples"]:
        print(f"  failure example: {example}", file=sys.stderr)
    return rows


def rows(clis: dict[str, str], quick: bool = False, rounds: int | None = None, wakes: int | None = None,
         sends: int | None = None) -> list[tuple]:
    ours = clis["agent-mail"]
    _with_extras(ours)
    with Database() as db:
        table_rows = cold_start_rows(clis, db, rounds or (5 if quick else 15))
        table_rows += import_rows(ours, db)
        table_rows += wake_rows(ours, db, wakes or (5 if quick else 30))
        table_rows += concurrency_rows(ours, db, 16, 8, sends or (3 if quick else 10))
    return table_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, for a smoke run")
    parser.add_argument("--rounds", type=int, help="cold-start rounds (15; quick 5)")
    parser.add_argument("--wakes", type=int, help="wake rounds (30; quick 5)")
    parser.add_argument("--sends", type=int, help="sends per sender (10; quick 3)")
    args = parser.parse_args()
    print(table(rows(implementations(), args.quick, args.rounds, args.wakes, args.sends), HEADERS))


if __name__ == "__main__":
    main()
