"""What a hostile newcomer found (issue 8): one regression test per finding, named after it.

Each test failed on the code before its fix. Real processes where only processes can show it
(closed stdout, kill -9, signals, file-size limits, umask, another user).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import signal
import sqlite3
import stat
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_mail import model, spec
from agent_mail.operations import mail
from agent_mail.store import sqlite as sqlite_store
from tests.lib.cli import am_process, as_a_user, process_env, run_inprocess
from tests.lib.tools import ROOT
from tests.lib.waiting import armed, until


def closed_stdout(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run agent-mail with its standard output closed: printing the result fails."""
    return subprocess.run([sys.executable, "-m", "agent_mail", *argv], env=env or process_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True,
                          preexec_fn=lambda: os.close(1), timeout=60)


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def subjects(document) -> list[str]:
    return [m["subject"] for m in document["messages"]]


# ---------------------------------------------------------------- 1. the suggested `next` never settles unseen mail


@pytest.mark.fast
def test_the_suggested_ack_never_settles_mail_that_arrived_after_the_read(am, send):
    for i in range(11):
        send("a:x", "w:z", f"m{i}")
    read = am("read", "w:z").json
    hint = [step for step in read["next"] if " ack " in step]
    assert hint == ["agent-mail ack w:z --all"]
    urgent = send("a:x", "w:z", "URGENT")["id"]
    argv = shlex.split(hint[0])[1:]
    result = am(*argv).json
    assert result["count"] == 11 and urgent not in result["acked"] and result["unread_left"] == 1
    assert subjects(am("watch", "w:z", "--once").json) == ["URGENT"]
    assert subjects(am("read", "w:z").json) == ["URGENT"]


@pytest.mark.fast
def test_ack_all_leaves_unread_mail_alone_and_says_so(am, send):
    seen = send("a:x", "w:z", "seen")["id"]
    am("read", "w:z").assert_ok()
    unseen = send("a:x", "w:z", "unseen")["id"]
    result = am("ack", "w:z", "--all").json
    assert result["acked"] == [seen] and result["unread_left"] == 1
    row = am("read", "w:z", "--no-mark-read").json["messages"][0]
    assert row["id"] == unseen and row["read_at"] is None and row["acked_at"] is None


@pytest.mark.fast
def test_no_mark_read_never_suggests_acking_what_was_not_delivered(am, send):
    for i in range(12):
        send("a:x", "w:z", f"m{i}")
    peek = am("read", "w:z", "--no-mark-read").json
    assert not [step for step in peek["next"] if " ack " in step]


# ---------------------------------------------------------------- 2. a value is a value


@pytest.mark.parametrize("extra", [
    ["--subject", "How do I use -h", "--body", "-h"],
    ["--subject", "--help"],
    ["--subject", "-h"],
    ["--subject", "help wanted", "--body", "--help"],
])
@pytest.mark.fast
def test_help_as_a_value_is_sent_not_taken_for_help(am, extra):
    receipt = am("send", "--from", "a:x", "--to", "b:y", *extra).json
    stored = am("read", "b:y").json["messages"][0]
    assert stored["id"] == receipt["id"]
    assert stored["subject"] == extra[1]


@pytest.mark.fast
def test_help_where_a_flag_stands_still_prints_the_manual(am):
    manual = am("describe", "send").json
    assert am("send", "--help").json == manual
    assert am("send", "--from", "a:x", "-h").json == manual
    assert am("send", "--", "-h").error  # after --, everything is a positional value


@pytest.mark.fast
def test_version_takes_no_arguments(am):
    assert am("--version").json["name"] == "agent-mail"
    assert am("--version", "extra").error["problems"][0]["field"] == "--version"


# ---------------------------------------------------------------- 3-6. a failed command changed nothing


def test_profile_that_cannot_print_writes_no_mirror_file(am, send, tmp_path):
    send("a:x", "p:n", "waiting")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    proc = closed_stdout("profile", "p:n", "--mirror-dir", str(mirror))
    assert proc.returncode == 1
    assert not (mirror / ".notification" / "email.json").exists()
    assert am("profile", "p:n").json["mirror_dir"] is None


