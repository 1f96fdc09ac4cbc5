"""Delivery semantics: fan-out, reachability and bounces, delay, attachments, handling, the mirror."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from agent_mail import model
from agent_mail.operations.mail import open_mailbox
from tests.lib.cli import process_env
from tests.lib.mailbox import mailbox_itself, raw_db

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL


def ids(document):
    return [m["id"] for m in document["messages"]]


def send_args(frm, *to, subject="hello"):
    argv = ["send", "--from", frm, "--subject", subject]
    for recipient in to:
        argv += ["--to", recipient]
    return argv


# ---------------------------------------------------------------- fan-out


@pytest.mark.fast
def test_fan_out_gives_each_recipient_its_own_copy_and_state(am):
    receipt = am(*send_args("lead:main", "w:one", "w:two", "w:one"), "--body", "b").json
    assert receipt["id"] is None and receipt["recipient"] is None
    assert [d["recipient"] for d in receipt["deliveries"]] == ["w:one", "w:two"]  # duplicates collapse
    one, two = (d["id"] for d in receipt["deliveries"])
    assert one != two and receipt["delivered"] == 2 and receipt["refused"] == 0
    assert ids(am("read", "w:one").json) == [one]
    # w:one's read does not touch w:two's copy
    assert ids(am("read", "w:two", "--no-mark-read").json) == [two]
    am("ack", "w:two", two).assert_ok()
    assert am("status", "--agent", "w:one", "--fields", "unacked").json["agents"][0]["unacked"] == 1


@pytest.mark.fast
def test_single_recipient_keeps_the_top_level_id(am):
    receipt = am(*send_args("a:x", "b:y")).json
    assert receipt["id"] == receipt["deliveries"][0]["id"] and receipt["recipient"] == "b:y"
    assert receipt["deliveries"][0]["status"] == "delivered"


@pytest.mark.fast
def test_broadcast_must_stand_alone(am):
    error = am(*send_args("a:x", "*", "b:y")).error
    assert error["problems"][0]["field"] == "--to"
    assert am("status").json["count"] == 0


@pytest.mark.fast
def test_any_bad_recipient_refuses_the_whole_send(am):
    error = am(*send_args("a:x", "b:y", "Not Valid", "c:z")).error
    assert [p["field"] for p in error["problems"]] == ["--to"]
    assert am("status").json["count"] == 0


KILLED_SENDER = """
import sys
from agent_mail.cli import main
recipients = [f"team:r{i}" for i in range(int(sys.argv[2]))]
argv = ["send", "--from", "lead:main", "--subject", "fan-out", "--attach", sys.argv[1]]
for r in recipients:
    argv += ["--to", r]
while True:
    main.main(argv)
