"""Load, crashes, output failures, hostile input and privacy, with real processes and bounded time."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sqlite3
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_mail import model, spec
from agent_mail.parts import waits
from tests.lib.cli import run_inprocess, process_env
from tests.lib.fuzz import examples
from tests.lib.mailbox import raw_db

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL


# Rows that point at nothing: what a half-done write would leave behind on either backend.
ORPHANS = {
    "attachments without their message": "SELECT count(*) FROM attachments a WHERE NOT EXISTS "
    "(SELECT 1 FROM messages m WHERE m.id = a.message_id)",
    "attachments without their content": "SELECT count(*) FROM attachments a WHERE NOT EXISTS "
    "(SELECT 1 FROM attachment_blobs b WHERE b.sha256 = a.sha256)",
    "broadcast states without their message": "SELECT count(*) FROM broadcast_acks b WHERE NOT EXISTS "
    "(SELECT 1 FROM messages m WHERE m.id = b.message_id)",
    "schedules without their message": "SELECT count(*) FROM scheduled s WHERE NOT EXISTS "
    "(SELECT 1 FROM messages m WHERE m.id = s.message_id)",
}


def integrity(mailbox) -> str:
    """'ok' when the mailbox is whole: SQLite's own integrity check on a file, and on both backends no row
    left pointing at nothing."""
    db = raw_db(mailbox)
    try:
        if isinstance(db, sqlite3.Connection):
            verdict = db.execute("PRAGMA integrity_check").fetchone()[0]
            if verdict != "ok":
                return verdict
        broken = [f"{n} {what}" for what, sql in ORPHANS.items() if (n := db.execute(sql).fetchone()[0])]
        return "; ".join(broken) or "ok"
    finally:
        db.close()


# ---------------------------------------------------------------- concurrency

WORKER = r"""
import io, json, sys, time, contextlib
from agent_mail.cli import main
role, me, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
log = open(sys.argv[4], "a", buffering=1)

