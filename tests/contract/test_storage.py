"""The mailbox file: creation, permissions, legacy mailboxes, hostile files, locks, concurrency."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import stat
import subprocess
import sys

import pytest


from agent_mail.store import sqlite as sqlite_store
from agent_mail.store import sqlite_schema
from tests.lib.cli import process_env
from tests.lib.waiting import until

LEGACY_SCHEMA = """
CREATE TABLE messages (
    id TEXT PRIMARY KEY, sender TEXT NOT NULL, recipient TEXT NOT NULL, subject TEXT NOT NULL,
    body TEXT NOT NULL DEFAULT '', refs TEXT, reply_to TEXT, type TEXT NOT NULL DEFAULT 'direct',
    ttl_hours INTEGER NOT NULL DEFAULT 24, created TEXT NOT NULL, read_at TEXT, acked_at TEXT);
CREATE INDEX idx_messages_recipient ON messages(recipient);
CREATE INDEX idx_messages_sender ON messages(sender);
CREATE INDEX idx_messages_created ON messages(created);
CREATE TABLE broadcast_acks (message_id TEXT NOT NULL, agent TEXT NOT NULL, read_at TEXT, acked_at TEXT,
    PRIMARY KEY (message_id, agent));
CREATE TABLE watchers (agent TEXT PRIMARY KEY, started_at TEXT NOT NULL, last_seen TEXT NOT NULL);
CREATE TABLE watch_sessions (id TEXT PRIMARY KEY, agent TEXT NOT NULL, started_at TEXT NOT NULL,
    last_seen TEXT NOT NULL, state TEXT NOT NULL DEFAULT 'armed', released_at TEXT, released_reason TEXT);
