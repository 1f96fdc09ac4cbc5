"""A team on one mailbox (issue 9): the paged, index-walking queries give exactly what a brute-force
reading of the tables gives, with broadcast backlogs, delays, and across the migration that added them."""

from __future__ import annotations

import datetime as dt
import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_mail import jsonout, model
from agent_mail.parts import liveness
from agent_mail.store import sqlite as sqlite_store
from agent_mail.store import sqlite_schema
from tests.lib.cli import run_inprocess
from tests.lib.fuzz import examples

AGENTS = ["t:a", "t:b", "t:c", "u:d"]


def ok(*argv):
    result = run_inprocess(*argv)
    assert result.code == 0, result.err
    return json.loads(result.out)


def oracle(path) -> dict[str, dict]:
    """What each identity should see, computed the slow way from every row."""
    db = sqlite3.connect(path)
    db.row_factory = sqlite3.Row
    now = model.now_iso()
    messages = [dict(r) for r in db.execute("SELECT rowid AS seq, * FROM messages")]
    state = {(r["message_id"], r["agent"]): dict(r) for r in db.execute("SELECT * FROM broadcast_acks")}
    db.close()

    def arrival(m):
        return (model.parse_iso(m["deliver_at"] or m["created"]), m["seq"])

    seen = {}
    for agent in AGENTS:
        mine = []
        for m in messages:
            if m["cancelled_at"] or (m["deliver_at"] and m["deliver_at"] > now):
                continue
            if m["recipient"] == agent:
                own = m
            elif m["recipient"] == "*" and m["sender"] != agent:
                own = state.get((m["id"], agent), {})
            else:
                continue
            mine.append({**m, "read": own.get("read_at"), "acked": own.get("acked_at"),
                         "archived": own.get("archived_at"), "deleted": own.get("deleted_at")})
        mine.sort(key=arrival)
        unread = [m["id"] for m in mine if not m["read"]]
        unacked = [m["id"] for m in mine if not (m["acked"] or m["archived"] or m["deleted"])]
        shown = [m["id"] for m in mine if not (m["archived"] or m["deleted"])]
        seen[agent] = {"unread": unread, "unacked": unacked, "shown": shown}
    return seen


def check(path, page: int = 3) -> None:
    rows = {r["agent"]: r for r in ok("status")["agents"]}  # first: it creates the mailbox if no op did
    expected = oracle(path)
    for agent, want in expected.items():
        one = ok("status", "--agent", agent)["agents"][0]
        assert (one["unread"], one["unacked"]) == (len(want["unread"]), len(want["unacked"])), agent
        if agent in rows:
            assert (rows[agent]["unread"], rows[agent]["unacked"]) == (one["unread"], one["unacked"]), agent
        assert [m["id"] for m in ok("watch", agent, "--once")["messages"]] == want["unread"], agent
        first = ok("read", agent, "--no-mark-read", "--limit", str(page))
        assert [m["id"] for m in first["messages"]] == want["unread"][:page], agent
        assert first["remaining"] == len(want["unread"]), agent
        newest = ok("read", agent, "--all", "--no-mark-read", "--limit", str(page))
        assert [m["id"] for m in newest["messages"]] == want["shown"][-page:], agent


_OPS = st.lists(st.tuples(
    st.sampled_from(["direct", "broadcast", "delayed", "read", "ack-all", "ack-one", "archive", "delete", "dismiss",
                     "cancel", "fall-due"]),
    st.sampled_from(AGENTS), st.sampled_from(AGENTS), st.integers(min_value=1, max_value=4)), min_size=1, max_size=25)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_pages_and_counts_match_a_brute_force_reading(mailbox_path, ops):
    if mailbox_path.exists():
        for suffix in ("", "-wal", "-shm"):
            if (mailbox_path.parent / (mailbox_path.name + suffix)).exists():
                (mailbox_path.parent / (mailbox_path.name + suffix)).unlink()
    scheduled: list[str] = []
    for op, actor, other, n in ops:
        if op == "direct":
            ok("send", "--from", actor, "--to", other, "--subject", op)
        elif op == "broadcast":
            ok("send", "--from", actor, "--to", "*", "--subject", op)
        elif op == "delayed":
            scheduled.append(ok("send", "--from", actor, "--to", "*" if n % 2 else other, "--subject", op,
                                "--delay-minutes", str(n))["deliveries"][0]["id"])
        elif op == "read":
            ok("read", actor, "--limit", str(n))
        elif op == "ack-all":
            ok("ack", actor, "--all")
        elif op in ("ack-one", "archive", "delete", "dismiss"):
            unread = ok("read", actor, "--all", "--no-mark-read", "--limit", "10")["messages"]
            if unread:
                command = "ack" if op == "ack-one" else op
                ok(command, actor, unread[n % len(unread)]["id"])
        elif op == "cancel" and scheduled:
            run_inprocess("cancel", actor, scheduled[n % len(scheduled)])  # refused unless actor sent it
        elif op == "fall-due" and scheduled:
            # a scheduled message falls due between messages already there: it sorts by when it arrived
            due = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=n)).isoformat(timespec="microseconds")
            db = sqlite3.connect(mailbox_path)
            with db:
                db.execute("UPDATE messages SET deliver_at = ? WHERE id = ?", (due, scheduled.pop(0)))
            db.close()
    check(mailbox_path)


