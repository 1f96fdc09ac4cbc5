"""Two `agent-mail serve` replicas on one PostgreSQL mailbox (issue 21), as real processes: a watch through one is
woken by a send through the other, at once (the wake-up, not the safety-net look); a token made once works on
both; revoking it ends a wait in progress on either; a replica killed under a blocked watch behind a load balancer
(a round-robin TCP proxy here, and the nginx and Caddy configurations of docs/deployment.md, run for real over TLS
when those programs are installed) leaves the watch to be answered through the other."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from agent_mail import model
from tests.lib.cli import am_process, json_of, process_env
from tests.lib.mailbox import raw_db
from tests.lib.replicas import Replicas, RoundRobin
from tests.lib.serving import Server
from tests.lib.tools import ROOT
from tests.lib.waiting import armed, until

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"], indirect=True), pytest.mark.timeout(120)]

DOCS = os.path.join(ROOT, "docs", "deployment.md")
# A blocked watch on PostgreSQL looks at the mailbox by itself only every HELD_REFRESH_SECONDS (300 s) and asks
# whether it is still wanted (server stopping, token revoked) every REFRESH_SECONDS (5 s; that ask reads no mail).
# An answer within these bounds is the wake-up's doing.
WAKE_BOUND = 3.0  # a send's exit -> the watch's exit, through the other replica
REVOKE_BOUND = 2.5  # the revocation's exit -> the watch's exit (taken within a second of the wait starting)


@pytest.fixture
def replicas(mailbox_path):
    running = Replicas(str(mailbox_path))
    try:
        yield running
    finally:
        running.stop()


def _client(url: str, token: str, *argv: str, **env: str) -> subprocess.CompletedProcess:
    return am_process(*argv, env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, **env))


def _watch(url: str, token: str, agent: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", agent], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, **env))


def _armed_sessions(mailbox, agent: str) -> int:
    """How many watch sessions of `agent` are armed (status shows one state per identity, not how many)."""
    db = raw_db(mailbox)
    try:
        return db.execute("SELECT COUNT(*) FROM watch_sessions WHERE agent = ? AND state = 'armed'",
                          (agent,)).fetchone()[0]
    finally:
        db.close()


def _finish(*procs: subprocess.Popen) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _served(server: Server, command: str) -> list[dict]:
    lines = [json.loads(line) for line in b"".join(server.log).decode().splitlines() if line.strip()]
    return [line for line in lines if line.get("command") == command]


def test_a_watch_through_one_replica_is_woken_by_a_send_through_the_other(replicas, mailbox_path):
    a, b = replicas
    worker = a.token("--agent", "deploy:worker")
    lead = a.token("--agent", "ops:lead")
    for here, there, subject in ((a, b, "from B"), (b, a, "from A")):
        watch = _watch(here.url, worker, "deploy:worker")
        try:
            armed("deploy:worker", procs=[watch])
            json_of(_client(there.url, lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject",
                            subject))
            sent = time.monotonic()
            out, err = watch.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            _finish(watch)
        assert watch.returncode == 0, err
        assert [m["subject"] for m in json.loads(out)["messages"]] == [subject]
        assert took < WAKE_BOUND, f"the watch through {here.url} answered {took:.2f} s after the send through " \
                                  f"{there.url}: not its wake-up"
        json_of(_client(here.url, worker, "read", "deploy:worker"))  # the next round's watch must wait
    # Each replica carried its own half: the watch answered by one, the send by the other.
    assert [line["status"] for line in _served(a, "watch")] == [200] and _served(b, "send")
    assert [line["status"] for line in _served(b, "watch")] == [200] and _served(a, "send")


def test_a_token_made_once_works_on_both_and_its_revocation_ends_waits_on_either(replicas, mailbox_path):
    a, b = replicas
    token = a.token("--agent", "a:x")
    other = a.token("--agent", "b:y")
    listed = json_of(a.direct("token", "list"))
    assert listed["count"] == 2  # one mailbox, one list of tokens: no replica keeps its own
    json_of(_client(a.url, other, "send", "--from", "b:y", "--to", "a:x", "--subject", "via A"))
    json_of(_client(b.url, other, "send", "--from", "b:y", "--to", "a:x", "--subject", "via B"))
    assert json_of(_client(b.url, token, "read", "a:x"))["count"] == 2
    assert json_of(_client(a.url, token, "status", "--agent", "a:x"))["agents"][0]["unread"] == 0
    # One wait on each replica, on the same token; revoked on the mailbox (the operator's side), both end.
    watches = [_watch(server.url, token, "a:x") for server in (a, b)]
    try:
        armed("a:x", procs=watches)
        until(lambda: _armed_sessions(mailbox_path, "a:x") == 2, 30, "both watches armed")
        json_of(a.direct("token", "revoke", token.split("_")[1]))
        revoked = time.monotonic()
        ended = []
        for watch in watches:
            out, err = watch.communicate(timeout=30)
            ended.append((time.monotonic() - revoked, watch.returncode, err.decode()))
    finally:
        _finish(*watches)
    for took, code, err in ended:
        assert code == 4 and "revoked" in json.loads(err)["error"], err
        assert took < REVOKE_BOUND, f"a wait ended {took:.2f} s after the revocation: not its wake-up"
        assert token not in err
    for server in (a, b):
        refused = _client(server.url, token, "read", "a:x")
        assert refused.returncode == 4 and "revoked" in json.loads(refused.stderr)["error"]
    assert json_of(_client(b.url, other, "read", "b:y", "--all"))["count"] == 0  # the other token still works


# Every command's client path in one process: the modules it loaded that are not the standard library's.
CLIENT_IMPORTS = """
import json, sys
before = set(sys.modules)
from agent_mail.cli import main
codes = [main.main(argv) for argv in json.loads(sys.argv[1])]
new = {m.split('.')[0] for m in set(sys.modules) - before}
print(json.dumps([codes, sorted(m for m in new if m not in sys.stdlib_module_names and m != 'agent_mail')]),
      file=sys.stderr)