def test_profile_moved_without_printing_puts_the_old_mirror_back(am, send, tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    am("profile", "p:n", "--mirror-dir", str(old)).assert_ok()
    send("a:x", "p:n", "waiting")
    before = (old / ".notification" / "email.json").read_bytes()
    proc = closed_stdout("profile", "p:n", "--mirror-dir", str(new))
    assert proc.returncode == 1
    assert (old / ".notification" / "email.json").read_bytes() == before
    assert not (new / ".notification" / "email.json").exists()


def _attachment_message(am, tmp_path) -> str:
    source = tmp_path / "report.txt"
    source.write_bytes(b"new content\n")
    return am("send", "--from", "a:x", "--to", "b:y", "--subject", "file", "--attach", str(source)).json["id"]


def test_overwrite_that_cannot_print_replaces_nothing(am, tmp_path):
    message = _attachment_message(am, tmp_path)
    target = tmp_path / "inbox"
    target.mkdir()
    (target / "report.txt").write_bytes(b"precious old content\n")
    proc = closed_stdout("attachments", "b:y", message, "--save-to", str(target), "--overwrite")
    assert proc.returncode == 1
    assert (target / "report.txt").read_bytes() == b"precious old content\n"
    assert sorted(os.listdir(target)) == ["report.txt"]  # no temporary file left either
    saved = am("attachments", "b:y", message, "--save-to", str(target), "--overwrite").json
    assert saved["saved"][0]["path"] == str(target / "report.txt")
    assert (target / "report.txt").read_bytes() == b"new content\n"


def test_save_that_cannot_print_leaves_no_directory(am, tmp_path):
    message = _attachment_message(am, tmp_path)
    target = tmp_path / "made" / "for" / "this"
    proc = closed_stdout("attachments", "b:y", message, "--save-to", str(target))
    assert proc.returncode == 1
    assert not (tmp_path / "made").exists()


def test_watch_once_that_cannot_print_records_no_heartbeat(am):
    proc = closed_stdout("watch", "w:z", "--once")
    assert proc.returncode == 1
    row = am("status", "--agent", "w:z").json["agents"][0]
    assert row["watching"] is False and row["last_seen"] is None


# ---------------------------------------------------------------- 7. a save killed mid-write


SAVER = r"""
import sys
from agent_mail.cli import main
sys.exit(main.main(["attachments", "b:y", sys.argv[1], "--save-to", sys.argv[2]]))
"""


def test_a_save_killed_at_any_moment_leaves_no_truncated_file(am, tmp_path):
    big = tmp_path / "big.bin"
    content = os.urandom(10 * 1024 * 1024)
    big.write_bytes(content)
    message = am("send", "--from", "a:x", "--to", "b:y", "--subject", "big", "--attach", str(big)).json["id"]
    rng = random.Random(7)
    outcomes = set()
    for attempt in range(7):
        target = tmp_path / f"save{attempt}"
        proc = subprocess.Popen([sys.executable, "-c", SAVER, message, str(target)], env=process_env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 0.4))
        proc.kill()
        proc.wait()
        final = target / "big.bin"
        if final.exists():
            assert final.read_bytes() == content, "a file under its final name must be whole"
            outcomes.add("whole")
        else:
            outcomes.add("absent")
            retry = am("attachments", "b:y", message, "--save-to", str(target)).json  # a retry just works
            assert (target / "big.bin").read_bytes() == content and retry["count"] == 1
    assert outcomes  # each kill left the file whole or absent, never truncated


@pytest.mark.fast
def test_stale_temporary_files_of_a_killed_save_are_swept(am, tmp_path):
    message = _attachment_message(am, tmp_path)
    target = tmp_path / "inbox"
    target.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = target / f".report.txt.am-{dead.stdout.strip()}-0badf00d.part"
    leftover.write_bytes(b"half")
    os.utime(leftover, (time.time() - 3600, time.time() - 3600))
    am("attachments", "b:y", message, "--save-to", str(target)).assert_ok()
    assert sorted(os.listdir(target)) == ["report.txt"]


# ---------------------------------------------------------------- 8. printed, then the commit failed


class _FailingCommit:
    """A connection whose write transactions fail at COMMIT the way a full disk does."""

    def __init__(self, db):
        self._db = db
        self._writing = False

    def execute(self, sql, *args):
        if sql == "BEGIN IMMEDIATE":
            self._writing = True
        if sql == "COMMIT" and self._writing:
            self._writing = False
            self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


@pytest.mark.fast
def test_a_result_printed_before_a_failed_commit_is_declared_void(am, send, monkeypatch):
    send("a:x", "b:y", "precious")
    connect = sqlite_store.SQLiteStore.connect
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_store.SQLiteStore, "connect", lambda self: _FailingCommit(connect(self)))
        result = run_inprocess("read", "b:y")
    assert result.code == 1
    assert json.loads(result.out)["count"] == 1  # the document reached stdout...
    error = json.loads(result.err)
    assert error["output_discarded"] is True and "not committed" in error["error"]  # ...and is declared void
    after = am("read", "b:y", "--no-mark-read")
    assert after.json["count"] == 1, after  # the mail is still unread
    rules = " ".join(am("describe").json["invariants"])
    assert "exit status decides" in rules and "output_discarded" in rules


# ---------------------------------------------------------------- 9. a damaged mailbox


