"""send / read / ack / status / cleanup: behaviour and every bad input."""

from __future__ import annotations


import pytest

from agent_mail import model

from tests.lib.mailbox import raw_db  # noqa: E402

pytestmark = [pytest.mark.backends, pytest.mark.fast]  # every test here runs on SQLite and on PostgreSQL


def ids(document):
    return [m["id"] for m in document["messages"]]


# ---------------------------------------------------------------- send and read


def test_send_then_read_delivers_once_and_marks_read(am, send):
    receipt = send("research:lead", "deploy:worker", "Fix the bug", "--body", "See logs.")
    assert receipt["type"] == "direct" and receipt["recipient"] == "deploy:worker"
    first = am("read", "deploy:worker").json
    assert ids(first) == [receipt["id"]]
    message = first["messages"][0]
    assert message["body"] == "See logs." and message["read_at"] is not None and message["acked_at"] is None
    assert first["remaining"] == 0
    assert am("read", "deploy:worker").json["messages"] == []


def test_read_is_oldest_first_and_limit_reports_remaining(am, send):
    sent = [send("a:x", "b:y", f"m{i}")["id"] for i in range(5)]
    page = am("read", "b:y", "--limit", "2").json
    assert ids(page) == sent[:2] and page["remaining"] == 3
    assert ids(am("read", "b:y").json) == sent[2:]


def test_non_ascii_round_trips_unchanged(am, send):
    send("a:x", "b:y", "Grüße 日本 🚀", "--body", "naïve — ✓")
    message = am("read", "b:y").json["messages"][0]
    assert message["subject"] == "Grüße 日本 🚀" and message["body"] == "naïve — ✓"


def test_note_to_self_is_delivered(am, send):
    receipt = send("a:x", "a:x", "remember")
    assert ids(am("read", "a:x").json) == [receipt["id"]]


def test_broadcast_reaches_everyone_but_the_sender_with_own_state(am, send):
    send("b:one", "a:lead", "hello")  # make b:one and c:two known identities
    send("c:two", "a:lead", "hello")
    receipt = send("a:lead", "*", "all hands")
    assert receipt["type"] == "broadcast"
    # One delivery, '*', that says how many identities it is for (b:one and c:two; not its sender)
    assert [(d["recipient"], d["identities"]) for d in receipt["deliveries"]] == [("*", 2)]
    assert receipt["id"] not in ids(am("read", "a:lead", "--all").json)
    assert ids(am("read", "b:one").json) == [receipt["id"]]
    # c:two has not read it yet, though b:one did
    assert ids(am("read", "c:two").json) == [receipt["id"]]
    assert am("read", "b:one").json["messages"] == []


def test_read_all_from_and_fields(am, send):
    one = send("a:x", "b:y", "one")["id"]
    two = send("c:z", "b:y", "two")["id"]
    am("read", "b:y").assert_ok()
    three = send("a:x", "b:y", "three")["id"]
    assert ids(am("read", "b:y", "--all", "--no-mark-read").json) == [one, two, three]
    assert ids(am("read", "b:y", "--all", "--limit", "2", "--no-mark-read").json) == [two, three]
    assert ids(am("read", "b:y", "--all", "--from", "a:x", "--no-mark-read").json) == [one, three]
    projected = am("read", "b:y", "--fields", "id,subject").json
    assert projected["messages"] == [{"id": three, "subject": "three"}]


def test_no_mark_read_leaves_unread_and_ack_acknowledges(am, send):
    message_id = send("a:x", "b:y", "one")["id"]
    assert ids(am("read", "b:y", "--no-mark-read").json) == [message_id]
    acked = am("read", "b:y", "--ack").json["messages"][0]
    assert acked["acked_at"] is not None and acked["read_at"] is not None
    row = am("status", "--agent", "b:y", "--fields", "agent,unread,unacked").json["agents"][0]
    assert row == {"agent": "b:y", "unread": 0, "unacked": 0}


def test_thread_walks_to_the_root_and_marks_nothing(am, send):
    root = send("a:x", "b:y", "question")["id"]
    reply = send("b:y", "a:x", "answer", "--reply-to", root)["id"]
    follow = send("a:x", "b:y", "thanks", "--reply-to", reply)["id"]
    unrelated = send("a:x", "b:y", "other")["id"]
    thread = am("read", "a:x", "--thread", follow).json
    assert ids(thread) == [root, reply, follow]
    assert unrelated not in ids(thread)
    # nothing new marked: b:y still has 'thanks' and 'other' unread
    assert ids(am("read", "b:y", "--no-mark-read").json) == [follow, unrelated]
    assert am("read", "a:x", "--thread", model.new_message_id()).error["problems"][0]["field"] == "--thread"


