"""The waits `agent-mail serve` carries (issue 21), as real processes: on PostgreSQL hundreds of waits hold no more
than the server's pool and its one LISTEN connection; a direct send wakes its recipient's waits only, a broadcast
every wait; a revoked token ends its waits at once and only its; a client that hangs up (killed) leaves its session
stale at once, a server killed leaves no session shown listening; a stop call releases a wait's session and its
holder ends the wait, and a bad one changes nothing; the LISTEN connection killed under the waits is made again and
nothing is missed; SIGTERM ends every wait at once with 503."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests.lib.cli import json_of, process_env
from tests.lib.mailbox import raw_db
from tests.lib.postgres import TEST_PG_URL
from tests.lib.serving import Server, backends_of
from tests.lib.waiting import armed, disarmed, presences, until

pytestmark = [pytest.mark.backends, pytest.mark.timeout(180)]

POOL_SIZE = 8  # agent_mail.server.app.POOL_SIZE: the server's connections for calls


class Waits:
    """Waits held as raw HTTP requests, one thread each: their answers as they come."""

    def __init__(self, server: Server, token: str, agents: list[str], seconds: float = 90.0, keys: list | None = None):
        self.answers: dict[int, tuple[int, dict, float]] = {}
        self._threads = []
        for i, agent in enumerate(agents):
            body = {"agent": agent, "wait_seconds": seconds, **({"stop_key": keys[i]} if keys else {})}
            thread = threading.Thread(target=self._wait, args=(server.port, token, i, body, seconds), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _wait(self, port: int, token: str, i: int, body: dict, seconds: float) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=seconds + 30)
        try:
            connection.request("POST", "/v1/call/watch", body=json.dumps(body),
                               headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
            response = connection.getresponse()
            self.answers[i] = (response.status, json.loads(response.read()), time.monotonic())
        except (OSError, http.client.HTTPException) as exc:
            self.answers[i] = (0, {"error": str(exc)}, time.monotonic())
        finally:
            connection.close()

    def until(self, count: int, seconds: float = 20.0) -> None:
        until(lambda: len(self.answers) >= count, seconds, lambda: f"{len(self.answers)} of {count} answered")


def _send(server: Server, *argv: str) -> None:
    proc = server.direct("send", "--from", "ops:lead", *argv)
    assert proc.returncode == 0, proc.stderr


def test_hundreds_of_waits_hold_a_handful_of_connections_and_wake_exactly_their_own(server, backend):
    if backend != "postgresql":
        pytest.skip("the LISTEN connection and the pool are PostgreSQL's; on SQLite the waits share the wake-up "
                    "pipes of the identities waited for")
    token = server.token("--agent", "*")
    agents = [f"w:a{i:03d}" for i in range(210)]
    waits = Waits(server, token, agents)
    armed(agents, server.mailbox, timeout=60)
    states = presences(agents[:3], server.mailbox)
    assert all(s["watching"] and s["watch_state"] == "armed" for s in states.values()), states
    held = backends_of(server.proc.pid, TEST_PG_URL)
    assert len(held) <= POOL_SIZE + 1, held
    assert [name for _, name in held if name.startswith("agent-mail serve ")] != [], held
    assert not waits.answers
    # A direct message wakes its recipient's wait, and no other.
    _send(server, "--to", "w:a007", "--subject", "for seven")
    waits.until(1)
    time.sleep(1.0)  # time for a wrongly woken wait to answer too
    assert list(waits.answers) == [7], sorted(waits.answers)
    status, document, _ = waits.answers[7]
    assert status == 200 and [m["subject"] for m in document["messages"]] == ["for seven"]
    # A broadcast wakes every one.
    _send(server, "--to", "*", "--subject", "everyone")
    waits.until(len(agents))
    assert all(status == 200 and document["messages"][-1]["subject"] == "everyone"
               for i, (status, document, _) in waits.answers.items() if i != 7)
    assert len(backends_of(server.proc.pid, TEST_PG_URL)) <= POOL_SIZE + 1
    disarmed(agents[:5], server.mailbox, timeout=60)


def test_revocation_ends_the_waits_of_that_token_only(server):
    revoked, kept = server.token("--agent", "a:*"), server.token("--agent", "b:z")
    first = Waits(server, revoked, ["a:x", "a:y", "a:x"])
    other = Waits(server, kept, ["b:z"])
    armed(["a:x", "a:y", "b:z"], server.mailbox, timeout=60)
    proc = server.direct("token", "revoke", revoked.split("_")[1])
    assert proc.returncode == 0, proc.stderr
    started = time.monotonic()
    first.until(3, seconds=10)
    assert all(status == 401 and "revoked" in document["error"] for status, document, _ in first.answers.values())
    assert max(at for _, _, at in first.answers.values()) - started < 5
    assert not other.answers  # the other token's wait goes on
    _send(server, "--to", "b:z", "--subject", "still here")
    other.until(1)
    assert other.answers[0][0] == 200 and other.answers[0][1]["messages"][0]["subject"] == "still here"
    assert revoked not in "".join(server.outputs)


def test_a_client_that_hangs_up_leaves_its_session_stale_at_once(server):
    """A killed client makes no stop call: the server sees it hang up, ends the wait and abandons its session,
    which reads as a killed watch's on the mailbox's machine: stale at once, never released, still watching."""
    token = server.token("--agent", "a:x")
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=process_env(AGENT_MAIL_DB=server.url,
                                                                        AGENT_MAIL_TOKEN=token))
    try:
        armed("a:x", server.mailbox, timeout=60)
        watch.kill()
        watch.wait()
        assert disarmed("a:x", server.mailbox, timeout=10) < 2.0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    state = presences("a:x", server.mailbox)["a:x"]
    assert state["watch_state"] == "stale" and state["released_at"] is None and state["watching"] is True


def test_a_signalled_client_that_cannot_tell_its_server_exits_within_its_bound(server):
    """The stop call is bounded: a server that does not answer (stopped here) is not waited for beyond about 2 s
    to connect and as long for its answer, and the client says so."""
    token = server.token("--agent", "a:x")
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=process_env(AGENT_MAIL_DB=server.url,
                                                                     AGENT_MAIL_TOKEN=token))
    try:
        armed("a:x", server.mailbox, timeout=60)
        server.proc.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        watch.send_signal(signal.SIGTERM)
        out, err = watch.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        server.proc.send_signal(signal.SIGCONT)
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 143 and out == b"" and took < 6, (took, err)
    error = json.loads(err)["error"]
    assert "did not confirm its release" in error and "may read as stale" in error and token not in err.decode()
    disarmed("a:x", server.mailbox, timeout=10)  # the server, running again, ends the wait


def _stop(server: Server, token: str | None, body: object) -> tuple[int, dict]:
    """POST /v1/watch/stop: (status, its JSON document)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    status, answer = server.raw("/v1/watch/stop", raw, headers)
    assert b"Traceback" not in answer
    return status, json.loads(answer)


