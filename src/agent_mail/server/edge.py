"""The edge of `agent-mail serve`: how a request may arrive and what is refused before the application sees it.

A request's line and headers must come within READ_SECONDS of the connection's opening (uvicorn has no such
limit: EdgeProtocol), a head over MAX_HEAD_BYTES is 431, a body may pause no longer than READ_SECONDS and must come
whole within that plus its size at MIN_BODY_RATE (408), a Content-Length over the cap is 413 before any of the
body is read, a body cut short is 400, a request that is not HTTP is 400: every refusal JSON `{error, problems}`
with the exit code header, logged as one JSON line (`log`: never a token). Connections are probed when quiet
(TCP keepalive, agent_mail.protocols.wire.keep_probing: set on the listening socket by agent_mail.server.app), so a
client cut off by the network ends its wait. Also the listen address's checks.
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio
import h11
from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.h11_impl import H11Protocol

from agent_mail.protocols import http_api
from agent_mail import errors, jsonout, model

EXIT_HEADER = http_api.EXIT_HEADER
# What a call may carry: a send's body and attachments (base64: 4/3 of their size), with room for the rest.
MAX_REQUEST_BYTES = model.ATTACHMENTS_MAX_BYTES_PER_SEND * 4 // 3 + model.BODY_MAX_CHARS * 4 + 1_000_000
MAX_IMPORT_BYTES = 8 * 1024**3  # an import's upload, spooled to a temporary file here
MAX_HEAD_BYTES = 16 * 1024  # a request's line and headers (a token is under 100 bytes): more is refused, 431
# How long a request may take to arrive: its line and headers from the connection's opening (or the first byte
# of the next request on a kept-alive connection); then its body may pause no longer than this, and must come
# whole within this plus its size at MIN_BODY_RATE. Later is answered 408 and the connection closed, so a slow or
# stalled client holds no connection, task or thread for longer. AGENT_MAIL_SERVE_READ_SECONDS changes it.
READ_SECONDS = float(os.environ.get("AGENT_MAIL_SERVE_READ_SECONDS", "30"))
LINGER_SECONDS = 2.0  # after a refusal answered before the body was all read: the rest read and dropped, then closed
# Bytes a second, on average: a large send's upload on a slow link still comes in time. AGENT_MAIL_SERVE_MIN_BODY_RATE.
MIN_BODY_RATE = int(os.environ.get("AGENT_MAIL_SERVE_MIN_BODY_RATE", str(64 * 1024)))
# The whole request's deadline, whatever its framing (EdgeProtocol): from its first byte, READ_SECONDS plus its body
# at MIN_BODY_RATE (its Content-Length, or for a chunked body what has come so far), and never more than this.
# AGENT_MAIL_SERVE_REQUEST_SECONDS changes it.
REQUEST_SECONDS = float(os.environ.get("AGENT_MAIL_SERVE_REQUEST_SECONDS", "900"))
# Wrong tokens slowed per client address (Penalties): each refused token's answer is held PENALTY_SECONDS, doubled
# with each further refusal from that address up to PENALTY_MAX_SECONDS, forgotten after PENALTY_FORGET_SECONDS
# without one. A right token is never held. AGENT_MAIL_SERVE_PENALTY_SECONDS / _PENALTY_MAX_SECONDS change them.
PENALTY_SECONDS = float(os.environ.get("AGENT_MAIL_SERVE_PENALTY_SECONDS", "0.05"))
PENALTY_MAX_SECONDS = float(os.environ.get("AGENT_MAIL_SERVE_PENALTY_MAX_SECONDS", "5"))
PENALTY_FORGET_SECONDS = 60.0
PENALTY_ADDRESSES = 10_000  # addresses remembered at most (the oldest forgotten first)
BEARER_CHALLENGE = 'Bearer realm="agent-mail"'  # WWW-Authenticate of every 401, on /v1 as on /mcp

class TooLarge(errors.InvalidInput):
    """A request larger than the most a call carries: refused from its Content-Length, before its body is read."""

    http_status = 413


class TooSlow(errors.InvalidInput):
    """A request that did not arrive in time (READ_SECONDS, MIN_BODY_RATE)."""

    http_status = 408


def log(**fields) -> None:
    """One JSON line per request on stderr. Never a token: only its id, which is not secret."""
    fields = {"time": model.now_iso(), **fields}
    try:
        sys.stderr.write(json.dumps(fields) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


async def read_body(request: Request) -> bytes:
    """A call's JSON body: at most MAX_REQUEST_BYTES (a larger Content-Length is refused before any of it is read),
    arriving in time (_arriving), not cut short, and of a shape a call takes (shape.Shape: refused as soon as it
    holds more values than any call, before it is all read or parsed)."""
    from agent_mail.server.shape import Shape

    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_REQUEST_BYTES):
        raise TooLarge([(None, f"the request is larger than {MAX_REQUEST_BYTES} bytes, the most a call carries; "
                               "nothing was done.")])
    shape, chunks = Shape(), []
    async for chunk in _arriving(request, MAX_REQUEST_BYTES, None):
        shape.feed(chunk)
        chunks.append(chunk)
    return b"".join(chunks)


async def _arriving(request: Request, most: int, field: str | None):
    """The request's body, chunk by chunk as it comes: each chunk within READ_SECONDS of the last, the whole
    within READ_SECONDS plus its size at MIN_BODY_RATE (else TooSlow), at most `most` bytes (else TooLarge), not
    cut short by the client hanging up."""
    declared = request.headers.get("content-length")
    expected = int(declared) if declared is not None and declared.isdigit() else most
    deadline = time.monotonic() + READ_SECONDS + expected / MIN_BODY_RATE
    chunks, size = request.stream().__aiter__(), 0
    while True:
        try:
            with anyio.fail_after(max(0.0, min(READ_SECONDS, deadline - time.monotonic()))):
                chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise TooSlow([(field, f"the request's body did not arrive in time (a pause over {READ_SECONDS:g} s, "
                                   f"or slower than {MIN_BODY_RATE // 1024} KiB/s); nothing was done. Send it "
                                   "again.")]) from None
        except ClientDisconnect:
            raise errors.InvalidInput([(field, "the request ended before its body was complete (the connection "
                                               "closed before Content-Length bytes came); nothing was done.")]) \
                from None
        size += len(chunk)
        if size > most:
            raise TooLarge([(field, f"the request is larger than {most} bytes, the most it may carry; nothing was "
                                    "done.")])
        yield chunk


async def spool_upload(request: Request, path: str) -> None:
    """An import's upload spooled to `path`: at most MAX_IMPORT_BYTES, arriving in time (_arriving)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_IMPORT_BYTES:
        raise TooLarge([("file", f"the upload is larger than {MAX_IMPORT_BYTES} bytes, the most an import through "
                                 "a server takes; nothing was imported. Run import where the mailbox is.")])
    with open(path, "wb") as out:
        async for chunk in _arriving(request, MAX_IMPORT_BYTES, "file"):
            out.write(chunk)


