"""A read through a server takes delivery in two steps (agent_mail.operations.deliveries): the server holds the marks
and names the delivery, the client prints, then confirms. Real server processes, on both backings: nothing is marked
read that was not printed, a delivery that was not confirmed comes again (at once when cancelled, after its hold
otherwise), concurrent readers still get each message once, and /v1/delivered refuses what it should."""

from __future__ import annotations

import datetime as dt
import http.client
import json
import resource
import subprocess
import sys
import time

import pytest

from agent_mail import model
from tests.lib.cli import process_env
from tests.lib.mailbox import raw_db
from tests.lib.serving import Server

pytestmark = [pytest.mark.backends, pytest.mark.timeout(120)]
DELIVERY = "X-Agent-Mail-Delivery"


def _post(server: Server, path: str, body: dict | bytes, token: str | None) -> tuple[int, dict, dict]:
    """(status, headers, document) of one request, as any HTTP client would make it."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request("POST", path, body=body if isinstance(body, bytes) else json.dumps(body).encode(),
                           headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read())
    finally:
        connection.close()


def _read(server, token, agent, **values) -> tuple[dict, str | None]:
    status, headers, document = _post(server, "/v1/call/read", {"agent": agent, "deliver": "confirm", **values},
                                      token)
    assert status == 200, document
    return document, headers.get(DELIVERY.lower())


def _settle(server, token, delivery, printed=True) -> tuple[int, dict]:
    status, _, document = _post(server, "/v1/delivered", {"delivery": delivery, "printed": printed}, token)
    return status, document


def _state(server: Server, agent: str) -> dict:
    """subject -> (read_at, acked_at) of every message of `agent`, straight from the mailbox."""
    listed = json.loads(server.direct("read", agent, "--all", "--no-mark-read", "--limit", "100").stdout)
    return {m["subject"]: (m["read_at"], m["acked_at"]) for m in listed["messages"]}


def _held(mailbox) -> int:
    db = raw_db(mailbox)
    try:
        return db.execute("SELECT COUNT(*) FROM deliveries").fetchone()[0]
    finally:
        db.close()


def _send(server: Server, *subjects: str, to: str = "b:y") -> None:
    for subject in subjects:
        assert server.direct("send", "--from", "a:x", "--to", to, "--subject", subject).returncode == 0


def test_marks_wait_for_the_confirmation_and_another_reader_gets_nothing_meanwhile(server, mailbox_path):
    reader = server.token("--agent", "b:y")
    _send(server, "one", "two")
    _send(server, "all", to="*")
    first, delivery = _read(server, reader, "b:y")
    assert [m["subject"] for m in first["messages"]] == ["one", "two", "all"] and delivery.startswith("dlv_")
    printed_at = {m["subject"]: m["read_at"] for m in first["messages"]}
    assert all(printed_at.values()) and first["remaining"] == 0
    # held, not marked: unread to everyone who looks, but not handed to another reader
    assert all(read_at is None for read_at, _ in _state(server, "b:y").values())
    assert json.loads(server.direct("status", "--agent", "b:y").stdout)["agents"][0]["unread"] == 3
    second, none = _read(server, reader, "b:y")
    assert second["count"] == 0 and second["remaining"] == 0 and none is None  # nothing held: nothing to confirm
    assert json.loads(server.direct("read", "b:y").stdout)["count"] == 0  # a read on the mailbox itself leaves it too
    assert _settle(server, reader, delivery) == (200, {"delivery": delivery, "agent": "b:y", "confirmed": 3})
    # marked as of the moment they were handed over, as printed
    assert {subject: read_at for subject, (read_at, _) in _state(server, "b:y").items()} == printed_at
    assert _held(mailbox_path) == 0
    # confirming again settles nothing, and says so without an error
    assert _settle(server, reader, delivery) == (200, {"delivery": delivery, "agent": None, "confirmed": 0})


def test_a_cancelled_delivery_is_unread_at_once_and_an_expired_one_goes_to_the_next_reader(server, mailbox_path):
    reader = server.token("--agent", "b:y")
    _send(server, "one")
    _, delivery = _read(server, reader, "b:y")
    assert _settle(server, reader, delivery, printed=False)[1]["cancelled"] == 1
    again, second = _read(server, reader, "b:y")
    assert [m["subject"] for m in again["messages"]] == ["one"]  # at once
    # the reader died: its hold ends (moved into the past rather than waited out) and the next read has the mail
    db = raw_db(mailbox_path)
    db.execute("UPDATE deliveries SET expires_at = '2000-01-01T00:00:00.000000+00:00'")
    db.commit()
    db.close()
    third, delivery3 = _read(server, reader, "b:y")
    assert [m["subject"] for m in third["messages"]] == ["one"] and delivery3 != second
    # the late confirmation of the first reader finds its delivery gone to another: it settles nothing
    assert _settle(server, reader, second)[1]["confirmed"] == 0
    assert _state(server, "b:y")["one"][0] is None
    assert _settle(server, reader, delivery3)[1]["confirmed"] == 1
    assert _state(server, "b:y")["one"][0] == third["messages"][0]["read_at"]


def test_read_ack_acknowledges_only_once_confirmed_and_looking_holds_nothing(server):
    reader = server.token("--agent", "b:y")
    _send(server, "one")
    looked, none = _read(server, reader, "b:y", no_mark_read=True)
    assert looked["count"] == 1 and none is None
    acked, delivery = _read(server, reader, "b:y", ack=True)
    assert acked["messages"][0]["acked_at"] is not None and _state(server, "b:y")["one"] == (None, None)
    assert _settle(server, reader, delivery)[1]["confirmed"] == 1
    read_at, acked_at = _state(server, "b:y")["one"]
    assert read_at is not None and acked_at == acked["messages"][0]["acked_at"]


def _limit(size: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return apply


def test_the_client_confirms_what_it_printed_and_cancels_what_it_could_not(server, tmp_path):
    reader = server.token("--agent", "b:y")
    for i in range(4):
        assert server.direct("send", "--from", "a:x", "--to", "b:y", "--subject", f"big {i}", "--body",
                             "x" * 40_000).returncode == 0
    env = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=reader)
    with open(tmp_path / "out.json", "wb") as sink:  # the 160 kB result cannot be written under a 100 kB limit
        failed = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=env, stdout=sink,
                                stderr=subprocess.PIPE, preexec_fn=_limit(100_000), timeout=60)
    assert failed.returncode == 1 and b"Traceback" not in failed.stderr
    assert "could not write the result" in json.loads(failed.stderr)["error"]
    assert all(read_at is None for read_at, _ in _state(server, "b:y").values())
    # cancelled, not left held: the next read has them at once, and marks them once printed
    read = server.client(reader, "read", "b:y")
    assert read.returncode == 0 and json.loads(read.stdout)["count"] == 4
    assert all(read_at is not None for read_at, _ in _state(server, "b:y").values())


def test_delivered_refuses_bad_calls_and_changes_nothing(server, mailbox_path):
    reader, other = server.token("--agent", "b:y"), server.token("--agent", "c:z")
    supervisor = server.token("--agent", "c:z", "--supervisor")
    _send(server, "one")
    _, delivery = _read(server, reader, "b:y")
    status, _, document = _post(server, "/v1/delivered", {"delivery": delivery, "printed": True}, None)
    assert status == 401 and "token" in document["error"]
    for token in (other, supervisor):  # neither may take delivery as b:y
        status, document = _settle(server, token, delivery)
        assert status == 403 and "b:y" in document["error"] and document["problems"]
    for body, fields in (({"delivery": "nope", "printed": True}, ["delivery"]),
                         ({"delivery": delivery}, ["printed"]),
                         ({"delivery": delivery, "printed": "yes"}, ["printed"]),
                         ({"delivery": delivery, "printed": True, "extra": 1}, ["extra"]),
                         ({}, ["delivery", "printed"])):
        status, _, document = _post(server, "/v1/delivered", body, reader)
        assert status == 400 and sorted(p["field"] for p in document["problems"]) == sorted(fields), document
    status, _, document = _post(server, "/v1/delivered", b"{not json", reader)
    assert status == 400 and "JSON" in document["error"]
    status, _, document = _post(server, "/v1/call/read", {"agent": "b:y", "deliver": "later"}, reader)
    assert status == 400 and [p["field"] for p in document["problems"]] == ["deliver"]
    # nothing changed: still held, still unread, and the right reader confirms it
    assert _held(mailbox_path) == 1 and _state(server, "b:y")["one"][0] is None
    assert _settle(server, reader, delivery)[1]["confirmed"] == 1
    assert "dlv_" not in "".join(line.decode() for line in server.log)  # deliveries are not logged


def test_a_watch_is_not_woken_by_held_mail_and_is_when_its_hold_ends(server, mailbox_path):
    """Held mail is being delivered, not waiting: a watch that woke for it would wake its agent for a read that
    finds nothing, again and again until the hold ends. It wakes when the hold ends (the mail waits again)."""
    reader = server.token("--agent", "b:y")
    _send(server, "one")
    _, delivery = _read(server, reader, "b:y")
    assert json.loads(server.direct("watch", "b:y", "--once").stdout)["count"] == 0
    assert json.loads(server.client(reader, "watch", "b:y", "--once").stdout)["count"] == 0
    ends = model.iso(model.now() + dt.timedelta(seconds=4))
    db = raw_db(mailbox_path)
    db.execute(f"UPDATE deliveries SET expires_at = '{ends}'")
    db.commit()
    db.close()
    watches = [subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "b:y"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=process_env(**env))
               for env in ({"AGENT_MAIL_DB": str(mailbox_path)},
                           {"AGENT_MAIL_DB": server.url, "AGENT_MAIL_TOKEN": reader})]
    try:
        started = time.monotonic()
        time.sleep(1.5)
        assert [w.poll() for w in watches] == [None, None]  # still blocked: the held mail woke neither
        for watch in watches:
            out, err = watch.communicate(timeout=60)
            assert watch.returncode == 0, err
            assert [m["subject"] for m in json.loads(out)["messages"]] == ["one"]
        assert time.monotonic() - started < 30  # woken by the hold's end, not by a safety net minutes later
    finally:
        for watch in watches:
            if watch.poll() is None:
                watch.kill()
                watch.communicate()
    assert _settle(server, reader, delivery)[1]["confirmed"] == 1  # printed late: still marked, once
