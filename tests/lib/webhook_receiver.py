"""A webhook's receiver on loopback for the webhook tests: a small http.server in a thread that records every POST
(its headers, raw body and when it came) and answers with the statuses it is told, in turn."""

from __future__ import annotations

import hashlib
import hmac
import http.server
import json
import threading
import time


class Receiver:
    """Listening on 127.0.0.1 (a free port) until stop(). `statuses`: the answers to the first POSTs, in turn (then
    200); `hang`: how many of the first POSTs get no answer at all (held until stop())."""

    def __init__(self, statuses=(), hang: int = 0):
        self.posts: list[dict] = []
        self.statuses, self.hang = list(statuses), hang
        self.lock = threading.Lock()
        self.released = threading.Event()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with owner.lock:
                    owner.posts.append({"at": time.monotonic(), "headers": {k.lower(): v for k, v in
                                                                             self.headers.items()},
                                        "body": body})
                    hanging = owner.hang > 0
                    owner.hang -= 1 if hanging else 0
                    status = owner.statuses.pop(0) if owner.statuses and not hanging else 200
                if hanging:
                    owner.released.wait(60)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/agent-mail"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def documents(self) -> list[dict]:
        with self.lock:
            return [json.loads(p["body"]) for p in self.posts]

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def signed(secret: str, body: bytes) -> str:
    """What X-Agent-Mail-Signature must say for `body` under `secret` (computed here, independently)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
