"""Two "hosts" for the cross-machine tests and benchmarks: network namespaces joined to this one by veth
links, each with its own HOME and working directory, reaching the PostgreSQL server over TCP only.

The server listens on this namespace's loopback; a small TCP relay here listens on each link's address
and forwards to it (the hosts cannot see this namespace's loopback). Taking a link down partitions that
host from the server: its packets go nowhere until the link comes back.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


def namespaces_problem() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if not shutil.which("ip"):
        return "the ip command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    name = f"am-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class Relay:
    """Forward TCP connections accepted on (address, port) to the server at target."""

    def __init__(self, address: str, port: int, target: tuple[str, int]):
        self.target = target
        self.listener = socket.create_server((address, port), reuse_port=False)
        self.sockets: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        for s in [self.listener, *self.sockets]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept() or recv()
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass


@dataclass
class Host:
    """One namespace: run agent-mail there with its own HOME, working directory and mailbox URL."""

    name: str
    netns: str
    link: str  # the server's end of this host's veth link, which partition() takes down
    server: str  # the relay's address as this host sees it
    root: str
    url: str = ""
    env_extra: dict = field(default_factory=dict)

    def env(self, **extra: str) -> dict:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.path.join(self.root, "home"),
               "PYTHONPATH": SRC, "AGENT_MAIL_DB": self.url, "PGCONNECT_TIMEOUT": "3", **self.env_extra}
        env.update(extra)
        return env

    def command(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, sys.executable, "-m", "agent_mail", *argv]

    def run(self, *argv: str, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(*argv), env=self.env(**extra), cwd=os.path.join(self.root, "work"),
                              capture_output=True, text=True, timeout=timeout)

    def popen(self, *argv: str, **extra: str) -> subprocess.Popen:
        return subprocess.Popen(self.command(*argv), env=self.env(**extra), cwd=os.path.join(self.root, "work"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def python(self, code: str, *args: str, **extra: str) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", self.netns, sys.executable, "-c", code, *args],
                                env=self.env(**extra), cwd=os.path.join(self.root, "work"), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def partition(self, down: bool = True) -> None:
        """Cut this host off from the server (its packets are dropped, as in a real partition), or reconnect it."""
        subprocess.run(["ip", "link", "set", self.link, "down" if down else "up"], check=True)


class TwoHosts:
    """Hosts a and b, made on entry and removed (namespaces, links, relays) on exit."""

    def __init__(self, root: str, database_url: str, schema: str, server=("127.0.0.1", 5432)):
        self.root, self.database_url, self.schema, self.server = root, database_url, schema, server
        tag = f"{os.getpid() % 100000}{os.urandom(2).hex()}"
        self.hosts: dict[str, Host] = {}
        self.relays: list[Relay] = []
        self._made: list[tuple[str, str]] = []
        self._tag = tag
        self._octet = int.from_bytes(os.urandom(1), "big") % 250 + 1

    def __enter__(self) -> TwoHosts:
        from urllib.parse import urlsplit

        parts = urlsplit(self.database_url)
        try:
            for index, name in enumerate(("a", "b")):
                netns, outside, inside = f"am-{self._tag}-{name}", f"am{self._tag}{name}o", f"am{self._tag}{name}i"
                subnet = f"10.{200 + index}.{self._octet}"
                commands = (
                    ["ip", "netns", "add", netns],
                    ["ip", "link", "add", outside, "type", "veth", "peer", "name", inside],
                    ["ip", "link", "set", inside, "netns", netns],
                    ["ip", "addr", "add", f"{subnet}.1/24", "dev", outside],
                    ["ip", "link", "set", outside, "up"],
                    ["ip", "-n", netns, "addr", "add", f"{subnet}.2/24", "dev", inside],
                    ["ip", "-n", netns, "link", "set", inside, "up"],
                    ["ip", "-n", netns, "link", "set", "lo", "up"],
                )
                self._made.append((netns, outside))
                for command in commands:
                    subprocess.run(command, check=True, capture_output=True)
                self.relays.append(Relay(f"{subnet}.1", self.server[1], self.server))
                host_root = os.path.join(self.root, f"host-{name}")
                for directory in ("home", "work"):
                    os.makedirs(os.path.join(host_root, directory), exist_ok=True)
                netloc = parts.netloc.rpartition("@")
                user = netloc[0] + "@" if netloc[1] else ""
                url = f"{parts.scheme}://{user}{subnet}.1:{self.server[1]}{parts.path}?schema={self.schema}"
                self.hosts[name] = Host(name, netns, outside, f"{subnet}.1", host_root, url)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __exit__(self, *exc) -> None:
        for relay in self.relays:
            relay.close()
        for netns, outside in self._made:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
            subprocess.run(["ip", "link", "del", outside], capture_output=True)  # gone with its peer, normally
