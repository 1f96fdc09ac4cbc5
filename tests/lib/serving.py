"""A running `agent-mail serve` for the tests that go through one (test_server*.py)."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading

from tests.lib.cli import am_process, process_env


STARTED: list = []  # every Server started: conftest stops those a test left running (one that failed early)


class Server:
    """A running `agent-mail serve` on a free loopback port (or `port`; `host`: another address, served without
    TLS), over the test's mailbox; `env`: more variables for the server process. Stopped after the test that
    started it, whatever happened in it."""

    def __init__(self, mailbox: str, port: int = 0, host: str = "127.0.0.1", **env: str):
        self.mailbox = mailbox
        self.host = host
        self.env = env
        self.outputs: list[str] = []
        self.earlier_logs: list[bytes] = []  # the logs of the processes kill() ended
        self._start(port)

    def _start(self, port: int) -> None:
        plain = [] if self.host.startswith("127.") else ["--insecure-no-tls"]
        self.proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", f"{self.host}:{port}",
                                      *plain], env=process_env(AGENT_MAIL_DB=self.mailbox, **self.env),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = json.loads(self.proc.stderr.readline())
        while "warning" in first:  # off loopback without TLS: said before "listening"
            first = json.loads(self.proc.stderr.readline())
        # The server logs a line per request: read as it comes, so a long run never fills the pipe and blocks it.
        self.log: list[bytes] = []
        self._reader = threading.Thread(target=lambda: self.log.extend(iter(self.proc.stderr.readline, b"")),
                                        daemon=True)
        self._reader.start()
        self.url = first["listening"]
        self.port = int(self.url.rsplit(":", 1)[1])
        STARTED.append(self)

    def kill(self) -> None:
        """SIGKILL the server (no clean stop: its waits and calls in flight are cut off)."""
        self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=10)
        self.earlier_logs += self.log
        self.proc.stdout.close()
        self.proc.stderr.close()

    def restart(self) -> None:
        """Serve again on the same port (after kill() or stop())."""
        self._start(self.port)

    def direct(self, *argv: str) -> subprocess.CompletedProcess:
        proc = am_process(*argv, env=process_env(AGENT_MAIL_DB=self.mailbox))
        self.outputs += [proc.stdout.decode(), proc.stderr.decode()]
        return proc

    def token(self, *argv: str) -> str:
        created = am_process("token", "create", *argv, env=process_env(AGENT_MAIL_DB=self.mailbox))
        return json.loads(created.stdout)["token"]  # the one output that shows it: kept out of self.outputs

    def client(self, token: str | None, *argv: str, input: bytes | None = None, **env: str) \
            -> subprocess.CompletedProcess:
        extra = {"AGENT_MAIL_DB": self.url, **env}
        if token is not None:
            extra["AGENT_MAIL_TOKEN"] = token
        environment = process_env(**extra)
        if token is None:
            environment.pop("AGENT_MAIL_TOKEN", None)
        proc = am_process(*argv, env=environment, input=input)
        self.outputs += [proc.stdout.decode(), proc.stderr.decode()]
        return proc

    def raw(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def stop(self) -> tuple[int, str]:
        if self.proc.stderr.closed:
            return self.proc.returncode, ""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=10)
        log = b"".join(self.log).decode()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return self.proc.returncode, log


def database_ports(pid: int, port: int = 5432) -> set[int]:
    """The local ports of the TCP connections process `pid` holds to `port` (a database server on this machine):
    pg_stat_activity's client_port of its backends."""
    import os

    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes and int(fields[2].rsplit(":", 1)[1], 16) == port:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def backends_of(pid: int, url: str) -> list[tuple[int, str]]:
    """(backend pid, application_name) of every PostgreSQL connection process `pid` holds to the server at `url`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        port = db.info.port
        return [(r[0], r[1]) for r in db.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE client_port = ANY(%s)",
            (sorted(database_ports(pid, port)),))]