CREATE INDEX idx_watch_sessions_agent ON watch_sessions(agent);
"""

LEGACY_ROWS = [
    # id, sender, recipient, subject, body, refs, reply_to, type, ttl_hours, created, read_at, acked_at
    ("11111111-1111-4111-8111-111111111111", "second-brain:main", "agent-mail:worker", "old handoff",
     "body one", '["/vault/spec.md"]', None, "direct", 24, "2026-07-31T15:04:11.882431-04:00", None, None),
    ("22222222-2222-4222-8222-222222222222", "agent-mail:worker", "second-brain:main", "reply",
     "", None, "11111111-1111-4111-8111-111111111111", "direct", 24, "2026-07-31T15:10:00.000000-04:00",
     "2026-07-31T15:11:00.000000-04:00", "2026-07-31T15:12:00.000000-04:00"),
    ("33333333-3333-4333-8333-333333333333", "second-brain:main", "*", "broadcast", "all", None, None,
     "broadcast", 24, "2026-08-01T09:00:00.000000-04:00", None, None),
]


def build_legacy_mailbox(path) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(LEGACY_SCHEMA)
    db.executemany("INSERT INTO messages VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", LEGACY_ROWS)
    db.execute("INSERT INTO broadcast_acks VALUES (?, ?, ?, NULL)",
               ("33333333-3333-4333-8333-333333333333", "agent-mail:worker", "2026-08-01T10:00:00-04:00"))
    db.execute("INSERT INTO watch_sessions VALUES ('s1', 'agent-mail:worker', '2026-08-01T10:00:00-04:00', "
               "'2026-08-01T10:05:00-04:00', 'released', '2026-08-01T10:05:00-04:00', 'mail')")
    db.commit()
    db.close()


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.fast
def test_new_mailbox_is_private(am, send, mailbox_path):
    send("a:x", "b:y", "hi")
    assert stat.S_IMODE(os.stat(mailbox_path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(mailbox_path).st_mode) == 0o600
    for suffix in ("-wal", "-shm"):
        side = str(mailbox_path) + suffix
        if os.path.exists(side):
            assert stat.S_IMODE(os.stat(side).st_mode) & 0o077 == 0


@pytest.mark.fast
def test_migrations_are_recorded_and_the_mailbox_is_marked(am, send, mailbox_path):
    send("a:x", "b:y", "hi")
    db = sqlite3.connect(mailbox_path)
    names = [r[0] for r in db.execute("SELECT name FROM schema_migrations ORDER BY name")]
    assert names == [m.__name__ for m in sqlite_schema.MIGRATIONS]
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(sqlite_schema.MIGRATIONS)
    assert db.execute("PRAGMA application_id").fetchone()[0] == sqlite_store.APPLICATION_ID
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.fast
def test_the_schema_version_counts_the_migrations():
    """A mailbox at SCHEMA_VERSION opens without importing the migrations: a migration added without raising it
    would never reach the mailboxes already there."""
    assert sqlite_store.SCHEMA_VERSION == len(sqlite_schema.MIGRATIONS)


@pytest.mark.fast
def test_legacy_mailbox_opens_unchanged_and_every_message_is_readable(am, mailbox_path):
    build_legacy_mailbox(mailbox_path)
    worker = am("read", "agent-mail:worker", "--all", "--no-mark-read").json
    assert [m["subject"] for m in worker["messages"]] == ["old handoff", "broadcast"]
    first = worker["messages"][0]
    assert first["refs"] == ["/vault/spec.md"] and first["created"] == "2026-07-31T15:04:11.882431-04:00"
    assert "ttl_hours" not in first
    assert worker["messages"][1]["read_at"] == "2026-08-01T10:00:00-04:00"
    main = am("read", "second-brain:main", "--all", "--no-mark-read").json
    assert [m["subject"] for m in main["messages"]] == ["reply"]
    thread = am("read", "agent-mail:worker", "--thread", "22222222-2222-4222-8222-222222222222").json
    assert thread["count"] == 2
    rows = {r["agent"]: r for r in am("status", "--fields", "agent,unread,unacked").json["agents"]}
    assert rows["agent-mail:worker"] == {"agent": "agent-mail:worker", "unread": 1, "unacked": 2}
    # the old rows and columns are all still there, untouched
    db = sqlite3.connect(mailbox_path)
    assert db.execute("SELECT COUNT(*) FROM messages WHERE ttl_hours = 24").fetchone()[0] == 3
    assert db.execute("SELECT COUNT(*) FROM watch_sessions").fetchone()[0] == 1
    assert db.execute("SELECT COUNT(*) FROM watchers").fetchone()[0] == 0
    # and new mail lands beside it
    am("send", "--from", "agent-mail:worker", "--to", "second-brain:main", "--subject", "new").assert_ok()
    assert db.execute("SELECT ttl_hours FROM messages WHERE subject = 'new'").fetchone()[0] == 24


@pytest.mark.fast
def test_not_a_database_is_refused_and_left_untouched(am, mailbox_path):
    mailbox_path.parent.mkdir(parents=True)
    mailbox_path.write_bytes(b"this is my shopping list, not a database\n" * 100)
    before = digest(mailbox_path)
    error = am("read", "a:b").error
    assert str(mailbox_path) in error["error"] and "untouched" in error["error"]
    assert digest(mailbox_path) == before
    assert am("describe").json["storage"]["messages"] is None


@pytest.mark.fast
def test_truncated_database_is_refused_and_left_untouched(am, send, mailbox_path):
    for i in range(50):
        send("a:x", "b:y", f"m{i}", "--body", "x" * 1000)
    db = sqlite3.connect(mailbox_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    data = mailbox_path.read_bytes()
    mailbox_path.write_bytes(data[:100])
    before = digest(mailbox_path)
    error = am("read", "b:y").error
    assert str(mailbox_path) in error["error"]
    assert digest(mailbox_path) == before


@pytest.mark.fast
def test_foreign_sqlite_database_is_refused_and_left_untouched(am, mailbox_path):
    mailbox_path.parent.mkdir(parents=True)
    db = sqlite3.connect(mailbox_path)
    db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, amount REAL)")
    db.execute("INSERT INTO invoices (amount) VALUES (12.5)")
    db.commit()
    db.close()
    before = digest(mailbox_path)
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s").error
    assert "not an agent-mail mailbox" in error["error"]
    assert digest(mailbox_path) == before


@pytest.mark.fast
def test_mailbox_path_that_is_a_directory(am, mailbox_path):
    mailbox_path.mkdir(parents=True)
    assert "directory" in am("read", "a:b").error["error"]


@pytest.mark.fast
def test_locked_past_the_busy_timeout_is_a_clear_error(am, send, mailbox_path, monkeypatch):
    send("a:x", "b:y", "hi")
    monkeypatch.setattr(sqlite_store, "BUSY_TIMEOUT_SECONDS", 0.2)
    holder = sqlite3.connect(mailbox_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "blocked").error
        assert "locked" in error["error"] and str(mailbox_path) in error["error"]
        assert am("read", "b:y", "--no-mark-read").json["count"] == 1  # readers are not blocked (WAL)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert am("read", "b:y").json["count"] == 1


WRITER = """
import json, subprocess, sys
me, n = sys.argv[1], int(sys.argv[2])
from agent_mail.cli import main
failures = 0
for i in range(n):
    code = main.main(["send", "--from", me, "--to", "sink:inbox", "--subject", f"{me} {i}"])
    failures += code != 0