def test_refs_resolve_to_absolute_paths_and_come_back_as_an_array(am, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.md").write_text("x")
    (tmp_path / "notes.md").write_text("y")
    receipt = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--ref", "plan.md",
                 "--refs", '["notes.md", "plan.md"]').json
    expected = [str(tmp_path / "plan.md"), str(tmp_path / "notes.md")]
    assert receipt["refs"] == expected
    assert am("read", "b:y").json["messages"][0]["refs"] == expected


def test_a_ref_inside_a_git_repository_is_stored_from_its_root_with_the_repository_named(am, tmp_path, monkeypatch):
    """Issue 32: a ref means the same file to every reader, in any clone on any machine: KEY//PATH from the root."""
    repo = tmp_path / "widget"
    (repo / ".git").mkdir(parents=True)
    (repo / ".git" / "config").write_text('[remote "origin"]\n\turl = https://git.example.com/team/widget.git\n')
    (repo / "docs").mkdir()
    (repo / "docs" / "plan.md").write_text("x")
    (tmp_path / "loose.md").write_text("y")
    monkeypatch.chdir(repo / "docs")
    receipt = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--ref", "plan.md", "--ref",
                 str(tmp_path / "loose.md"), "--refs", '["../docs/plan.md", ".."]').json
    key = "git.example.com/team/widget"
    expected = [f"{key}//docs/plan.md", str(tmp_path / "loose.md"), f"{key}//."]
    assert receipt["refs"] == expected
    monkeypatch.chdir(tmp_path)
    assert am("read", "b:y").json["messages"][0]["refs"] == expected


@pytest.mark.parametrize("argv, field", [
    (["--ref", "missing.md"], "--ref"),
    (["--refs", "not json"], "--refs"),
    (["--refs", '{"a": 1}'], "--refs"),
    (["--refs", '["missing.md"]'], "--refs"),
    (["--refs", "[1]"], "--refs"),
])
def test_bad_refs_are_rejected_and_nothing_is_stored(am, tmp_path, monkeypatch, argv, field):
    monkeypatch.chdir(tmp_path)
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", *argv).error
    assert [p["field"] for p in error["problems"]] == [field]
    assert am("status").json["count"] == 0


def test_reply_marks_the_answered_message_read_and_acked(am, send):
    question = send("a:x", "b:y", "question")["id"]
    receipt = send("b:y", "a:x", "answer", "--reply-to", question)
    assert receipt["acknowledged"] == question and receipt["reply_to"] == question
    row = am("status", "--agent", "b:y", "--fields", "agent,unread,unacked").json["agents"][0]
    assert row == {"agent": "b:y", "unread": 0, "unacked": 0}


def test_reply_with_no_ack_marks_read_only(am, send):
    question = send("a:x", "b:y", "question")["id"]
    assert send("b:y", "a:x", "answer", "--reply-to", question, "--no-ack")["acknowledged"] is None
    row = am("status", "--agent", "b:y", "--fields", "agent,unread,unacked").json["agents"][0]
    assert row == {"agent": "b:y", "unread": 0, "unacked": 1}


def test_reply_to_a_broadcast_acks_it_for_the_replier_only(am, send):
    send("c:z", "a:x", "hi")
    announcement = send("a:x", "*", "all hands")["id"]
    send("b:y", "a:x", "on it", "--reply-to", announcement)
    assert am("status", "--agent", "b:y").json["agents"][0]["unacked"] == 0
    assert ids(am("read", "c:z", "--no-mark-read").json) == [announcement]


def test_reply_to_unknown_message_is_refused_and_stores_nothing(am, send):
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--reply-to",
               model.new_message_id()).error
    assert error["problems"][0]["field"] == "--reply-to"
    assert am("read", "b:y").json["messages"] == []


# ---------------------------------------------------------------- text limits


@pytest.mark.parametrize("subject, ok", [
    ("x" * model.SUBJECT_MAX_CHARS, True),
    ("x" * (model.SUBJECT_MAX_CHARS + 1), False),
    ("two\nlines", False),
    ("carriage\rreturn", False),
    ("bell\x07", False),
    ("   ", False),
    ("", False),
])
def test_subject_rules(am, subject, ok):
    result = am("send", "--from", "a:x", "--to", "b:y", "--subject", subject)
    if ok:
        assert result.json["subject"] == subject
    else:
        assert result.error["problems"][0]["field"] == "--subject"


@pytest.mark.parametrize("body, ok", [
    ("x" * model.BODY_MAX_CHARS, True),
    ("x" * (model.BODY_MAX_CHARS + 1), False),
    ("tab\tnewline\ncr\r", True),
    ("nul\x00", False),
    ("escape\x1b[31m", False),
    ("del\x7f", False),
    ("c1\x85", False),
    ("bad \udcff utf-8", False),
])
def test_body_rules(am, body, ok):
    result = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", body)
    if ok:
        result.assert_ok()
        assert am("read", "b:y").json["messages"][0]["body"] == body
    else:
        error = result.error
        assert error["problems"][0]["field"] == "--body"
        assert am("status").json["count"] == 0