def _sessions(mailbox: str, agent: str) -> list[tuple]:
    db = raw_db(mailbox)
    try:
        return [tuple(row) for row in db.execute("SELECT state, released_at, released_reason FROM watch_sessions "
                                                 "WHERE agent = ?", (agent,))]
    finally:
        db.close()


def test_a_stop_call_releases_the_session_and_its_holder_ends_the_wait(server):
    token = server.token("--agent", "s:x")
    key = str(uuid.uuid4())
    waits = Waits(server, token, ["s:x"], keys=[key])
    armed("s:x", server.mailbox, timeout=60)
    status, answer = _stop(server, token, {"agent": "s:x", "key": key, "signal": 15})
    assert status == 200 and answer["agent"] == "s:x" and answer["released"] is True
    assert presences("s:x", server.mailbox)["s:x"]["watch_state"] == "released"  # at once: done before it answered
    waits.until(1, seconds=10)  # the holder ends the wait, without writing to its session again
    status, document, _ = waits.answers[0]
    assert status == 409 and "released by its client" in document["error"]
    [(state, released_at, reason)] = _sessions(server.mailbox, "s:x")
    assert (state, released_at, reason) == ("released", answer["released_at"], "signal 15")
    assert _stop(server, token, {"agent": "s:x", "key": key}) == \
        (200, {"agent": "s:x", "released": False, "released_at": answer["released_at"]})  # said again: no change


