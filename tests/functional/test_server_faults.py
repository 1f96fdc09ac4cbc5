"""`agent-mail serve` under faults, with real processes, on SQLite and PostgreSQL (issue 21): the server killed
with SIGKILL and restarted under blocked watches and looping senders, PostgreSQL restarted under the server, a
client cut off from the server by the network, and malformed, oversized, slow and truncated requests. Every send
reported ok is stored once, every failure is a clear JSON error, nothing is half done, and the server stays up."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

from tests.lib import twohosts
from tests.lib.cli import am_process, json_of, process_env
from tests.lib.mailbox import raw_db
from tests.lib.serving import Server
from tests.lib.tools import unavailable
from tests.lib.waiting import armed, disarmed, until

pytestmark = [pytest.mark.backends, pytest.mark.timeout(120)]

READ_SECONDS = 2  # the server's limit for a request to arrive (AGENT_MAIL_SERVE_READ_SECONDS), short for the tests


@pytest.fixture
def server_env():
    """The `server` fixture's server, with READ_SECONDS as its limit."""
    return {"AGENT_MAIL_SERVE_READ_SECONDS": str(READ_SECONDS)}


def _clear_error(stderr: bytes | str, *secrets: str) -> dict:
    """The one JSON error a failed command prints: {error, ...}, no traceback, no secret."""
    text = stderr.decode() if isinstance(stderr, bytes) else stderr
    assert "Traceback" not in text, text
    assert not any(secret in text for secret in secrets), text
    error = json.loads(text)
    assert isinstance(error["error"], str) and error["error"], error
    return error


def _stored(mailbox, recipient: str) -> dict[str, int]:
    """subject -> how many messages to `recipient` the mailbox holds with it."""
    db = raw_db(mailbox)
    try:
        rows = db.execute("SELECT subject, COUNT(*) FROM messages WHERE recipient = ? GROUP BY subject",
                          (recipient,)).fetchall()
    finally:
        db.close()
    return {subject: count for subject, count in rows}


