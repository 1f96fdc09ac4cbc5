"""watch, heartbeat and liveness: in-process for the logic, real processes for waking and signals."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from agent_mail import errors, model
from agent_mail.parts import waits
from agent_mail.operations.mail import describe_liveness, open_mailbox
from tests.lib.cli import process_env
from tests.lib.mailbox import mailbox_exists, mailbox_itself, raw_db
from tests.lib.waiting import armed, until

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL

ENVELOPE = {"id", "sender", "subject", "type", "created"}


def envelope_ids(document):
    return [m["id"] for m in document["messages"]]


# ---------------------------------------------------------------- what watch reports


@pytest.mark.fast
def test_once_with_and_without_mail(am, send):
    empty = am("watch", "b:y", "--once").json
    assert empty["messages"] == [] and empty["count"] == 0 and empty["timeout"] is True
    message = send("a:x", "b:y", "hi")["id"]
    found = am("watch", "b:y", "--once").json
    assert envelope_ids(found) == [message] and found["timeout"] is False and found["count"] == 1
    assert found["next"][0] == "agent-mail read b:y"


@pytest.mark.fast
def test_watch_reports_exactly_what_read_delivers(am, send):
    send("c:z", "b:y", "introduce c:z")
    direct = send("a:x", "b:y", "direct")["id"]
    broadcast = send("c:z", "*", "broadcast")["id"]
    note = send("b:y", "b:y", "note to self")["id"]
    send("b:y", "*", "own broadcast")
    already = send("a:x", "b:y", "already read")["id"]
    am("ack", "b:y", already).assert_ok()  # acking implies read
    watched = am("watch", "b:y", "--once").json
    read = am("read", "b:y", "--no-mark-read").json
    assert envelope_ids(watched) == envelope_ids(read)
    assert set(envelope_ids(watched)) == {envelope_ids(watched)[0], direct, broadcast, note}
    for envelope in watched["messages"]:
        assert set(envelope) == ENVELOPE


@pytest.mark.fast
def test_watch_consumes_nothing(am, send):
    message = send("a:x", "b:y", "hi", "--body", "secret body")["id"]
    before = am("status", "--agent", "b:y", "--fields", "unread,unacked").json
    watched = am("watch", "b:y", "--once").json
    assert "secret body" not in json.dumps(watched)
    assert am("status", "--agent", "b:y", "--fields", "unread,unacked").json == before
    assert envelope_ids(am("read", "b:y").json) == [message]


@pytest.mark.local_only("the library's blocking loop, called in-process")
def test_the_blocking_loop_times_out_on_a_sub_floor_deadline(send):
    with open_mailbox() as mailbox:
        started = time.monotonic()
        with pytest.raises(errors.InvalidInput, match="timeout_minutes"):  # the library keeps the spec's floor
            mailbox.watch(agent="b:y", timeout_minutes=0.01)
        result = mailbox.watch(agent="b:y", timeout_seconds=0.6)  # what a bounded MCP wait passes
        elapsed = time.monotonic() - started
    assert result["timeout"] is True and result["messages"] == [] and result["count"] == 0
    assert 0.5 <= elapsed < 5
    assert result["next"] == ["agent-mail watch b:y"] and result["reachable"] is False
    with open_mailbox() as mailbox:
        row = mailbox.status(agent="b:y")["agents"][0]
        listed = [r["agent"] for r in mailbox.status()["agents"]]
    assert row["watch_state"] == "released" and row["watching"] is True
    assert listed == ["b:y"]  # an identity that has only ever watched is still listed


@pytest.mark.local_only("the library's blocking loop, called in-process, signalled")
def test_a_second_signal_while_a_stopped_wait_releases_its_session_still_ends_it_as_stopped(mailbox_path):
    """SIGTERM, then another while the session is being released (a waiter stood down twice): the wait ends with
    the first signal's Interrupted, its session released, the process's own handler back; never an exception from
    inside the release."""
    before = signal.getsignal(signal.SIGTERM)
    with open_mailbox() as mailbox:
        release = mailbox.waits.release
        seen = []

        def release_signalled(session, reason, **options):
            seen.append(reason)
            os.kill(os.getpid(), signal.SIGTERM)  # the second stand-down, as the release starts
            return release(session, reason, **options)

        mailbox.waits.release = release_signalled

        def look() -> list:
            os.kill(os.getpid(), signal.SIGTERM)  # the first, while the wait looks
            return []

        with pytest.raises(errors.Interrupted) as stopped:
            mailbox.wait_armed("b:y", 30.0, look)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert seen == [f"signal {int(signal.SIGTERM)}"]
    assert signal.getsignal(signal.SIGTERM) is before
    state, reason = raw_db(mailbox_path).execute("SELECT state, released_reason FROM watch_sessions").fetchone()
    assert (state, reason) == ("released", f"signal {int(signal.SIGTERM)}")


@pytest.mark.local_only("the library's blocking loop, called in-process with its refresh interval shortened")
def test_the_blocking_loop_refreshes_its_session(monkeypatch, mailbox_path):
    monkeypatch.setattr(model, "REFRESH_SECONDS", 0.1)
    with open_mailbox() as mailbox:  # PostgreSQL refreshes the row idle_scale times less often
        mailbox.watch(agent="b:y", timeout_seconds=0.6 * mailbox.store.idle_scale)
    db = raw_db(mailbox_path)
    started, last_seen, state, reason = db.execute(
        "SELECT started_at, last_seen, state, released_reason FROM watch_sessions").fetchone()
    assert state == "released" and reason == "timeout" and last_seen > started


REFUSED = [
    (["--timeout", "30"], "--timeout"),
    (["--timeout"], "--timeout"),
    (["--poll", "0.1"], "--poll"),
    (["--timeout-minutes", "4.9"], "--timeout-minutes"),
    (["--timeout-minutes", "241"], "--timeout-minutes"),
    (["--timeout-minutes", "abc"], "--timeout-minutes"),
    (["--timeout-minutes", "nan"], "--timeout-minutes"),
    (["--once", "--timeout-minutes", "30"], "--once"),
]


@pytest.mark.fast
@pytest.mark.parametrize("argv, field", REFUSED)
def test_rejected_flags_and_bounds(am, argv, field):
    error = am("watch", "b:y", *argv).error
    assert error["problems"][0]["field"] == field


@pytest.mark.fast
@pytest.mark.local_only("whether the mailbox file or schema gets made (a server's mailbox exists before it serves)")
@pytest.mark.parametrize("argv, field", REFUSED)
def test_a_rejected_watch_makes_no_mailbox(am, argv, field, mailbox_path):
    assert am("watch", "b:y", *argv).error["problems"][0]["field"] == field
    assert not mailbox_exists(mailbox_path)  # rejected before the mailbox is touched


@pytest.mark.fast
def test_removed_flags_name_their_replacement(am):
    assert "--timeout-minutes" in am("watch", "b:y", "--timeout", "30").error["error"]
    assert "--once" in am("watch", "b:y", "--poll", "1").error["error"]


@pytest.mark.fast
def test_describe_documents_watch_and_the_discipline(am):
    doc = am("describe").json
    watch = doc["commands"]["watch"]
    assert watch["args"]["--timeout-minutes"]["default"] == 55
    assert watch["args"]["--timeout-minutes"]["range"] == [5, 240]
    assert set(watch["item_fields"]["fields"]) == ENVELOPE
    assert any("watch never marks anything read" in rule for rule in doc["invariants"])


# ---------------------------------------------------------------- liveness states


def _facts(**kwargs):
    base = {"armed_seen": None, "released_at": None, "session_seen": None, "heartbeat": None, "sessions": 1}
    base.update(kwargs)
    return base


NOW = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("facts, state, watching, reachable", [
    (None, "never", False, False),
    (_facts(armed_seen=NOW, session_seen=NOW), "armed", True, True),
    (_facts(released_at=NOW - dt.timedelta(seconds=30), session_seen=NOW - dt.timedelta(seconds=30)),
     "released", True, False),
    (_facts(released_at=NOW - dt.timedelta(seconds=90), session_seen=NOW - dt.timedelta(seconds=90)),
     "released", False, False),
    (_facts(armed_seen=NOW - dt.timedelta(seconds=20), session_seen=NOW - dt.timedelta(seconds=20)),
     "stale", True, False),
    # a killed watch after an earlier clean exit is stale; a clean exit after a killed one is released
    (_facts(armed_seen=NOW - dt.timedelta(seconds=20), released_at=NOW - dt.timedelta(minutes=5),
            session_seen=NOW - dt.timedelta(seconds=20)), "stale", True, False),
    (_facts(armed_seen=NOW - dt.timedelta(minutes=5), released_at=NOW - dt.timedelta(seconds=20),
            session_seen=NOW - dt.timedelta(seconds=20)), "released", True, False),
    # an armed session wins over any number of exits
    (_facts(armed_seen=NOW - dt.timedelta(seconds=3), released_at=NOW - dt.timedelta(seconds=1),
            session_seen=NOW - dt.timedelta(seconds=1)), "armed", True, True),
    # heartbeat only: watching and reachable, but it never watched
    (_facts(sessions=0, heartbeat=NOW - dt.timedelta(seconds=10)), "never", True, True),
])
@pytest.mark.fast
def test_liveness_states(facts, state, watching, reachable):
    described = describe_liveness(facts, NOW)
    assert (described["watch_state"], described["watching"], described["reachable"]) == (state, watching, reachable)


@pytest.mark.fast
def test_heartbeat_counts_as_presence_and_lists_the_identity(am, send):
    beat = am("heartbeat", "hook:agent").json
    assert beat["reachable"] is True and beat["unread"] == 0 and beat["next"] == []
    row = am("status", "--agent", "hook:agent").json["agents"][0]
    assert row["watching"] is True and row["last_seen"] == beat["last_seen"] and row["watch_state"] == "never"
    assert "hook:agent" in [r["agent"] for r in am("status").json["agents"]]
    send("a:x", "hook:agent", "hi")
    assert am("heartbeat", "hook:agent").json["next"] == ["agent-mail read hook:agent"]


@pytest.mark.fast
def test_status_liveness_fields_are_projectable(am):
    am("heartbeat", "a:x").assert_ok()
    rows = am("status", "--fields", "agent,watching,last_seen,watch_state,released_at").json["agents"]
    assert set(rows[0]) == {"agent", "watching", "last_seen", "watch_state", "released_at"}


@pytest.mark.fast
def test_read_ack_and_send_carry_reachable_and_next(am, send, mailbox_path):
    question = send("a:x", "b:y", "q")["id"]
    read = am("read", "b:y").json
    assert read["reachable"] is False
    assert read["next"] == [f"agent-mail ack b:y {question}", "agent-mail watch b:y"]
    ack = am("ack", "b:y", question).json
    assert ack["next"] == ["agent-mail watch b:y"]
    # a sender that never watched gets no re-arm hint; one whose watch lapsed does
    assert send("b:y", "a:x", "r")["next"] == []
    with mailbox_itself(mailbox_path) as mailbox:  # a watch that ran out (the command waits 5 minutes at least)
        mailbox.watch(agent="b:y", timeout_seconds=0.06)
    receipt = send("b:y", "a:x", "r2")
    assert receipt["sender_reachable"] is False and receipt["next"] == ["agent-mail watch b:y"]


@pytest.mark.fast
def test_heartbeat_makes_read_reachable(am, send):
    send("a:x", "b:y", "q")
    am("heartbeat", "b:y").assert_ok()
    read = am("read", "b:y").json
    assert read["reachable"] is True and not any("watch" in step for step in read["next"])


@pytest.mark.fast
def test_cleanup_sweeps_old_liveness_rows(am, mailbox_path):
    am("heartbeat", "old:agent").assert_ok()
    am("heartbeat", "new:agent").assert_ok()
    with mailbox_itself(mailbox_path) as mailbox:
        mailbox.watch(agent="old:agent", timeout_seconds=0.06)
    db = raw_db(mailbox_path)
    db.execute("UPDATE heartbeats SET last_seen = '2020-01-01T00:00:00+00:00' WHERE agent = 'old:agent'")
    db.execute("UPDATE watch_sessions SET last_seen = '2020-01-01T00:00:00-07:00'")
    db.commit()
    assert am("cleanup", "--older-than", "1", "--dry-run").json["sessions_deleted"] == 2
    assert am("cleanup", "--older-than", "1").json["sessions_deleted"] == 2
    assert db.execute("SELECT COUNT(*) FROM watch_sessions").fetchone()[0] == 0
    assert [r[0] for r in db.execute("SELECT agent FROM heartbeats")] == ["new:agent"]


# ---------------------------------------------------------------- real processes


def _start_watch(*extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "b:y", *extra],
                            env=env or process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def reap():
    """Kill any watch a test leaves behind."""
    procs = []
    yield procs.append
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _send_process(subject="wake"):
    return subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "b:y",
                           "--subject", subject], env=process_env(), capture_output=True, timeout=60)


def test_a_blocked_watch_is_woken_by_a_send_from_another_process(mailbox_path, reap, am, backend):
    watch = _start_watch("--timeout-minutes", "5")
    reap(watch)
    armed("b:y", procs=[watch])
    first_seen = am("status", "--agent", "b:y").json["agents"][0]["last_seen"]
    # while blocked: watching, armed, last_seen advancing, and no lock held
    time.sleep(model.REFRESH_SECONDS + 0.7)
    row = am("status", "--agent", "b:y").json["agents"][0]
    assert row["watching"] is True and row["watch_state"] == "armed" and row["last_seen"] > first_seen
    assert am("status", "--agent", "b:y", "--fields", "agent,watching").json["agents"] == [
        {"agent": "b:y", "watching": True}]
    if backend == "sqlite":
        writer = sqlite3.connect(mailbox_path, timeout=0, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # would fail at once if the watch held a lock
        writer.execute("ROLLBACK")
        writer.close()
    else:  # no transaction open while it waits
        db = raw_db(mailbox_path)
        states = db.execute("SELECT state FROM pg_stat_activity WHERE application_name LIKE 'agent-mail%' "
                            "AND pid != pg_backend_pid()").fetchall()
        db.close()
        assert states and all(s[0] == "idle" for s in states), states
    sent_at = time.monotonic()
    sent = _send_process()
    assert sent.returncode == 0, sent.stderr
    out, err = watch.communicate(timeout=30)
    woke_after = time.monotonic() - sent_at
    assert watch.returncode == 0, err
    result = json.loads(out)
    assert result["timeout"] is False and result["messages"][0]["subject"] == "wake"
    assert woke_after < 10  # the timeout was 300 s: woken by the send, not by the clock
    row = am("status", "--agent", "b:y").json["agents"][0]
    assert row["watch_state"] == "released" and row["unread"] == 1  # nothing consumed


def test_wake_without_file_notifications_falls_back_to_polling(mailbox_path, reap):
    watch = _start_watch("--timeout-minutes", "5", env=process_env(AGENT_MAIL_POLL="1"))
    reap(watch)
    armed("b:y", procs=[watch])
    assert _send_process().returncode == 0
    out, _ = watch.communicate(timeout=30)
    assert json.loads(out)["count"] == 1


def test_a_send_to_someone_else_does_not_wake_the_watch(mailbox_path, reap):
    watch = _start_watch("--timeout-minutes", "5")
    reap(watch)
    armed("b:y", procs=[watch])
    subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "c:z", "--subject", "no"],
                   env=process_env(), check=True, capture_output=True)
    time.sleep(0.5)
    assert watch.poll() is None
    assert _send_process("yes").returncode == 0
    out, _ = watch.communicate(timeout=30)
    assert [m["subject"] for m in json.loads(out)["messages"]] == ["yes"]


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_signalled_watch_releases_its_session(mailbox_path, reap, am, signum, code):
    watch = _start_watch()
    reap(watch)
    armed("b:y", procs=[watch])
    watch.send_signal(signum)
    out, err = watch.communicate(timeout=30)
    assert watch.returncode == code and out == b""
    assert "released" in json.loads(err)["error"] and b"Traceback" not in err
    # The watch released its session before it exited (through a server: told it, and waited for its answer).
    row = am("status", "--agent", "b:y").json["agents"][0]
    assert row["watch_state"] == "released" and row["released_at"] is not None


def _state_within(am, seconds: float, wanted: str) -> dict:
    """b:y's status row once its watch_state is `wanted`, or as it is after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        row = am("status", "--agent", "b:y").json["agents"][0]
        if row["watch_state"] == wanted or time.monotonic() > deadline:
            return row
        time.sleep(0.05)