def test_a_bad_stop_call_is_refused_by_field_and_changes_nothing(server):
    mine, other = server.token("--agent", "a:x"), server.token("--agent", "b:y")
    keys = [str(uuid.uuid4()), str(uuid.uuid4())]
    waits = Waits(server, mine, ["a:x"], keys=keys[:1])
    theirs = Waits(server, other, ["b:y"], keys=keys[1:])
    armed(["a:x", "b:y"], server.mailbox, timeout=60)
    refused = [
        (mine, b"{not json", 400, None),
        (mine, b"[1, 2]", 400, None),
        (mine, {}, 400, "agent"),
        (mine, {"agent": "a:x"}, 400, "key"),
        (mine, {"agent": "a:x", "key": "not-a-uuid"}, 400, "key"),
        (mine, {"agent": 7, "key": keys[0]}, 400, "agent"),
        (mine, {"agent": "a:x", "key": keys[0], "signal": "TERM"}, 400, "signal"),
        (mine, {"agent": "a:x", "key": keys[0], "session": "x"}, 400, "session"),
        (mine, {"agent": "a:x", "key": str(uuid.uuid4())}, 400, "key"),  # no wait has it
        (mine, {"agent": "a:x", "key": keys[1]}, 400, "key"),  # another identity's wait
        (mine, {"agent": "b:y", "key": keys[1]}, 403, "agent"),  # a token that cannot act as b:y
        (None, {"agent": "a:x", "key": keys[0]}, 401, None),
        ("am_nope_nope", {"agent": "a:x", "key": keys[0]}, 401, None),
    ]
    for token, body, code, field in refused:
        status, answer = _stop(server, token, body)
        assert status == code and answer["error"] and isinstance(answer["problems"], list), (body, answer)
        if field is not None:
            assert field in [problem["field"] for problem in answer["problems"]], (body, answer)
    time.sleep(0.5)
    assert not waits.answers and not theirs.answers  # both waits go on
    assert {a: s["watch_state"] for a, s in presences(["a:x", "b:y"], server.mailbox).items()} == \
        {"a:x": "armed", "b:y": "armed"}
    assert all(token not in "".join(server.outputs) + b"".join(server.log).decode() for token in (mine, other))


def test_a_killed_server_leaves_no_session_shown_listening(mailbox_path):
    running = Server(str(mailbox_path))
    try:
        token = running.token("--agent", "a:*")
        agents = ["a:x", "a:y", "a:z"]
        Waits(running, token, agents)
        armed(agents, running.mailbox, timeout=60)
        running.proc.send_signal(signal.SIGKILL)
        running.proc.wait()
        took = disarmed(agents, running.mailbox, timeout=15)
        assert took < 3.0, took
        assert {s["watch_state"] for s in presences(agents, running.mailbox).values()} == {"stale"}
    finally:
        running.stop()


