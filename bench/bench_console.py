"""The web console's live updates (issue 34): what 100 open consoles cost an idle `agent-mail serve`, and how soon a
send reaches them.

    python bench/bench_console.py [--consoles 100] [--idle-seconds 30] [--sends 20] [--postgres]

Runs this tree with this interpreter (the `server` extra; `--postgres`: a PostgreSQL mailbox, a schema of its own on
AGENT_MAIL_BENCH_PG, default the local server's `test` database). It serves a fresh mailbox, signs in once as a
supervisor (POST /ui/login), then measures:
- the server process's on-CPU time over IDLE_SECONDS while nothing happens, with no console open and then with
  CONSOLES consoles' live streams (GET /ui/events: each a connection, as a browser tab holds one) open, as a share
  of one core; and its resident memory (VmRSS) in each state;
- for SENDS sends (each committed in this process, to a new identity), with 1 console and with CONSOLES open: the
  time from the send's commit to every console's stream saying `change` (the first console told, and the last);
  with 1 console, also to its page, fetched again as the page's script does on a change, showing the new
  identity (the whole update a person sees): the median and the worst.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
from bench_herd import process_stat  # noqa: E402
from common import ROOT, machine, table  # noqa: E402

PG_URL = os.environ.get("AGENT_MAIL_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _env(location: str) -> dict:
    env = {**os.environ, "AGENT_MAIL_DB": location, "PYTHONPATH": os.path.join(ROOT, "src")}
    env.pop("AGENT_MAIL_TOKEN", None)
    return env


async def _page(port: int, cookie: str) -> bytes:
    """GET /ui/ as the page's script does on a change (a connection of its own): the page's bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /ui/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n"
                 .encode())
    page = await reader.read()
    writer.close()
    return page


async def _stream(port: int, cookie: str, ready: asyncio.Event, told: list, index: int, opened: list,
                  drawn: list, wanted: list, fetch: bool):
    """One console: its live stream; on each change (`fetch`), its page fetched again (as console.js does), and the
    moment the page held what was last sent (`wanted[0]`) noted in `drawn`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /ui/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nCookie: {cookie}\r\n"
                 f"Accept: text/event-stream\r\n\r\n".encode())
    await writer.drain()
    opened.append(writer)
    while line := await reader.readline():
        if line.startswith(b"event: ready"):
            ready.set()
        elif line.startswith(b"event: change"):
            told.append((index, time.perf_counter()))
            if fetch and wanted and wanted[0].encode() in await _page(port, cookie):
                drawn.append((index, time.perf_counter()))


async def run(consoles: int, idle: float, sends: int, location: str) -> list[tuple]:
    from agent_mail.operations.mail import open_mailbox

    env = _env(location)
    made = subprocess.run([sys.executable, "-m", "agent_mail", "token", "create", "--agent", "bench:lead",
                           "--supervisor"], env=env, capture_output=True, check=True)
    token = json.loads(made.stdout)["token"]
    server = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = int(json.loads(server.stderr.readline())["listening"].rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = urllib.parse.urlencode({"token": token}).encode()
        writer.write(f"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/"
                     f"x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
        answer = (await reader.read()).decode("latin-1")
        writer.close()
        cookie = next(line.split(":", 1)[1].strip().split(";")[0] for line in answer.split("\r\n")
                      if line.lower().startswith("set-cookie:"))
        rows = []
        await asyncio.sleep(2.0)  # past the start and the login
        for label, count in (("no console open", 0), ("1 console open", 1), (f"{consoles} consoles open", consoles)):
            told: list = []
            drawn: list = []
            wanted: list = []
            readies = [asyncio.Event() for _ in range(count)]
            opened: list = []
            fetch = count == 1
            tasks = [asyncio.create_task(_stream(port, cookie, readies[n], told, n, opened, drawn, wanted, fetch))
                     for n in range(count)]
            for ready in readies:
                await asyncio.wait_for(ready.wait(), 60)
            await asyncio.sleep(2.0)
            cpu0, _ = process_stat(server.pid)
            t0 = time.perf_counter()
            await asyncio.sleep(idle)
            cpu1, _ = process_stat(server.pid)
            share = (cpu1 - cpu0) / (time.perf_counter() - t0) * 100
            rows.append((f"idle server, {label}: CPU (share of one core)", f"{share:.2f} %"))
            rows.append((f"idle server, {label}: resident memory", f"{rss_mib(server.pid):.1f} MiB"))
            if count:
                firsts, lasts, pages = [], [], []
                for n in range(sends):
                    told.clear()
                    drawn.clear()
                    wanted[:] = [f"bench:new{count}x{n}<"]
                    with open_mailbox() as mailbox:
                        mailbox.send(from_="bench:lead", to=[f"bench:new{count}x{n}"], subject=f"news {n}")
                    committed = time.perf_counter()
                    deadline = committed + 30
                    while (len({i for i, _ in told}) < count or (fetch and not drawn)) and \
                            time.perf_counter() < deadline:
                        await asyncio.sleep(0.002)
                    if fetch:
                        assert drawn, f"the page never showed send {n}"
                        pages.append((drawn[0][1] - committed) * 1000)
                    at = {}
                    for index, moment in told:
                        at.setdefault(index, moment)
                    assert len(at) == count, f"only {len(at)} of {count} consoles were told of send {n}"
                    firsts.append((min(at.values()) - committed) * 1000)
                    lasts.append((max(at.values()) - committed) * 1000)
                    await asyncio.sleep(0.3)
                rows.append((f"send -> first of {count} consoles told (median / worst of {sends})",
                             f"{statistics.median(firsts):.1f} / {max(firsts):.1f} ms"))
                rows.append((f"send -> last of {count} consoles told (median / worst of {sends})",
                             f"{statistics.median(lasts):.1f} / {max(lasts):.1f} ms"))
                if pages:
                    rows.append(("send -> the console's page fetched again, showing it (median / worst)",
                                 f"{statistics.median(pages):.1f} / {max(pages):.1f} ms"))
            for writer in opened:
                writer.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return rows
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consoles", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    parser.add_argument("--sends", type=int, default=20)
    parser.add_argument("--postgres", action="store_true")
    options = parser.parse_args()
    sys.path.insert(0, os.path.join(ROOT, "src"))
    with tempfile.TemporaryDirectory(prefix="am-bench-console-") as home:
        if options.postgres:
            schema = "bench_console_" + secrets.token_hex(4)
            location = f"{PG_URL}?schema={schema}" if "?" not in PG_URL else f"{PG_URL}&schema={schema}"
        else:
            location = os.path.join(home, "mail.db")
        os.environ["AGENT_MAIL_DB"] = location
        os.environ["HOME"] = home
        try:
            rows = asyncio.run(run(options.consoles, options.idle_seconds, options.sends, location))
        finally:
            if options.postgres:
                import psycopg

                with psycopg.connect(PG_URL, autocommit=True) as connection:
                    connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    backend = "PostgreSQL" if options.postgres else "SQLite"
    print(f"# The web console's live updates on {backend} ({machine()})\n")
    print(table(rows, ("measure", f"agent-mail serve on {backend}")))


if __name__ == "__main__":
    main()
