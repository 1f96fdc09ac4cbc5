"""agent_mail.protocols.wire: the client's one HTTP/1.1 exchange, against answers shaped every way a server or a
proxy in front of one may shape them (a socket server in the test writes them byte for byte), over TLS with a CA of
the test's own, and what it imports."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import threading

import pytest
from tests.lib.cli import process_env

from agent_mail.protocols import wire


class Canned:
    """A loopback server that reads one request and writes `answer` (bytes, or a function of the request)."""

    def __init__(self, answer, tls: ssl.SSLContext | None = None):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer, self.tls, self.requests = answer, tls, []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            connection, _ = self.listener.accept()
        except OSError:
            return
        if self.tls is not None:
            try:
                connection = self.tls.wrap_socket(connection, server_side=True)
            except (ssl.SSLError, OSError):
                connection.close()
                return
        with connection:
            data = b""
            while b"\r\n\r\n" not in data:
                data += connection.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int([line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(
                b"content-length")][0])
            while len(body) < length:
                body += connection.recv(65536)
            self.requests.append((head.decode("latin-1"), body))
            answer = self.answer(head, body) if callable(self.answer) else self.answer
            connection.sendall(answer)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.listener.close()
        self.thread.join(timeout=5)


@pytest.fixture
def canned():
    made = []

    def make(answer, tls=None) -> Canned:
        made.append(Canned(answer, tls))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.mark.fast
def test_the_request_is_one_post_with_its_length_and_headers(canned):
    server = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Agent-Mail-Exit: 0\r\n\r\n{}")
    reply = wire.post(server.url + "/base/", "/v1/call/read", b'{"agent": "a:b"}', {"Authorization": "Bearer t"}, 5)
    assert (reply.status, reply.body, reply.header("X-AGENT-MAIL-EXIT")) == (200, b"{}", "0")
    head, body = server.requests[0]
    assert head.startswith("POST /base/v1/call/read HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}" in head and "Content-Length: 16" in head
    assert "Authorization: Bearer t" in head and "Connection: close" in head
    assert body == b'{"agent": "a:b"}'


@pytest.mark.fast
@pytest.mark.parametrize("answer, body", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nX-T: 1\r\n\r\n",
     b"abcdefg"),  # as a proxy may re-frame it, with an extension and a trailer
    (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/html\r\n\r\n<html>down</html>", b"<html>down</html>"),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nyes", b"yes"),
    (b"HTTP/1.0 204 No Content\r\n\r\n", b""),
])
def test_answers_framed_every_way_are_read_whole(canned, answer, body):
    server = canned(answer)
    assert wire.post(server.url, "/x", b"", {}, 5).body == body


@pytest.mark.fast
@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # cut off mid-body
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nz\r\n",  # not a chunk size
    b"SSH-2.0-OpenSSH\r\n\r\n",  # not HTTP
    b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000,  # a head that never ends
    b"",  # closed without a word
])
def test_an_answer_cut_short_or_not_http_is_lost_after_sending(canned, answer):
    server = canned(answer)
    with pytest.raises(wire.Lost) as lost:
        wire.post(server.url, "/x", b"{}", {}, 5)
    assert lost.value.sent is True  # the request went out whole: the call may have been carried out


@pytest.mark.fast
def test_nobody_listening_is_lost_before_sending():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    with pytest.raises(wire.Lost) as lost:
        wire.post(f"http://127.0.0.1:{port}", "/x", b"{}", {}, 5)
    assert lost.value.sent is False and "refused" in lost.value.reason.lower()


@pytest.mark.fast
def test_a_server_that_never_answers_times_out(canned):
    listener = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel's backlog), never answers
    try:
        with pytest.raises(wire.Lost) as lost:
            wire.post(f"http://127.0.0.1:{listener.getsockname()[1]}", "/x", b"{}", {}, 0.5)
        assert lost.value.sent is True and lost.value.reason == "timed out"
    finally:
        listener.close()


@pytest.mark.fast
@pytest.mark.parametrize("url, parts", [
    ("http://127.0.0.1:8025", ("http", "127.0.0.1", 8025, "")),
    ("HTTPS://mail.example.com/", ("https", "mail.example.com", 443, "")),
    ("https://mail.example.com/team/a", ("https", "mail.example.com", 443, "/team/a")),
    ("http://[::1]:9000/x/", ("http", "::1", 9000, "/x")),
    ("http://user:secret@host:81", ("http", "host", 81, "")),
])
def test_urls_are_split_as_written(url, parts):
    assert wire.split(url) == parts


@pytest.mark.fast
@pytest.mark.parametrize("url", ["ftp://host", "http://", "http://host:port", "host:8025"])
def test_what_is_not_an_http_url_is_refused(url):
    with pytest.raises(ValueError):
        wire.split(url)


@pytest.mark.fast
def test_tls_is_verified_against_the_ca_named(canned, tmp_path, monkeypatch):
    cert, key = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                           "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                          capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr.decode()[-200:]}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    monkeypatch.delenv(wire.CA_VAR, raising=False)
    unknown = canned(answer, tls=context)
    with pytest.raises(wire.Lost) as lost:  # a CA nobody named: refused before anything is sent
        wire.post(f"https://127.0.0.1:{unknown.port}", "/x", b"{}", {}, 5)
    assert lost.value.sent is False and "CERTIFICATE_VERIFY_FAILED" in lost.value.reason
    monkeypatch.setenv(wire.CA_VAR, cert)
    trusted = canned(answer, tls=context)
    assert wire.post(f"https://127.0.0.1:{trusted.port}", "/x", b"{}", {}, 5).body == b"ok"


def test_a_plain_call_imports_no_http_client_email_re_or_json():
    """What makes a command through a server cheap to start: one exchange on the C socket module."""
    code = ("import sys\nfrom agent_mail.protocols import wire\n"
            "try:\n    wire.post('http://127.0.0.1:9', '/x', b'', {}, 1)\nexcept wire.Lost:\n    pass\n"
            "print(sorted({'http.client', 'email', 'json', 're', 'enum', 'ssl', 'socket', 'urllib.parse'} & "
            "set(sys.modules)))")
    done = subprocess.run([sys.executable, "-S", "-c", code], env=process_env(), capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.sqlite_only
def test_everyday_commands_through_a_server_import_no_http_client_json_or_re(mailbox_path):
    """A command through a server is measured against a local cold start (issue 21: at most 1.5x): read, send,
    status, ack and a watch's look load neither http.client (its email parser) nor json, re or enum."""
    from tests.lib.serving import Server

    server = Server(str(mailbox_path))
    try:
        token = server.token("--agent", "*")
        code = ("import sys\nfrom agent_mail.cli.main import main\ncode = main(sys.argv[1:])\n"
                "print(code, sorted({'http.client', 'email', 'json', 're', 'enum', 'urllib.parse', 'base64', "
                "'ssl', 'typing'} & set(sys.modules)), file=sys.stderr)")
        for argv in (["send", "--from", "a:x", "--to", "b:y", "--subject", "plain", "--body", "text"],
                     ["read", "b:y", "--no-mark-read"], ["status", "--agent", "b:y"], ["ack", "b:y", "--all"],
                     ["watch", "b:y", "--once"]):
            done = subprocess.run([sys.executable, "-S", "-c", code, *argv], capture_output=True, text=True,
                                  env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token))
            assert done.stderr.strip().splitlines()[-1] == "0 []", (argv, done.stderr)
    finally:
        server.stop()