def _damaged_mailbox(am, mailbox_path) -> int:
    """A mailbox of a few hundred KB with 8 KB of random bytes written over two pages of its messages
    table (those holding a message from the middle); returns messages sent."""
    n = 0
    while not mailbox_path.exists() or os.path.getsize(mailbox_path) < 400 * 1024:
        for _ in range(50):
            body = f"body of m{n}:" + "x" * 900  # a body is stored in the table only, not in any index
            am("send", "--from", "a:x", "--to", "b:y", "--subject", f"m{n}", "--body", body).assert_ok()
            n += 1
        db = sqlite3.connect(mailbox_path)
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.close()
    content = mailbox_path.read_bytes()
    page = content.index(f"body of m{n // 2}:".encode()) // 4096 * 4096
    rng = random.Random(2026)
    with open(mailbox_path, "r+b") as handle:
        handle.seek(page)
        handle.write(bytes(rng.getrandbits(8) for _ in range(8192)))
    return n


def test_damage_is_named_and_nothing_more_is_written(am, mailbox_path):
    _damaged_mailbox(am, mailbox_path)
    described = am("describe").json["storage"]
    assert described["integrity"].startswith("damaged"), described
    outcomes = {}
    for argv in (["read", "b:y", "--all", "--limit", "10000", "--no-mark-read"], ["status"],
                 ["send", "--from", "a:x", "--to", "b:y", "--subject", "after"], ["read", "b:y"]):
        result = run_inprocess(*argv)
        assert "Traceback" not in result.err and "internal error" not in result.err
        if result.code:
            error = json.loads(result.err)["error"]
            assert "damaged" in error and "doctor" in error and str(mailbox_path) in error
        outcomes[argv[0]] = result.code
    assert outcomes["read"] != 0  # reading everything meets the damage
    before = digest(mailbox_path)
    refused = run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", "more")
    assert refused.code == 1 and "damaged" in json.loads(refused.err)["error"]
    assert digest(mailbox_path) == before  # nothing more was written into it
    assert os.path.exists(str(mailbox_path) + ".damaged")


def test_doctor_finds_the_damage_and_repair_saves_every_readable_message(am, mailbox_path):
    healthy = am("doctor").json
    assert healthy["ok"] is True and healthy["integrity"] == [] and healthy["repair"] is None
    sent = _damaged_mailbox(am, mailbox_path)
    check = am("doctor").json
    assert check["ok"] is False and check["integrity"] and check["next"] == ["agent-mail doctor --repair"]
    fixed = am("doctor", "--repair").json["repair"]
    saved = fixed["saved"]["messages"]
    lost = sum((u["up_to_rowid"] or sent) - (u["after_rowid"] or 0)
               for u in fixed["unsaved"] if u["table"] == "messages" and "after_rowid" in u)
    assert 0 < saved < sent and saved + lost >= sent, fixed
    assert os.path.exists(fixed["damaged_copy"])
    assert am("doctor").json["ok"] is True
    assert not os.path.exists(str(mailbox_path) + ".damaged")
    assert am("status").json["count"] == 2
    assert am("read", "b:y", "--all", "--limit", "10000", "--no-mark-read").json["count"] == saved
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "after repair").assert_ok()


def test_repair_of_a_mailbox_cut_short_saves_what_remains_and_counts_what_was_lost(am, mailbox_path):
    """A 1,500-message mailbox cut at 300,000, 600,000 and 900,000 bytes (`head -c`): SQLite refuses the whole
    file (its header counts pages that are gone), yet the pages before the cut still hold mail."""
    for i in range(1500):
        am("send", "--from", f"p:s{i % 7}", "--to", f"p:r{i % 11}", "--subject", f"m{i}",
           "--body", "b" * 400).assert_ok()
    db = sqlite3.connect(mailbox_path)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    whole = mailbox_path.read_bytes()
    for cut in (300_000, 600_000, 900_000):
        mailbox_path.write_bytes(whole[:cut])
        check = am("doctor").json
        assert check["ok"] is False and any("cut short" in finding for finding in check["integrity"]), check
        report = am("doctor", "--repair").json["repair"]
        assert report["complete"] is False and report["damaged_file"] == {
            "size_bytes": cut, "size_in_header_bytes": len(whole), "cut_short": True}, report
        saved, lost = report["saved"]["messages"], report["lost"]["messages"]
        assert saved > 0 and lost["more_unknown"] is True, report
        assert saved + lost["rows_estimated"] <= 1500 <= saved + lost["rows_estimated"] + 50, report
        assert report["unsaved_count"] > 0 and "lost" in report["summary"], report
        assert am("read", "p:r0", "--all", "--limit", "10000", "--no-mark-read").json["count"] > 0
        assert am("status").json["count"] > 0
        assert am("doctor").json["ok"] is True


@pytest.mark.fast
def test_doctor_on_a_healthy_mailbox_lifts_a_stale_marker(am, send, mailbox_path):
    send("a:x", "b:y", "fine")
    (mailbox_path.parent / "mail.db.damaged").write_text('{"error": "found earlier"}')
    assert "damaged" in am("read", "b:y").error["error"]
    report = am("doctor").json
    assert report["ok"] is True and report["damage_marker"]["error"] == "found earlier"
    assert am("read", "b:y").json["count"] == 1


