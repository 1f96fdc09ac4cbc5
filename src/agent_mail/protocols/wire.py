"""One HTTP/1.1 exchange with an agent-mail server, for the calls an agent makes all day (standard library only).

Why not http.client for these: importing it loads the `email` parser, `re`, `urllib.parse` and more, ~15-25 ms
on this project's reference machine: more than half of a whole local `read`, which a command through a server is
measured against (issue 21: at most 1.5x a local cold start). A call here is one small POST and its answer: the
request is written whole, the answer read by its Content-Length (or chunked, as a proxy may send it, or to the
end of the connection), the connection closed. Plain http on the C socket module alone; https through `ssl`
(and `socket`, which ssl wraps), verified against the system's CAs or AGENT_MAIL_CA. Streaming (export, import)
keeps http.client, imported only there. Also the TCP keepalive (keep_probing) both ends of a connection set: the
client's calls, here and through http.client, and the server's listening socket (agent_mail.server.app).
"""

from __future__ import annotations

import os

CA_VAR = "AGENT_MAIL_CA"
MAX_HEADER_BYTES = 65_536
# A connection gone quiet is probed (TCP keepalive: after 5 s idle, every 2 s, 3 probes, and at most 11 s for data
# not acknowledged): a peer cut off by the network is noticed within about 11 s, however long a call waits. The
# same on both sides: the client's calls (here and agent_mail.protocols.http_client) and the server's connections.
KEEPALIVE = (5, 2, 3, 11_000)  # idle seconds, seconds between probes, probes, most milliseconds unacknowledged


class Lost(Exception):
    """No whole answer: `sent` says whether the request had been written whole (then it may have been carried
    out)."""

    def __init__(self, reason: str, sent: bool, lasting: bool = False):
        super().__init__(reason)
        self.reason, self.sent, self.lasting = reason, sent, lasting


def lasting(exc: BaseException) -> bool:
    """Whether asking again cannot help: the server's certificate was not trusted (an ssl.SSLCertVerificationError,
    told by its verify_code without importing ssl)."""
    return getattr(exc, "verify_code", None) is not None