"""


def test_every_client_path_loads_the_standard_library_only(replicas, tmp_path):
    a, _ = replicas
    token = a.token("--agent", "a:x")
    note = tmp_path / "note.txt"
    note.write_text("attached")
    commands = [["send", "--from", "a:x", "--to", "a:x", "--subject", "hi", "--attach", str(note), "--ref", str(note)],
                ["watch", "a:x"], ["watch", "a:x", "--once"], ["status", "--agent", "a:x"], ["search", "hi",
                "--agent", "a:x"], ["read", "a:x"], ["ack", "a:x", "--all"], ["export", "--agent", "a:x"],
                ["heartbeat", "a:x"], ["describe"]]
    proc = subprocess.run([sys.executable, "-c", CLIENT_IMPORTS, json.dumps(commands)], capture_output=True,
                          text=True, env=process_env(AGENT_MAIL_DB=a.url, AGENT_MAIL_TOKEN=token))
    codes, outside = json.loads(proc.stderr.strip().splitlines()[-1])
    assert codes == [0] * len(commands) and outside == [], proc.stderr
    assert "psycopg" not in proc.stderr and token not in proc.stdout + proc.stderr


def _killed_under_a_watch(replicas, mailbox_path, url: str, carried_by) -> None:
    """A watch through `url` (a load balancer in front of both replicas); the replica carrying it (carried_by())
    killed with SIGKILL; mail sent meanwhile through the other is answered to the watch through that other."""
    a, b = replicas
    worker, lead = a.token("--agent", "deploy:worker"), a.token("--agent", "ops:lead")
    watch = _watch(url, worker, "deploy:worker")
    try:
        armed("deploy:worker", procs=[watch])
        holding = carried_by()
        survivor = b if holding is a else a
        holding.proc.send_signal(signal.SIGKILL)
        holding.proc.wait(timeout=10)
        killed = time.monotonic()
        json_of(_client(survivor.url, lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject",
                        "while it was down"))
        out, err = watch.communicate(timeout=30)
        took = time.monotonic() - killed
    finally:
        _finish(watch)
    assert watch.returncode == 0, err
    assert [m["subject"] for m in json.loads(out)["messages"]] == ["while it was down"]
    assert took < 15, f"the watch took {took:.1f} s to be answered through the surviving replica"
    assert [line["status"] for line in _served(survivor, "watch")] == [200]
    # Nothing read was lost: the mail is still unread for the next `read` (a watch marks nothing).
    assert json_of(survivor.direct("read", "deploy:worker", "--no-mark-read"))["count"] == 1


def test_a_replica_killed_under_a_blocked_watch_leaves_it_to_the_other(replicas, mailbox_path):
    a, b = replicas
    balancer = RoundRobin([a.port, b.port])
    try:
        _killed_under_a_watch(replicas, mailbox_path, balancer.url,
                              lambda: a if balancer.chosen[-1] == a.port else b)
        assert len(balancer.chosen) >= 2 and len(set(balancer.chosen)) == 2  # it came back through the other
    finally:
        balancer.close()


def test_a_signalled_watch_behind_a_balancer_is_released_through_the_other_replica(replicas, mailbox_path):
    """SIGTERM to a watch whose wait one replica holds: its stop call goes (round robin) to the other, which
    releases the session from the database; the holder ends the wait without writing to it again; `status`
    right after the client exits reads released."""
    a, b = replicas
    balancer = RoundRobin([a.port, b.port])
    worker = a.token("--agent", "deploy:worker")
    watch = _watch(balancer.url, worker, "deploy:worker")
    try:
        armed("deploy:worker", procs=[watch])
        watch.send_signal(signal.SIGTERM)
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 143 and out == b"", err
        assert "its session was released" in json.loads(err)["error"]
        row = json_of(_client(a.url, worker, "status", "--agent", "deploy:worker"))["agents"][0]
        assert row["watch_state"] == "released" and row["released_at"] is not None
        assert balancer.chosen[:2] == [a.port, b.port]  # the wait on A, the stop call on B
        assert [line["status"] for line in _served(b, "stop_watch")] == [200]
        until(lambda: _served(a, "watch"), 10, "A never logged the wait's end")
        assert [line["status"] for line in _served(a, "watch")] in ([409], [499])  # ended: released, or hung up
        db = raw_db(mailbox_path)
        try:
            rows = db.execute("SELECT state, released_at, released_reason FROM watch_sessions").fetchall()
        finally:
            db.close()
        assert [tuple(r) for r in rows] == [("released", row["released_at"], "signal 15")]  # never un-released
        assert worker not in "".join(b"".join(r.log).decode() for r in (a, b)) + err.decode()
    finally:
        _finish(watch)
        balancer.close()


class Gateway(RoundRobin):
    """RoundRobin answering as nginx does when no backend takes the connection: 502 with a page of its own."""

    async def _carry(self, reader, writer) -> None:
        for port in self.ports:
            try:
                _, probe = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            probe.close()
            return await super()._carry(reader, writer)
        await reader.read(65536)
        page = b"<html><body>502 Bad Gateway</body></html>"
        writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(page), page))
        await writer.drain()
        writer.close()


@pytest.mark.parametrize("proxy", [RoundRobin, Gateway])
def test_a_read_while_no_replica_answers_is_asked_again_until_one_does(replicas, mailbox_path, proxy):
    """Both replicas down behind a balancer (connections refused, or the proxy's 502): a read, marking or not,
    asks again (as send and watch do) and is answered once a replica is back; the marking read marks once."""
    a, b = replicas
    balancer = proxy([a.port, b.port])
    worker = a.token("--agent", "deploy:worker")
    json_of(a.direct("send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "during the outage"))
    ports = a.port, b.port
    try:
        a.stop()
        b.stop()
        looking = subprocess.Popen([sys.executable, "-m", "agent_mail", "read", "deploy:worker", "--no-mark-read"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=process_env(AGENT_MAIL_DB=balancer.url, AGENT_MAIL_TOKEN=worker))
        marking = subprocess.Popen([sys.executable, "-m", "agent_mail", "read", "deploy:worker"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env=process_env(AGENT_MAIL_DB=balancer.url, AGENT_MAIL_TOKEN=worker))
        try:
            time.sleep(2)  # lets both reads find no replica, at least twice (they ask every half second)
            assert looking.poll() is None and marking.poll() is None, "a read gave up while no replica answered"
            replicas.restart(a, ports[0])
            out, err = looking.communicate(timeout=30)
            assert looking.returncode == 0, err
            assert [m["subject"] for m in json.loads(out)["messages"]] == ["during the outage"]
            out, err = marking.communicate(timeout=30)
            assert marking.returncode == 0, err
            assert [m["subject"] for m in json.loads(out)["messages"]] == ["during the outage"]
        finally:
            _finish(looking, marking)
        assert json_of(a.direct("read", "deploy:worker", "--no-mark-read"))["count"] == 0  # marked, once
    finally:
        balancer.close()


# ---------------------------------------------------------------- the documented proxies, run for real


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _documented(language: str) -> str:
    with open(DOCS, encoding="utf-8") as handle:
        blocks = re.findall(rf"```{language}\n(.*?)```", handle.read(), re.S)
    assert blocks, f"docs/deployment.md has no ```{language} block"
    return blocks[0]


def _certificate(directory) -> tuple[str, str]:
    cert, key = str(directory / "fullchain.pem"), str(directory / "privkey.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def _placed(text: str, a: Server, b: Server, cert: str, key: str) -> str:
    """The documented configuration with this test's replicas and certificate in place of the examples."""
    for example, here in (("127.0.0.1:8025", f"127.0.0.1:{a.port}"), ("127.0.0.1:8026", f"127.0.0.1:{b.port}"),
                          ("/etc/agent-mail/tls/fullchain.pem", cert), ("/etc/agent-mail/tls/privkey.pem", key)):
        assert example in text, f"the documented configuration no longer names {example}"
        text = text.replace(example, here)
    return text


def _until_answering(url: str, proc: subprocess.Popen, cert: str) -> None:
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=cert)

    def answering() -> bool:
        assert proc.poll() is None, proc.communicate()
        try:
            with urllib.request.urlopen(f"{url}/v1/health", context=context, timeout=5) as answer:
                return json.loads(answer.read())["ok"]
        except OSError:
            return False

    until(answering, 20, "the proxy never answered /v1/health")