# ---------------------------------------------------------------- 10-13. odd mailbox paths


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_mailbox_path_that_is_not_a_regular_file_is_refused_for_what_it_is(am, monkeypatch, tmp_path, kind):
    if kind == "device":
        path, word = "/dev/null", "character device"
    else:
        path, word = str(tmp_path / "pipe"), "named pipe"
        os.mkfifo(path)
    monkeypatch.setenv("AGENT_MAIL_DB", path)
    error = am("status").error["error"]
    assert word in error and "chmod" not in error
    assert word in am("describe").json["storage"]["problem"]


def test_a_new_mailbox_on_a_full_disk_reports_the_lack_of_space(tmp_path):
    path = tmp_path / "full" / "mail.db"

    def tiny_files():
        import resource
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    proc = subprocess.run([sys.executable, "-m", "agent_mail", "status"], env=process_env(AGENT_MAIL_DB=str(path)),
                          capture_output=True, preexec_fn=tiny_files, timeout=60)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    error = json.loads(proc.stderr)["error"]
    assert "no space" in error and "rollback" not in error
    assert not path.exists()


@pytest.mark.fast
def test_a_symlinked_mailbox_is_resolved_to_the_real_file(am, monkeypatch, tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir(mode=0o700)
    link_dir = tmp_path / "links"
    link_dir.mkdir(mode=0o700)
    (link_dir / "mail.db").symlink_to(real_dir / "mail.db")
    monkeypatch.setenv("AGENT_MAIL_DB", str(link_dir / "mail.db"))
    assert mail.resolve_location()[0] == str(real_dir / "mail.db")
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "via link").assert_ok()
    storage = am("describe").json["storage"]
    assert storage["path"] == str(real_dir / "mail.db") and storage["link"] == str(link_dir / "mail.db")
    # the permission check looks at the directory the file really lives in
    os.chmod(real_dir, 0o777)
    try:
        assert "chmod 700 " + str(real_dir) in am("status").error["error"]
    finally:
        os.chmod(real_dir, 0o700)


@pytest.mark.fast
def test_a_watch_through_a_symlink_listens_beside_the_real_file(monkeypatch, tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (tmp_path / "mail.db").symlink_to(real_dir / "mail.db")
    monkeypatch.setenv("AGENT_MAIL_DB", str(tmp_path / "mail.db"))
    with mail.open_mailbox() as mailbox:
        mailbox.store.listen("b:y")
        pipes = os.listdir(real_dir / ".mail.db.wake")  # its wake-up pipe, beside the real file
        assert pipes and not (tmp_path / ".mail.db.wake").exists()
        mailbox.send(from_="a:x", to=["b:y"], subject="wake")
        assert mailbox.store.wait_for_wake(10) is True


def test_every_directory_made_for_the_mailbox_is_private_whatever_the_umask(tmp_path):
    path = tmp_path / "a" / "b" / "c" / "mail.db"
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "status"], env=process_env(AGENT_MAIL_DB=str(path)),
                          capture_output=True, preexec_fn=lambda: os.umask(0), timeout=60)
    assert proc.returncode == 0, proc.stderr
    for directory in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.fast
def test_blank_mailbox_variable_is_refused_and_empty_means_unset(am, monkeypatch, tmp_path):
    monkeypatch.setenv("AGENT_MAIL_DB", " ")
    error = am("status").error
    assert error["problems"][0]["field"] == "AGENT_MAIL_DB"
    assert "AGENT_MAIL_DB" in am("describe").json["storage"]["problem"]
    monkeypatch.setenv("AGENT_MAIL_DB", "")
    assert am("describe").json["storage"]["source"] == "default"


# ---------------------------------------------------------------- 14. the mirror directory


@pytest.mark.fast
def test_a_removed_mirror_directory_is_never_recreated(am, tmp_path):
    mirror = tmp_path / "deep" / "mirror"
    mirror.mkdir(parents=True)
    am("profile", "p:n", "--mirror-dir", str(mirror)).assert_ok()
    os.rmdir(mirror)
    receipt = am("send", "--from", "a:x", "--to", "p:n", "--subject", "hi").json
    assert not mirror.exists()
    assert receipt["mirrors"][0]["status"] == "failed" and "no longer exists" in receipt["mirrors"][0]["error"]
    assert "no longer exists" in am("profile", "p:n").json["mirror_problem"]


@pytest.mark.fast
def test_a_profile_that_failed_to_commit_leaves_nothing_in_the_mirror_directory(am, send, tmp_path, monkeypatch):
    """A full disk at COMMIT: `profile --mirror-dir` exits 1, "nothing was changed", and so it is: not even the
    .notification folder its render made is left (it held only files the rollback took back)."""
    send("a:x", "c:d", "unread", "--body", "waiting")
    send("c:d", "c:d", "a bounce-free note")
    mirror = tmp_path / "m"
    mirror.mkdir()
    connect = sqlite_store.SQLiteStore.connect
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_store.SQLiteStore, "connect", lambda self: _FailingCommit(connect(self)))
        result = run_inprocess("profile", "c:d", "--mirror-dir", str(mirror))
    assert result.code == 1 and "nothing was changed" in json.loads(result.err)["error"], result
    assert os.listdir(mirror) == []
    assert am("profile", "c:d").json["mirror_dir"] is None