sys.exit(failures)
"""

READER = """
import io, json, sys, contextlib
from agent_mail.cli import main
seen, failures = [], 0
for _ in range(int(sys.argv[1])):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main.main(["read", "sink:inbox", "--limit", "7"])
    if code:
        failures += 1
        continue
    seen += [m["subject"] for m in json.loads(out.getvalue())["messages"]]
print(json.dumps({"seen": seen, "failures": failures}), file=sys.stderr)
"""


def test_concurrent_writers_and_readers_lose_and_duplicate_nothing(am, mailbox_path):
    am("status").assert_ok()  # create the mailbox once, so the race is about traffic, not creation
    env = process_env()
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, f"w:n{i}", "25"], env=env,
                                stderr=subprocess.PIPE) for i in range(4)]
    readers = [subprocess.Popen([sys.executable, "-c", READER, "30"], env=env, stderr=subprocess.PIPE)
               for _ in range(2)]
    for proc in writers:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    seen = []
    for proc in readers:
        _, err = proc.communicate(timeout=120)
        report = json.loads(err.decode().strip().splitlines()[-1])
        assert report["failures"] == 0
        seen += report["seen"]
    seen += [m["subject"] for m in am("read", "sink:inbox", "--limit", "1000").json["messages"]]
    expected = [f"w:n{i} {j}" for i in range(4) for j in range(25)]
    assert sorted(seen) == sorted(expected)  # every message exactly once
    db = sqlite3.connect(mailbox_path)
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_first_use_by_many_processes_at_once(mailbox_path):
    env = process_env()
    procs = [subprocess.Popen([sys.executable, "-m", "agent_mail", "send", "--from", f"p:n{i}", "--to", "b:y",
                               "--subject", "race"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(6)]
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    db = sqlite3.connect(mailbox_path)
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 6
    assert db.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == len(sqlite_schema.MIGRATIONS)


def test_a_new_mailbox_opened_by_many_processes_in_the_same_instant(tmp_path):
    """Switching a new file to WAL conflicts at once (no busy wait); nobody may fail for it."""
    go = tmp_path / "go"
    for attempt in range(5):
        ready = tmp_path / f"ready{attempt}"  # each process says here that it is waiting
        ready.mkdir()
        script = (
            "import os, sys, time\n"
            f"open(os.path.join({str(ready)!r}, str(os.getpid())), 'w').close()\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.001)\n"
            "from agent_mail.cli.main import main\n"
            "sys.exit(main(['status']))\n"
        )
        box = tmp_path / f"box{attempt}" / "mail.db"
        env = process_env(AGENT_MAIL_DB=str(box))
        procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE) for _ in range(6)]
        until(lambda ready=ready: len(os.listdir(ready)) == 6, 60, "not all of them started")  # all waiting
        go.touch()
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        go.unlink()


@pytest.mark.fast
@pytest.mark.parametrize("url, shown", [
    ("postgresql://u:secret@h/db?schema=x&password=p2", "postgresql://u@h/db?schema=x"),
    ("postgres://u:p%40ss@h1:5432,h2/db", "postgres://u@h1:5432,h2/db"),
    ("postgresql://?service=team", "postgresql://?service=team"),
    ("postgresql://h/db?sslmode=verify-full", "postgresql://h/db?sslmode=verify-full"),
])
def test_a_mailbox_url_is_shown_without_its_password(url, shown):
    from agent_mail.urls import redact_url, url_secrets

    assert redact_url(url) == shown
    for secret in url_secrets(url):
        assert secret not in redact_url(url)


@pytest.mark.fast
@pytest.mark.parametrize("location, backend", [
    ("/tmp/x/mail.db", "sqlite"), ("relative/mail.db", "sqlite"), ("postgresql://h/db", "postgresql"),
    ("postgres://h/db", "postgresql"), ("POSTGRESQL://h/db", "postgresql"), ("weird:name.db", "sqlite"),
])
def test_the_registry_picks_the_backend_from_the_location(location, backend):
    from agent_mail.store import backend_name

    assert backend_name(location) == backend