def _forwarded_as_the_proxy_saw(url: str, cert: str, a: Server, b: Server) -> None:
    """Wrong tokens through the proxy, each claiming in X-Forwarded-For to come from 203.0.113.9: the replica
    (started with --forwarded-allow-ips 127.0.0.1, as documented) counts each against the address the proxy saw,
    127.0.0.5 or 127.0.0.1 (a client on the proxy's own host, which a proxy appending to the header would let name
    any address), never the one the client wrote."""
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=cert)
    host, port = url.removeprefix("https://").rsplit(":", 1)
    for source in ("127.0.0.5", "127.0.0.1"):
        connection = http.client.HTTPSConnection(host, int(port), timeout=30, context=context,
                                                 source_address=(source, 0))
        try:
            connection.request("POST", "/v1/call/status", body=b"{}", headers={
                "Authorization": "Bearer am_000000000000_" + "0" * 43, "X-Forwarded-For": "203.0.113.9"})
            assert connection.getresponse().status == 401
        finally:
            connection.close()

    def refused() -> list:
        lines = [json.loads(line) for line in b"".join(a.log + b.log).decode().splitlines() if line.strip()]
        return [line["client"] for line in lines if line.get("status") == 401 and "client" in line]
    until(lambda: len(refused()) >= 2, 10, "the refusals' log lines")
    assert sorted(refused()) == ["127.0.0.1", "127.0.0.5"], refused()