def test_a_killed_watch_is_stale_at_once(mailbox_path, reap, am):
    """Issue 20, finding 20: what a blocked watch holds (SQLite: the lock on its wake-up pipe; PostgreSQL: its
    connection) is freed when it dies, so a SIGKILLed watch reads as stale within 2 s, well before the
    STALE_SECONDS of missed refreshes it took before."""
    watch = _start_watch()
    reap(watch)
    armed("b:y", procs=[watch])
    assert am("status", "--agent", "b:y").json["agents"][0]["watch_state"] == "armed"
    watch.kill()
    watch.communicate(timeout=30)
    row = _state_within(am, 2.0, "stale")
    assert row["watch_state"] == "stale" and row["watching"] is True and row["released_at"] is None
    assert am("read", "b:y").json["reachable"] is False


def _age_presence(mailbox_path, backend, seconds: float) -> None:
    """Make the armed watch's last refresh `seconds` old, where it is kept (SQLite: its pipe's mtime)."""
    moment = time.time() - seconds
    if backend == "sqlite":
        bells = os.path.join(os.path.dirname(mailbox_path), f".{os.path.basename(mailbox_path)}.wake")
        for name in os.listdir(bells):
            os.utime(os.path.join(bells, name), (moment, moment))
    db = raw_db(mailbox_path)
    db.execute("UPDATE watch_sessions SET last_seen = ? WHERE state = 'armed'",
               (dt.datetime.fromtimestamp(moment, dt.timezone.utc).isoformat(),))
    db.commit()
    db.close()