def test_the_listen_connection_is_made_again_and_nothing_is_missed(server, backend):
    if backend != "postgresql":
        pytest.skip("the server's LISTEN connection is PostgreSQL's")
    import psycopg

    token = server.token("--agent", "r:*")
    agents = [f"r:a{i}" for i in range(6)]
    waits = Waits(server, token, agents)
    armed(agents, server.mailbox, timeout=60)

    def hub() -> list[int]:
        return [pid for pid, name in backends_of(server.proc.pid, TEST_PG_URL) if name.startswith("agent-mail serve")]
    [before] = hub()
    with psycopg.connect(TEST_PG_URL, autocommit=True) as db:
        assert db.execute("SELECT pg_terminate_backend(%s)", (before,)).fetchone()[0]
    _send(server, "--to", "r:a0", "--subject", "while it was down")  # looked for once the hub is back
    waits.until(1)
    assert waits.answers[0][0] == 200 and waits.answers[0][1]["messages"][0]["subject"] == "while it was down"
    after = until(hub, 10, "the server never made its LISTEN connection again")
    assert after != [before]
    operator = server.token("--agent", "*")
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {operator}"})
    scraped = connection.getresponse().read().decode()
    connection.close()
    assert "\nagent_mail_hub_reconnects_total 1\n" in scraped, scraped  # what a monitor sees of it
    _send(server, "--to", "r:a1", "--subject", "after")  # woken through the new connection
    waits.until(2)
    assert waits.answers[1][0] == 200 and waits.answers[1][1]["messages"][0]["subject"] == "after"
    _send(server, "--to", "*", "--subject", "all")
    waits.until(len(agents))
    assert all(status == 200 for status, _, _ in waits.answers.values())


def test_sigterm_ends_every_wait_at_once_with_503(server):
    token = server.token("--agent", "t:*")
    agents = [f"t:a{i:02d}" for i in range(30)]
    waits = Waits(server, token, agents)
    armed(agents, server.mailbox, timeout=60)
    started = time.monotonic()
    code, log = server.stop()
    assert code == 0, log
    waits.until(len(agents), seconds=10)
    assert {status for status, _, _ in waits.answers.values()} == {503}
    assert max(at for _, _, at in waits.answers.values()) - started < 5
    assert {s["watch_state"] for s in presences(agents, server.mailbox).values()} == {"released"}


def test_a_delayed_message_falling_due_wakes_the_wait(server):
    token = server.token("--agent", "d:x")
    waits = Waits(server, token, ["d:x"])
    armed("d:x", server.mailbox, timeout=60)
    _send(server, "--to", "d:x", "--subject", "later", "--delay-minutes", "0.05")  # due in 3 s: no wake-up says so
    sent = time.monotonic()
    waits.until(1, seconds=20)
    status, document, at = waits.answers[0]
    assert status == 200 and [m["subject"] for m in document["messages"]] == ["later"]
    assert 2.0 < at - sent < 10


def test_calls_and_waits_outlive_the_servers_connections_being_killed(server, backend):
    """Every PostgreSQL connection of the server (its pool and its LISTEN connection) killed at once: the pool
    gives no broken store to a call, the waits look again, nothing is lost."""
    if backend != "postgresql":
        pytest.skip("SQLite has no connections to kill")
    import psycopg

    token = server.token("--agent", "k:*")
    agents = ["k:a", "k:b"]
    waits = Waits(server, token, agents)
    armed(agents, server.mailbox, timeout=60)
    held = backends_of(server.proc.pid, TEST_PG_URL)
    assert len(held) >= 2  # the hub, and the pooled stores the calls so far used
    with psycopg.connect(TEST_PG_URL, autocommit=True) as db:
        for pid, _ in held:
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    sent = server.client(token, "send", "--from", "k:c", "--to", "k:a", "--subject", "through the server")
    assert sent.returncode == 0, sent.stderr
    waits.until(1)
    assert waits.answers[0][0] == 200 and waits.answers[0][1]["messages"][0]["subject"] == "through the server"
    read = server.client(token, "read", "k:a")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout)["count"] == 1
    _send(server, "--to", "k:b", "--subject", "and after")
    waits.until(2)
    assert waits.answers[1][0] == 200
    assert len(backends_of(server.proc.pid, TEST_PG_URL)) <= POOL_SIZE + 1