def _through_proxy(replicas, mailbox_path, url: str, proc: subprocess.Popen, cert: str) -> None:
    """Commands through the proxy over TLS; then a blocked watch through it outlives each replica in turn killed
    with SIGKILL (and the first started again on its port): whichever replica carried it, it is carried over at
    least once, and answered."""
    a, b = replicas
    _until_answering(url, proc, cert)
    _forwarded_as_the_proxy_saw(url, cert, a, b)
    token, lead = a.token("--agent", "deploy:worker"), a.token("--agent", "ops:lead")
    unknown = _client(url, token, "read", "deploy:worker")  # without AGENT_MAIL_CA the proxy's certificate is refused
    assert unknown.returncode == 1 and "certificate" in json.loads(unknown.stderr)["error"]
    json_of(_client(url, lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "over TLS",
                    AGENT_MAIL_CA=cert))
    assert json_of(_client(url, token, "read", "deploy:worker", AGENT_MAIL_CA=cert))["count"] == 1
    watch = _watch(url, token, "deploy:worker", AGENT_MAIL_CA=cert)
    try:
        armed("deploy:worker", procs=[watch])
        port = a.port
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=10)
        again = replicas.restart(a, port)
        armed("deploy:worker", procs=[watch])  # again, through the other
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait(timeout=10)
        json_of(_client(again.url, lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject",
                        "while one was down"))
        out, err = watch.communicate(timeout=60)
    finally:
        _finish(watch)
    assert watch.returncode == 0, err
    assert [m["subject"] for m in json.loads(out)["messages"]] == ["while one was down"]
    db = raw_db(mailbox_path)
    try:
        sessions = db.execute("SELECT COUNT(*) FROM watch_sessions WHERE agent = 'deploy:worker'").fetchone()[0]
    finally:
        db.close()
    assert sessions >= 2, "the watch was never carried over to the other replica"
    assert json_of(again.direct("read", "deploy:worker", "--no-mark-read"))["count"] == 1
    # A call the proxy passed on to a replica that died before answering: the proxy's own 502 page reaches the
    # client, which must not take it for "nothing happened" (the send may have been stored; its repeats carry
    # its idempotency key, so it is stored once whatever happens).
    again.proc.send_signal(signal.SIGSTOP)  # it takes the connection (the kernel does) but never answers
    try:
        cut = subprocess.Popen([sys.executable, "-m", "agent_mail", "send", "--from", "ops:lead", "--to",
                                "deploy:worker", "--subject", "cut off"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE,
                               env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=lead, AGENT_MAIL_CA=cert,
                                               AGENT_MAIL_RECONNECT_SECONDS="3"))
        time.sleep(1.5)  # the send is through the proxy to the stopped replica, waiting there (nothing to look at)
    finally:
        again.proc.send_signal(signal.SIGKILL)
        again.proc.wait(timeout=10)
    out, err = cut.communicate(timeout=30)
    assert cut.returncode == 1 and out == b"", err
    error = json.loads(err)["error"]
    # A send repeats itself with its idempotency key while the proxy answers 502 (here for 3 s), then says it may
    # have been stored, once.
    assert "may have been stored (once" in error and "Traceback" not in err.decode(), error