def test_a_hung_watch_stays_armed_while_alive_and_goes_stale_when_its_refreshes_stop_for_minutes(
        mailbox_path, reap, am, backend):
    """A watch that holds its presence refreshes only every HELD_REFRESH_SECONDS: a missed few seconds mean
    nothing; no refresh for HUNG_SECONDS means it is hung (alive, deaf): stale."""
    watch = _start_watch()
    reap(watch)
    armed("b:y", procs=[watch])
    watch.send_signal(signal.SIGSTOP)
    try:
        _age_presence(mailbox_path, backend, model.STALE_SECONDS + 5)
        assert am("status", "--agent", "b:y").json["agents"][0]["watch_state"] == "armed"
        _age_presence(mailbox_path, backend, model.HUNG_SECONDS + 5)
        row = am("status", "--agent", "b:y").json["agents"][0]
        assert row["watch_state"] == "stale" and row["released_at"] is None
    finally:
        watch.send_signal(signal.SIGCONT)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the process's context switches in /proc")
def test_an_idle_watch_does_not_wake_for_its_presence(mailbox_path, reap):
    """Idle is free: a blocked watch sleeps through the seconds in which it used to refresh its session (every
    REFRESH_SECONDS) and look at the mailbox; nothing wakes it but mail (and, rarely, HELD_REFRESH_SECONDS)."""
    watch = _start_watch("--timeout-minutes", "5")
    reap(watch)
    armed("b:y", procs=[watch])
    time.sleep(0.5)  # from writing its row to sleeping

    def woken() -> int:
        with open(f"/proc/{watch.pid}/status") as handle:
            return next(int(line.split()[1]) for line in handle if line.startswith("voluntary_ctxt_switches"))

    before = woken()
    time.sleep(model.REFRESH_SECONDS + 1.0)
    assert woken() == before and watch.poll() is None