"""


def test_a_killed_sender_leaves_every_send_all_or_nothing(tmp_path, mailbox_path, am, backend):
    attachment = tmp_path / "payload.bin"
    attachment.write_bytes(os.urandom(256 * 1024))
    am("status").assert_ok()
    recipients = 40
    for _ in range(8):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_SENDER, str(attachment), str(recipients)],
                                env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(random.uniform(0.3, 0.9))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    db = raw_db(mailbox_path)
    if backend == "sqlite":
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # One statement, one snapshot: through a server a killed client's send may still be committing meanwhile.
    batches = db.execute("SELECT m.batch_id, COUNT(DISTINCT m.id), COUNT(a.message_id) FROM messages m "
                         "LEFT JOIN attachments a ON a.message_id = m.id GROUP BY m.batch_id").fetchall()
    assert batches, "no send completed; the test proves nothing"
    assert {(n, links) for _, n, links in batches} == {(recipients, recipients)}  # each message its one link
    assert db.execute("SELECT COUNT(*) FROM attachment_blobs").fetchone()[0] == 1  # stored once
    orphans = db.execute("SELECT COUNT(*) FROM attachments WHERE message_id NOT IN (SELECT id FROM messages)")
    assert orphans.fetchone()[0] == 0


# ---------------------------------------------------------------- reachability and bounces


@pytest.mark.fast
def test_each_delivery_says_whether_the_recipient_is_reachable(am):
    am("heartbeat", "w:awake").assert_ok()
    am("profile", "jj:boss", "--human").assert_ok()
    receipt = am(*send_args("lead:main", "w:awake", "w:asleep", "jj:boss", "lead:main")).json
    reach = {d["recipient"]: d["reachable"] for d in receipt["deliveries"]}
    assert reach == {"w:awake": True, "w:asleep": False, "jj:boss": True, "lead:main": True}
    assert receipt["delivered"] == 4  # accepted either way: mail waits


@pytest.mark.fast
def test_require_reachable_refuses_the_unreachable_and_bounces(am):
    am("heartbeat", "w:awake").assert_ok()
    result = am(*send_args("lead:main", "w:awake", "w:asleep", "lead:main", subject="urgent"), "--require-reachable")
    assert result.code == 3 and "Traceback" not in result.err
    receipt = json.loads(result.out)
    by = {d["recipient"]: d for d in receipt["deliveries"]}
    assert by["w:awake"]["status"] == "delivered" and by["lead:main"]["status"] == "delivered"
    refused = by["w:asleep"]
    assert refused["status"] == "refused" and refused["id"] is None and "never watched" in refused["reason"]
    assert receipt["refused"] == 1 and receipt["delivered"] == 2
    assert am("read", "w:asleep").json["messages"] == []  # nothing published for it
    events = am("notifications", "lead:main").json["system"]["events"]
    assert [(e["source"], e["recipient"], e["subject"]) for e in events] == [("email.bounce", "w:asleep", "urgent")]
    assert events[0]["reason"] == refused["reason"]


def test_bounces_are_kept_until_dismissed_never_capped(am):
    for i in range(60):
        assert am(*send_args("lead:main", f"w:n{i}"), "--require-reachable").code == 3
    events = am("notifications", "lead:main").json["system"]["events"]
    assert len(events) == 60
    first = events[0]["id"]
    dismissed = am("notifications", "lead:main", "--dismiss", first).json
    assert dismissed["dismissed"] == [first] and len(dismissed["system"]["events"]) == 59
    error = am("notifications", "lead:main", "--dismiss", first).error
    assert error["problems"][0]["field"] == "--dismiss"


@pytest.mark.fast
def test_broadcast_require_reachable_with_nobody_listening(am):
    am(*send_args("w:one", "lead:main")).assert_ok()
    result = am(*send_args("lead:main", "*"), "--require-reachable")
    assert result.code == 3 and json.loads(result.out)["deliveries"][0]["status"] == "refused"
    am("heartbeat", "w:one").assert_ok()
    assert am(*send_args("lead:main", "*"), "--require-reachable").json["delivered"] == 1


# ---------------------------------------------------------------- delay


@pytest.mark.fast
def test_a_delayed_message_is_invisible_until_due(am, mailbox_path):
    receipt = am(*send_args("lead:main", "w:one", subject="later"), "--delay-minutes", "60").json
    delivery = receipt["deliveries"][0]
    assert delivery["status"] == "scheduled" and receipt["scheduled"] == 1
    assert am("read", "w:one").json["messages"] == []
    assert am("watch", "w:one", "--once").json["count"] == 0
    assert am("status", "--agent", "w:one", "--fields", "unread,unacked").json["agents"][0] == {"unread": 0,
                                                                                              "unacked": 0}
    assert am("notifications", "w:one").json["email"] is None
    # it falls due: bring its time forward instead of waiting an hour
    db = raw_db(mailbox_path)
    past = model.iso(model.now() - __import__("datetime").timedelta(seconds=1))
    db.execute("UPDATE messages SET deliver_at = ?", (past,))
    db.execute("UPDATE scheduled SET deliver_at = ?", (past,))
    db.commit()
    read = am("read", "w:one").json
    assert ids(read) == [delivery["id"]] and read["messages"][0]["deliver_at"] == past


def test_a_delayed_message_survives_restarts_and_needs_no_daemon(tmp_path):
    started = time.monotonic()
    sent = subprocess.run([sys.executable, "-m", "agent_mail", *send_args("a:x", "b:y"), "--delay-minutes", "0.05"],
                          env=process_env(), capture_output=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    early = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=process_env(),
                           capture_output=True, timeout=60)
    if time.monotonic() - started < 3.0:  # read before it fell due (a loaded machine may take longer)
        assert json.loads(early.stdout)["count"] == 0
    time.sleep(max(0.0, started + 3.5 - time.monotonic()))  # no process of ours runs in between
    late = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=process_env(),
                          capture_output=True, timeout=60)
    assert json.loads(late.stdout)["count"] == 1


def test_a_blocked_watch_wakes_when_a_delayed_message_falls_due(mailbox_path):
    sent = subprocess.run([sys.executable, "-m", "agent_mail", *send_args("a:x", "b:y"), "--delay-minutes", "0.03"],
                          env=process_env(), capture_output=True, timeout=60)
    assert sent.returncode == 0
    started = time.monotonic()
    watch = subprocess.run([sys.executable, "-m", "agent_mail", "watch", "b:y", "--timeout-minutes", "5"],
                           env=process_env(), capture_output=True, timeout=120)
    elapsed = time.monotonic() - started
    result = json.loads(watch.stdout)
    assert result["count"] == 1 and result["timeout"] is False
    assert elapsed < 60  # woken by the due time, not the 300 s timeout


@pytest.mark.fast
def test_cancel_before_due_and_its_errors(am, mailbox_path):
    receipt = am(*send_args("lead:main", "w:one", "w:two"), "--delay-minutes", "30").json
    one, two = (d["id"] for d in receipt["deliveries"])
    now = am(*send_args("lead:main", "w:one", subject="now")).json["id"]
    # Neither a recipient of a message not yet due nor a stranger learns that it exists, or who sent it: the
    # answer every other command gives for a message an identity may not see.
    for stranger, message in (("w:two", two), ("other:agent", one)):
        error = am("cancel", stranger, message).error["error"]
        assert f"is visible to {stranger}" in error and "lead:main" not in error, error
    error = am("cancel", "w:one", now).error["error"]  # one it received: it may know who sent it
    assert "sent to w:one by lead:main" in error and "only its sender" in error, error
    error = am("cancel", "lead:main", one, now).error
    assert "cannot be withdrawn" in error["error"]
    assert am("cancel", "lead:main", one).json == {"sender": "lead:main", "cancelled": [one], "count": 1}
    assert "already cancelled" in am("cancel", "lead:main", one).error["error"]
    assert "no message" in am("cancel", "lead:main", model.new_message_id()).error["error"]
    # w:two's copy still stands, and w:one never sees the cancelled one
    with mailbox_itself(mailbox_path) as mailbox:
        db = mailbox.store.db
        db.execute("UPDATE messages SET deliver_at = '2000-01-01T00:00:00+00:00' WHERE deliver_at IS NOT NULL")
    assert ids(am("read", "w:one").json) == [now]
    assert ids(am("read", "w:two").json) == [two]


@pytest.mark.fast
@pytest.mark.parametrize("value", ["-1", "43201", "nan", "soon"])
def test_delay_bounds(am, value):
    assert am(*send_args("a:x", "b:y"), "--delay-minutes", value).error["problems"][0]["field"] == "--delay-minutes"


# ---------------------------------------------------------------- attachments


@pytest.fixture
def report(tmp_path):
    path = tmp_path / "report.txt"
    path.write_bytes(b"quarterly numbers\n")
    return path


@pytest.mark.fast
def test_attachments_are_stored_once_and_outlive_the_original(am, report, tmp_path, mailbox_path):
    receipt = am(*send_args("lead:main", "w:one", "w:two"), "--attach", str(report)).json
    assert receipt["attachments"][0]["name"] == "report.txt" and receipt["attachments"][0]["size"] == 18
    report.unlink()
    message = am("read", "w:one").json["messages"][0]
    assert message["attachments"] == receipt["attachments"]
    saved = am("attachments", "w:one", message["id"], "--save-to", str(tmp_path / "in")).json
    assert (tmp_path / "in" / "report.txt").read_bytes() == b"quarterly numbers\n"
    assert saved["saved"][0]["path"] == str(tmp_path / "in" / "report.txt")
    db = raw_db(mailbox_path)
    assert db.execute("SELECT COUNT(*) FROM attachment_blobs").fetchone()[0] == 1
    # the sender can list its own; a stranger cannot
    assert am("attachments", "lead:main", message["id"]).json["count"] == 1
    assert am("attachments", "w:stranger", message["id"]).error["problems"][0]["field"] == "id"


@pytest.mark.fast
def test_attachment_validation(am, tmp_path, report):
    big = tmp_path / "big.bin"
    with open(big, "wb") as handle:
        handle.truncate(model.ATTACHMENT_MAX_BYTES + 1)
    error = am(*send_args("a:x", "b:y"), "--attach", str(big), "--attach", str(tmp_path / "missing"),
               "--attach", str(tmp_path), "--attach", "/dev/null").error
    messages = [p["message"] for p in error["problems"]]
    assert len(messages) == 4 and all(p["field"] == "--attach" for p in error["problems"])
    assert "limit" in messages[0] and "does not exist" in messages[1] and "regular file" in messages[2]
    assert am("status").json["count"] == 0


@pytest.mark.fast
def test_attachment_total_and_count_caps(am, tmp_path, monkeypatch):
    monkeypatch.setattr(model, "ATTACHMENTS_MAX_BYTES_PER_SEND", 10)
    monkeypatch.setattr(model, "ATTACHMENTS_MAX_COUNT", 2)
    files = []
    for i in range(3):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"123456")
        files += ["--attach", str(path)]
    assert "limit is 2" in am(*send_args("a:x", "b:y"), *files).error["error"]
    assert "in all" in am(*send_args("a:x", "b:y"), *files[:4]).error["error"]


@pytest.mark.fast
def test_symlinked_attachment_attaches_the_target(am, report, tmp_path):
    link = tmp_path / "link.txt"
    link.symlink_to(report)
    receipt = am(*send_args("a:x", "b:y"), "--attach", str(link)).json
    assert receipt["attachments"][0]["size"] == 18


def _plant_attachment(mailbox_path, message_id, name, content=b"x"):
    import hashlib

    digest = hashlib.sha256(content).hexdigest()
    db = raw_db(mailbox_path)
    db.execute("INSERT INTO attachment_blobs VALUES (?, ?, ?, '2026-01-01T00:00:00+00:00') ON CONFLICT DO NOTHING",
               (digest, len(content), content))
    position = db.execute("SELECT COUNT(*) FROM attachments WHERE message_id = ?", (message_id,)).fetchone()[0]
    db.execute("INSERT INTO attachments VALUES (?, ?, ?, ?, ?)", (message_id, position, name, len(content), digest))
    db.commit()
    db.close()


@pytest.mark.parametrize("hostile, expected", [
    ("../../escape.txt", "escape.txt"),
    ("/etc/passwd", "passwd"),
    ("..\\..\\win.txt", "win.txt"),
    ("..", "attachment-1"),
    ("", "attachment-1"),
    ("bell\x07name", "bellname"),
    ("what?.txt", "what.txt"),
])
@pytest.mark.fast
def test_hostile_names_never_leave_the_directory(am, mailbox_path, tmp_path, hostile, expected):
    message = am(*send_args("a:x", "b:y")).json["id"]
    _plant_attachment(mailbox_path, message, hostile)
    target = tmp_path / "box-out"
    saved = am("attachments", "b:y", message, "--save-to", str(target)).json["saved"]
    assert [s["name"] for s in saved] == [expected]
    assert os.listdir(target) == [expected]
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.fast
def test_saving_never_overwrites_unasked_and_never_follows_links(am, mailbox_path, tmp_path):
    message = am(*send_args("a:x", "b:y")).json["id"]
    _plant_attachment(mailbox_path, message, "notes.txt", b"new")
    _plant_attachment(mailbox_path, message, "notes.txt", b"second")
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_bytes(b"precious")
    error = am("attachments", "b:y", message, "--save-to", str(target)).error
    assert "already exists" in error["error"]
    assert sorted(os.listdir(target)) == ["notes.txt"] and (target / "notes.txt").read_bytes() == b"precious"
    saved = am("attachments", "b:y", message, "--save-to", str(target), "--overwrite").json["saved"]
    assert [s["name"] for s in saved] == ["notes.txt", "notes (2).txt"]
    assert (target / "notes.txt").read_bytes() == b"new"
    # a link planted where a name will land is never written through
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"untouched")
    links = tmp_path / "links"
    links.mkdir()
    (links / "notes.txt").symlink_to(outside)
    assert "already exists" in am("attachments", "b:y", message, "--save-to", str(links)).error["error"]
    assert "not a regular file" in am("attachments", "b:y", message, "--save-to", str(links),
                                      "--overwrite").error["error"]
    assert outside.read_bytes() == b"untouched"


@pytest.mark.fast
@pytest.mark.sqlite_only
@pytest.mark.local_only("the mailbox's own files are on this machine only when it is opened here")
def test_saving_never_replaces_the_mailbox_own_files_even_with_overwrite(am, mailbox_path, tmp_path):
    message = am(*send_args("a:x", "b:y")).json["id"]
    name = os.path.basename(mailbox_path)
    for planted in (name, name + "-wal", name + "-shm"):
        _plant_attachment(mailbox_path, message, planted, b"not a database")
    folder = os.path.dirname(mailbox_path)
    before = sorted(os.listdir(folder))
    error = am("attachments", "b:y", message, "--save-to", folder, "--overwrite").error
    assert error["problems"][0]["field"] == "--save-to" and "mailbox's own files" in error["error"]
    assert sorted(os.listdir(folder)) == before  # nothing saved, nothing replaced
    assert am("read", "b:y", "--no-mark-read").json["count"] == 1  # the mailbox is whole
    other = tmp_path / "elsewhere"
    assert len(am("attachments", "b:y", message, "--save-to", str(other)).json["saved"]) == 3


# ---------------------------------------------------------------- handling


@pytest.mark.fast
def test_dismiss_archive_delete(am, send):
    one, two = (send("a:x", "b:y", s)["id"] for s in ("one", "two"))
    three = send("a:x", "b:y", "three", "--reply-to", one)["id"]
    dismissed = am("dismiss", "b:y", one).json
    assert dismissed["dismissed"] == [one] and "body" not in json.dumps(dismissed)
    assert am("dismiss", "b:y", one).json["already_read"] == [one]
    assert am("archive", "b:y", two).json["archived"] == [two]
    assert am("delete", "b:y", three).json["deleted"] == [three]
    assert am("delete", "b:y", three).json["already_deleted"] == [three]
    assert ids(am("read", "b:y", "--all").json) == [one]
    assert ids(am("read", "b:y", "--archived").json) == [two]
    assert am("watch", "b:y", "--once").json["count"] == 0
    assert am("status", "--agent", "b:y", "--fields", "unread,unacked").json["agents"][0] == {"unread": 0,
                                                                                            "unacked": 1}
    # the sender keeps its record of the deleted one; b:y's thread view no longer has it
    assert ids(am("read", "a:x", "--thread", one).json) == [one, three]
    assert ids(am("read", "b:y", "--thread", one).json) == [one]
    assert "is visible to c:z" in am("delete", "c:z", one).error["error"]


@pytest.mark.fast
def test_deleting_a_broadcast_is_per_agent(am, send):
    send("c:z", "a:x", "hi")
    send("b:y", "a:x", "hi")
    broadcast = send("a:x", "*", "all")["id"]
    am("delete", "b:y", broadcast).assert_ok()
    assert am("read", "b:y", "--all").json["count"] == 0
    assert ids(am("read", "c:z").json) == [broadcast]
    assert am("cleanup", "--older-than", "0").json["deleted_count"] >= 1  # only cleanup removes the record


# ---------------------------------------------------------------- the unread mirror


@pytest.fixture
def mirrored(am, tmp_path):
    directory = tmp_path / "worktree"
    directory.mkdir()
    am("profile", "w:one", "--mirror-dir", str(directory), "--max-entries", "2").assert_ok()
    return directory / ".notification" / "email.json"


def _mirror(path):
    return json.loads(path.read_text()) if path.exists() else None


@pytest.mark.fast
def test_mirror_follows_every_change(am, send, mirrored):
    assert not mirrored.exists()
    first = send("a:x", "w:one", "one", "--body", "first body")["id"]
    doc = _mirror(mirrored)
    assert doc["data"]["count"] == 1 and doc["data"]["email_ids"] == [first]
    entry = doc["data"]["emails"][0]
    assert entry == {**entry, "id": first, "from": "a:x", "subject": "one", "message": "first body",
                     "message_chars": 10, "message_truncated": False}
    assert "dismiss w:one" in doc["instructions"]
    second = send("a:x", "w:one", "two")["id"]
    third = send("a:x", "w:one", "three")["id"]
    doc = _mirror(mirrored)
    assert doc["data"]["count"] == 3 and doc["data"]["email_ids"] == [third, second]  # newest max_entries
    am("dismiss", "w:one", third).assert_ok()
    assert _mirror(mirrored)["data"]["email_ids"] == [second, first]
    am("archive", "w:one", second).assert_ok()
    assert _mirror(mirrored)["data"]["count"] == 1
    am("read", "w:one", "--no-mark-read").assert_ok()
    assert _mirror(mirrored)["data"]["count"] == 1  # looking is not a change
    reply = send("w:one", "a:x", "re", "--reply-to", first)
    assert reply["mirrors"][0]["status"] == "removed"  # replying handled the last one
    assert not mirrored.exists()
    send("a:x", "*", "broadcast")
    assert _mirror(mirrored)["data"]["count"] == 1
    am("read", "w:one").assert_ok()
    assert not mirrored.exists()


@pytest.mark.fast
@pytest.mark.local_only("counts what an in-process send (the library, its store patched) reads back")
def test_a_send_renders_its_recipients_mirrors_without_reading_back_what_it_wrote(am, send, tmp_path, report):
    """A send to N mirrored recipients lists the rows it just stored from memory: the store is asked for
    the rows (and attachments) of earlier mail only, and the files are what a full read-back renders."""
    agents = [f"w:n{i}" for i in range(3)]
    files = {}
    for agent in agents:
        directory = tmp_path / agent.replace(":", "-")
        directory.mkdir()
        am("profile", agent, "--mirror-dir", str(directory)).assert_ok()
        files[agent] = directory / ".notification" / "email.json"
    earlier = send("a:x", agents[0], "earlier", "--attach", str(report))["id"]
    asked: list[str] = []

    def counting(real, position):  # records the ids a read-back method is asked for
        def wrapper(*args, **kwargs):
            asked.extend(args[position])
            return real(*args, **kwargs)
        return wrapper

    with open_mailbox() as mailbox:
        store = mailbox.store
        store.addressed = counting(store.addressed, 1)  # addressed(agent, message_ids, now)
        store.attachments_of = counting(store.attachments_of, 0)  # attachments_of(message_ids)
        receipt = mailbox.send(from_="a:x", to=agents, subject="to all", body="the plan", ref=[str(report)],
                               attach=[str(report)])
    written = {d["id"] for d in receipt["deliveries"]}
    assert len(written) == 3 and {m["status"] for m in receipt["mirrors"]} == {"rendered"}
    assert written.isdisjoint(asked) and set(asked) == {earlier}  # only the mail that was there before
    for agent in agents:  # and each file is what reading everything back would have rendered
        assert _mirror(files[agent]) == am("notifications", agent).json["email"]
    assert _mirror(files[agents[0]])["data"]["email_ids"][1] == earlier


@pytest.mark.fast
def test_clearing_the_mirror_marks_nothing_read(am, send, mirrored):
    send("a:x", "w:one", "one")
    result = am("notifications", "w:one", "--clear-email").json
    assert result["cleared"] is True and not mirrored.exists()
    assert result["email"]["data"]["count"] == 1
    assert am("status", "--agent", "w:one", "--fields", "unread").json["agents"][0]["unread"] == 1


@pytest.mark.fast
def test_a_scheduled_message_renders_the_mirror_when_due(am, mirrored, mailbox_path):
    am(*send_args("a:x", "w:one"), "--delay-minutes", "60").assert_ok()
    assert not mirrored.exists()
    db = raw_db(mailbox_path)
    db.execute("UPDATE messages SET deliver_at = '2000-01-01T00:00:00+00:00'")
    db.execute("UPDATE scheduled SET deliver_at = '2000-01-01T00:00:00+00:00'")
    db.commit()
    am("status").assert_ok()  # anyone touching the mailbox publishes what fell due
    assert _mirror(mirrored)["data"]["count"] == 1


@pytest.mark.fast
def test_system_channel_file(am, tmp_path):
    directory = tmp_path / "lead"
    directory.mkdir()
    am("profile", "lead:main", "--mirror-dir", str(directory)).assert_ok()
    assert am(*send_args("lead:main", "w:gone"), "--require-reachable").code == 3
    system = directory / ".notification" / "system.json"
    event = json.loads(system.read_text())["events"][0]
    assert event["source"] == "email.bounce" and event["recipient"] == "w:gone"
    am("notifications", "lead:main", "--dismiss", event["id"]).assert_ok()
    assert not system.exists()


@pytest.mark.fast
def test_a_failed_render_is_reported_and_never_fails_the_send(am, tmp_path):
    directory = tmp_path / "broken"
    directory.mkdir()
    am("profile", "w:one", "--mirror-dir", str(directory)).assert_ok()
    (directory / ".notification").write_text("a file where the folder should be")
    receipt = am(*send_args("a:x", "w:one")).json
    assert receipt["delivered"] == 1
    assert receipt["mirrors"][0]["status"] == "failed" and receipt["mirrors"][0]["error"]
    assert am("read", "w:one").json["count"] == 1


@pytest.mark.fast
def test_profile_show_set_clear(am, tmp_path, mirrored):
    shown = am("profile", "w:one").json
    assert shown["max_entries"] == 2 and shown["mirror_dir"] == str(mirrored.parent.parent)
    am(*send_args("a:x", "w:one")).assert_ok()
    assert mirrored.exists()
    cleared = am("profile", "w:one", "--clear", "mirror-dir", "--clear", "max-entries").json
    assert cleared["mirror_dir"] is None and cleared["max_entries"] is None
    assert not mirrored.exists()  # clearing the directory removes the file it wrote
    assert am("profile", "new:one").json["updated_at"] is None  # showing creates nothing
    errors = am("profile", "w:one", "--clear", "colour", "--mirror-dir", str(tmp_path / "missing")).error
    assert [p["field"] for p in errors["problems"]] == ["--clear", "--mirror-dir"]
    assert "set and clear" in am("profile", "w:one", "--human", "--clear", "human").error["error"]


RENDERER = """
import sys
from agent_mail.cli import main
for i in range(int(sys.argv[1])):
    main.main(["send", "--from", "a:x", "--to", "w:one", "--subject", f"{sys.argv[2]} {i}"])
    if i % 3 == 0:
        main.main(["read", "w:one", "--limit", "2"])
