"""Webhooks (issue 34), as real processes on both backends: `agent-mail serve` POSTs each event to a receiver on
loopback (tests/lib/webhook_receiver.py), signed with HMAC-SHA256 of the raw body, within a bound of the commit;
retries a 500; records a failure; loses nothing across a restart (stopped, or killed mid-POST); delivers each event
once with two replicas; tells of an identity deaf for a short --after-minutes; and refuses bad input, naming the
field, changing nothing."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.lib.serving import Server
from tests.lib.waiting import until
from tests.lib.webhook_receiver import Receiver, signed

pytestmark = [pytest.mark.backends, pytest.mark.timeout(120),
              pytest.mark.local_only("starts and stops servers of its own, which deliver the webhooks")]

DELIVERY_BOUND = 5.0  # the send's exit -> its POST received (the bound)
FIRST_RETRY_BOUND = 10.0  # a failed POST -> its first retry received
SECRET = "s3cr3t-for-webhooks-" + "7f" * 12


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "hook-secret"
    path.write_text(SECRET + "\n")
    path.chmod(0o600)
    return str(path)


@pytest.fixture
def receiver():
    made = []

    def make(statuses=(), hang=0):
        made.append(Receiver(statuses, hang))
        return made[-1]
    yield make
    for r in made:
        r.stop()


def _add(am, url, secret_file, *args):
    return am("webhook", "add", "--url", url, "--secret-file", secret_file, *args).json


def _listed(am):
    return am("webhook", "list").json


def _send(am, frm, to, subject="hello", *extra):
    return am("send", "--from", frm, "--to", to, "--subject", subject, "--body", "the body", *extra).json


def test_a_send_is_posted_signed_within_the_bound(am, mailbox_path, secret_file, receiver):
    plain, slack = receiver(), receiver()
    am("profile", "ops:alice", "--human").assert_ok()
    added = _add(am, plain.url, secret_file, "--agent", "ops:alice")
    _add(am, slack.url, secret_file, "--agent", "ops:alice", "--format", "slack", "--with-body")
    assert added["events"] == ["mail"] and added["url"] == plain.url.rsplit("/", 1)[0] + "/…"
    assert "agent-mail serve" in added["delivered_by"] and SECRET not in json.dumps(added)
    server = Server(str(mailbox_path))
    receipt = _send(am, "ops:bob", "ops:alice", "Deploy <b>now</b> & then")
    sent = time.monotonic()
    _send(am, "ops:bob", "ops:carol", "not for alice")  # another identity's mail: no POST
    until(lambda: plain.posts and slack.posts, DELIVERY_BOUND, "both webhooks POSTed within the bound")
    post = plain.posts[0]
    assert post["at"] - sent < DELIVERY_BOUND
    assert post["headers"]["x-agent-mail-signature"] == signed(SECRET, post["body"])
    assert post["headers"]["content-type"] == "application/json"
    document = json.loads(post["body"])
    assert post["headers"]["x-agent-mail-delivery"] == document["id"]
    assert document["kind"] == "mail" and document["agent"] == "ops:alice" and document["time"]
    assert document["message"] == {"id": receipt["id"], "sender": "ops:bob", "recipient": "ops:alice",
                                   "subject": "Deploy <b>now</b> & then"}  # never the body unless asked
    text = json.loads(slack.posts[0]["body"])
    assert set(text) == {"text"}  # what a Slack-compatible incoming webhook takes
    assert "Deploy &lt;b&gt;now&lt;/b&gt; &amp; then" in text["text"] and "the body" in text["text"]
    assert slack.posts[0]["headers"]["x-agent-mail-signature"] == signed(SECRET, slack.posts[0]["body"])
    time.sleep(0.5)  # time for a wrong POST to come: none does
    assert len(plain.posts) == 1 and len(slack.posts) == 1
    code, log = server.stop()
    assert code == 0 and SECRET not in log
    hook = _listed(am)["webhooks"][0]
    assert hook["deliveries"] == {"pending": 0, "delivered": 1, "failed": 0}
    assert hook["recent"][0]["state"] == "delivered" and hook["recent"][0]["last_status"] == 200
    assert SECRET not in json.dumps(_listed(am))


def test_a_500_is_retried_with_the_same_delivery_id(am, mailbox_path, secret_file, receiver):
    flaky = receiver(statuses=[500])
    _add(am, flaky.url, secret_file, "--event", "mail")
    server = Server(str(mailbox_path))
    _send(am, "ops:bob", "ops:alice")
    until(lambda: len(flaky.posts) >= 2, DELIVERY_BOUND + FIRST_RETRY_BOUND, "the POST answered 500 was retried")
    first, again = flaky.posts[:2]
    assert again["at"] - first["at"] < FIRST_RETRY_BOUND
    assert first["headers"]["x-agent-mail-delivery"] == again["headers"]["x-agent-mail-delivery"]
    assert first["body"] == again["body"]
    server.stop()
    recent = _listed(am)["webhooks"][0]["recent"][0]
    assert recent["state"] == "delivered" and recent["attempts"] == 2 and recent["last_status"] == 200


def test_a_delivery_that_keeps_failing_is_recorded_failed(am, mailbox_path, secret_file, receiver):
    broken = receiver(statuses=[503] * 50)
    _add(am, broken.url, secret_file, "--event", "mail")
    server = Server(str(mailbox_path), AGENT_MAIL_WEBHOOK_RETRY_SECONDS="4")
    _send(am, "ops:bob", "ops:alice")
    listed = until(lambda: (lambda got: got if got["failures"] else None)(_listed(am)), 30,
                   "the delivery recorded failed once its retries ran out")
    server.stop()
    failed = listed["failures"][0]
    assert failed["state"] == "failed" and failed["last_status"] == 503 and failed["last_error"] == "HTTP 503"
    assert 2 <= failed["attempts"] == len(broken.posts)
    assert listed["webhooks"][0]["deliveries"]["failed"] == 1


def test_events_queued_while_no_server_runs_are_posted_when_one_starts(am, mailbox_path, secret_file, receiver):
    got = receiver()
    _add(am, got.url, secret_file, "--event", "mail")
    server = Server(str(mailbox_path))
    _send(am, "ops:bob", "ops:alice", "first")
    until(lambda: got.posts, DELIVERY_BOUND, "the first POST")
    server.stop()
    _send(am, "ops:bob", "ops:alice", "while stopped")
    time.sleep(0.5)  # no server: nothing is POSTed
    assert len(got.posts) == 1
    server.restart()
    until(lambda: len(got.posts) == 2, DELIVERY_BOUND, "the event queued while stopped, POSTed after the restart")
    assert got.documents()[1]["message"]["subject"] == "while stopped"
    server.stop()


def test_a_server_killed_mid_post_leaves_the_delivery_to_the_next(am, mailbox_path, secret_file, receiver):
    stuck = receiver(hang=1)  # the first POST gets no answer
    _add(am, stuck.url, secret_file, "--event", "mail")
    env = {"AGENT_MAIL_WEBHOOK_TIMEOUT_SECONDS": "1"}  # its lease: 6 s
    server = Server(str(mailbox_path), **env)
    _send(am, "ops:bob", "ops:alice", "killed mid-POST")
    until(lambda: stuck.posts, DELIVERY_BOUND, "the first POST")
    server.kill()
    server = Server(str(mailbox_path), **env)
    until(lambda: len(stuck.posts) >= 2, 20, "the delivery POSTed again by the next server once its lease ran out")
    first, again = stuck.posts[:2]
    assert first["headers"]["x-agent-mail-delivery"] == again["headers"]["x-agent-mail-delivery"]
    server.stop()
    assert _listed(am)["webhooks"][0]["deliveries"] == {"pending": 0, "delivered": 1, "failed": 0}


def test_two_replicas_deliver_each_event_once(am, mailbox_path, secret_file, receiver):
    got = receiver()
    _add(am, got.url, secret_file, "--event", "mail")
    replicas = [Server(str(mailbox_path)), Server(str(mailbox_path))]
    for n in range(20):
        _send(am, "ops:bob", f"ops:w{n % 4}", f"job {n}")
    until(lambda: len(got.posts) >= 20, 20, lambda: f"20 POSTs ({len(got.posts)} so far)")
    time.sleep(1.0)  # time for a second delivery of any of them: none comes
    ids = [p["headers"]["x-agent-mail-delivery"] for p in got.posts]
    assert len(ids) == 20 == len(set(ids))
    assert sorted(d["message"]["subject"] for d in got.documents()) == sorted(f"job {n}" for n in range(20))
    logs = [replica.stop()[1] for replica in replicas]
    assert sum(log.count('"outcome": "delivered"') for log in logs) == 20


def test_an_identity_deaf_for_the_minutes_is_told_once(am, mailbox_path, secret_file, receiver):
    got = receiver()
    am("heartbeat", "ops:carol").assert_ok()  # listening: never deaf
    _add(am, got.url, secret_file, "--event", "deaf", "--after-minutes", "0.05")  # 3 s
    server = Server(str(mailbox_path))
    _send(am, "ops:bob", "ops:dave", "anyone there?")
    _send(am, "ops:bob", "ops:carol", "you are listening")
    until(lambda: got.posts, 3 + DELIVERY_BOUND, "the deaf event")
    time.sleep(2.0)  # more looks for deaf identities: the same unread mail is told of once
    documents = got.documents()
    assert [d["agent"] for d in documents] == ["ops:dave"]
    deaf = documents[0]
    assert deaf["kind"] == "deaf" and deaf["unread"] == 1 and deaf["after_minutes"] == 0.05
    assert deaf["message"]["subject"] == "anyone there?"
    from agent_mail import model
    assert (model.parse_iso(deaf["time"]) - model.parse_iso(deaf["since"])).total_seconds() >= 3
    server.stop()


def test_a_bounce_and_a_reservation_clash_are_posted(am, mailbox_path, secret_file, receiver):
    got = receiver()
    _add(am, got.url, secret_file, "--event", "bounce", "--event", "clash")
    server = Server(str(mailbox_path))
    refused = am("send", "--from", "ops:bob", "--to", "ops:nobody", "--subject", "urgent", "--body", "b",
                 "--require-reachable")
    assert refused.code == 3
    am("reserve", "ops:bob", "src/**", "--repo", "github.com/acme/widget", "--reason", "rewrite").assert_ok()
    clash = am("reserve", "ops:eve", "src/parser.py", "--repo", "github.com/acme/widget")
    assert clash.code == 3
    until(lambda: len(got.posts) >= 2, DELIVERY_BOUND, "the bounce and the clash")
    by_kind = {d["kind"]: d for d in got.documents()}
    assert by_kind["bounce"]["message"]["recipient"] == "ops:nobody" and by_kind["bounce"]["reason"]
    assert by_kind["clash"]["agent"] == "ops:eve" and by_kind["clash"]["patterns"] == ["/src/parser.py"]
    assert by_kind["clash"]["holders"][0]["holder"] == "ops:bob"
    server.stop()


def test_through_a_server_with_an_operators_token_only(am, mailbox_path, secret_file, receiver):
    got = receiver()
    server = Server(str(mailbox_path))
    operator, agent = server.token("--agent", "*"), server.token("--agent", "ops:alice")
    refused = server.client(agent, "webhook", "add", "--url", got.url, "--event", "mail", "--secret-file",
                            secret_file)
    assert refused.returncode == 4 and "operator" in json.loads(refused.stderr)["error"]
    added = server.client(operator, "webhook", "add", "--url", got.url, "--event", "mail", "--secret-file",
                          secret_file)
    assert added.returncode == 0, added.stderr
    server.client(operator, "send", "--from", "ops:bob", "--to", "ops:alice", "--subject", "s", "--body", "b")
    until(lambda: got.posts, DELIVERY_BOUND, "the POST")
    assert got.posts[0]["headers"]["x-agent-mail-signature"] == signed(SECRET, got.posts[0]["body"])
    listed = server.client(operator, "webhook", "list")
    assert listed.returncode == 0 and json.loads(listed.stdout)["count"] == 1
    removed = server.client(operator, "webhook", "remove", json.loads(added.stdout)["id"])
    assert removed.returncode == 0 and json.loads(removed.stdout)["removed"] is True
    server.stop()
    assert all(SECRET not in output for output in server.outputs)


@pytest.mark.parametrize("args, field", [
    (["--url", "ftp://example.com/x", "--event", "mail"], "--url"),
    (["--url", "not a url", "--event", "mail"], "--url"),
    (["--url", "http://127.0.0.1:9/x", "--event", "mail", "--secret-file", "/nonexistent/secret"], "--secret-file"),
    (["--url", "http://127.0.0.1:9/x", "--event", "everything"], "--event"),
    (["--url", "http://127.0.0.1:9/x", "--agent", "ops:nobody-yet"], "--agent"),
    (["--url", "http://127.0.0.1:9/x", "--agent", "Not An Identity"], "--agent"),
    (["--url", "http://127.0.0.1:9/x", "--event", "mail", "--after-minutes", "5"], "--after-minutes"),
    (["--url", "http://127.0.0.1:9/x"], "--agent"),
    (["--url", "http://127.0.0.1:9/x", "--event", "mail", "--secret-file", "OPEN"], "--secret-file"),
])
def test_bad_input_names_the_field_and_changes_nothing(am, secret_file, tmp_path, args, field):
    if "OPEN" in args:
        opened = tmp_path / "open-secret"
        opened.write_text(SECRET)
        opened.chmod(0o644)
        args = [str(opened) if a == "OPEN" else a for a in args]
    if "--secret-file" not in args:
        args = [*args, "--secret-file", secret_file]
    _send(am, "ops:bob", "ops:alice")
    failed = am("webhook", "add", *args)
    assert failed.code == 2 or failed.code == 1, failed.err
    error = failed.error
    assert field in [p["field"] for p in error["problems"]], error
    assert SECRET not in failed.err
    assert _listed(am)["count"] == 0


def test_remove_stops_the_deliveries_and_an_unknown_id_is_refused(am, mailbox_path, secret_file, receiver):
    got = receiver()
    hook = _add(am, got.url, secret_file, "--event", "mail")
    _send(am, "ops:bob", "ops:alice")  # queued; no server yet
    removed = am("webhook", "remove", hook["id"]).json
    assert removed == {"id": hook["id"], "removed": True, "dropped": 1}
    assert am("webhook", "remove", hook["id"]).error["problems"][0]["field"] == "id"
    server = Server(str(mailbox_path))
    _send(am, "ops:bob", "ops:alice")
    time.sleep(1.0)  # nothing is POSTed for a removed webhook
    server.stop()
    assert got.posts == [] and os.path.exists(secret_file)