def _armed_sessions(mailbox_path) -> int:
    """How many watch sessions are armed (status shows one state per identity, not how many hold it)."""
    con = raw_db(mailbox_path)
    try:
        return con.execute("SELECT COUNT(*) FROM watch_sessions WHERE state = 'armed'").fetchone()[0]
    finally:
        con.close()


def test_two_watches_one_exits_the_other_keeps_the_identity_armed(mailbox_path, reap, am):
    first, second = _start_watch(), _start_watch()
    reap(first)
    reap(second)
    armed("b:y", procs=[first])
    until(lambda: _armed_sessions(mailbox_path) == 2, 30, "the second watch never armed")
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=30)
    assert am("status", "--agent", "b:y").json["agents"][0]["watch_state"] == "armed"


@pytest.fixture(params=["pipe", "polling"])
def wake_mode(request, monkeypatch):
    if request.param == "polling":
        monkeypatch.setenv("AGENT_MAIL_POLL", "1")
    return request.param


def _listener(mailbox_path, agent):
    from agent_mail.store import open_store

    store = open_store(str(mailbox_path))
    store.listen(agent)
    return store


@pytest.mark.local_only("the store's wake-ups, listened for and written by the library in this process")
def test_only_mail_for_the_listener_wakes_it_and_only_once_committed(am, send, mailbox_path, wake_mode):
    """What a watch waits for: a committed message for it. Liveness, heartbeats, reads, acks, status,
    mail for others and a send that rolled back wake nothing (each wait runs out its bound)."""
    first = send("a:x", "b:y", "already here")["id"]
    listener = _listener(mailbox_path, "b:y")
    try:
        with open_mailbox() as other:
            session = "s-" + first
            with other.store.transaction(write=True):
                other.store.open_session(session, "c:z", "2026-01-01T00:00:00+00:00")
            with other.store.transaction(write=True):
                other.store.touch_session(session, "2026-01-01T00:00:05+00:00")
            other.heartbeat(agent="c:z")
            other.read(agent="b:y")
            other.ack(agent="b:y", ids=[first])
            other.status()
            if wake_mode == "pipe":  # polling can only see that some message was added
                other.send(from_="a:x", to=["c:z"], subject="for someone else")
            with pytest.raises(RuntimeError):
                with other.store.transaction(write=True):
                    other.store.insert_message({"id": "rolled-back", "sender": "a:x", "recipient": "b:y",
                                                "subject": "never", "body": "", "refs": [], "reply_to": None,
                                                "type": "direct", "created": "2026-01-01T00:00:00+00:00"})
                    raise RuntimeError("the send failed before its commit")
        assert listener.wait_for_wake(0.5) is False
        send("a:x", "b:y", "for b:y")
        assert listener.wait_for_wake(10) is True
        assert listener.wait_for_wake(0.2) is False  # one wake-up per ring
    finally:
        listener.close()