@pytest.mark.fast
def test_a_broadcast_backlog_counts_exactly_and_reads_page_by_page(am, mailbox_path):
    for i in range(120):
        am("send", "--from", f"boss:b{i % 3}", "--to", "*", "--subject", f"b{i}").assert_ok()
    for i in range(30):
        am("send", "--from", "boss:b0", "--to", "t:a", "--subject", f"d{i}").assert_ok()
    am("read", "t:b", "--limit", "7").assert_ok()  # t:b has read some
    check(mailbox_path, page=50)
    page = am("read", "t:a").json
    assert page["count"] == 50 and page["remaining"] == 150 - 50
    assert am("ack", "t:a", "--all").json["count"] == 50
    check(mailbox_path, page=50)


@pytest.mark.fast
def test_a_page_of_a_backlog_is_fetched_by_id_in_a_mailbox_without_statistics(am, mailbox_path):
    """Issue 20, finding 19: a mailbox that grew in use (rows written by another tool, no ANALYZE) has no
    statistics. The rows of read's page are then still looked up by id, not found by walking every
    broadcast of the backlog (bodies included) and filtering it by id."""
    from agent_mail.store import open_store

    am("send", "--from", "boss:b", "--to", "t:a", "--subject", "direct").assert_ok()
    db = sqlite3.connect(mailbox_path)
    created = model.now_iso()
    with db:
        db.executemany("INSERT INTO messages (id, sender, recipient, subject, body, type, created) "
                       "VALUES (?, 'boss:b', '*', ?, ?, 'broadcast', ?)",
                       [(model.new_message_id(), f"b{i}", "x" * 300, created) for i in range(400)])
    assert not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchall()
    db.close()
    store = open_store(str(mailbox_path))
    statements: list[str] = []
    try:
        with store.transaction():
            now = model.now_iso()
            page = store.unread("t:a", now, limit=5)
            store.db.set_trace_callback(statements.append)
            found = store.addressed("t:a", [m["id"] for m in page], now)
            store.db.set_trace_callback(None)
            assert sorted(found) == sorted(m["id"] for m in page) and len(found) == 5
            plans = [[row[3] for row in store.db.execute("EXPLAIN QUERY PLAN " + sql)] for sql in statements]
    finally:
        store.close()
    assert plans
    for plan in plans:
        reads = [step for step in plan if step.startswith(("SEARCH m ", "SCAN m"))]
        assert reads and all("(id=?)" in step for step in reads), plan
    assert ok("read", "t:a", "--no-mark-read", "--limit", "5")["remaining"] == 401