def test_body_limit_error_names_the_limit_and_the_remedy(am):
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", "x" * 50_001).error
    assert "50000" in error["error"] and "--ref" in error["error"]


def test_body_file_utf8_with_bom(am, tmp_path):
    path = tmp_path / "body.md"
    path.write_bytes("\ufeffcode `x` \"quoted\"\n".encode("utf-8"))
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body-file", str(path)).assert_ok()
    assert am("read", "b:y").json["messages"][0]["body"] == "code `x` \"quoted\"\n"


def test_body_file_from_stdin(am):
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body-file", "-",
       stdin="from stdin".encode()).assert_ok()
    assert am("read", "b:y").json["messages"][0]["body"] == "from stdin"


@pytest.mark.parametrize("content", [b"\xff\xfe not utf-8", ("x" * 50_001).encode()])
def test_body_file_rejections(am, tmp_path, content):
    path = tmp_path / "body.txt"
    path.write_bytes(content)
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body-file", str(path)).error
    assert error["problems"][0]["field"] == "--body-file"


def test_huge_body_file_is_refused_without_reading_it_all(am, tmp_path):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as handle:
        handle.truncate(50 * 1024 * 1024)
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body-file", str(path)).error
    assert "--ref" in error["error"]


def test_body_file_missing_or_directory(am, tmp_path):
    for target in (tmp_path / "missing.txt", tmp_path):
        error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body-file", str(target)).error
        assert error["problems"][0]["field"] == "--body-file"


def test_body_and_body_file_are_exclusive(am, tmp_path):
    path = tmp_path / "b.txt"
    path.write_text("x")
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", "x", "--body-file", str(path)).error
    assert error["problems"][0]["field"] == "--body"


# ---------------------------------------------------------------- ack


def test_ack_ids_and_already_acked(am, send):
    one = send("a:x", "b:y", "one")["id"]
    two = send("a:x", "b:y", "two")["id"]
    first = am("ack", "b:y", one).json
    assert first["acked"] == [one] and first["already_acked"] == [] and first["count"] == 1
    second = am("ack", "b:y", one, two.upper()).json
    assert second["acked"] == [two] and second["already_acked"] == [one]
    # acknowledging implies it was read
    assert am("read", "b:y").json["messages"] == []


def test_ack_all_covers_direct_and_broadcast_per_agent(am, send):
    send("c:z", "a:x", "hi")
    direct = send("a:x", "b:y", "direct")["id"]
    broadcast = send("a:x", "*", "broadcast")["id"]
    am("read", "b:y").assert_ok()  # --all settles what was delivered
    result = am("ack", "b:y", "--all").json
    assert sorted(result["acked"]) == sorted([direct, broadcast]) and result["unread_left"] == 0
    assert am("status", "--agent", "c:z").json["agents"][0]["unacked"] == 1
    assert am("ack", "b:y", "--all").json["count"] == 0


def test_ack_unknown_or_foreign_ids_change_nothing(am, send):
    mine = send("a:x", "b:y", "mine")["id"]
    theirs = send("a:x", "c:z", "theirs")["id"]
    error = am("ack", "b:y", mine, theirs, model.new_message_id()).error
    assert len(error["problems"]) == 2
    assert "is visible to b:y" in error["error"]
    assert am("status", "--agent", "b:y").json["agents"][0]["unacked"] == 1


@pytest.mark.parametrize("argv", [["b:y"], ["b:y", "not-an-id"], ["b:y", "--all", model.new_message_id()]])
def test_ack_usage_errors(am, argv):
    assert am("ack", *argv).error


def test_own_broadcast_cannot_be_acked_by_its_sender(am, send):
    broadcast = send("a:x", "*", "hello")["id"]
    assert "not addressed" in am("ack", "a:x", broadcast).error["error"]


# ---------------------------------------------------------------- status


def test_status_rows_filters_and_fields(am, send):
    send("deploy:lead", "deploy:worker", "one")
    send("deploy:lead", "deploy:worker", "two")
    send("research:lead", "*", "all")
    rows = {r["agent"]: r for r in am("status", "--fields", "agent,unread,unacked").json["agents"]}
    assert rows["deploy:worker"] == {"agent": "deploy:worker", "unread": 3, "unacked": 3}
    assert rows["deploy:lead"] == {"agent": "deploy:lead", "unread": 1, "unacked": 1}
    assert rows["research:lead"] == {"agent": "research:lead", "unread": 0, "unacked": 0}
    deploy = am("status", "--project", "deploy").json
    assert [r["agent"] for r in deploy["agents"]] == ["deploy:lead", "deploy:worker"]
    unseen = am("status", "--agent", "new:one", "--fields", "agent,unread").json
    # never seen, but the broadcast is waiting for it: the count is what `read new:one` would deliver
    assert unseen["agents"] == [{"agent": "new:one", "unread": 1}]
    assert am("read", "new:one", "--no-mark-read").json["count"] == 1