def test_a_broadcast_wakes_every_listener_and_a_scheduled_send_wakes_its_recipient(send, mailbox_path, wake_mode):
    listeners = [_listener(mailbox_path, f"team:w{i}") for i in range(3)]
    try:
        send("boss:main", "*", "everyone")
        assert all(listener.wait_for_wake(10) for listener in listeners)
        send("boss:main", "team:w1", "later", "--delay-minutes", "30")
        assert listeners[1].wait_for_wake(10) is True  # to learn when it falls due
        if wake_mode == "pipe":
            assert listeners[0].wait_for_wake(0.2) is False
    finally:
        for listener in listeners:
            listener.close()


def test_a_direct_message_leaves_the_other_watches_blocked(mailbox_path, reap, am):
    am("status").assert_ok()
    watches = {agent: subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", agent], env=process_env(),
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
               for agent in ("team:a", "team:b")}
    for agent, proc in watches.items():
        reap(proc)
        armed(agent, procs=[proc])
    assert subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "x:y", "--to", "team:a", "--subject",
                           "only a"], env=process_env(), capture_output=True).returncode == 0
    out, _ = watches["team:a"].communicate(timeout=30)
    assert json.loads(out)["count"] == 1
    time.sleep(0.3)
    assert watches["team:b"].poll() is None  # still blocked after team:a returned
    assert am("status", "--agent", "team:b").json["agents"][0]["watch_state"] == "armed"


