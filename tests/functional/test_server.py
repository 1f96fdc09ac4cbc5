"""`agent-mail serve` and the client, as real processes, on both backings (issue 21): the commands through a
server give what they give directly, a token acts only as the identities it names, a supervisor looks without
marking, revocation and SIGTERM end waits at once, bad requests get clear 4xx, no token is ever shown."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.lib.cli import am_process, json_of, process_env
from tests.lib.serving import Server
from tests.lib.waiting import armed

pytestmark = [pytest.mark.backends, pytest.mark.timeout(120)]


def _unread(server: Server, agent: str) -> int:
    return json_of(server.direct("read", agent, "--no-mark-read"))["count"]


def test_commands_through_the_server_answer_as_directly(server, tmp_path):
    worker, lead = server.token("--agent", "deploy:worker"), server.token("--agent", "ops:lead")
    note = tmp_path / "note.txt"
    note.write_bytes(b"attached \x00 bytes")
    sent = json_of(server.client(lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "fix X",
                                 "--body", "please", "--attach", str(note), "--ref", str(note)))
    assert sent["delivered"] == 1 and sent["refs"] == [str(note)] and sent["attachments"][0]["name"] == "note.txt"
    read = json_of(server.client(worker, "read", "deploy:worker"))
    assert [m["subject"] for m in read["messages"]] == ["fix X"]
    assert read["next"] and all(isinstance(step, str) and step.startswith("agent-mail ") for step in read["next"])
    saved = json_of(server.client(worker, "attachments", "deploy:worker", sent["id"], "--save-to",
                                  str(tmp_path / "out")))
    assert (tmp_path / "out" / "note.txt").read_bytes() == b"attached \x00 bytes" and saved["saved"]
    assert json_of(server.client(worker, "ack", "deploy:worker", sent["id"]))["acked"] == [sent["id"]]
    found = json_of(server.client(worker, "search", "fix", "--agent", "deploy:worker"))
    assert found["count"] == 1
    status = json_of(server.client(worker, "status", "--agent", "deploy:worker"))
    assert status["agents"][0]["unread"] == 0
    # The same refusals, with the same exit codes and the command line's names for arguments.
    for argv in (("read", "deploy:worker", "--limit", "0"), ("ack", "deploy:worker", "not-an-id"),
                 ("send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "")):
        token = lead if argv[0] == "send" else worker
        remote, direct = server.client(token, *argv), server.direct(*argv)
        assert remote.returncode == direct.returncode == 2
        assert json.loads(remote.stderr)["problems"] == json.loads(direct.stderr)["problems"]
    # A watch blocked through the server is woken by a send through it.
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "deploy:worker"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=worker))
    try:
        armed("deploy:worker", procs=[watch])
        json_of(server.client(lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "wake"))
        out, err = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 0, err
    assert [m["subject"] for m in json.loads(out)["messages"]] == ["wake"]
    code, log = server.stop()
    assert code == 0
    lines = [json.loads(line) for line in log.splitlines()]
    assert all({"method", "path", "command", "as", "status", "ms"} <= set(line) for line in lines if "path" in line)
    for secret in (worker, lead):
        assert secret not in log and not any(secret in text for text in server.outputs)


ACTING = [
    ("send", "--from", "b:y", "--to", "a:x", "--subject", "as b"),
    ("read", "b:y"), ("ack", "b:y", "--all"), ("watch", "b:y", "--once"), ("heartbeat", "b:y"),
    ("dismiss", "b:y", "MID"), ("archive", "b:y", "MID"), ("delete", "b:y", "MID"), ("cancel", "b:y", "LATER"),
    ("attachments", "b:y", "MID"), ("profile", "b:y", "--human"), ("notifications", "b:y", "--clear-email"),
    ("search", "hello", "--agent", "b:y"), ("search", "hello"), ("status",), ("cleanup", "--older-than", "0"),
]


def test_a_token_acts_only_as_the_identities_it_names(server):
    mine = server.token("--agent", "a:x", "--agent", "c:*")
    mid = json_of(server.direct("send", "--from", "c:z", "--to", "b:y", "--subject", "hello"))["id"]
    later = json_of(server.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "later",
                                  "--delay-minutes", "30"))["id"]
    before = server.direct("read", "b:y", "--all", "--no-mark-read").stdout, json_of(server.direct("status"))["agents"]
    for argv in ACTING:
        argv = tuple(mid if word == "MID" else later if word == "LATER" else word for word in argv)
        proc = server.client(mine, *argv)
        assert proc.returncode == 4, (argv, proc.stderr)
        error = json.loads(proc.stderr)
        assert error["problems"] and "a:x, c:*" in error["error"], error
    after = server.direct("read", "b:y", "--all", "--no-mark-read").stdout, json_of(server.direct("status"))["agents"]
    assert after == before  # nothing read, marked, sent, cancelled or seen
    # What it names, it may do: exactly, and by project.
    assert server.client(mine, "heartbeat", "a:x").returncode == 0
    assert server.client(mine, "send", "--from", "c:anyone", "--to", "b:y", "--subject", "ok").returncode == 0
    assert mine not in "".join(server.outputs)


def test_a_supervisor_looks_without_marking(server):
    boss = server.token("--agent", "ops:lead", "--supervisor")
    json_of(server.direct("send", "--from", "a:x", "--to", "b:y", "--subject", "private"))
    looked = json_of(server.client(boss, "read", "b:y", "--no-mark-read"))
    assert looked["count"] == 1 and _unread(server, "b:y") == 1
    assert json_of(server.client(boss, "status"))["count"] >= 1
    assert json_of(server.client(boss, "search", "private"))["count"] == 1
    for argv in (("read", "b:y"), ("ack", "b:y", "--all"), ("send", "--from", "b:y", "--to", "a:x", "--subject", "x"),
                 ("watch", "b:y", "--once")):
        assert server.client(boss, *argv).returncode == 4, argv
    assert _unread(server, "b:y") == 1


def test_revocation_refuses_at_once_and_ends_a_blocked_watch(server):
    token = server.token("--agent", "a:x")
    token_id = token.split("_")[1]
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token))
    try:
        armed("a:x", procs=[watch])
        json_of(server.direct("token", "revoke", token_id))
        started = time.monotonic()
        out, err = watch.communicate(timeout=20)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 4 and time.monotonic() - started < 5, err
    assert "revoked" in json.loads(err)["error"] and token not in err.decode()
    refused = server.client(token, "read", "a:x")
    assert refused.returncode == 4 and "revoked" in json.loads(refused.stderr)["error"]
    status = json_of(server.direct("status", "--agent", "a:x"))["agents"][0]
    assert status["watch_state"] == "released"


def test_missing_bad_and_loose_tokens_are_refused(server, tmp_path):
    assert server.client(None, "read", "a:x").returncode == 4
    wrong = server.client("am_000000000000_guessed", "read", "a:x")
    assert wrong.returncode == 4 and "guessed" not in wrong.stderr.decode()
    token = server.token("--agent", "a:x")
    loose = tmp_path / "token"
    loose.write_text(token)
    loose.chmod(0o644)
    proc = server.client(None, "read", "a:x", AGENT_MAIL_TOKEN_FILE=str(loose))
    assert proc.returncode == 2 and "chmod 600" in json.loads(proc.stderr)["error"]
    loose.chmod(0o600)
    assert server.client(None, "read", "a:x", AGENT_MAIL_TOKEN_FILE=str(loose)).returncode == 0
    for argv in (("copy", "--from", "x.db"), ("token", "list"), ("doctor", "--repair")):
        refused = server.client(token, *argv)
        assert refused.returncode == 2 and "AGENT_MAIL_DB" in refused.stderr.decode(), argv
    described = json_of(server.client(token, "describe"))
    assert described["storage"]["url"] == server.url and token not in json.dumps(described)


def test_bad_requests_get_clear_4xx_and_the_server_stays_up(server):
    token = server.token("--agent", "a:x")
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for body, expected in ((b"{not json", 400), (b"[1, 2]", 400), (b'{"agent": 5}', 400),
                           (b'{"agent": "a:x", "nope": 1}', 400)):
        status, answer = server.raw("/v1/call/read", body, auth)
        assert status == expected and json.loads(answer)["problems"], (body, answer)
    status, answer = server.raw("/v1/call/read", b"{}", {**auth, "Content-Length": str(10**10)})
    assert status == 413 and "larger" in json.loads(answer)["error"]
    status, answer = server.raw("/v1/call/copy", b"{}", auth)
    assert status == 404
    status, answer = server.raw("/v1/call/read", b'{"agent": "a:x"}', {"Content-Type": "application/json"})
    assert status == 401
    assert server.client(token, "read", "a:x").returncode == 0  # still serving


def test_sigterm_ends_the_server_and_its_waits(server):
    token = server.token("--agent", "a:x")
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token,
                                             AGENT_MAIL_RECONNECT_SECONDS="1"))
    try:
        armed("a:x", procs=[watch])
        started = time.monotonic()
        code, log = server.stop()
        assert code == 0 and time.monotonic() - started < 8, log
        out, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 1 and "gave up" in json.loads(err)["error"]
    assert json_of(server.direct("status", "--agent", "a:x"))["agents"][0]["watch_state"] == "released"


@pytest.mark.sqlite_only
def test_a_watch_survives_a_server_restart(mailbox_path):
    first = Server(str(mailbox_path))
    token = first.token("--agent", "a:x")
    port = first.port
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=process_env(AGENT_MAIL_DB=first.url, AGENT_MAIL_TOKEN=token))
    second = None
    try:
        armed("a:x", procs=[watch])
        first.stop()
        again = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", f"127.0.0.1:{port}"],
                                 env=process_env(AGENT_MAIL_DB=str(mailbox_path)), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        second = again
        json.loads(again.stderr.readline())
        first.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "after the restart")
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        assert [m["subject"] for m in json.loads(out)["messages"]] == ["after the restart"]
    finally:
        for proc in (watch, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if second is not None:
            second.stdout.close()
            second.stderr.close()


@pytest.mark.sqlite_only
def test_a_sigterm_right_after_listening_stops_the_server(mailbox_path):
    """The moment serve says it is listening, a SIGTERM stops it (it once came before uvicorn's own handlers and
    was swallowed: the server ran on)."""
    for _ in range(3):
        serve = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"],
                                 env=process_env(AGENT_MAIL_DB=str(mailbox_path)), stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert "listening" in json.loads(serve.stderr.readline())
            serve.send_signal(signal.SIGTERM)
            _, err = serve.communicate(timeout=20)
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.communicate()
        assert serve.returncode == 0, err
        assert json.loads(err.splitlines()[-1]) == {**json.loads(err.splitlines()[-1]), "stopped": True}


@pytest.mark.sqlite_only
def test_a_client_command_imports_the_standard_library_only(server):
    token = server.token("--agent", "a:x")
    code = ("import sys; before = set(sys.modules); from agent_mail.cli.main import main; "
            "code = main(['read', 'a:x']); new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(code, sorted(m for m in new if m not in sys.stdlib_module_names and m != 'agent_mail'), "
            "file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token))
    assert proc.stderr.strip().splitlines()[-1] == "0 []", proc.stderr
    assert "psycopg" not in proc.stderr


def test_serve_refuses_an_open_address_without_tls(mailbox_path):
    proc = am_process("serve", "--listen", "0.0.0.0:0", env=process_env(AGENT_MAIL_DB=str(mailbox_path)))
    assert proc.returncode == 2 and "--tls-cert" in json.loads(proc.stderr)["error"]


def test_an_idle_server_sleeps_and_still_dates_its_answers(server):
    """Idle is free: with waits blocked and nothing happening, no thread of the server wakes (uvicorn's own loop
    would, ten times a second, to refresh its Date header); every answer is dated as it is sent instead."""
    import http.client

    token = server.token("--agent", "*")
    waits = [subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", f"idle:w{i}", "--timeout-minutes", "5"],
                              env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(3)]
    try:
        armed([f"idle:w{i}" for i in range(3)], procs=waits)
        time.sleep(1.5)  # settled: what arming set going (its log lines, its first refresh) is over

        def wakes() -> int:
            total = 0
            for task in __import__("os").listdir(f"/proc/{server.proc.pid}/task"):
                with open(f"/proc/{server.proc.pid}/task/{task}/status") as handle:
                    total += sum(int(line.split()[1]) for line in handle if "ctxt_switches" in line)
            return total
        before = wakes()
        time.sleep(3.0)
        assert wakes() - before <= 3, "an idle server woke up: something ticks"
    finally:
        for proc in waits:
            proc.terminate()
        for proc in waits:
            proc.wait(timeout=30)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request("GET", "/v1/health")
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200 and answer.getheader("Date", "").endswith(" GMT")
    finally:
        connection.close()