# Where the protocol leaves, in a request's scope, why it cut the request off at its deadline (408 already written):
# the application's own line for that request then says so, and is its only line.
CUT_KEY = "agent_mail.cut"


def _refusal(status: int, reason: str, text: str, logged: bool = True) -> bytes:
    """A whole HTTP/1.1 answer, {error, problems} in JSON, to a request the protocol refuses before the application
    sees it; the connection closes after it. Logged here unless `logged` is False (the application logs it)."""
    if logged:
        log(status=status, exit=errors.EXIT_INVALID, refused=text)
    body = jsonout.dumps(errors.InvalidInput([(None, text)]).payload(), end="\n").encode("utf-8")
    return (f"HTTP/1.1 {status} {reason}\r\ndate: {http_date().decode()}\r\ncontent-type: {http_api.JSON}\r\n"
            f"content-length: {len(body)}\r\n"
            f"{EXIT_HEADER}: {errors.EXIT_INVALID}\r\nconnection: close\r\n\r\n").encode("ascii") + body


class Penalties:
    """Wrong tokens slowed per client address: how long to hold the answer to a refused token. The holds of one
    address follow one another (an answer no sooner than the last one's plus the next step), within
    PENALTY_MAX_SECONDS of now; only refusals are held, so a right token from the same address, and any other
    address, go through at once."""

    def __init__(self, step: float = PENALTY_SECONDS, most: float = PENALTY_MAX_SECONDS,
                 forget: float = PENALTY_FORGET_SECONDS):
        self.step, self.most, self.forget = step, most, forget
        self._by_address: dict[str, tuple[int, float, float]] = {}  # address: (refusals, last one, answered at)

    def hold(self, address: str) -> float:
        """A refusal from `address`: the seconds its answer is held."""
        now = time.monotonic()
        strikes, last, free = self._by_address.pop(address, (0, 0.0, 0.0))
        if now - last > self.forget:
            strikes, free = 0, now
        strikes += 1
        at = min(now + self.most, max(now, free) + min(self.most, self.step * 2 ** min(strikes - 1, 30)))
        self._by_address[address] = (strikes, now, at)  # last in the dict's order: the most recent
        if len(self._by_address) > PENALTY_ADDRESSES:
            for old in list(self._by_address)[:len(self._by_address) // 10]:
                del self._by_address[old]
        return max(0.0, at - now)


class Admitted:
    """What the Gate admitted a request as: the token's grant ({id, agents, supervisor}) and the waits' generation
    read before the token was looked up (a revocation after it wakes the request's wait)."""

    __slots__ = ("grant", "since")

    def __init__(self, grant: dict, since: int):
        self.grant, self.since = grant, since


class Gate:
    """ASGI middleware, the one place a request's token is read: the bearer token of a request to a guarded path
    (`guarded(path, method)`: every route that takes a token) checked before a byte of its body is read
    (`authenticate(token)` -> Admitted, errors.Forbidden when refused), so a client without a token cannot make the
    server take in a body. A refusal is 401 with WWW-Authenticate, held as Penalties say when a token was given; a
    database that cannot be reached is 503. The admission is left in the scope (GRANT_KEY, read with `admitted`),
    as Starlette's AuthenticationMiddleware leaves `auth`: every route takes its grant from there, and the token is
    looked up once per request.
    """

    GRANT_KEY = "agent_mail.grant"

    def __init__(self, app, authenticate, guarded, penalties: Penalties | None = None):
        self.app, self.authenticate, self.guarded = app, authenticate, guarded
        self.penalties = penalties or Penalties()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.guarded(scope.get("path", ""), scope.get("method", "")):
            return await self.app(scope, receive, send)
        started = time.monotonic()
        presented = _bearer(scope)
        try:
            if presented is None:
                raise errors.Forbidden("no token: send Authorization: Bearer TOKEN (the client reads "
                                       "AGENT_MAIL_TOKEN or AGENT_MAIL_TOKEN_FILE). The mailbox's operator creates "
                                       "one with agent-mail token create.", unauthenticated=True)
            scope[self.GRANT_KEY] = await self.authenticate(presented)
        except errors.AgentMailError as exc:
            refused, held = isinstance(exc, errors.Forbidden), None
            client = str((scope.get("client") or ("unknown", 0))[0])  # the proxy's, unless --forwarded-allow-ips
            if refused and presented is not None:
                held = self.penalties.hold(client)
                await anyio.sleep(held)
            status = 401 if refused else 503 if isinstance(exc, errors.StorageError) else 500
            told = exc.for_callers() if isinstance(exc, errors.StorageError) else exc  # no grant: never where the
            # database is (the log line says it)
            body = jsonout.dumps(told.payload(), end="\n").encode("utf-8")
            headers = [(b"content-type", http_api.JSON.encode()), (b"content-length", str(len(body)).encode()),
                       (EXIT_HEADER.lower().encode(), str(exc.exit_code).encode())]
            if status == 401:
                headers.append((b"www-authenticate", BEARER_CHALLENGE.encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            path = scope.get("path", "")
            command = path[len(http_api.CALL_PATH):] if path.startswith(http_api.CALL_PATH) else None
            log(method=scope.get("method"), path=path, command=command, token_id=None, status=status,
                exit=exc.exit_code, ms=round((time.monotonic() - started) * 1000, 1), client=client,
                **({"held": round(held, 3)} if held is not None else {}),
                **({} if refused else {"error": told.message, "detail": exc.message}))
            return
        return await self.app(scope, receive, send)


def admitted(scope) -> Admitted:
    """What the Gate admitted the request of `scope` as; errors.Forbidden (401) when it admitted nothing (a route
    the Gate does not guard: refused rather than served without a token)."""
    admission = scope.get(Gate.GRANT_KEY)
    if not isinstance(admission, Admitted):
        raise errors.Forbidden("no token: send Authorization: Bearer TOKEN.", unauthenticated=True)
    return admission


def _bearer(scope) -> str | None:
    """The token of a request's `Authorization: Bearer TOKEN`, or None: read here only (the Gate)."""
    for key, value in scope.get("headers", ()):
        if key == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class EdgeProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a request's head held to READ_SECONDS, its own refusals (a malformed
    request, a head over MAX_HEAD_BYTES) in JSON like the application's, and the connection closed LINGER_SECONDS
    after an answer given before the request's body was all read (a refusal: the rest is read and dropped till
    then, so the client can read the answer; closing at once could reset the connection under it)."""

    _head_timer = None
    _linger = None
    _body_timer = None
    _began = 0.0  # when the request's first byte came (or the connection opened)
    _received = 0  # bytes received since

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._began, self._received = time.monotonic(), 0
        self._head_timer = self.loop.call_later(READ_SECONDS, self._head_late)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            if self._head_timer is None:  # the next request's first byte
                self._began, self._received = time.monotonic(), 0
                self._head_timer = self.loop.call_later(READ_SECONDS, self._head_late)
            head = self.conn.trailing_data[0] + data
            end = head.find(b"\r\n\r\n")
            if end > MAX_HEAD_BYTES or (end < 0 and len(head) > MAX_HEAD_BYTES):  # h11 holds it to that only
                self._refuse(431)  # when it comes in pieces
                return
        self._received += len(data)
        super().data_received(data)
        if self._linger is not None and self.conn.their_state is not h11.SEND_BODY:  # the refused body ended
            self._linger.cancel()
            self._linger = None
        if self.conn.their_state is not h11.IDLE and self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self.conn.their_state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_timer = self.loop.call_at(self._deadline(), self._body_late)
        elif self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def connection_lost(self, exc) -> None:
        for timer in (self._head_timer, self._linger, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._linger = self._body_timer = None
        super().connection_lost(exc)

    def _deadline(self) -> float:
        """When the request being received must have come whole (in the loop's time): from its first byte,
        READ_SECONDS plus its body at MIN_BODY_RATE (its Content-Length, or for a chunked one what came so far),
        at most REQUEST_SECONDS."""
        declared = dict(self.headers or ()).get(b"content-length", b"")
        size = int(declared) if declared.isdigit() else self._received
        allowed = min(REQUEST_SECONDS, READ_SECONDS + size / MIN_BODY_RATE)
        return self.loop.time() + (self._began + allowed - time.monotonic())

    def _body_late(self) -> None:
        """The request's deadline came: still arriving (a chunked body may have earned more time since), it is
        answered 408 (when nothing was answered yet) and the connection closed; the application sees the client
        gone."""
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        deadline = self._deadline()
        if deadline > self.loop.time() + 0.01:
            self._body_timer = self.loop.call_at(deadline, self._body_late)
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            text = (f"the request did not arrive in time (within {READ_SECONDS:g} s plus its body at "
                    f"{MIN_BODY_RATE // 1024} KiB/s, at most {REQUEST_SECONDS:g} s); nothing was done. Send it again.")
            cycle.scope[CUT_KEY] = text  # the application's line for it says so (one line per request)
            self.transport.write(_refusal(408, "Request Timeout", text, logged=False))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # nothing more written for it; its reads end as the client gone
            cycle.message_event.set()
        self.transport.close()

    def _head_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # part of a request came, too slowly: say so
            self.transport.write(_refusal(408, "Request Timeout", f"the request's line and headers did not arrive "
                                                                  f"within {READ_SECONDS:g} s; nothing was done."))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._refuse(431 if len(self.conn.trailing_data[0]) > MAX_HEAD_BYTES else 400)

    def _refuse(self, status: int) -> None:
        if status == 431:
            answer = _refusal(431, "Request Header Fields Too Large", f"the request's line and headers are larger "
                                                                      f"than {MAX_HEAD_BYTES} bytes; nothing was done.")
        else:
            answer = _refusal(400, "Bad Request", "this is not a well-formed HTTP/1.1 request; nothing was done. "
                                                  f"Send POST {http_api.CALL_PATH}COMMAND with a JSON body.")
        if not self.transport.is_closing():
            self.transport.write(answer)
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing() and self._linger is None:
            self._linger = self.loop.call_later(LINGER_SECONDS, self._linger_end)

    def _linger_end(self) -> None:
        self._linger = None
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self.transport.close()


def listen_address(listen: str) -> tuple[str, int]:
    """(host, port) of --listen's HOST:PORT (a host in brackets for IPv6); InvalidInput if it is not one."""
    host, colon, port = listen.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise errors.InvalidInput([("listen", f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8025).")])
    return host, int(port)


FORWARDED_ENV = "AGENT_MAIL_FORWARDED_ALLOW_IPS"


def forwarded_from(given: str | None) -> list[str]:
    """The proxies whose X-Forwarded-For is trusted: --forwarded-allow-ips (`given`), else FORWARDED_ENV, else none.
    Each comma-separated item an address or a network, written as uvicorn compares them (it would take anything
    else for a name no connection ever has, and trust nobody without a word); InvalidInput naming the flag (or the
    variable) otherwise."""
    import ipaddress

    source, text = ("forwarded_allow_ips", given) if given is not None else (None, os.environ.get(FORWARDED_ENV, ""))
    if given is None and not text.strip():
        return []
    named = "" if source else f"{FORWARDED_ENV}: "
    trusted, problems = [], []
    for item in (part.strip() for part in text.split(",")):
        try:
            trusted.append(str(ipaddress.ip_network(item, strict=False) if "/" in item else ipaddress.ip_address(item)))
        except ValueError:
            why = ("'*' would trust the header from every client, which is what it must not be: name your proxy's "
                   "address or network" if item == "*" else
                   f"{item!r} is not an address or a network (a name is not taken: give the address your proxy "
                   "connects from, e.g. 127.0.0.1 or 10.0.0.0/8)")
            problems.append((source, f"{named}{why}; comma-separated, e.g. 127.0.0.1,::1."))
    if problems:
        raise errors.InvalidInput(problems)
    return trusted


def is_loopback(host: str) -> bool:
    """Whether `host` is a literal loopback address (127.0.0.0/8, ::1): no TLS needed there. A name, `localhost`
    included, is not taken for one: what it resolves to is /etc/hosts' or DNS's to say, not the command line's."""
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_DATE: list = [0, b""]  # (the second it was made for, the Date header's value)


def http_date() -> bytes:
    """The Date header's value for now (made once a second at most)."""
    now = int(time.time())
    if _DATE[0] != now:
        from email.utils import formatdate

        _DATE[:] = [now, formatdate(now, usegmt=True).encode("ascii")]
    return _DATE[1]


class Dated:
    """Every answer dated as it is sent (HTTP wants a Date from a server with a clock). uvicorn's own Date header is
    turned off: it is refreshed by a tick ten times a second, the only thing an idle server would do."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def dated(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), (b"date", http_date())]}
            await send(message)
        return await self.app(scope, receive, dated)