@pytest.mark.fast
def test_a_planted_notification_link_is_never_followed(am, tmp_path):
    mirror, elsewhere = tmp_path / "mirror", tmp_path / "elsewhere"
    mirror.mkdir()
    elsewhere.mkdir()
    am("profile", "p:n", "--mirror-dir", str(mirror)).assert_ok()
    (mirror / ".notification").symlink_to(elsewhere)
    receipt = am("send", "--from", "a:x", "--to", "p:n", "--subject", "hi").json
    assert os.listdir(elsewhere) == []
    assert receipt["mirrors"][0]["status"] == "failed" and "symbolic link" in receipt["mirrors"][0]["error"]
    assert "symbolic link" in am("profile", "p:n").json["mirror_problem"]
    refused = am("profile", "q:n", "--mirror-dir", str(mirror)).error
    assert refused["problems"][0]["field"] == "--mirror-dir"


def test_a_mirror_directory_this_user_cannot_write_is_refused(am, tmp_path):
    mirror = tmp_path / "locked"
    mirror.mkdir()
    os.chmod(mirror, 0o555)
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "profile", "p:n", "--mirror-dir", str(mirror)],
                          env=process_env(), capture_output=True, timeout=60, **as_a_user())
    assert proc.returncode == 2, proc.stderr
    problem = json.loads(proc.stderr)["problems"][0]
    assert problem["field"] == "--mirror-dir" and "not writable" in problem["message"]
    assert am("profile", "p:n").json["mirror_dir"] is None


# ---------------------------------------------------------------- 15. killed mailbox creations


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


@pytest.mark.fast
def test_files_of_killed_mailbox_creations_are_swept_safely(am, send, mailbox_path):
    send("a:x", "b:y", "exists")
    directory = mailbox_path.parent
    dead, alive = _dead_pid(), os.getpid()
    stale = [f".mail.db.am-{dead}-0badf00d.new", f".mail.db.am-{dead}-0badf00d.new-wal",
             f".mail.db.am-{dead}-0badf00d.new-shm", f".mail.db.{dead}.cafe0123.new"]  # the older naming too
    kept = [f".mail.db.am-{alive}-feedface.new", "notes.new", f".other.db.am-{dead}-0badf00d.new"]
    for name in stale + kept:
        (directory / name).write_bytes(b"x")
        os.utime(directory / name, (time.time() - 3600, time.time() - 3600))
    fresh = directory / f".mail.db.am-{_dead_pid()}-12345678.new"  # too recent to be judged
    fresh.write_bytes(b"x")
    assert am("cleanup", "--older-than", "30", "--dry-run").json["temporary_files_deleted"] == len(stale)
    assert all((directory / name).exists() for name in stale)
    assert am("cleanup", "--older-than", "30").json["temporary_files_deleted"] == len(stale)
    assert not any((directory / name).exists() for name in stale)
    assert all((directory / name).exists() for name in kept) and fresh.exists()
    assert am("doctor").json["temporary_files"] == []


@pytest.mark.fast
def test_doctor_names_the_step_that_removes_leftover_files_and_that_step_removes_them(am, send, mailbox_path):
    send("a:x", "b:y", "exists")
    directory = mailbox_path.parent
    stale = [f".mail.db.am-{_dead_pid()}-0badf00d.new", f".mail.db.am-{_dead_pid()}-0badf00d.new-wal"]
    for name in stale:
        (directory / name).write_bytes(b"x")
        os.utime(directory / name, (time.time() - 3600, time.time() - 3600))
    found = am("doctor").json
    assert sorted(found["temporary_files"]) == sorted(stale) and found["ok"] is True
    assert found["next"] == ["agent-mail doctor --repair"], found
    fixed = am("doctor", "--repair").json
    assert sorted(fixed["temporary_files_removed"]) == sorted(stale) and fixed["temporary_files"] == []
    assert fixed["repair"] is None and fixed["next"] == []  # the healthy mailbox itself was left as it is
    assert not any((directory / name).exists() for name in stale)
    assert am("read", "b:y").json["count"] == 1


def test_kill_9_during_mailbox_creation_leaves_nothing_that_is_not_swept(tmp_path):
    rng = random.Random(15)
    for attempt in range(6):
        path = tmp_path / f"box{attempt}" / "mail.db"
        env = process_env(AGENT_MAIL_DB=str(path))
        proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "status"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.02, 0.12))
        proc.kill()
        proc.wait()
        for name in os.listdir(path.parent) if path.parent.exists() else []:
            os.utime(path.parent / name, (time.time() - 3600, time.time() - 3600))
        done = am_process("cleanup", "--older-than", "30", env=env)
        assert done.returncode == 0, done.stderr
        assert [n for n in os.listdir(path.parent) if n.startswith(".mail.db")] == []
        check = am_process("doctor", env=env)
        assert json.loads(check.stdout)["ok"] is True