def test_fifty_watches_all_wake_for_one_broadcast(mailbox_path, reap, am):
    am("status").assert_ok()
    agents = [f"herd:w{i:02d}" for i in range(50)]
    watches = {}
    for agent in agents:
        watches[agent] = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", agent], env=process_env(),
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        reap(watches[agent])
    armed(agents, timeout=120, procs=list(watches.values()))
    assert am("send", "--from", "boss:main", "--to", "*", "--subject", "all hands").json["delivered"] == 1
    for agent, proc in watches.items():
        out, err = proc.communicate(timeout=60)  # well before their 55-minute timeout
        assert proc.returncode == 0, err
        assert [m["subject"] for m in json.loads(out)["messages"]] == ["all hands"], agent


@pytest.mark.local_only("the blocking loop's safety net, run in-process with its intervals shortened")
def test_mail_whose_wake_up_was_lost_is_found_at_the_next_refresh(am, send, mailbox_path, monkeypatch):
    """A sender killed between its commit and its wake-up, or another tool writing the mailbox: the
    watch's periodic look at the mailbox finds the mail anyway."""
    monkeypatch.setattr(waits, "SAFETY_CHECK_SECONDS", 0.2)
    monkeypatch.setattr(model, "HELD_REFRESH_SECONDS", 0.2)  # a watch that holds its presence looks this often
    am("status").assert_ok()
    import threading

    def write_behind_its_back():
        armed("b:y")  # the watch below is blocked: what it finds now, its periodic look finds
        db = raw_db(mailbox_path)
        with db:
            db.execute("INSERT INTO messages (id, sender, recipient, subject, created) "
                       "VALUES ('99999999-9999-4999-8999-999999999999', 'old:tool', 'b:y', 'no bell', ?)",
                       (model.now_iso(),))
        db.close()

    thread = threading.Thread(target=write_behind_its_back)
    thread.start()
    with open_mailbox() as mailbox:
        result = mailbox.watch(agent="b:y", timeout_seconds=60)
    thread.join()
    assert [m["subject"] for m in result["messages"]] == ["no bell"]
