"""What only the PostgreSQL backend has: URLs and passwords, the server's clock, rights, faults of the
server and the connection, moving a mailbox over, and the mirror kept current by a follower."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from agent_mail import model
from tests.lib.cli import process_env
from tests.lib.mailbox import raw_db
from tests.lib.postgres import TEST_PG_URL, drop_schema, new_schema_name, pg_url
from tests.lib.tools import require, unavailable
from tests.lib.waiting import armed, until

@pytest.fixture
def backend():
    """Every test here is about PostgreSQL: the shared mailbox fixture gives each a schema of its own."""
    return "postgresql"


@pytest.fixture(autouse=True)
def _server():
    require("postgresql")


def _am(*argv, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "agent_mail", *argv], env=env or process_env(), capture_output=True,
                          text=True, timeout=timeout)


def _admin():
    import psycopg

    return psycopg.connect(TEST_PG_URL, autocommit=True)


def _with_password(url: str, password: str) -> str:
    scheme, rest = url.split("://", 1)
    userinfo, at, hosts = rest.partition("@")
    return f"{scheme}://{userinfo}:{password}@{hosts}" if at else url


# ---------------------------------------------------------------- URLs, passwords, drivers


def test_no_output_ever_shows_the_password(mailbox_path, tmp_path):
    secret = "s3cr3t-Pa55"
    url = _with_password(mailbox_path, secret)
    env = process_env(AGENT_MAIL_DB=url)
    sent = _am("send", "--from", "a:x", "--to", "b:y", "--subject", "hi", env=env)
    assert sent.returncode == 0 and secret not in sent.stdout + sent.stderr
    described = _am("describe", env=env)
    storage = json.loads(described.stdout)["storage"]
    assert secret not in described.stdout and storage["url"] == mailbox_path and storage["messages"] == 1
    refused = _am("status", env=process_env(AGENT_MAIL_DB=url.replace(":5432", ":1")))
    assert refused.returncode == 1 and secret not in refused.stdout + refused.stderr
    assert "cannot reach" in json.loads(refused.stderr)["error"]
    setup = _am("setup", "claude-code", "--agent", "a:x", "--dir", str(tmp_path), env=env)
    assert setup.returncode == 0, setup.stderr
    written = (tmp_path / ".mcp.json").read_text() + (tmp_path / ".claude" / "settings.local.json").read_text()
    assert secret not in written and mailbox_path in written


def test_without_the_driver_a_postgresql_url_names_the_extra(mailbox_path):
    # -S: no site-packages, so no psycopg
    proc = subprocess.run([sys.executable, "-S", "-m", "agent_mail", "status"], env=process_env(),
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert 'pip install \\"agent-mail[postgres]\\"' in proc.stderr


def test_an_unknown_scheme_and_a_bad_schema_name_are_input_errors(monkeypatch):
    from tests.lib.cli import run_inprocess as am

    monkeypatch.setenv("AGENT_MAIL_DB", "mysql://root@localhost/db")
    assert am("status").error["problems"][0]["field"] == "AGENT_MAIL_DB"
    monkeypatch.setenv("AGENT_MAIL_DB", pg_url("Robert'); DROP TABLE x;--"))
    error = am("status").error
    assert error["problems"][0]["field"] == "AGENT_MAIL_DB" and "schema" in error["error"]


def test_connection_refused_is_a_clear_error_and_quick(monkeypatch):
    from tests.lib.cli import run_inprocess as am

    monkeypatch.setenv("AGENT_MAIL_DB", "postgresql://postgres@127.0.0.1:1/test")
    started = time.monotonic()
    error = am("read", "b:y").error
    assert "cannot reach" in error["error"] and "Nothing was changed" in error["error"]
    assert time.monotonic() - started < 10


# ---------------------------------------------------------------- rights, timeouts, first use


def test_a_role_without_the_right_to_create_the_schema_is_told_which_right(mailbox_path):
    role = f"am_norights_{os.getpid()}"
    with _admin() as db:
        db.execute(f"DROP ROLE IF EXISTS {role}")
        db.execute(f"CREATE ROLE {role} LOGIN")
    try:
        url = mailbox_path.replace("postgres@", f"{role}@", 1)
        proc = _am("status", env=process_env(AGENT_MAIL_DB=url))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        error = json.loads(proc.stderr)["error"]
        assert "lacks a right" in error and "GRANT CREATE ON DATABASE" in error
    finally:
        with _admin() as db:
            db.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_statement_timeout_is_a_clear_error_that_changes_nothing(mailbox_path, am):
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "one").assert_ok()
    schema = mailbox_path.rpartition("=")[2]
    holder = _admin()
    holder.autocommit = False
    holder.execute(f'LOCK TABLE "{schema}".messages IN ACCESS EXCLUSIVE MODE')
    try:
        url = mailbox_path.replace("?", "?options=-c%20statement_timeout%3D300&", 1)
        proc = _am("read", "b:y", env=process_env(AGENT_MAIL_DB=url))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert "statement_timeout" in json.loads(proc.stderr)["error"]
    finally:
        holder.rollback()
        holder.close()
    assert am("read", "b:y", "--no-mark-read").json["count"] == 1  # nothing was marked read


def test_many_processes_creating_the_mailbox_at_once_all_succeed(mailbox_path):
    procs = [subprocess.Popen([sys.executable, "-m", "agent_mail", "send", "--from", f"a:w{i}", "--to", "b:y",
                               "--subject", f"n{i}"], env=process_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE) for i in range(8)]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    db = raw_db(mailbox_path)
    from agent_mail.store import postgres

    assert db.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] == len(postgres.MIGRATIONS)
    assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 8
    db.close()


def test_schemas_keep_mailboxes_apart_in_one_database(mailbox_path, am):
    other = new_schema_name()
    try:
        am("send", "--from", "a:x", "--to", "b:y", "--subject", "here").assert_ok()
        elsewhere = _am("read", "b:y", env=process_env(AGENT_MAIL_DB=pg_url(other)))
        assert json.loads(elsewhere.stdout)["count"] == 0
        assert am("read", "b:y").json["count"] == 1
    finally:
        drop_schema(other)


# ---------------------------------------------------------------- one clock


def test_clients_whose_clocks_disagree_still_agree_on_order_liveness_and_due_times(am, monkeypatch):
    """A client whose clock is ten minutes slow and one ten minutes fast: timestamps come from the server."""
    real = model.system_now
    monkeypatch.setattr(model, "followed", None)
    monkeypatch.setattr(model, "system_now", lambda: real() - dt.timedelta(minutes=10))
    am("send", "--from", "slow:clock", "--to", "b:y", "--subject", "first").assert_ok()
    am("heartbeat", "slow:clock").assert_ok()
    am("send", "--from", "slow:clock", "--to", "b:y", "--subject", "due in a minute",
       "--delay-minutes", "1").assert_ok()
    monkeypatch.setattr(model, "system_now", lambda: real() + dt.timedelta(minutes=10))
    am("send", "--from", "fast:clock", "--to", "b:y", "--subject", "second").assert_ok()
    read = am("read", "b:y", "--no-mark-read").json["messages"]
    assert [m["subject"] for m in read] == ["first", "second"]  # the scheduled one is not due for anyone
    created = [model.parse_iso(m["created"]) for m in read]
    assert abs((created[1] - created[0]).total_seconds()) < 30
    assert abs((created[0] - real()).total_seconds()) < 30  # the server's time, not either client's
    row = am("status", "--agent", "slow:clock").json["agents"][0]
    assert row["last_seen"] is not None and row["watching"] is True  # its heartbeat is fresh for the fast client


# ---------------------------------------------------------------- faults under watches and senders


def _watch_backends(schema: str) -> list[int]:
    with _admin() as db:
        return [r[0] for r in db.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'agent-mail%%' AND state = 'idle' "
            "AND pid != pg_backend_pid()")]  # between the tests' in-process commands, only the watch is connected


def test_a_watch_whose_connection_is_terminated_reconnects_and_misses_nothing(mailbox_path, am):
    am("status").assert_ok()
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "b:y"], env=process_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        armed("b:y", procs=[watch])
        pids = until(lambda: _watch_backends(mailbox_path), 10, "the watch holds no connection")
        with _admin() as db:
            for pid in pids:
                db.execute("SELECT pg_terminate_backend(%s)", (pid,))
            am("send", "--from", "a:x", "--to", "b:y", "--subject", "while it was cut off").assert_ok()
        out, err = watch.communicate(timeout=60)  # well before its 55-minute timeout
        assert watch.returncode == 0, err
        assert [m["subject"] for m in json.loads(out)["messages"]] == ["while it was cut off"]
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()


def test_a_sender_terminated_mid_transaction_changes_nothing(mailbox_path, am):
    from agent_mail.store.postgres import PostgresStore

    am("status").assert_ok()
    store = PostgresStore(mailbox_path)
    try:
        with store.transaction(write=True):  # hold the write lock: the sender waits inside its transaction
            sender = subprocess.Popen([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "b:y",
                                       "--to", "c:z", "--subject", "never half"], env=process_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            def waiting() -> list[int]:
                with _admin() as db:
                    return [r[0] for r in db.execute(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = "
                        "'agent-mail'")]

            waiting = until(waiting, 20, "the sender never waited for the lock")
            with _admin() as db:
                db.execute("SELECT pg_terminate_backend(%s)", (waiting[0],))
            out, err = sender.communicate(timeout=60)
    finally:
        store.close()
    assert sender.returncode == 1 and out == "" and "Traceback" not in err, err
    assert am("read", "b:y", "--no-mark-read").json["count"] == 0
    assert am("read", "c:z", "--no-mark-read").json["count"] == 0


def _stored_sends(mailbox) -> int:
    db = raw_db(mailbox)
    try:
        return db.execute("SELECT COUNT(*) FROM messages WHERE sender LIKE 'send:%'").fetchone()[0]
    finally:
        db.close()


@pytest.mark.requires("pg_ctlcluster")
def test_a_server_restart_under_watches_and_senders_loses_nothing(mailbox_path, am):
    if os.geteuid() != 0 or not os.path.isdir("/etc/postgresql"):
        unavailable("restarting the shared server needs root and its Debian cluster (/etc/postgresql)")
    am("status").assert_ok()
    version = sorted(os.listdir("/etc/postgresql"))[0]
    watches = {a: subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", a], env=process_env(),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for a in ("w:one", "w:two")}
    try:
        armed(list(watches), procs=list(watches.values()))
        senders = [subprocess.Popen([sys.executable, "-c", _SENDER_LOOP, str(i)], env=process_env(),
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
        until(lambda: _stored_sends(mailbox_path) > 0, 30, "the senders never sent")  # sending when it restarts
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"], check=True,
                       capture_output=True, timeout=120)
        time.sleep(1.0)  # the senders go on after the restart
        for proc in senders:
            proc.kill()  # each line is flushed whole; a send cut off here proves all-or-nothing too
        logs = [proc.communicate(timeout=60)[0] for proc in senders]
        am("send", "--from", "boss:main", "--to", "*", "--subject", "after the restart").assert_ok()
        for agent, proc in watches.items():
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            assert json.loads(out)["count"] >= 1, agent
    finally:
        for proc in watches.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    # A sender killed while writing leaves its last line cut short: only lines that ended are counted.
    lines = [line for log in logs for line in log.split("\n")[:-1]]
    succeeded = [line.split()[1] for line in lines if line.startswith("ok ")]
    failed = [line for line in lines if line.startswith("error ")]
    assert succeeded and failed, (len(succeeded), failed[:3])  # the restart really cut some sends off
    assert all("Traceback" not in line for line in failed)
    db = raw_db(mailbox_path)
    stored = {r[0]: r[1] for r in db.execute("SELECT batch_id, COUNT(*) FROM messages WHERE sender LIKE 'send:%' "
                                             "GROUP BY batch_id")}
    db.close()
    assert set(succeeded) <= set(stored)  # every send reported done is there
    assert set(stored.values()) == {2}  # and every stored send is whole (both recipients)


_SENDER_LOOP = """
import io, json, os, sys, contextlib
from agent_mail.cli import main
n = sys.argv[1]
while True:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main.main(["send", "--from", f"send:s{n}", "--to", "w:one", "--to", "w:two", "--subject", "load"])
    if code == 0:
        line = "ok " + json.loads(out.getvalue())["batch_id"]
    else:
        line = "error " + json.loads(err.getvalue())["error"].replace(chr(10), " ")
    os.write(1, (line + chr(10)).encode())  # one write a line: a kill cuts between lines, not inside one