@pytest.mark.sqlite_only  # on a cluster of its own, whichever backend the other tests run on
def test_waits_outlive_a_postgresql_restart(private_postgres):
    base, restart = private_postgres.url, private_postgres.restart
    running = Server(f"{base}?schema=restart")
    try:
        token = running.token("--agent", "p:*")
        agents = ["p:a", "p:b", "p:c"]
        waits = Waits(running, token, agents)
        armed(agents, running.mailbox, timeout=60)
        before = backends_of(running.proc.pid, base)
        restart()
        armed(agents, running.mailbox, timeout=30)  # the LISTEN connection is back: alive again
        after = backends_of(running.proc.pid, base)
        assert [name for _, name in after if name.startswith("agent-mail serve ")] and not set(before) & set(after)
        assert not waits.answers
        _send(running, "--to", "p:b", "--subject", "after the restart")
        waits.until(1)
        [(i, (status, document, _))] = waits.answers.items()
        assert (i, status) == (1, 200) and document["messages"][0]["subject"] == "after the restart"
        _send(running, "--to", "*", "--subject", "all")
        waits.until(3)
        assert {status for status, _, _ in waits.answers.values()} == {200}
        assert len(backends_of(running.proc.pid, base)) <= POOL_SIZE + 1
    finally:
        running.stop()


def _descriptors(pid: int) -> list[int]:
    """The numbers of the descriptors process `pid` holds open."""
    import os

    return sorted(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


class Idle:
    """`count` connections to the server that never send a request (as a crowd of clients, or an attacker, would
    hold): each is a descriptor in the server, so what it opens after them is numbered above them."""

    def __init__(self, server: Server, count: int):
        import socket

        self.sockets = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(count)]
        until(lambda: len(_descriptors(server.proc.pid)) >= count, 30,
              lambda: f"the server holds {len(_descriptors(server.proc.pid))} descriptors, not yet {count}")

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _look(server: Server, token: str, path: str, body: dict, answers: dict, name: str) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Authorization": f"Bearer {token}"})
        response = connection.getresponse()
        answers[name] = (response.status, json.loads(response.read()))
    except (OSError, http.client.HTTPException) as exc:
        answers[name] = (0, {"error": str(exc)})
    finally:
        connection.close()


def _mcp_watch(server: Server, token: str, agent: str, answers: dict) -> None:
    import anyio
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def main():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"},
                                      timeout=httpx2.Timeout(30, read=300)) as client:
            async with streamable_http_client(f"{server.url}/mcp", http_client=client) as streams:
                async with ClientSession(streams[0], streams[1]) as session:
                    await session.initialize()
                    result = await session.call_tool("watch", {"agent": agent, "wait_seconds": 90})
                    return ("error" if result.is_error else "ok"), json.loads(result.content[0].text)
    try:
        answers["mcp"] = anyio.run(main)
    except Exception as exc:  # shown by the assertion
        answers["mcp"] = ("failed", {"error": repr(exc)})


def test_every_kind_of_wait_answers_with_descriptors_numbered_above_1024(server, backend):
    """Issue 27, finding 1: with ~1,100 descriptors open in the server, every wait slept in select(), which cannot
    watch a descriptor numbered 1,024 or more: watch, follow, dashboard and MCP watch answered 500 "filedescriptor
    out of range in select()". 1,100 idle connections first: what the waits open is numbered above them."""
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[test]')")
    token = server.token("--agent", "*")
    supervisor = server.token("--supervisor")
    idle = Idle(server, 1100)
    try:
        first = {}
        _look(server, token, "/v1/follow", {"agent": "w:f"}, first, "follow")
        _look(server, supervisor, "/v1/dashboard", {"views": {"feed": {}}}, first, "dashboard")
        assert first["follow"][0] == 200 and first["dashboard"][0] == 200, first
        answers: dict = {}
        looks = [threading.Thread(target=_look, args=(server, token, "/v1/follow", {
                     "agent": "w:f", "after": first["follow"][1]["fingerprint"], "wait_seconds": 90}, answers,
                     "follow"), daemon=True),
                 threading.Thread(target=_look, args=(server, supervisor, "/v1/dashboard", {
                     "views": {"feed": {}}, "after": first["dashboard"][1]["marker"], "wait_seconds": 90}, answers,
                     "dashboard"), daemon=True),
                 threading.Thread(target=_mcp_watch, args=(server, token, "w:m", answers), daemon=True)]
        for thread in looks:
            thread.start()
        waits = Waits(server, token, ["w:a", "w:b", "w:c"])
        armed(["w:a", "w:b", "w:c", "w:m"], server.mailbox, timeout=60)
        assert max(_descriptors(server.proc.pid)) >= 1100  # what the waits hold is numbered above 1,024
        assert not waits.answers and not answers, (waits.answers, answers)
        _send(server, "--to", "*", "--subject", "everyone")
        waits.until(3, seconds=30)
        until(lambda: len(answers) == 3, 30, lambda: f"answered: {answers}")
        assert [(status, document["messages"][-1]["subject"]) for status, document, _ in waits.answers.values()] \
            == [(200, "everyone")] * 3, waits.answers
        assert answers["follow"][0] == 200 and answers["follow"][1]["unread"] == 1, answers["follow"]
        assert answers["dashboard"][0] == 200 and answers["dashboard"][1]["marker"] != first["dashboard"][1][
            "marker"], answers["dashboard"]
        assert answers["mcp"][0] == "ok" and answers["mcp"][1]["messages"][-1]["subject"] == "everyone", answers["mcp"]
    finally:
        idle.close()
    _, log = server.stop()
    assert "out of range" not in log and '"status": 500' not in log, log[-2000:]


