"""Unauthenticated bodies against `agent-mail serve` (issue 27, finding 6): the server's resident memory while 10
concurrent requests without a token each declare and send a 34 MB body, on every route that takes a token.

    python bench/bench_edge.py [--pg URL] [--clients 10] [--mb 34] [--src DIR]

Starts a server (this checkout's, or the source tree --src names: e.g. an older checkout to compare) on a fresh
SQLite mailbox (and with --pg, a fresh schema of that PostgreSQL database), then for each route: 10 connections at
once, each sending the request's head (Content-Length 34 MB, no Authorization) and then its body as fast as the
server takes it, until the server answers and closes. The server's VmRSS (/proc/PID/status) is sampled every 10 ms
from the first byte until 3 s after the last connection ended: its peak, beside the 250 MB target, and the answers'
statuses. Loopback only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
TARGET_MB = 250
ROUTES = ("/v1/call/send", "/v1/call/status", "/v1/delivered", "/v1/watch/stop", "/v1/follow", "/v1/dashboard",
          "/v1/export", "/v1/import", "/mcp")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def start(src: str, mailbox: str) -> tuple[subprocess.Popen, int]:
    env = {**os.environ, "PYTHONPATH": src, "AGENT_MAIL_DB": mailbox}
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = json.loads(proc.stderr.readline())
    threading.Thread(target=lambda: [None for _ in iter(proc.stderr.readline, b"")], daemon=True).start()
    return proc, int(first["listening"].rsplit(":", 1)[1])


def one(port: int, path: str, size: int, statuses: list) -> None:
    """A request without a token declaring `size` bytes, its body sent until the server stops taking it."""
    chunk = b"x" * (1 << 20)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {size}\r\n\r\n".encode())
        sent = 0
        try:
            while sent < size:
                sock.sendall(chunk[:min(len(chunk), size - sent)])
                sent += min(len(chunk), size - sent)
        except OSError:
            pass  # the server answered and closed: the rest was never taken in
        try:
            head = sock.recv(200).split(b" ", 2)
            statuses.append(int(head[1]) if len(head) > 1 else "closed")
        except OSError:
            statuses.append("reset")


def route(proc: subprocess.Popen, port: int, path: str, clients: int, size: int) -> dict:
    before, peak, statuses = rss_mb(proc.pid), 0.0, []
    threads = [threading.Thread(target=one, args=(port, path, size, statuses)) for _ in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    ended = None
    while ended is None or time.monotonic() < ended + 3:
        peak = max(peak, rss_mb(proc.pid))
        if ended is None and not any(t.is_alive() for t in threads):
            ended = time.monotonic()
        time.sleep(0.01)
    return {"route": path, "before_mb": round(before, 1), "peak_mb": round(peak, 1),
            "after_mb": round(rss_mb(proc.pid), 1), "seconds": round(ended - started, 2),
            "statuses": sorted(statuses, key=str)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="also on a fresh schema of this PostgreSQL database")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--mb", type=int, default=34)
    parser.add_argument("--src", default=SRC, help="the source tree to serve from (default: this checkout's)")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="bench-edge-")
    mailboxes = [("SQLite", os.path.join(directory, "mail.db"))]
    schema = f"bench_edge_{os.getpid()}"
    if args.pg:
        mailboxes.append(("PostgreSQL", f"{args.pg}{'&' if '?' in args.pg else '?'}schema={schema}"))
    worst = 0.0
    try:
        for backend, mailbox in mailboxes:
            proc, port = start(args.src, mailbox)
            try:
                print(f"{backend}: {args.clients} clients x {args.mb} MB declared, no token; server {proc.pid}")
                print(f"  {'route':18} {'before':>8} {'peak':>8} {'after':>8} {'target':>8} {'s':>6}  answers")
                for path in ROUTES:
                    row = route(proc, port, path, args.clients, args.mb * 1_000_000)
                    worst = max(worst, row["peak_mb"])
                    print(f"  {path:18} {row['before_mb']:>6} MB {row['peak_mb']:>6} MB {row['after_mb']:>6} MB "
                          f"{TARGET_MB:>5} MB {row['seconds']:>6}  {row['statuses']}", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if args.pg:
            import psycopg

            with psycopg.connect(args.pg, autocommit=True) as db:
                db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    print(f"peak resident memory: {worst} MB (target < {TARGET_MB} MB): {'met' if worst < TARGET_MB else 'MISSED'}")


if __name__ == "__main__":
    main()