"""


# ---------------------------------------------------------------- moving a mailbox, the mirror


def test_a_sqlite_mailbox_moves_to_postgresql_and_back_whole(tmp_path, mailbox_path, am):
    source = str(tmp_path / "old.db")
    env = process_env(AGENT_MAIL_DB=source)
    attachment = tmp_path / "notes.txt"
    attachment.write_text("the plan")
    first = json.loads(_am("send", "--from", "a:x", "--to", "b:y", "--to", "c:z", "--subject", "plan", "--attach",
                           str(attachment), env=env).stdout)
    _am("send", "--from", "b:y", "--to", "a:x", "--subject", "re: plan", "--reply-to",
        first["deliveries"][0]["id"], env=env)
    _am("send", "--from", "a:x", "--to", "*", "--subject", "all hands", env=env)
    _am("send", "--from", "a:x", "--to", "c:z", "--subject", "tomorrow", "--delay-minutes", "600", env=env)
    _am("read", "c:z", env=env)
    _am("ack", "c:z", "--all", env=env)
    _am("profile", "h:boss", "--human", env=env)
    before = {agent: json.loads(_am("read", agent, "--all", "--no-mark-read", env=env).stdout)["messages"]
              for agent in ("a:x", "b:y", "c:z")}
    moved = am("copy", "--from", source).json
    assert moved["verified"] is True and moved["copied"]["messages"] == 5
    assert moved["target_counts"] == moved["source_counts"]
    assert am("copy", "--from", source).error["problems"][0]["field"] == "--merge"  # not into a non-empty one
    after = {agent: am("read", agent, "--all", "--no-mark-read").json["messages"] for agent in before}
    assert after == before  # ids, threads, states, attachments: the same
    thread = am("read", "a:x", "--thread", first["deliveries"][0]["id"], "--no-mark-read").json["messages"]
    assert [m["subject"] for m in thread] == ["plan", "re: plan"]
    assert am("profile", "h:boss").json["human"] is True
    back = str(tmp_path / "back.db")
    returned = json.loads(_am("copy", "--from", mailbox_path, "--to", back).stdout)
    assert returned["verified"] and returned["target_counts"] == moved["source_counts"]
    again = {agent: json.loads(_am("read", agent, "--all", "--no-mark-read",
                                   env=process_env(AGENT_MAIL_DB=back)).stdout)["messages"] for agent in before}
    assert again == before
    # new mail in the copy continues the insertion order after the copied mail
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "newest").assert_ok()
    assert am("read", "b:y", "--no-mark-read").json["messages"][-1]["subject"] == "newest"


def test_a_follower_keeps_the_mirror_current_whoever_sends(tmp_path, mailbox_path, am):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    am("profile", "b:y", "--mirror-dir", str(mirror)).assert_ok()
    follower = subprocess.Popen([sys.executable, "-m", "agent_mail", "notifications", "b:y", "--follow"],
                                env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(follower.stdout.readline())
        assert first["agent"] == "b:y" and first["unread"] == 0
        am("send", "--from", "a:x", "--to", "b:y", "--subject", "for the mirror").assert_ok()
        update = json.loads(follower.stdout.readline())  # woken by the commit, not by a timer
        assert update["unread"] == 1
        mirrored = json.loads((mirror / ".notification" / "email.json").read_text())
        assert mirrored["data"]["count"] == 1
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["stopped_by"] == "SIGTERM"
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()


def test_a_sender_without_the_mirror_directory_leaves_it_to_that_machine(tmp_path, am):
    gone = tmp_path / "on-another-machine"
    gone.mkdir()
    am("profile", "b:y", "--mirror-dir", str(gone)).assert_ok()
    gone.rmdir()
    receipt = am("send", "--from", "a:x", "--to", "b:y", "--subject", "hi").json
    assert receipt["mirrors"] == [{"agent": "b:y", "path": str(gone), "status": "elsewhere"}]
    assert not gone.exists()


def test_a_reader_cut_off_after_its_output_marks_nothing_read(mailbox_path, am, monkeypatch):
    """The result reached stdout, then the server ended the reader's connection before its commit: the
    command fails (the output is disowned), and the message is still unread for the next read."""
    from agent_mail.cli import main

    am("send", "--from", "a:x", "--to", "b:y", "--subject", "precious").assert_ok()
    printed = main.emit

    def emit_then_cut(document):
        printed(document)
        with _admin() as db:
            db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                       "'agent-mail' AND state = 'idle in transaction'")

    monkeypatch.setattr(main, "emit", emit_then_cut)
    result = am("read", "b:y")
    monkeypatch.setattr(main, "emit", printed)
    assert result.code == 1 and "Traceback" not in result.err
    error = json.loads(result.err)
    assert error["output_discarded"] is True and "disregard" in error["error"]
    assert [m["subject"] for m in am("read", "b:y").json["messages"]] == ["precious"]


def test_libpq_service_files_and_parameters_work_as_for_any_libpq_client(tmp_path, mailbox_path, am):
    """AGENT_MAIL_DB=postgresql://?service=NAME with PGSERVICEFILE: libpq fills in host, port, database and
    user; other libpq parameters pass through (sslmode=require against a server without SSL is refused
    clearly)."""
    from urllib.parse import urlsplit

    parts = urlsplit(TEST_PG_URL)
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[amtest]\nhost={parts.hostname}\nport={parts.port or 5432}\n"
                        f"dbname={parts.path.lstrip('/')}\nuser={parts.username}\n")
    schema = mailbox_path.rpartition("=")[2]
    env = process_env(AGENT_MAIL_DB=f"postgresql://?service=amtest&schema={schema}", PGSERVICEFILE=str(services))
    sent = _am("send", "--from", "a:x", "--to", "b:y", "--subject", "via the service file", env=env)
    assert sent.returncode == 0, sent.stderr
    assert [m["subject"] for m in am("read", "b:y").json["messages"]] == ["via the service file"]
    with _admin() as db:
        ssl = db.execute("SHOW ssl").fetchone()[0]
    if ssl == "off":
        refused = _am("status", env=process_env(AGENT_MAIL_DB=mailbox_path + "&sslmode=require"))
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert "SSL" in json.loads(refused.stderr)["error"]