def test_the_hub_started_above_1024_descriptors_makes_no_reconnect_loop(server, backend):
    """Issue 27, finding 2: a LISTEN thread started while 1,100 idle connections were open slept in select() on a
    descriptor above 1,024, failed at once, paused in select() too (failing as fast) and connected again, ~240 new
    PostgreSQL sessions a second until the server stopped. Now its one connection stays, through the idle
    connections closing, and its waits are woken."""
    if backend != "postgresql":
        pytest.skip("the LISTEN connection is PostgreSQL's")
    token = server.token("--agent", "*")
    idle = Idle(server, 1100)
    try:
        waits = Waits(server, token, ["w:a"])  # the first wait starts the hub: its descriptors above 1,024
        armed("w:a", server.mailbox, timeout=60)
    finally:
        idle.close()

    def hubs() -> list[int]:
        return [pid for pid, name in backends_of(server.proc.pid, TEST_PG_URL) if name.startswith("agent-mail serve ")]
    first = hubs()
    assert len(first) == 1, first
    seen, ends = set(first), time.monotonic() + 3.0  # a loop made ~700 sessions in this time
    while time.monotonic() < ends:
        seen.update(hubs())
    assert seen == set(first), f"the hub connected again: {len(seen)} sessions"
    _send(server, "--to", "w:a", "--subject", "still listening")
    waits.until(1)
    assert waits.answers[0][0] == 200 and waits.answers[0][1]["messages"][0]["subject"] == "still listening"
    _, log = server.stop()
    assert "hub connection failed" not in log and "out of range" not in log, log[-2000:]


def test_follow_and_dashboard_waits_hold_no_connection_of_their_own(server, backend):
    """Issue 27, finding 3: on PostgreSQL a follow or dashboard wait held a database connection each (~90 such waits
    exhausted a default server). Now they wait on the server's one LISTEN connection: 15 of each keep the server at
    its pool + 1, and a broadcast answers them all."""
    if backend != "postgresql":
        pytest.skip("the LISTEN connection and the pool are PostgreSQL's")
    token, supervisor = server.token("--agent", "*"), server.token("--supervisor")
    first: dict = {}
    _look(server, token, "/v1/follow", {"agent": "f:x"}, first, "follow")
    _look(server, supervisor, "/v1/dashboard", {"views": {}}, first, "dashboard")
    answers: dict = {}
    for i in range(15):
        threading.Thread(target=_look, daemon=True, args=(server, token, "/v1/follow", {
            "agent": f"f:a{i:02d}", "after": first["follow"][1]["fingerprint"], "wait_seconds": 120}, answers,
            f"follow{i}")).start()
        threading.Thread(target=_look, daemon=True, args=(server, supervisor, "/v1/dashboard", {
            "views": {}, "after": first["dashboard"][1]["marker"], "wait_seconds": 120}, answers,
            f"dashboard{i}")).start()
    until(lambda: len(_descriptors(server.proc.pid)) >= 30, 30, "the 30 looks connected")
    most, ends = 0, time.monotonic() + 5.0  # holding a connection each, they made 30 more within this
    while time.monotonic() < ends:
        most = max(most, len(backends_of(server.proc.pid, TEST_PG_URL)))
    assert most <= POOL_SIZE + 1 and not answers, (most, answers)
    _send(server, "--to", "*", "--subject", "everyone")
    until(lambda: len(answers) == 30, 30, lambda: f"{len(answers)} of 30 answered")
    assert all(status == 200 for status, _ in answers.values()), answers
    assert all(document["unread"] == 1 for name, (_, document) in answers.items() if name.startswith("follow"))
    assert all(document["marker"] != first["dashboard"][1]["marker"] for name, (_, document) in answers.items()
               if name.startswith("dashboard"))