class _Counted(bytes):
    """A piece of an answer as a socket gives it, counting the bytes copied by concatenating onto it
    (`buffer += piece` with a bytes buffer calls piece.__radd__ first: a subclass's reflected method wins)."""

    copied = [0, 0]  # concatenations, bytes they copied

    def __radd__(self, other):
        _Counted.copied[0] += 1
        _Counted.copied[1] += len(other) + len(self)
        return bytes(other) + bytes(self)


class _Pieces:
    def __init__(self, answer: bytes, size: int):
        self.pieces = [_Counted(answer[at:at + size]) for at in range(0, len(answer), size)]
        self.calls = 0

    def recv(self, _most: int) -> bytes:
        self.calls += 1
        return self.pieces.pop(0) if self.pieces else b""


@pytest.mark.fast
@pytest.mark.parametrize("framing", ["length", "chunked", "to the end"])
def test_a_large_answer_is_read_in_linear_work(framing):
    """Issue 27, finding 5: an attachment saved through a server took 22.7 s for 25 MB, the reader growing one
    bytes object by every recv (quadratic). Counted, not timed: reading 24 MB in 64 KiB pieces copies no piece
    onto a growing buffer, and takes one recv per piece."""
    body = bytes(range(256)) * (24 * 4096)  # 24 MiB
    if framing == "length":
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    elif framing == "chunked":
        answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
            b"%x\r\n%s\r\n" % (len(body[at:at + 1_000_000]), body[at:at + 1_000_000])
            for at in range(0, len(body), 1_000_000)) + b"0\r\n\r\n"
    else:
        answer = b"HTTP/1.0 200 OK\r\n\r\n" + body
    sock = _Pieces(answer, 65_536)
    pieces = len(sock.pieces)
    _Counted.copied[:] = [0, 0]
    reply = wire.read_reply(sock)
    assert reply.status == 200 and reply.body == body
    assert _Counted.copied == [0, 0]  # `buffer += piece` would be ~400 concatenations copying ~5 GB
    assert sock.calls <= pieces + 1