# ---------------------------------------------------------------- 16. the watched file goes away


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_watch_ends_when_its_mailbox_is_deleted_or_replaced(am, mailbox_path, tmp_path, how, monkeypatch):
    """At its next look at the mailbox (every HELD_REFRESH_SECONDS for a watch that holds its presence, made
    short here), well before its timeout."""
    import threading

    from agent_mail import errors

    monkeypatch.setattr(model, "HELD_REFRESH_SECONDS", 0.3)
    am("status").assert_ok()

    def take_it_away():
        armed("w:z", timeout=20)
        if how == "deleted":
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(str(mailbox_path) + suffix):
                    os.unlink(str(mailbox_path) + suffix)
        else:
            other = tmp_path / "other.db"
            proc = am_process("status", env=process_env(AGENT_MAIL_DB=str(other)))
            assert proc.returncode == 0
            os.replace(other, mailbox_path)

    thread = threading.Thread(target=take_it_away)
    thread.start()
    try:
        with pytest.raises(errors.StorageError, match="deleted or replaced"):
            with mail.open_mailbox() as mailbox:
                mailbox.watch(agent="w:z", timeout_seconds=60)
    finally:
        thread.join()


# ---------------------------------------------------------------- 17-18. arrival time


def _set(mailbox_path, message_id, **columns):
    db = sqlite3.connect(mailbox_path)
    with db:
        for column, value in columns.items():
            db.execute(f"UPDATE messages SET {column} = ? WHERE id = ?", (value, message_id))
    db.close()