@pytest.mark.fast
def test_counts_stay_exact_across_the_migration_that_added_the_indexes(mailbox_path, monkeypatch):
    """A mailbox made before m006 (the arrival indexes), holding a backlog and every kind of state."""
    with monkeypatch.context() as before:
        # (With the activity and webhooks tables, which today's commands write and read as they run: they add
        # tables and a column only.)
        before.setattr(sqlite_schema, "MIGRATIONS", sqlite_schema.MIGRATIONS[:5] + (sqlite_schema.m016_activity,
                                                                                     sqlite_schema.m017_webhooks))
        # The version that wrote this knew no harness sessions (a later migration's table): its sends asked none.
        before.setattr(liveness, "harnesses_of", lambda store, agent=None: {})
        for i in range(40):
            ok("send", "--from", "boss:main", "--to", "*", "--subject", f"b{i}")
        for agent in AGENTS:
            ok("send", "--from", "boss:main", "--to", agent, "--subject", "direct")
        later = ok("send", "--from", "boss:main", "--to", "*", "--subject", "later", "--delay-minutes", "5")["id"]
        # the state an earlier version left: reads, acks, an archive and a deletion, per agent
        db = sqlite3.connect(mailbox_path)
        broadcasts = [r[0] for r in db.execute("SELECT id FROM messages WHERE recipient = '*' AND deliver_at IS NULL "
                                               "ORDER BY rowid")]
        at = model.now_iso()
        with db:
            for i, message in enumerate(broadcasts[:15]):
                db.execute("INSERT INTO broadcast_acks (message_id, agent, read_at, acked_at) VALUES (?, 't:a', ?, ?)",
                           (message, at, at if i % 2 else None))
            for message in broadcasts[:3]:
                db.execute("INSERT INTO broadcast_acks (message_id, agent, read_at) VALUES (?, 't:b', ?)",
                           (message, at))
            db.execute("INSERT INTO broadcast_acks (message_id, agent, read_at, archived_at) VALUES (?, 't:c', ?, ?)",
                       (broadcasts[0], at, at))
            db.execute("INSERT INTO broadcast_acks (message_id, agent, read_at, deleted_at) VALUES (?, 't:c', ?, ?)",
                       (broadcasts[1], at, at))
            db.execute("UPDATE messages SET read_at = ?, acked_at = ? WHERE recipient = 't:a'", (at, at))
            db.execute("UPDATE messages SET read_at = ? WHERE recipient = 'u:d'", (at,))
        db.close()
        db = sqlite3.connect(mailbox_path)
        assert db.execute("PRAGMA user_version").fetchone()[0] == 7  # m001-m005, the activity and webhooks tables
        assert not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'idx_messages_broadcast_arrival'").fetchone()
        db.close()
        expected = oracle(mailbox_path)
    assert later  # scheduled, still invisible
    check(mailbox_path)  # opened by the current code: m006 is applied first
    db = sqlite3.connect(mailbox_path)
    assert db.execute("SELECT 1 FROM schema_migrations WHERE name = 'm006_arrival_indexes'").fetchone()
    db.close()
    assert oracle(mailbox_path) == expected  # the migration changed no row


@pytest.mark.fast
@pytest.mark.parametrize("agent", ["t:a", "new:one"])
def test_status_of_one_identity_is_what_read_would_deliver(am, agent):
    am("send", "--from", "boss:main", "--to", "*", "--subject", "all").assert_ok()
    am("send", "--from", "boss:main", "--to", "t:a", "--subject", "one").assert_ok()
    row = am("status", "--agent", agent).json["agents"][0]
    assert row["unread"] == am("read", agent, "--no-mark-read").json["count"]


_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)


@pytest.mark.fast
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.booleans(), _TEXT, _TEXT, _TEXT, st.integers(0, 2)), min_size=1, max_size=12))
def test_envelopes_laid_out_by_sqlite_are_what_the_json_module_writes(mailbox_path, rows):
    """A watch's envelopes are laid out by SQLite (json_quote): byte for byte json.dumps of the same rows,
    whatever the stored text holds (quotes, backslashes, control characters, any Unicode), merged in
    arrival order with insertion order breaking ties (arrival times are given a few distinct values)."""
    if not mailbox_path.exists():
        ok("status")
    store = sqlite_store.SQLiteStore(str(mailbox_path))
    try:
        with store.transaction(write=True):
            store.db.execute("DELETE FROM messages")
            for i, (broadcast, sender, subject, kind, tick) in enumerate(rows):
                created = f"2026-03-01T10:00:0{tick}.000000+00:00"
                store.db.execute(
                    "INSERT INTO messages (id, sender, recipient, subject, body, type, created) "
                    "VALUES (?, ?, ?, ?, '', ?, ?)",
                    (f"id-{i}\"\\\x01", f"s{sender}", "*" if broadcast else "t:a", subject, kind, created))
        now = model.now_iso()
        with store.transaction():
            rendered = store.unread("t:a", now, lean=True, layout_level=2)
            plain = store.unread("t:a", now, lean=True)
    finally:
        store.close()
    assert type(rendered) is jsonout.Rendered and len(rendered) == len(plain) == len(rows)
    document = {"agent": "t:a", "messages": rendered, "count": len(rendered)}
    expected = json.dumps({"agent": "t:a", "messages": plain, "count": len(plain)}, indent=2, ensure_ascii=False)
    # (jsonout escapes what json.dumps keeps and a terminal takes as a command: DEL, C1, U+2028, U+2029)
    assert jsonout.dumps(document) == expected.translate(jsonout.RAW_ESCAPED)
    assert rendered == plain  # and to Python code it is the same list
    # At any other depth it is laid out from the decoded list, still the same text.
    assert jsonout.dumps([document]) == json.dumps([document], indent=2, ensure_ascii=False,
                                                   default=list).translate(jsonout.RAW_ESCAPED)