@pytest.mark.requires("nginx")
def test_the_documented_nginx_configuration_over_tls(replicas, mailbox_path, tmp_path):
    a, b = replicas
    cert, key = _certificate(tmp_path)
    port = _free_port()
    documented = _documented("nginx")
    # A watch's request is silent for its whole wait: the proxy's read timeout must outlast the longest one.
    hours = [int(h) for h in re.findall(r"proxy_read_timeout\s+(\d+)h;", documented)]
    assert hours and min(hours) * 60 > model.WATCH_MINUTES_MAX, "proxy_read_timeout is shorter than a watch"
    site = _placed(documented, a, b, cert, key).replace("listen 443 ssl", f"listen 127.0.0.1:{port} ssl")
    temp = tmp_path / "nginx"
    temp.mkdir()
    user = "user root root;\n" if os.geteuid() == 0 else ""  # the workers write under the test's own directory
    (tmp_path / "nginx.conf").write_text(
        f"{user}daemon off;\nworker_processes 1;\npid {temp}/nginx.pid;\nerror_log {temp}/error.log;\n"
        f"events {{ worker_connections 256; }}\nhttp {{\naccess_log off;\nclient_body_temp_path {temp}/body;\n"
        f"proxy_temp_path {temp}/proxy;\nfastcgi_temp_path {temp}/f;\nuwsgi_temp_path {temp}/u;\n"
        f"scgi_temp_path {temp}/s;\n{site}\n}}\n")
    proc = subprocess.Popen(["nginx", "-p", str(temp), "-c", str(tmp_path / "nginx.conf")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _through_proxy(replicas, mailbox_path, f"https://127.0.0.1:{port}", proc, cert)
    finally:
        proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


@pytest.mark.requires("caddy")
def test_the_documented_caddy_configuration_over_tls(replicas, mailbox_path, tmp_path):
    a, b = replicas
    cert, key = _certificate(tmp_path)
    port = _free_port()
    site = _placed(_documented("caddyfile"), a, b, cert, key).replace("mail.example.com", f"https://127.0.0.1:{port}")
    # The test's own global options: no admin endpoint, no port-80 redirect listener, state in the test's directory.
    (tmp_path / "Caddyfile").write_text("{\n\tadmin off\n\tauto_https disable_redirects\n\tskip_install_trust\n"
                                        f"\tstorage file_system {tmp_path}/caddy\n}}\n{site}")
    proc = subprocess.Popen(["caddy", "run", "--config", str(tmp_path / "Caddyfile"), "--adapter", "caddyfile"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"),
                                 "XDG_CONFIG_HOME": str(tmp_path / "config")})
    try:
        _through_proxy(replicas, mailbox_path, f"https://127.0.0.1:{port}", proc, cert)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
