"""Replicas of `agent-mail serve` over one mailbox, and a round-robin TCP proxy in front of them (docs/deployment.md's
layout, for test_server_replicas.py and test_console.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

from tests.lib.cli import process_env
from tests.lib.serving import Server


class Replica(Server):
    """`agent-mail serve` on the test's mailbox, on a free loopback port or the one given (a restart), trusting
    X-Forwarded-For from a proxy on this host as docs/deployment.md starts them."""

    def __init__(self, mailbox: str, port: int = 0):
        self.mailbox = mailbox
        self.proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", f"127.0.0.1:{port}",
                                      "--forwarded-allow-ips", "127.0.0.1"], env=process_env(AGENT_MAIL_DB=mailbox),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = json.loads(self.proc.stderr.readline())
        self.log: list[bytes] = []
        self._reader = threading.Thread(target=lambda: self.log.extend(iter(self.proc.stderr.readline, b"")),
                                        daemon=True)
        self._reader.start()
        self.url = first["listening"]
        self.port = int(self.url.rsplit(":", 1)[1])
        self.outputs: list[str] = []


class Replicas:
    """Replicas A and B over the test's schema, started at the same moment (as a service manager starts them);
    every one started is stopped at the end."""

    def __init__(self, mailbox: str):
        self.mailbox, self.started = mailbox, []
        threads = [threading.Thread(target=lambda: self.started.append(Replica(mailbox))) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert len(self.started) == 2, "a replica did not start"

    def __iter__(self):
        return iter(self.started[:2])

    def restart(self, dead: Replica, port: int) -> Replica:
        dead.stop()
        again = Replica(self.mailbox, port)
        self.started.append(again)
        return again

    def stop(self) -> None:
        for server in self.started:
            server.stop()


class RoundRobin:
    """A TCP load balancer on a loopback port: each connection goes to the next backend in turn, and to the one
    after it when that one refuses the connection (as nginx's proxy_next_upstream error does); `chosen` lists the
    backend port each connection was carried to."""

    def __init__(self, ports: list[int]):
        self.ports, self.chosen, self._next = ports, [], 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self._thread.start()
        assert ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(asyncio.start_server(self._carry, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    async def _carry(self, reader, writer) -> None:
        upstream = None
        for _ in self.ports:
            port = self.ports[self._next % len(self.ports)]
            self._next += 1
            try:
                upstream = await asyncio.open_connection("127.0.0.1", port)
                self.chosen.append(port)
                break
            except OSError:
                continue
        if upstream is None:
            writer.close()
            return

        async def pipe(source, sink) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, upstream[1]), pipe(upstream[0], writer))

    def close(self) -> None:
        async def stop() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