def call(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.main(list(argv))
    if code not in (0,):
        log.write(json.dumps({"failure": argv[0], "code": code, "stderr": err.getvalue()}) + "\n")
        return None
    return json.loads(out.getvalue())

deadline = time.monotonic() + seconds
n = 0
while time.monotonic() < deadline:
    if role == "send":
        subject = f"{me}-{n}"
        if call("send", "--from", me, "--to", "team:one", "--to", "team:two", "--subject", subject) is not None:
            log.write(json.dumps({"sent": subject}) + "\n")
    elif role == "read":
        result = call("read", me, "--limit", "5")
        if result:
            for m in result["messages"]:
                log.write(json.dumps({"read": m["subject"], "by": me}) + "\n")
    elif role == "ack":
        # acknowledge what the reader already took delivery of (acking implies read, so acking
        # unread mail would take it away from the reader)
        seen = call("read", me, "--all", "--no-mark-read", "--limit", "20")
        done = [m["id"] for m in (seen or {"messages": []})["messages"] if m["read_at"] and not m["acked_at"]]
        if done:
            call("ack", me, *done)
    elif role == "watch":
        call("watch", me, "--once")
        call("heartbeat", me)
    elif role == "status":
        call("status")
    n += 1
"""


def test_many_processes_at_once_deliver_everything_exactly_once(tmp_path, mailbox_path, am):
    am("status").assert_ok()
    log = tmp_path / "log.jsonl"
    roles = [("send", "src:a"), ("send", "src:b"), ("send", "src:c"), ("read", "team:one"), ("read", "team:two"),
             ("ack", "team:one"), ("ack", "team:two"), ("watch", "team:one"), ("status", "x:y")]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, role, me, "4", str(log)], env=process_env(),
                              stderr=subprocess.PIPE) for role, me in roles]
    # and a blocked watch, woken over and over by the traffic
    watcher = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "team:two", "--timeout-minutes", "5"],
                               env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err
        out, _ = watcher.communicate(timeout=60)
        assert json.loads(out)["timeout"] is False
    finally:
        for proc in procs + [watcher]:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    events = [json.loads(line) for line in log.read_text().splitlines()]
    failures = [e for e in events if "failure" in e]
    assert failures == []  # no "database is locked", nothing else either
    sent = sorted(e["sent"] for e in events if "sent" in e)
    assert len(sent) > 10, "too little traffic to prove anything"
    for inbox in ("team:one", "team:two"):
        delivered = [e["read"] for e in events if e.get("by") == inbox]
        delivered += [m["subject"] for m in am("read", inbox, "--limit", "10000").json["messages"]]
        assert sorted(delivered) == sent, inbox  # every message exactly once to each recipient
    assert integrity(mailbox_path) == "ok"


# ---------------------------------------------------------------- crashes

READER_LOOP = """
import sys
from agent_mail.cli import main
while True:
    main.main(["read", "b:y", "--limit", "3"])
"""

ACKER_LOOP = """
import sys
from agent_mail.cli import main
ids = sys.argv[1:]
i = 0
while True:
    main.main(["ack", "b:y", *ids[i:i + 4]])
    i = (i + 4) % len(ids)
"""


def test_killed_readers_and_ackers_never_mark_what_was_not_output(tmp_path, mailbox_path, am, send):
    sent = [send("a:x", "b:y", f"m{i}")["id"] for i in range(160)]
    acked_by_acker = sent[:40]  # the acker works on these (acking implies read); the reader on any
    output = tmp_path / "reader-output.txt"
    rng = random.Random(11)
    for _ in range(6):
        with open(output, "ab") as sink:
            reader = subprocess.Popen([sys.executable, "-c", READER_LOOP], env=process_env(), stdout=sink,
                                      stderr=subprocess.DEVNULL)
            acker = subprocess.Popen([sys.executable, "-c", ACKER_LOOP, *acked_by_acker],
                                     env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.4, 0.9))
            for proc in (reader, acker):
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
    assert integrity(mailbox_path) == "ok"
    printed = output.read_text(errors="replace")
    db = raw_db(mailbox_path)
    read_ids = [r[0] for r in db.execute("SELECT id FROM messages WHERE read_at IS NOT NULL")
                if r[0] not in acked_by_acker]
    assert read_ids, "the reader never got to read anything; the test proves nothing"
    # marked read by the reader must mean: it reached the reader's stdout
    assert [i for i in read_ids if i not in printed] == []
    acked = {r[0] for r in db.execute("SELECT id FROM messages WHERE acked_at IS NOT NULL")}
    assert acked and acked <= set(acked_by_acker)


# ---------------------------------------------------------------- output and disk failures


def _limit_file_size(limit: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


@pytest.mark.sqlite_only  # about the SQLite file itself
def test_output_over_the_file_size_limit_changes_nothing(tmp_path, send, am, mailbox_path):
    for i in range(6):
        send("a:x", "b:y", f"precious {i}", "--body", "x" * 40_000)
    db = raw_db(mailbox_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    # the 240 kB result cannot be written in full under a 150 kB file-size limit
    with open(tmp_path / "out.json", "wb") as sink:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y", "--no-mark-read"],
                              env=process_env(), stdout=sink, stderr=subprocess.PIPE,
                              preexec_fn=_limit_file_size(150_000), timeout=60)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert "could not write the result" in json.loads(proc.stderr)["error"]
    # a marking read under the same limit fails at the first write it cannot make, and marks nothing
    with open(tmp_path / "out2.json", "wb") as sink:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=process_env(), stdout=sink,
                              stderr=subprocess.PIPE, preexec_fn=_limit_file_size(150_000), timeout=60)
    assert proc.returncode == 1 and json.loads(proc.stderr)["error"]
    assert am("read", "b:y", "--no-mark-read").json["count"] == 6
    assert integrity(mailbox_path) == "ok"


@pytest.mark.sqlite_only  # about the SQLite file itself
@pytest.mark.local_only("the file-size limit is set on the process that writes the SQLite file: a server's, not the "
                        "client's")
def test_a_mailbox_that_cannot_grow_refuses_cleanly(tmp_path, send, am, mailbox_path):
    send("a:x", "b:y", "before")
    db = raw_db(mailbox_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 * 1024 * 1024))
    size = os.path.getsize(mailbox_path)
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "b:y",
                           "--subject", "too big", "--attach", str(big)], env=process_env(), capture_output=True,
                          preexec_fn=_limit_file_size(size + 64 * 1024), timeout=60)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    error = json.loads(proc.stderr)["error"]
    assert str(mailbox_path) in error
    assert integrity(mailbox_path) == "ok"
    assert [m["subject"] for m in am("read", "b:y", "--all", "--no-mark-read").json["messages"]] == ["before"]
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "after").assert_ok()  # and it still works


# ---------------------------------------------------------------- bad input, fuzzed

_IDENTITIES = st.sampled_from(["a:x", "b:y", "team:one", "*", "Bad:Id", "nocolon", "a:", ":b", "a:b:c", ""])
_TEXT = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x9f), max_size=20),
)
_NUMBERS = st.sampled_from(["0", "1", "-1", "5", "55", "241", "1e9", "nan", "inf", "-0", "0.5", "abc"])
_IDS = st.one_of(st.builds(model.new_message_id), st.sampled_from(["not-an-id", "", "00000000-0000-4000-8000-0"]))
_PATHS = st.sampled_from(["files/a.txt", "files", "missing.txt", "-", "/dev/null", "", "../outside", "files/link"])
_FLAGS = sorted({a.name for c in spec.COMMANDS.values() for a in c.args if not a.positional} | {"--help", "--bogus"})


def _tokens():
    return st.lists(st.one_of(st.sampled_from(_FLAGS), _IDENTITIES, _TEXT, _NUMBERS, _IDS, _PATHS,
                              st.sampled_from(["--", "-", "-x", "--to=*", "--limit=3"])), max_size=10)


@pytest.fixture
def fuzz_room(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("attachment")
    (tmp_path / "files" / "link").symlink_to("/etc/hostname")
    # a watch that would block for 55 minutes returns at once instead; the parser is what is fuzzed
    monkeypatch.setattr(waits.Waits, "wait_for_mail", lambda self, agent, session, seconds, *more: [])
    # and a dashboard checks its options and opens the mailbox, but draws nothing
    from agent_mail import dashboard

    monkeypatch.setattr(dashboard, "show", lambda **options: None)
    # and `serve` checks its options and binds its port, but answers no request: it returns at once
    from agent_mail.server import app

    monkeypatch.setattr(app.Server, "run", lambda self, sockets=None: None)
    return tmp_path


@pytest.mark.fast
@pytest.mark.local_only("stubs the blocking wait, the dashboard and serve in this process: through a server a fuzzed "
                        "watch would wait its 55 minutes there")
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# `mcp` is left out: it serves JSON-RPC on stdin until the client closes it (test_mcp.py drives it).
@given(command=st.sampled_from(sorted(set(spec.COMMANDS) - {"mcp"}) + ["bogus", "", "--version"]), tokens=_tokens())
def test_fuzzed_argv_never_tracebacks(fuzz_room, command, tokens):
    result = run_inprocess(command, *tokens, stdin=b"body from stdin")
    assert "Traceback" not in result.out + result.err
    if result.code == 0 and command == "dashboard" and result.out == "":  # it drew a screen and printed nothing
        assert result.err == ""
    elif result.code == 0 and command == "serve" and result.out == "":  # its log is JSON lines on stderr
        assert all(isinstance(json.loads(line), dict) for line in result.err.splitlines())
    elif result.code == 0 and command == "export" and not result.out.startswith("{\n"):  # the export itself
        assert all(isinstance(json.loads(line), dict) for line in result.out.splitlines()) and result.err == ""
    elif result.code in (0, 3):
        document = json.loads(result.out)
        assert isinstance(document, dict) and result.err == ""
    else:
        assert result.out == ""
        error = json.loads(result.err)
        assert isinstance(error["error"], str) and error["error"]
        assert "internal error" not in error["error"], error
        assert result.code in (1, 2, 129, 130, 143)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(subject=_TEXT, body=_TEXT)
def test_fuzzed_text_is_stored_exactly_or_refused(fuzz_room, subject, body):
    result = run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", subject, "--body", body)
    if result.code == 0:
        stored = run_inprocess("read", "b:y", "--thread", json.loads(result.out)["id"])
        message = json.loads(stored.out)["messages"][0]
        assert (message["subject"], message["body"]) == (subject, body)
    else:
        assert result.code == 2 and json.loads(result.err)["problems"]


def _strict(raw: str) -> dict:
    """What a strict JSON parser accepts: no lone surrogate anywhere, escaped or raw."""
    document = json.loads(raw)
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(document, ensure_ascii=False)), raw
    return document


def _judge(result) -> dict:
    """Every outcome is a result (0/3) or bad input/failure (1/2) as strict JSON; never an internal error."""
    assert "Traceback" not in result.out + result.err
    if result.code in (0, 3):
        return _strict(result.out)
    error = _strict(result.err)
    assert "internal error" not in error["error"], error
    assert result.code in (1, 2), result
    return error


# File names: any bytes but '/' and NUL, including ones that are not UTF-8 and bidi controls.
_NAMES = st.one_of(
    st.binary(min_size=1, max_size=24).filter(lambda b: b"/" not in b and b"\x00" not in b and b not in (b".", b"..")),
    st.sampled_from([b"\xff.txt", b"caf\xe9", "\u202eexe.txt".encode(), b"-h", b"--help", b" ", b"a" * 255]),
)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_NAMES, flag=st.sampled_from(["--ref", "--refs", "--attach", "--body-file"]))
def test_fuzzed_file_names_are_sent_or_refused_never_internal_errors(fuzz_room, name, flag):
    path = os.path.join(os.fsencode(str(fuzz_room)), b"names", name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        with open(path, "wb") as handle:
            handle.write("body text".encode())
    except OSError:  # a name the file system itself refuses
        return
    shown = os.fsdecode(path)
    value = json.dumps([shown]) if flag == "--refs" else shown
    result = run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", "s", flag, value)
    _judge(result)
    if result.code == 0 and flag == "--attach":
        message = json.loads(result.out)["id"]
        target = os.path.join(str(fuzz_room), "saved")
        _judge(run_inprocess("attachments", "b:y", message, "--save-to", target, "--overwrite"))
    os.unlink(path)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(depth=st.integers(min_value=0, max_value=60_000), inner=st.sampled_from(['"files/a.txt"', "", "1", "{}"]),
       wrap=st.sampled_from(["[]", "{}", "[{"]))
def test_fuzzed_json_depth_is_bad_input_never_an_internal_error(fuzz_room, depth, inner, wrap):
    opening, closing = (wrap, "") if wrap == "[{" else (wrap[0], wrap[1])
    refs = opening * depth + inner + closing * depth
    _judge(run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--refs", refs))


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(subject=st.integers(min_value=0, max_value=model.SUBJECT_MAX_CHARS + 2),
       body=st.integers(min_value=0, max_value=model.BODY_MAX_CHARS + 2),
       half=st.integers(min_value=1, max_value=model.NAME_MAX_CHARS + 2), char=st.sampled_from(["a", "é", "日", "😀"]))
def test_fuzzed_sizes_around_every_limit(fuzz_room, subject, body, half, char):
    recipient = "p:" + "n" * half
    result = run_inprocess("send", "--from", "a:x", "--to", recipient, "--subject", (char * subject) or " ",
                            "--body", char * body)
    _judge(result)
    fits = 0 < subject <= model.SUBJECT_MAX_CHARS and body <= model.BODY_MAX_CHARS and half <= model.NAME_MAX_CHARS
    assert (result.code == 0) == fits, (subject, body, half, result.err[:300])


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=_NAMES)
def test_fuzzed_mailbox_paths_describe_and_work_or_refuse(fuzz_room, monkeypatch, name):
    path = os.path.join(os.fsencode(str(fuzz_room)), b"boxes", name, b"mail.db")
    monkeypatch.setenv("AGENT_MAIL_DB", os.fsdecode(path))
    _judge(run_inprocess("describe"))
    _judge(run_inprocess("status"))


# ---------------------------------------------------------------- privacy and permissions


@pytest.mark.fast
@pytest.mark.sqlite_only  # about the SQLite file itself
@pytest.mark.local_only("the refusal names the file and its chmod; a server's callers are never told where its "
                        "database lives (the operator's log is)")
def test_a_world_writable_directory_is_refused_untouched(am, send, mailbox_path):
    send("a:x", "b:y", "hi")
    os.chmod(mailbox_path.parent, 0o777)
    try:
        error = am("read", "b:y").error
        assert "chmod 700" in error["error"] and str(mailbox_path.parent) in error["error"]
    finally:
        os.chmod(mailbox_path.parent, 0o700)
    assert am("read", "b:y").json["count"] == 1  # nothing was marked by the refused call


@pytest.mark.fast
@pytest.mark.sqlite_only  # about the SQLite file itself
@pytest.mark.local_only("the refusal names the file and its chmod; a server's callers are never told where its "
                        "database lives (the operator's log is)")
def test_a_world_writable_mailbox_is_refused(am, send, mailbox_path):
    send("a:x", "b:y", "hi")
    os.chmod(mailbox_path, 0o666)
    assert "chmod 600" in am("status").error["error"]


@pytest.mark.fast
def test_a_sticky_shared_directory_is_accepted(am, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("AGENT_MAIL_DB", str(shared / "mail.db"))
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "s").assert_ok()
    assert stat.S_IMODE(os.stat(shared / "mail.db").st_mode) == 0o600


@pytest.mark.fast
@pytest.mark.sqlite_only  # about the SQLite file itself
@pytest.mark.local_only("describe reports the mailbox's own storage; through a server it reports the server")
def test_a_readable_mailbox_is_reported_by_describe(am, send, mailbox_path):
    send("a:x", "b:y", "hi")
    assert am("describe").json["storage"]["permissions"]["private"] is True
    os.chmod(mailbox_path.parent, 0o755)
    os.chmod(mailbox_path, 0o644)
    permissions = am("describe").json["storage"]["permissions"]
    assert permissions == {**permissions, "directory": "0755", "file": "0644", "private": False}
    assert "chmod" in permissions["warning"]
    assert am("read", "b:y").json["count"] == 1  # readable by others: warned, still usable