@pytest.mark.parametrize("argv", [
    ["--project", "Bad Project"], ["--agent", "nope"], ["--fields", "agent,bogus"],
    ["--agent", "a:b", "--project", "a"],
])
def test_status_bad_input(am, argv):
    assert am("status", *argv).error


# ---------------------------------------------------------------- cleanup


def _age(mailbox_path, message_id, created):
    db = raw_db(mailbox_path)
    db.execute("UPDATE messages SET created = ? WHERE id = ?", (created, message_id))
    db.commit()
    db.close()


def test_cleanup_requires_an_age_and_deletes_nothing_without_it(am, send):
    send("a:x", "b:y", "keep")
    error = am("cleanup").error
    assert "--older-than" in error["error"] and "default" in error["error"]
    assert am("status", "--agent", "b:y").json["agents"][0]["unread"] == 1


def test_cleanup_dry_run_then_real(am, send, mailbox_path):
    old = send("a:x", "*", "old broadcast")["id"]
    send("c:z", "a:x", "c:z exists")
    am("read", "c:z").assert_ok()  # creates a broadcast_acks row for the old broadcast
    # a legacy local-offset timestamp 40 days ago
    _age(mailbox_path, old, "2000-01-01T10:00:00.000000-05:00")
    new = send("a:x", "b:y", "new")["id"]
    dry = am("cleanup", "--older-than", "30", "--dry-run").json
    assert dry["dry_run"] is True and dry["deleted_count"] == 1
    assert dry["oldest_deleted"] == dry["newest_deleted"] == "2000-01-01T10:00:00.000000-05:00"
    assert set(dry) == {"dry_run", "cutoff", "deleted_count", "oldest_deleted", "newest_deleted", "sessions_deleted",
                        "events_deleted", "attachments_deleted", "temporary_files_deleted"}
    assert am("read", "b:y", "--all", "--no-mark-read").json["count"] == 2
    real = am("cleanup", "--older-than", "30").json
    assert real["dry_run"] is False and real["deleted_count"] == 1
    assert ids(am("read", "b:y", "--all", "--no-mark-read").json) == [new]
    db = raw_db(mailbox_path)
    assert db.execute("SELECT COUNT(*) FROM broadcast_acks WHERE message_id = ?", (old,)).fetchone()[0] == 0


def test_cleanup_keeps_recent_messages_in_other_time_zones(am, send, mailbox_path):
    # 10 days old written with a +14:00 offset must not be mistaken for older
    import datetime as dt

    ten_days = dt.datetime.now(dt.timezone(dt.timedelta(hours=14))) - dt.timedelta(days=10)
    message = send("a:x", "b:y", "recent")["id"]
    _age(mailbox_path, message, ten_days.isoformat())
    assert am("cleanup", "--older-than", "11").json["deleted_count"] == 0
    assert am("cleanup", "--older-than", "9").json["deleted_count"] == 1


@pytest.mark.parametrize("value", ["-1", "abc", "1.5", "99999999"])
def test_cleanup_bad_age(am, value):
    assert am("cleanup", "--older-than", value).error["problems"][0]["field"] == "--older-than"


def test_old_messages_are_never_deleted_by_other_commands(am, send, mailbox_path):
    message = send("a:x", "b:y", "ancient")["id"]
    _age(mailbox_path, message, "2001-01-01T00:00:00+00:00")
    send("a:x", "c:z", "new")
    am("status").assert_ok()
    am("ack", "c:z", "--all").assert_ok()
    assert ids(am("read", "b:y").json) == [message]


def test_message_ids_are_random_version_4_uuids():
    import uuid

    made = {model.new_message_id() for _ in range(500)}
    assert len(made) == 500
    for value in made:
        parsed = uuid.UUID(value)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == value


def test_status_counts_stay_exact_when_another_writer_left_stray_broadcast_state(am, send, mailbox_path):
    send("b:y", "a:x", "introduce b:y")
    broadcast = send("a:x", "*", "all hands")["id"]
    send("a:x", "*", "second")
    am("dismiss", "b:y", broadcast).assert_ok()
    db = raw_db(mailbox_path)
    # a read mark for a message that no longer exists, as an older tool's purge could leave behind
    db.execute("INSERT INTO broadcast_acks (message_id, agent, read_at) VALUES "
               "('00000000-0000-4000-8000-000000000000', 'b:y', '2026-01-01T00:00:00+00:00')")
    db.commit()
    row = am("status", "--agent", "b:y", "--fields", "unread,unacked").json["agents"][0]
    assert row == {"unread": 1, "unacked": 2}