def _threads(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/task"))


def _hook_wait(server: Server, token: str, agent: str, answers: dict, name: str) -> None:
    """A Claude Code waiter's wait through the server, as `agent-mail hook claude-code wait` sends it."""
    import os

    _look(server, token, "/v1/call/hook", {"harness": "claude-code", "event": "wait", "agent": agent,
                                           "session": {"session_id": f"s-{agent}", "waiter": f"w-{agent}",
                                                       "pid": os.getpid(), "host": "tests"},
                                           "wait_seconds": 90}, answers, name)


def test_every_kind_of_wait_holds_no_thread_nor_connection_of_its_own(server, backend):
    """Issue 27: on SQLite each served wait held a thread (and on PostgreSQL an MCP watch and a hook's waiter a
    connection each). Now watches, follow and dashboard waits, MCP watches (the real SDK client) and hook waiters
    all wait on the server's event loop, woken by one watcher of the mailbox's change signal: 40 watches and 8 of
    each other kind leave the server with no more threads than an idle one keeps (its worker threads retire), and on
    PostgreSQL at most its pool + 2 connections. A broadcast sent by another process writing the mailbox itself
    (the command line on this machine) answers them all."""
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[test]')")
    token, supervisor = server.token("--agent", "*"), server.token("--supervisor")
    first: dict = {}
    _look(server, token, "/v1/follow", {"agent": "f:x"}, first, "follow")
    _look(server, supervisor, "/v1/dashboard", {"views": {}}, first, "dashboard")
    assert first["follow"][0] == 200 and first["dashboard"][0] == 200, first
    watches = [f"w:a{i:02d}" for i in range(40)]
    waits = Waits(server, token, watches)
    answers: dict = {}
    for i in range(8):
        for target, args in ((_look, (server, token, "/v1/follow", {
                                 "agent": f"f:a{i}", "after": first["follow"][1]["fingerprint"], "wait_seconds": 90},
                                 answers, f"follow{i}")),
                             (_look, (server, supervisor, "/v1/dashboard", {
                                 "views": {}, "after": first["dashboard"][1]["marker"], "wait_seconds": 90}, answers,
                                 f"dashboard{i}")),
                             (_mcp_watch_as, (server, token, f"m:a{i}", answers, f"mcp{i}")),
                             (_hook_wait, (server, token, f"h:a{i}", answers, f"hook{i}"))):
            threading.Thread(target=target, args=args, daemon=True).start()
    held = watches + [f"m:a{i}" for i in range(8)] + [f"h:a{i}" for i in range(8)]
    armed(held, server.mailbox, timeout=90)
    # The worker threads that checked the calls retire once idle (anyio's, after 10 s): a thread per wait would not.
    until(lambda: _threads(server.proc.pid) <= 24, 60,
          lambda: f"the server holds {_threads(server.proc.pid)} threads with {len(held) + 16} waits")
    if backend == "postgresql":
        most, ends = 0, time.monotonic() + 3.0
        while time.monotonic() < ends:
            most = max(most, len(backends_of(server.proc.pid, TEST_PG_URL)))
        assert most <= POOL_SIZE + 2, most
    assert not waits.answers and not answers, (waits.answers, answers)
    _send(server, "--to", "*", "--subject", "everyone")
    waits.until(len(watches), seconds=60)
    until(lambda: len(answers) == 32, 60, lambda: f"{len(answers)} of 32 answered: {sorted(answers)}")
    assert all(status == 200 and document["messages"][-1]["subject"] == "everyone"
               for status, document, _ in waits.answers.values()), waits.answers
    for name, (status, document) in answers.items():
        if name.startswith("follow"):
            assert status == 200 and document["unread"] == 1, (name, document)
        elif name.startswith("dashboard"):
            assert status == 200 and document["marker"] != first["dashboard"][1]["marker"], (name, document)
        elif name.startswith("mcp"):
            assert status == "ok" and document["messages"][-1]["subject"] == "everyone", (name, document)
        else:
            assert status == 200 and document["wake"] and "everyone" in document["note"], (name, document)
    _, log = server.stop()
    assert '"status": 5' not in log, log[-2000:]


def _mcp_watch_as(server: Server, token: str, agent: str, answers: dict, name: str) -> None:
    got: dict = {}
    _mcp_watch(server, token, agent, got)
    answers[name] = got["mcp"]


def test_a_revocation_ends_every_kind_of_wait_made_with_that_token_only(server):
    """A revoked token wakes the server's waits (no wait polls its token): a watch, a follow wait, an MCP watch and a
    hook's waiter made with it end with the revocation, while the same kinds made with another token wait on and
    are answered by their mail."""
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[test]')")
    revoked, kept = server.token("--agent", "r:*"), server.token("--agent", "k:*")
    first: dict = {}
    for token, side in ((revoked, "r"), (kept, "k")):
        _look(server, token, "/v1/follow", {"agent": f"{side}:f"}, first, side)
    answers: dict = {}
    for token, side in ((revoked, "r"), (kept, "k")):
        for target, args in ((_look, (server, token, "/v1/call/watch", {"agent": f"{side}:w", "wait_seconds": 90},
                                      answers, f"{side}-watch")),
                             (_look, (server, token, "/v1/follow", {"agent": f"{side}:f", "wait_seconds": 90,
                                                                     "after": first[side][1]["fingerprint"]},
                                      answers, f"{side}-follow")),
                             (_mcp_watch_as, (server, token, f"{side}:m", answers, f"{side}-mcp")),
                             (_hook_wait, (server, token, f"{side}:h", answers, f"{side}-hook"))):
            threading.Thread(target=target, args=args, daemon=True).start()
    armed(["r:w", "r:m", "r:h", "k:w", "k:m", "k:h"], server.mailbox, timeout=60)
    assert json_of(server.direct("token", "revoke", revoked.split("_")[1]))
    until(lambda: len(answers) == 4, 30, lambda: f"answered: {sorted(answers)}")
    assert sorted(answers) == ["r-follow", "r-hook", "r-mcp", "r-watch"], answers
    for name, (status, document) in answers.items():
        assert status in (401, "error") and "revoked" in document["error"], (name, status, document)
    for agent in ("k:w", "k:f", "k:m", "k:h"):
        _send(server, "--to", agent, "--subject", f"for {agent}")
    until(lambda: len(answers) == 8, 30, lambda: f"answered: {sorted(answers)}")
    assert answers["k-watch"][0] == 200 and answers["k-watch"][1]["messages"][0]["subject"] == "for k:w"
    assert answers["k-follow"][0] == 200 and answers["k-follow"][1]["unread"] == 1
    assert answers["k-mcp"][0] == "ok" and answers["k-mcp"][1]["messages"][0]["subject"] == "for k:m"
    assert answers["k-hook"][0] == 200 and answers["k-hook"][1]["wake"] and "for k:h" in answers["k-hook"][1]["note"]