"""


def test_concurrent_renders_never_leave_a_torn_file(am, mirrored):
    torn, reads, stop = [], [0], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                text = mirrored.read_text()
            except FileNotFoundError:
                continue
            reads[0] += 1
            try:
                json.loads(text)
            except ValueError:
                torn.append(text)

    thread = threading.Thread(target=reader)
    thread.start()
    procs = [subprocess.Popen([sys.executable, "-c", RENDERER, "15", f"p{i}"], env=process_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(3)]
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
    finally:
        stop.set()
        thread.join()
    assert reads[0] > 0 and torn == []
    # and the last render matches the mailbox
    final = am("notifications", "w:one").json["email"]
    assert _mirror(mirrored) == final


def test_a_read_that_could_not_be_printed_leaves_the_mirror_as_the_mailbox(am, mirrored):
    am(*send_args("a:x", "w:one")).assert_ok()
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "w:one"], env=process_env(),
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60)
    finally:
        os.close(write_end)
    assert proc.returncode == 1
    # the render inside the transaction removed the file; the rollback must have put it back
    assert _mirror(mirrored)["data"]["count"] == 1
    assert am("status", "--agent", "w:one", "--fields", "unread").json["agents"][0]["unread"] == 1


@pytest.mark.fast
def test_a_reply_refused_everywhere_settles_nothing(am, send):
    question = send("a:x", "b:y", "question")["id"]
    result = am("send", "--from", "b:y", "--to", "a:x", "--subject", "answer", "--reply-to", question,
                "--require-reachable")
    assert result.code == 3 and json.loads(result.out)["acknowledged"] is None
    row = am("status", "--agent", "b:y", "--fields", "unread,unacked").json["agents"][0]
    assert row == {"unread": 1, "unacked": 1}  # the question is still open: no answer went out
    am("heartbeat", "a:x").assert_ok()
    assert send("b:y", "a:x", "answer", "--reply-to", question, "--require-reachable")["acknowledged"] == question


@pytest.mark.local_only("the library's send with an idempotency key (a client's repeat through a server: "
                        "tests/functional/test_server_faults.py)")
def test_an_idempotency_key_repeats_one_send_and_refuses_another(mailbox_path):
    """A key reused for the same send answers with what was stored; reused for another send (other recipients,
    another body, ...) it is refused, naming the first send, and nothing more is stored: the second message is
    never lost without a word."""
    from agent_mail import errors

    key = model.new_message_id()
    send = {"from_": "a:x", "to": ["b:y", "c:z"], "subject": "once", "body": "the body"}
    with mailbox_itself(mailbox_path) as mailbox:
        first = mailbox.send(**send, uploaded={"key": key})
        again = mailbox.send(**send, uploaded={"key": key})
        assert again["batch_id"] == first["batch_id"] == key
        assert [d["id"] for d in again["deliveries"]] == [d["id"] for d in first["deliveries"]]
        for changed, what in (({"to": ["b:y"]}, "list of recipients"), ({"to": ["b:y", "d:w"]}, "list of recipients"),
                              ({"body": "another body"}, "body"), ({"subject": "other"}, "subject"),
                              ({"from_": "a:y"}, "sender")):
            with pytest.raises(errors.InvalidInput) as refused:
                mailbox.send(**{**send, **changed}, uploaded={"key": key})
            problem = refused.value.problems()[0]
            field, message = problem["field"], problem["message"]
            assert field == "idempotency_key" and f"batch {key}" in message and what in message, problem
            assert "b:y, c:z" in message and "'once'" in message
        assert mailbox.read(agent="b:y", no_mark_read=True)["count"] == 1
        assert mailbox.read(agent="d:w", no_mark_read=True)["count"] == 0