@pytest.mark.fast
def test_a_delayed_message_sorts_by_when_it_arrived(am, send, mailbox_path, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    am("profile", "b:y", "--mirror-dir", str(mirror), "--max-entries", "1").assert_ok()
    delayed = send("a:x", "b:y", "delayed", "--delay-minutes", "1")["id"]
    prompt = send("a:x", "b:y", "prompt")
    fell_due = model.iso(model.parse_iso(prompt["created"]) + __import__("datetime").timedelta(milliseconds=5))
    _set(mailbox_path, delayed, deliver_at=fell_due)
    _set_scheduled = sqlite3.connect(mailbox_path)
    with _set_scheduled:
        _set_scheduled.execute("UPDATE scheduled SET deliver_at = ? WHERE message_id = ?", (fell_due, delayed))
    _set_scheduled.close()
    until(lambda: model.now() > model.parse_iso(fell_due), 5, "the delayed message never fell due")
    assert subjects(am("read", "b:y", "--no-mark-read").json) == ["prompt", "delayed"]
    assert subjects(am("watch", "b:y", "--once").json) == ["prompt", "delayed"]
    mirror_doc = am("notifications", "b:y").json["email"]["data"]
    assert mirror_doc["email_ids"] == [delayed] and mirror_doc["newest_received_at"] == fell_due
    assert [e["received_at"] for e in mirror_doc["emails"]] == [fell_due]


@pytest.mark.fast
def test_cleanup_never_ages_out_mail_that_has_not_arrived(am, send, mailbox_path):
    later = send("a:x", "b:y", "in two days", "--delay-minutes", "2880")["id"]
    _set(mailbox_path, later, created="2000-01-01T00:00:00.000000+00:00")
    assert am("cleanup", "--older-than", "30", "--dry-run").json["deleted_count"] == 0
    assert am("cleanup", "--older-than", "30").json["deleted_count"] == 0
    assert am("cancel", "a:x", later).json["cancelled"] == [later]  # still there, still scheduled


# ---------------------------------------------------------------- 19. one visibility rule


@pytest.mark.fast
def test_a_stranger_sees_no_thread_no_attachments_and_cannot_reply(am, tmp_path):
    source = tmp_path / "secret.txt"
    source.write_text("secret")
    root = am("send", "--from", "a:x", "--to", "b:y", "--subject", "private", "--body", "the plan",
              "--attach", str(source)).json["id"]
    reply = am("send", "--from", "b:y", "--to", "a:x", "--subject", "re", "--reply-to", root).json["id"]
    for argv in (["read", "c:z", "--thread", reply], ["attachments", "c:z", root]):
        result = run_inprocess(*argv)
        assert result.code == 2 and "the plan" not in result.err and "is visible to c:z" in result.err
    refused = am("send", "--from", "c:z", "--to", "a:x", "--subject", "butting in", "--reply-to", root).error
    assert refused["problems"][0]["field"] == "--reply-to"
    # the parties keep seeing it all
    assert [m["id"] for m in am("read", "b:y", "--thread", reply).json["messages"]] == [root, reply]
    assert am("attachments", "a:x", root).json["count"] == 1


@pytest.mark.fast
def test_thread_state_fields_are_the_readers_own(am, send):
    root = send("a:x", "b:y", "question")["id"]
    am("read", "b:y").assert_ok()
    am("ack", "b:y", root).assert_ok()
    view = {m["id"]: m for m in am("read", "a:x", "--thread", root).json["messages"]}
    assert view[root]["read_at"] is None and view[root]["acked_at"] is None  # a:x sent it; b:y's stamps are b:y's
    mine = {m["id"]: m for m in am("read", "b:y", "--thread", root).json["messages"]}
    assert mine[root]["read_at"] is not None and mine[root]["acked_at"] is not None


# ---------------------------------------------------------------- 20. file names and depth


@pytest.mark.fast
def test_a_ref_whose_name_is_not_utf8_is_bad_input(am, tmp_path):
    name = os.fsdecode(str(tmp_path).encode() + b"/\xff.txt")
    open(name, "w").close()
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--ref", name).error
    assert error["problems"][0]["field"] == "--ref" and "UTF-8" in error["error"]
    refs = json.dumps([name])  # json.dumps escapes the surrogate: the decoded path still carries it
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--refs", refs).error


@pytest.mark.fast
def test_an_attachment_whose_name_is_not_utf8_still_travels(am, tmp_path):
    name = os.fsdecode(str(tmp_path).encode() + b"/caf\xe9.txt")
    with open(name, "wb") as handle:
        handle.write(b"content")
    receipt = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--attach", name).json
    assert receipt["attachments"][0]["name"] == "caf\ufffd.txt"
    saved = am("attachments", "b:y", receipt["id"], "--save-to", str(tmp_path / "out")).json["saved"][0]
    assert open(saved["path"], "rb").read() == b"content"


def test_a_mailbox_path_that_is_not_utf8_works_and_prints_strict_json(tmp_path):
    directory = os.fsdecode(str(tmp_path).encode() + b"/\xff")
    env = process_env(AGENT_MAIL_DB=os.path.join(directory, "mail.db"))
    described = am_process("describe", env=env)
    assert described.returncode == 0, described.stderr
    storage = json.loads(described.stdout.decode("utf-8"))["storage"]
    assert storage["path"].endswith("\\xff/mail.db")  # the byte shown as text, never a lone surrogate
    sent = am_process("send", "--from", "a:x", "--to", "b:y", "--subject", "s", env=env)
    assert sent.returncode == 0, sent.stderr
    assert json.loads(am_process("read", "b:y", env=env).stdout)["count"] == 1


@pytest.mark.fast
def test_deeply_nested_refs_are_bad_input(am):
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--refs", "[" * 20000 + "]" * 20000).error
    assert error["problems"][0]["field"] == "--refs" and "nested" in error["error"]


# ---------------------------------------------------------------- 21. signals while waiting for the lock


def _hold_write_lock(mailbox_path):
    holder = sqlite3.connect(mailbox_path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_a_send_blocked_on_the_lock_at_once(am, send, mailbox_path, signum, code):
    send("a:x", "b:y", "first")
    holder = _hold_write_lock(mailbox_path)
    try:
        # SIGINT as a terminal delivers it, even when this suite runs as a background job (which starts
        # its children with SIGINT ignored).
        proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "b:y",
                                 "--subject", "blocked"], env=process_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(1.0)  # well into its wait for the lock (the busy timeout is 10 s)
        assert proc.poll() is None
        sent_at = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=8)
        took = time.monotonic() - sent_at
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == code and out == b""
    assert "nothing was changed" in json.loads(err)["error"]
    assert took < 5, f"took {took:.1f} s: the signal waited for the lock"  # vs the 10 s busy timeout
    assert subjects(am("read", "b:y", "--all", "--no-mark-read").json) == ["first"]


def test_sigterm_ends_a_watch_whose_refresh_is_blocked_on_the_lock(am, mailbox_path):
    am("status").assert_ok()
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "w:z"], env=process_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    holder = None
    try:
        armed("w:z", timeout=20, procs=[watch])
        holder = _hold_write_lock(mailbox_path)
        time.sleep(model.REFRESH_SECONDS + 1.0)  # its refresh is now waiting for the lock
        sent_at = time.monotonic()
        watch.send_signal(signal.SIGTERM)
        out, err = watch.communicate(timeout=15)
        took = time.monotonic() - sent_at
    finally:
        if holder is not None:
            holder.execute("ROLLBACK")
            holder.close()
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 143 and out == b""
    assert took < 5, f"took {took:.1f} s: the signal waited for the lock"  # before: ~19 s (two busy timeouts)


# ---------------------------------------------------------------- limits and parsing


@pytest.mark.fast
def test_identities_have_a_length_limit(am):
    ok = "p:" + "n" * model.NAME_MAX_CHARS
    assert am("send", "--from", "a:x", "--to", ok, "--subject", "s").json
    error = am("send", "--from", "a:x", "--to", ok + "n", "--subject", "s").error
    assert "at most 64" in error["error"]
    assert am("send", "--from", "a:x", "--to", "p:" + "n" * 100_000, "--subject", "s").error
    assert am("describe").json["limits"]["identity_part_max_chars"] == model.NAME_MAX_CHARS