class Reply:
    """The answer: its status, headers (names in lower case) and body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


def split(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of an http(s):// URL; ValueError if it is not one."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    authority, slash, path = rest.partition("/")
    authority = authority.rpartition("@")[2]  # credentials never travel in the URL
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else ""
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise ValueError(f"{url!r} names no host")
    if port_text and not port_text.isdigit():
        raise ValueError(f"{url!r} has a port that is not a number")
    port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    return scheme, host, port, ("/" + path).rstrip("/") if slash else ""


def keep_probing(sock) -> None:
    """Have the system probe `sock` when it goes quiet (KEEPALIVE), so a peer cut off by the network is an error,
    not a hang. A listening socket's accepted connections inherit it. Any socket, by the C module's constants (the
    `socket` module loads `enum`, which a plain call does without)."""
    import _socket

    idle, interval, count, user_timeout_ms = KEEPALIVE
    sock.setsockopt(_socket.SOL_SOCKET, _socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count),
                          ("TCP_USER_TIMEOUT", user_timeout_ms)):
        if hasattr(_socket, option):  # Linux; others keep the system's
            sock.setsockopt(_socket.IPPROTO_TCP, getattr(_socket, option), value)


def _connect(scheme: str, host: str, port: int, connect_timeout: float | None, timeout: float | None,
             keepalive: bool):
    """A connected socket: within `connect_timeout`, then each answer awaited up to `timeout` (None: as long as
    it takes), probed when quiet (keep_probing) if `keepalive`."""
    if scheme == "https":
        import socket as sockets
        import ssl

        context = ssl.create_default_context(cafile=os.environ.get(CA_VAR) or None)
        raw = sockets.create_connection((host, port), timeout=connect_timeout)
        try:
            if keepalive:
                keep_probing(raw)
            sock = context.wrap_socket(raw, server_hostname=host)
            sock.settimeout(timeout)
            return sock
        except BaseException:
            raw.close()
            raise
    import _socket

    problem = None
    # An ASCII name as bytes: given text, the socket module encodes it with the idna codec, which loads `re`.
    name = host.encode("ascii") if host.isascii() else host
    for family, kind, proto, _, address in _socket.getaddrinfo(name, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(connect_timeout)
            sock.connect(address)
            if keepalive:
                keep_probing(sock)
            sock.settimeout(timeout)
            return sock
        except OSError as exc:
            sock.close()
            problem = exc
    raise problem or OSError(f"no address for {host}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    text = getattr(exc, "strerror", None) or str(exc)
    return text or type(exc).__name__


def post(url: str, path: str, body: bytes, headers: dict[str, str], timeout: float | None, *,
         connect_timeout: float | None = None, keepalive: bool = False) -> Reply:
    """POST `body` to `path` under `url`; the whole answer, or Lost. `connect_timeout` (default: `timeout`) bounds
    the connecting; `timeout` each wait for the answer's bytes; `keepalive`: the connection probed when quiet
    (keep_probing)."""
    scheme, host, port, prefix = split(url)
    shown_host = f"[{host}]" if ":" in host else host
    default = 443 if scheme == "https" else 80
    lines = [f"POST {prefix}{path} HTTP/1.1", f"Host: {shown_host}" + ("" if port == default else f":{port}"),
             f"Content-Length: {len(body)}", "Connection: close", "Accept-Encoding: identity",
             *(f"{name}: {value}" for name, value in headers.items())]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    sent = False
    try:
        sock = _connect(scheme, host, port, timeout if connect_timeout is None else connect_timeout, timeout,
                        keepalive)
    except (OSError, ValueError) as exc:
        raise Lost(_reason(exc), sent=False, lasting=lasting(exc)) from None
    try:
        sock.sendall(request)
        sent = True
        return read_reply(sock)
    except (OSError, ValueError) as exc:
        raise Lost(_reason(exc), sent=sent) from None
    finally:
        sock.close()


class _Reader:
    """The answer's bytes as they arrive: the pieces received are kept in a list and joined once, when a part of
    the answer is taken (a head, a chunk, the body), so reading N bytes copies each of them a bounded number of
    times. Growing one bytes object piece by piece (`buffer += piece`) copied the whole of it at every recv:
    quadratic, 22.7 s for a 25 MB attachment (issue 27)."""

    def __init__(self, sock):
        self.sock, self.pieces, self.size = sock, [], 0

    def fill(self) -> bool:
        piece = self.sock.recv(65_536)
        if piece:
            self.pieces.append(piece)
            self.size += len(piece)
        return bool(piece)

    def _joined(self) -> bytes:
        if len(self.pieces) != 1:
            self.pieces = [b"".join(self.pieces)]
        return self.pieces[0]

    def _keep(self, rest: bytes) -> None:
        self.pieces, self.size = ([rest] if rest else []), len(rest)

    def until(self, mark: bytes, limit: int) -> bytes:
        while True:
            buffer = self._joined() if self.pieces else b""
            if mark in buffer:
                break
            if self.size > limit:
                raise ValueError("the answer's head is too long")
            if not self.fill():
                raise ValueError("the connection closed before the answer was whole")
        head, _, rest = buffer.partition(mark)
        self._keep(rest)
        return head

    def exactly(self, size: int) -> bytes:
        while self.size < size:
            if not self.fill():
                raise ValueError("the connection closed before the answer was whole")
        buffer = self._joined() if self.pieces else b""
        if len(buffer) == size:
            self._keep(b"")
            return buffer
        self._keep(buffer[size:])
        return buffer[:size]

    def rest(self) -> bytes:
        while self.fill():
            pass
        data = self._joined() if self.pieces else b""
        self._keep(b"")
        return data


def read_reply(sock) -> Reply:
    """The answer read from `sock` (anything with recv(size)): its head, then its body framed as the head says;
    ValueError when it is no HTTP answer or ends early."""
    reader = _Reader(sock)
    while True:
        head = reader.until(b"\r\n\r\n", MAX_HEADER_BYTES).decode("latin-1")
        status_line, *header_lines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP answer ({status_line[:40]!r})")
        status = int(parts[1])
        if not 100 <= status < 200 or status == 101:
            break  # an interim 1xx answer is skipped; the real one follows
    headers: dict[str, str] = {}
    for line in header_lines:
        name, colon, value = line.partition(":")
        if colon:
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    if status in (204, 304):
        return Reply(status, headers, b"")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = bytearray()
        while True:
            size_line = reader.until(b"\r\n", 1024).split(b";", 1)[0].strip()
            size = int(size_line, 16)
            if size == 0:  # the last chunk: any trailers after it are not ours (the connection closes)
                return Reply(status, headers, bytes(body))
            body += reader.exactly(size)
            reader.exactly(2)
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise ValueError("the answer's Content-Length is not a number")
        return Reply(status, headers, reader.exactly(int(length)))
    return Reply(status, headers, reader.rest())