def _watch(url: str, token: str, agent: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", agent], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, **env))


@contextmanager
def _ended(*procs):
    """Kill what is still running on the way out."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


class Senders:
    """Threads each running `agent-mail send` processes in a loop through the server, every subject unique;
    what each printed and its exit code recorded."""

    def __init__(self, url: str, token: str, names: list[str], to: str, **env: str):
        self.env = process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, **env)
        self.to, self.done = to, threading.Event()
        self.results: list[tuple[str, int, bytes, bytes]] = []
        self.threads = [threading.Thread(target=self._loop, args=(name,), daemon=True) for name in names]
        for thread in self.threads:
            thread.start()

    def _loop(self, name: str) -> None:
        i = 0
        while not self.done.is_set():
            subject = f"{name}-{i}"
            proc = am_process("send", "--from", f"senders:{name}", "--to", self.to, "--subject", subject,
                              env=self.env)
            self.results.append((subject, proc.returncode, proc.stdout, proc.stderr))
            i += 1

    def stop(self) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(timeout=90)


def test_sigkill_and_restart_under_watches_and_senders(mailbox_path):
    """The server SIGKILLed mid-run and restarted on its port after a moment, under 10 blocked watches and 4
    looping senders: every send reported ok is stored once, every failure is one clear JSON error and stored
    nothing, every watch sees on its next answer the mail that arrived while the server was down.

    A send carries an idempotency key and is sent again with it while no answer comes, for the client's
    reconnect window: two senders ride out the restart that way (a send cut off after its commit is answered by
    the restarted server with what was stored, not stored twice); two have a window shorter than the outage
    and fail, clearly: "Nothing was sent" having stored nothing, or (a send cut off after it went out, the
    inherent ambiguity when no answer can come back) "may have been stored", stored at most once."""
    server = Server(str(mailbox_path))
    token = server.token("--agent", "*")
    watchers = [f"team:w{n}" for n in range(10)]
    watches = [_watch(server.url, token, agent, AGENT_MAIL_RECONNECT_SECONDS="60") for agent in watchers]
    patient = impatient = None
    try:
        with _ended(*watches):
            armed(watchers, server.mailbox)
            patient = Senders(server.url, token, ["p0", "p1"], "sink:all", AGENT_MAIL_RECONNECT_SECONDS="60")
            impatient = Senders(server.url, token, ["i0", "i1"], "sink:all", AGENT_MAIL_RECONNECT_SECONDS="1")
            until(lambda: len(patient.results) + len(impatient.results) >= 8, 30, "8 sends before the kill")
            server.kill()
            down_at = time.monotonic()
            before = len(patient.results) + len(impatient.results)
            for agent in watchers:  # what arrives while the server is down, written straight to the mailbox
                json_of(server.direct("send", "--from", "ops:lead", "--to", agent, "--subject", f"while down {agent}"))
            time.sleep(max(0.0, 3.0 - (time.monotonic() - down_at)))  # longer than the impatient senders' window
            assert all(watch.poll() is None for watch in watches)  # waiting for the server, not failed
            server.restart()
            until(lambda: len(patient.results) + len(impatient.results) >= before + 8, 30, "8 sends after it")
            patient.stop()
            impatient.stop()
            for agent, watch in zip(watchers, watches, strict=True):
                out, err = watch.communicate(timeout=60)
                assert watch.returncode == 0, err
                assert [m["subject"] for m in json.loads(out)["messages"]] == [f"while down {agent}"]
    finally:
        for senders in (patient, impatient):
            if senders is not None:
                senders.stop()
        server.stop()
    stored = _stored(mailbox_path, "sink:all")
    results = patient.results + impatient.results
    ok = [subject for subject, code, _, _ in results if code == 0]
    failed = [(subject, code, err) for subject, code, _, err in results if code != 0]
    assert all(code == 0 for _, code, _, _ in patient.results), patient.results  # rode out the restart
    assert failed and len(ok) > before  # the impatient gave up while it was down; all went on after it
    for subject in ok:
        assert stored.get(subject) == 1, (subject, stored.get(subject))
    unsure = []
    for subject, code, err in failed:
        error = _clear_error(err, token)
        assert code == 1 and "cannot reach" in error["error"], error
        if "Nothing was sent" in error["error"]:
            assert subject not in stored, (subject, error)
        else:  # cut off after it went out, and the server not back within the window: at most once, and said so
            assert "may have been stored (once" in error["error"], error
            assert stored.get(subject, 0) <= 1, (subject, stored.get(subject))
            unsure.append(subject)
    assert set(stored) <= set(ok) | set(unsure)  # nothing stored that no sender was told of
    assert token not in b"".join(server.earlier_logs).decode()


def _raw(port: int, data: bytes, *, then_close: bool = False, timeout: float = 10) -> tuple[int, dict, bytes]:
    """Send `data` on a fresh connection; the status, headers and body of the answer (0 when none came)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        if then_close:
            sock.shutdown(socket.SHUT_WR)
        return _answer(sock)


def _answer(sock: socket.socket, until_closed: bool = False) -> tuple[int, dict, bytes]:
    """The answer on `sock`: read to its Content-Length, or (`until_closed`) until the server closes."""
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
            head, _, body = received.partition(b"\r\n\r\n")
            length = [line.split(b":")[1] for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if not until_closed and length and len(body) >= int(length[0]):
                break
    except (ConnectionResetError, TimeoutError):
        pass
    if not received:
        return 0, {}, b""
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def _post(path: str, body: bytes, token: str, *, length: int | None = None, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body) if length is None else length}\r\n{extra}\r\n").encode() + body


def _refused(answer: tuple[int, dict, bytes], status: int, token: str) -> dict:
    code, headers, body = answer
    assert code == status, answer
    assert headers.get("content-type", "").startswith("application/json"), headers
    document = json.loads(body)
    assert isinstance(document["error"], str) and isinstance(document["problems"], list), document
    assert "Traceback" not in body.decode() and token not in body.decode()
    return document


def _still_serving(server: Server, token: str, subject: str) -> None:
    connection_answer = _raw(server.port, b"GET /v1/health HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
    assert connection_answer[0] == 200 and json.loads(connection_answer[2])["ok"] is True
    sent = json_of(server.client(token, "send", "--from", "a:x", "--to", "b:y", "--subject", subject))
    assert sent["delivered"] == 1


def test_malformed_oversized_slow_and_truncated_requests_get_clear_4xx_and_the_server_stays_up(server):
    from agent_mail.server.edge import MAX_HEAD_BYTES, MAX_REQUEST_BYTES

    token = server.token("--agent", "a:x")
    port = server.port
    # Malformed JSON, a body that is not an object, wrong types, an unknown argument, an unknown command.
    for path, body, status in (("/v1/call/read", b"{not json", 400), ("/v1/call/read", b"[1, 2]", 400),
                               ("/v1/call/read", b'{"agent": 5}', 400), ("/v1/call/send", b'{"from": "a:x", '
                                                                           b'"to": 7, "subject": ["x"]}', 400),
                               ("/v1/call/read", b'{"agent": "a:x", "nope": 1}', 400),
                               ("/v1/call/nonsense", b"{}", 404)):
        document = _refused(_raw(port, _post(path, body, token, extra="Connection: close\r\n")), status, token)
        assert document["problems"], document
        _still_serving(server, token, f"after {path} {body[:10]!r}")
    # A path the API has not, a method a path is not called with.
    for data, status in ((b"GET /nope HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", 404),
                         (b"GET /v1/call/read HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n", 405)):
        assert _refused(_raw(port, data), status, token)["problems"]
    # Not HTTP at all.
    _refused(_raw(port, b"\x16\x03\x01 this is no request\r\n\r\n"), 400, token)
    _still_serving(server, token, "after garbage")
    # Oversized: refused from its Content-Length before the body is read (the rest is never sent).
    started = time.monotonic()
    document = _refused(_raw(port, _post("/v1/call/send", b'{"from": "a:x"', token, length=MAX_REQUEST_BYTES + 1)),
                        413, token)
    assert "larger than" in document["error"] and time.monotonic() - started < READ_SECONDS  # not read first
    _still_serving(server, token, "after oversized")
    # Headers too large.
    document = _refused(_raw(port, _post("/v1/call/read", b"{}", token, extra=f"X-Big: {'x' * MAX_HEAD_BYTES}\r\n")),
                        431, token)
    assert str(MAX_HEAD_BYTES) in document["error"]
    _still_serving(server, token, "after big headers")
    # A body slower than the limit (slowloris): 408 and the connection closed, however long the client dribbles.
    with socket.create_connection(("127.0.0.1", port), timeout=READ_SECONDS + 10) as sock:
        body = json.dumps({"from": "a:x", "to": "b:y", "subject": "slow"}).encode()
        sock.sendall(_post("/v1/call/send", b"", token, length=len(body)))
        started = time.monotonic()
        try:
            for byte in body:
                sock.sendall(bytes([byte]))
                time.sleep(0.25)
                if time.monotonic() - started > READ_SECONDS + 5:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        document = _refused(_answer(sock, until_closed=True), 408, token)  # and closed, not held
        assert time.monotonic() - started < READ_SECONDS + 5
    _still_serving(server, token, "after a slow body")
    # A head slower than the limit: 408 too.
    with socket.create_connection(("127.0.0.1", port), timeout=READ_SECONDS + 10) as sock:
        sock.sendall(b"POST /v1/call/read HTTP/1.1\r\nHost: test\r\n")
        started = time.monotonic()
        try:
            for byte in b"X-Slow: " + b"y" * 100:
                sock.sendall(bytes([byte]))
                time.sleep(0.25)
                if time.monotonic() - started > READ_SECONDS + 5:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        _refused(_answer(sock, until_closed=True), 408, token)
        assert time.monotonic() - started < READ_SECONDS + 5
    _still_serving(server, token, "after a slow head")
    # An import's upload that stalls (an operator's: any other token is refused before its upload): 408 naming the
    # file, however large it said it was.
    operator = server.token("--agent", "*")
    with socket.create_connection(("127.0.0.1", port), timeout=READ_SECONDS + 10) as sock:
        sock.sendall(_post("/v1/import", b'{"kind": ', operator, length=10**9))
        started = time.monotonic()
        document = _refused(_answer(sock), 408, operator)
        assert document["problems"][0]["field"] == "file" and time.monotonic() - started < READ_SECONDS + 5
    _still_serving(server, token, "after a stalled upload")
    # Truncated: a Content-Length larger than what comes, then the connection closed.
    whole = json.dumps({"from": "a:x", "to": "b:y", "subject": "truncated"}).encode()
    assert _raw(port, _post("/v1/call/send", whole[:20], token, length=len(whole)), then_close=True)[0] in (0, 400)
    _still_serving(server, token, "after a truncated body")
    # Many connections opened and left idle: the server still answers, and closes them after the limit.
    idle = [socket.create_connection(("127.0.0.1", port), timeout=READ_SECONDS + 10) for _ in range(200)]
    try:
        _still_serving(server, token, "beside idle connections")
        for sock in idle:
            assert sock.recv(1) == b""  # closed by the server, not held forever
    finally:
        for sock in idle:
            sock.close()
    _still_serving(server, token, "after the idle connections")
    stored = _stored(server.mailbox, "b:y")
    assert "slow" not in stored and "truncated" not in stored
    code, log = server.stop()
    lines = [json.loads(line) for line in log.splitlines()]
    assert not [line for line in lines if line.get("status", 0) >= 500], log
    assert any(line.get("status") == 400 and line.get("path") == "/v1/call/send" for line in lines)  # the truncated
    assert token not in log


@pytest.mark.sqlite_only  # run once: it serves a PostgreSQL cluster of its own, whatever the backing of the rest
def test_postgresql_restarted_under_the_server(private_postgres):
    """PostgreSQL restarted (pg_ctl restart -m fast) under a server with blocked watches: the watches wait on and
    are woken by sends after it; stopped for a while: calls get a clear JSON error (exit 1, HTTP 503, never a 500),
    store nothing, and a send whose window outlasts the outage goes through once it is back; nothing is lost."""
    mailbox = f"{private_postgres.url}?schema=faults"
    server = Server(mailbox)
    token = server.token("--agent", "*")
    watchers = [f"team:w{n}" for n in range(3)]
    try:
        watches = [_watch(server.url, token, agent, AGENT_MAIL_RECONNECT_SECONDS="60") for agent in watchers]
        with _ended(*watches):
            armed(watchers, server.mailbox)
            private_postgres.restart()
            time.sleep(1.0)
            assert all(watch.poll() is None for watch in watches)  # still waiting, not failed
            for agent in watchers:
                json_of(server.client(token, "send", "--from", "ops:lead", "--to", agent, "--subject", "after restart"))
            for watch in watches:
                out, err = watch.communicate(timeout=30)
                assert watch.returncode == 0, err
                assert [m["subject"] for m in json.loads(out)["messages"]] == ["after restart"]
        # Stopped for a while: clear errors, nothing stored; a patient send waits for it and goes through once.
        watch = _watch(server.url, token, "team:late", AGENT_MAIL_RECONNECT_SECONDS="60")
        with _ended(watch):
            armed("team:late", server.mailbox)
            private_postgres.stop()
            patient = subprocess.Popen([sys.executable, "-m", "agent_mail", "send", "--from", "ops:lead", "--to",
                                        "team:late", "--subject", "patient"], stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE,
                                       env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token,
                                                       AGENT_MAIL_RECONNECT_SECONDS="60"))
            with _ended(patient):
                for argv in (("send", "--from", "ops:lead", "--to", "team:late", "--subject", "during the outage"),
                             ("read", "team:late"), ("status",)):
                    proc = server.client(token, *argv, AGENT_MAIL_RECONNECT_SECONDS="1")
                    assert proc.returncode == 1 and proc.stdout == b"", (argv, proc.stderr)
                    # the token cannot be looked up either: the caller is told no more than that (the log is)
                    assert "cannot be reached" in _clear_error(proc.stderr, token)["error"], proc.stderr
                assert watch.poll() is None and patient.poll() is None
                private_postgres.start()
                out, err = patient.communicate(timeout=60)
                assert patient.returncode == 0, err
                out, err = watch.communicate(timeout=30)
                assert watch.returncode == 0, err
                assert [m["subject"] for m in json.loads(out)["messages"]] == ["patient"]
        late = json_of(server.client(token, "read", "team:late", "--all"))
        assert [m["subject"] for m in late["messages"]] == ["patient"]  # once; the refused one not at all
        for agent in watchers:
            assert [m["subject"] for m in json_of(server.client(token, "read", agent, "--all"))["messages"]] == \
                ["after restart"]
    finally:
        code, log = server.stop()
    lines = [json.loads(line) for line in log.splitlines()]
    assert any(line.get("status") == 503 for line in lines), log
    assert not [line for line in lines if line.get("status", 0) >= 500 and line["status"] != 503], log
    assert token not in log and "Traceback" not in log


class HoldingRelay(twohosts.Relay):
    """twohosts' relay, able to hold the server's answers back (`holding` set) as if they were lost on the way:
    the call has been carried out, the client has not heard."""

    def __init__(self, *args, **kwargs):
        self.holding = threading.Event()
        super().__init__(*args, **kwargs)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        from_server = source.getpeername() == self.target
        try:
            while data := source.recv(65536):
                while from_server and self.holding.is_set():
                    time.sleep(0.05)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


@pytest.fixture
def partitionable(server, tmp_path, monkeypatch):
    """Host a, in a network namespace of its own, reaching the server only through a relay on its link."""
    problem = twohosts.namespaces_problem()
    if problem:
        unavailable(f"the partition test: {problem}")
    monkeypatch.setattr(twohosts, "Relay", HoldingRelay)
    with twohosts.TwoHosts(str(tmp_path), server.url, "unused", server=("127.0.0.1", server.port)) as made:
        host = made["a"]
        host.url = f"http://{host.server}:{server.port}"
        yield host, made.relays[0]


def test_a_partitioned_client_gets_a_clear_error_and_nothing_is_half_done(server, partitionable, request):
    """A client in a network namespace cut off from the server (its link down) mid-watch and mid-send: the send
    whose answer was lost notices within the keepalive's ~11 s and sends again with its idempotency key until the
    link is back (then it is stored once: the server answers the repeat with what it stored); a send started in
    the partition with a short window fails within CONNECT_SECONDS + the window, clearly, having stored nothing;
    the server ends the wait of the client it can no longer reach (its keepalive); the watch reconnects when the
    link returns and sees the mail that arrived meanwhile. (The watch reaches a second server listening on the
    link itself, without the relay, whose connection to the server would not be cut.)"""
    from agent_mail.protocols.http_client import CONNECT_SECONDS

    host, relay = partitionable
    token = server.token("--agent", "*")
    on_the_link = Server(server.mailbox, host=host.server)
    request.addfinalizer(on_the_link.stop)
    watch = host.popen("watch", "team:alice", AGENT_MAIL_DB=on_the_link.url, AGENT_MAIL_TOKEN=token,
                       AGENT_MAIL_RECONNECT_SECONDS="60")
    with _ended(watch):
        armed("team:alice", server.mailbox)
        relay.holding.set()  # what the server answers from now on is lost on the way
        held = host.popen("send", "--from", "team:alice", "--to", "team:bob", "--subject", "cut mid-send",
                          AGENT_MAIL_TOKEN=token, AGENT_MAIL_RECONNECT_SECONDS="60")
        with _ended(held):
            until(lambda: "cut mid-send" in _stored(server.mailbox, "team:bob"), 30,
                  "the send was never carried out")  # carried out; its answer held back
            host.partition()
            cut_at = time.monotonic()
            try:
                started = time.monotonic()
                refused = host.run("send", "--from", "team:alice", "--to", "team:bob", "--subject", "never",
                                   AGENT_MAIL_TOKEN=token, AGENT_MAIL_RECONNECT_SECONDS="1")
                assert time.monotonic() - started < CONNECT_SECONDS + 1 + 5, refused.stderr
                assert refused.returncode == 1 and refused.stdout == "", refused.stderr
                assert "Nothing was sent" in _clear_error(refused.stderr, token)["error"]
                disarmed("team:alice", server.mailbox, timeout=max(1.0, 25 - (time.monotonic() - cut_at)))
                # the server let the unreachable wait go; its client never said it stopped: stale, not released
                assert _alice(server)["watch_state"] == "stale"
                json_of(server.direct("send", "--from", "team:bob", "--to", "team:alice", "--subject", "meanwhile"))
                time.sleep(max(0.0, 15 - (time.monotonic() - cut_at)))  # the keepalive noticed the dead link
                assert held.poll() is None and watch.poll() is None  # both waiting for the link, neither failed
            finally:
                relay.holding.clear()
                host.partition(down=False)
            back_at = time.monotonic()
            out, err = watch.communicate(timeout=60)
            assert watch.returncode == 0, err
            assert [m["subject"] for m in json.loads(out)["messages"]] == ["meanwhile"]
            sent_out, sent_err = held.communicate(timeout=60)
            assert held.returncode == 0, sent_err
            assert time.monotonic() - back_at < CONNECT_SECONDS + 5
    on_the_link_log = on_the_link.stop()[1]
    stored = _stored(server.mailbox, "team:bob")
    assert stored == {"cut mid-send": 1}  # once, though sent twice; "never" not at all
    receipt = json.loads(sent_out)
    assert receipt["delivered"] == 1
    assert receipt["id"] == json_of(server.direct("read", "team:bob"))["messages"][0]["id"]
    code, log = server.stop()
    sends = [line for line in map(json.loads, log.splitlines()) if line.get("command") == "send"]
    assert [line["status"] for line in sends] == [200, 200], log  # carried out, then its repeat answered
    assert token not in log and token not in on_the_link_log


def _alice(server: Server) -> dict:
    return json_of(server.direct("status", "--agent", "team:alice"))["agents"][0]


def test_a_send_repeated_with_its_idempotency_key_is_stored_once(server):
    """What the client's repeat of a send whose answer was lost relies on, asked of the server directly."""
    token = server.token("--agent", "a:x")
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    key = "0b7e4f9a-3c1d-4e2f-9a8b-7c6d5e4f3a2b"
    send = {"from": "a:x", "to": ["b:y", "c:z"], "subject": "once", "idempotency_key": key}
    first_status, first = server.raw("/v1/call/send", json.dumps(send).encode(), auth)
    again_status, again = server.raw("/v1/call/send", json.dumps(send).encode(), auth)
    assert first_status == again_status == 200, (first, again)
    first, again = json.loads(first), json.loads(again)
    assert again["batch_id"] == first["batch_id"] == key
    assert [(d["recipient"], d["id"], d["status"]) for d in again["deliveries"]] == \
        [(d["recipient"], d["id"], d["status"]) for d in first["deliveries"]]
    assert set(again) == set(first)  # the receipt a send gives, not another document
    assert _stored(server.mailbox, "b:y") == {"once": 1} and _stored(server.mailbox, "c:z") == {"once": 1}
    for changed, field in (({**send, "subject": "other"}, "idempotency_key"),
                           ({**send, "idempotency_key": "not-a-uuid"}, "idempotency_key")):
        status, answer = server.raw("/v1/call/send", json.dumps(changed).encode(), auth)
        assert status == 400 and json.loads(answer)["problems"][0]["field"] == field, answer
    assert _stored(server.mailbox, "b:y") == {"once": 1}


@pytest.mark.sqlite_only  # the client's own reckoning; the backing does not enter into it
def test_a_watch_rides_out_one_restart_after_another_and_a_wrong_server_fails_at_once(mailbox_path, tmp_path):
    """RECONNECT_SECONDS is time without a server, counted afresh for each outage: a watch that waited through
    one restart rides out the next one too. And what answers but is no agent-mail server (a web server's
    page) is an error at once, not something to ask again for a minute."""
    import http.server

    server = Server(str(mailbox_path))
    token = server.token("--agent", "*")
    watch = _watch(server.url, token, "team:alice", AGENT_MAIL_RECONNECT_SECONDS="3")  # each outage ~1.7 s
    try:
        with _ended(watch):
            armed("team:alice", server.mailbox)
            for _ in range(2):
                server.kill()
                time.sleep(1.0)
                server.restart()
                time.sleep(2.5)  # more than the window since the outage began: waiting on the new server
                assert watch.poll() is None, watch.communicate()
            json_of(server.direct("send", "--from", "team:bob", "--to", "team:alice", "--subject", "twice restarted"))
            out, err = watch.communicate(timeout=30)
            assert watch.returncode == 0, err
            assert [m["subject"] for m in json.loads(out)["messages"]] == ["twice restarted"]
    finally:
        server.stop()
    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)  # POST: 501, a page
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        env = process_env(AGENT_MAIL_DB=f"http://127.0.0.1:{web.server_address[1]}", AGENT_MAIL_TOKEN=token,
                          AGENT_MAIL_RECONNECT_SECONDS="60")
        started = time.monotonic()
        proc = am_process("send", "--from", "a:x", "--to", "b:y", "--subject", "nowhere", env=env)
        assert proc.returncode == 1 and time.monotonic() - started < 10, proc.stderr
        assert "not an agent-mail answer" in _clear_error(proc.stderr, token)["error"]
    finally:
        web.shutdown()
        web.server_close()