@pytest.mark.fast
@pytest.mark.parametrize("value", ["1_0", "\u0665", " 5", "5 ", "1e1", "+5", "0x10", "5.", ".5e1", "１０"])
def test_numbers_are_accepted_in_their_plain_form_only(am, value):
    error = am("read", "b:y", "--limit", value).error
    assert error["problems"][0]["field"] == "--limit"
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--delay-minutes", value).error


@pytest.mark.fast
@pytest.mark.parametrize("value", ["0.5", "5", "12.25"])
def test_plain_numbers_are_accepted(am, value):
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--delay-minutes", value).json


@pytest.mark.fast
def test_a_flag_that_needs_another_is_refused_alone(am, send):
    message = send("a:x", "b:y", "s")["id"]
    error = am("attachments", "b:y", message, "--overwrite").error
    assert error["problems"][0]["field"] == "--overwrite" and "--save-to" in error["error"]
    assert am("describe", "attachments").json["command"]["requires"] == {"--overwrite": "--save-to"}
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--no-ack").error


@pytest.mark.fast
def test_the_same_file_attached_twice_is_attached_once(am, tmp_path, monkeypatch):
    (tmp_path / "f.txt").write_text("x")
    monkeypatch.chdir(tmp_path)
    receipt = am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--attach", "f.txt",
                 "--attach", str(tmp_path / "f.txt")).json
    assert [a["name"] for a in receipt["attachments"]] == ["f.txt"]


@pytest.mark.fast
@pytest.mark.parametrize("text", ["\u202eexe.txt", "pay \u2066me\u2069", "\u202aa"])
def test_bidirectional_controls_are_refused_in_what_is_shown(am, tmp_path, text):
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", text).error["problems"][0]["field"] == "--subject"
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", text).error
    path = tmp_path / text.replace("/", "")
    path.write_text("x")
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--ref", str(path)).error
    assert am("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--attach", str(path)).error
    assert am("read", "b:y").json["count"] == 0


# ---------------------------------------------------------------- the docs tell the truth


@pytest.mark.fast
def test_problems_the_mailbox_finds_are_reported_with_the_others(am):
    error = am("send", "--from", "a:x", "--to", "b:y", "--subject", "", "--reply-to", model.new_message_id()).error
    assert sorted(p["field"] for p in error["problems"]) == ["--reply-to", "--subject"]


@pytest.mark.fast
def test_describe_documents_what_the_code_does(am, send, tmp_path):
    manual = am("describe").json
    assert "--version" in manual["global_flags"]
    assert "SIGINT (any command)" in manual["exit_codes"]["130"]
    assert "page by page" in manual["commands"]["watch"]["output_fields"]["messages"]
    mirror = tmp_path / "m"
    mirror.mkdir()
    am("profile", "b:y", "--mirror-dir", str(mirror)).assert_ok()
    send("a:x", "b:y", "hello")
    entry = am("notifications", "b:y").json["email"]["data"]["emails"][0]
    documented = manual["commands"]["notifications"]["documents"]["email.data.emails[]"]
    assert set(entry) == set(documented) == set(spec.MIRROR_ENTRY_FIELDS)
    written = json.loads((mirror / ".notification" / "email.json").read_text())["data"]["emails"][0]
    assert set(written) == set(documented)


@pytest.mark.fast
def test_the_quick_start_uses_a_virtual_environment():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    quick_start = readme.split("## Quick start", 1)[1].split("##", 1)[0]
    assert "python3 -m venv" in quick_start and "--version" in readme


_TEXT = st.text(alphabet=st.characters(exclude_categories=()) | st.sampled_from(
    "\x00\x07\t\n\r\x1b\x7f\x85\x9f\u00a0\u200d\u2028\u202a\u202e\u2066\u2069\ud800\udfff é"), max_size=40)


@pytest.mark.fast
@settings(max_examples=300, deadline=None)
@given(value=_TEXT)
def test_text_checks_without_a_regex_say_what_the_patterns_say(value):
    """A send's text checks use str methods first (no regex to import for ordinary text); on any text
    they must refuse exactly what the patterns refuse, with the same words."""
    import re

    surrogate = re.search(r"[\ud800-\udfff]", value) is not None
    assert model.has_surrogates(value) == surrogate
    bidi = re.search(model.BIDI, value)
    assert (model.bidi_problem(value) is None) == (bidi is None)
    if not surrogate and bidi is None and value.strip() and "\n" not in value and "\r" not in value:
        control = re.search(model.LINE_CONTROL, value) is not None
        refused = model.subject_problem(value[:model.SUBJECT_MAX_CHARS])
        assert (refused == "contains control characters. Use plain printable text.") == control, refused
    if not surrogate and bidi is None:
        match = re.search(model.BODY_CONTROL, value)
        refused = model.body_problem(value)
        assert (refused is not None and "control character" in refused) == (match is not None), refused
        if match:
            assert f"U+{ord(match.group()):04X} at position {match.start()}" in refused
