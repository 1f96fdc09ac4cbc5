"""The store contract (store/base.py, store/sql.py), proved on every backend.

Writers are serialised; insertion order is commit order; readers racing for the same unread mail never
both take a message; a transaction is all or nothing; only the project's own StorageError leaves a store.
Then every public method of the interface, called directly (the shape of huey's StorageTests: one class of
tests, subclassed per backend); a test fails when the interface has a method none of them calls.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import inspect
import threading

import pytest

from agent_mail import errors, model
from agent_mail.operations.mail import open_mailbox, resolve_location
from agent_mail.store import base, open_store
from tests.lib.waiting import armed

#: The public store methods the tests below call directly (each test names its own with @exercises).
EXERCISED: set[str] = set()


def exercises(*names: str):
    def mark(test):
        EXERCISED.update(names)
        return test
    return mark


def _message(i: int, recipient: str = "b:y", **fields) -> dict:
    return {"id": model.new_message_id(), "sender": "a:x", "recipient": recipient, "subject": f"m{i}", "body": "",
            "refs": [], "reply_to": None, "type": "direct", "created": model.now_iso(), **fields}


def _ago(minutes: float) -> str:
    return model.iso(model.now() - dt.timedelta(minutes=minutes))


@pytest.fixture
def store():
    opened = open_store(resolve_location()[0])
    try:
        yield opened
    finally:
        opened.close()


class StoreContract:
    """Every test here runs once per backend (see the subclasses at the end)."""

    @pytest.mark.fast
    def test_insertion_order_is_commit_order_under_concurrent_writers(self):
        """Sixteen threads, each with its own connection, commit messages; the insertion sequence never
        shows a message that committed later before one that committed earlier (the hooks' watermark
        relies on it)."""
        committed: list[tuple[int, str]] = []
        lock = threading.Lock()

        def writer(n: int) -> None:
            store = open_store(resolve_location()[0])
            try:
                for i in range(10):
                    message = _message(n * 100 + i)
                    with store.transaction(write=True):
                        store.insert_message(message)
                        seq = store.newest_seq()
                        with lock:  # inside the write lock: the order writers commit in
                            committed.append((seq, message["id"]))
            finally:
                store.close()

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        seqs = [seq for seq, _ in committed]
        assert len(seqs) == 160 and seqs == sorted(seqs) and len(set(seqs)) == 160

    @pytest.mark.fast
    def test_racing_readers_never_take_the_same_message(self):
        with open_mailbox() as mailbox:
            for i in range(120):
                mailbox.send(from_="a:x", to=["b:y"], subject=f"job {i}")
        taken: list[str] = []
        failures: list[BaseException] = []
        lock = threading.Lock()

        def reader() -> None:
            try:
                with open_mailbox() as mailbox:
                    while True:
                        got = mailbox.read(agent="b:y", limit=3)["messages"]
                        if not got:
                            return
                        with lock:
                            taken.extend(m["id"] for m in got)
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not failures
        assert len(taken) == 120 and len(set(taken)) == 120  # every job once: none lost, none twice

    @pytest.mark.fast
    def test_a_transaction_is_all_or_nothing(self):
        store = open_store(resolve_location()[0])
        try:
            with pytest.raises(RuntimeError):
                with store.transaction(write=True):
                    store.insert_message(_message(1))
                    store.insert_message(_message(2))
                    raise RuntimeError("fail before commit")
            with store.transaction():
                assert store.count_unread("b:y", model.now_iso()) == 0
        finally:
            store.close()

    @pytest.mark.fast
    def test_driver_errors_leave_only_as_storage_errors(self):
        store = open_store(resolve_location()[0])
        try:
            message = _message(1)
            with store.transaction(write=True):
                store.insert_message(message)
            with pytest.raises(errors.StorageError) as caught:
                with store.transaction(write=True):
                    store.insert_message(message)  # the same id again: the engine's constraint
            assert type(caught.value) is errors.StorageError and "password" not in caught.value.message.lower()
            with store.transaction():  # the store is usable afterwards, and the first insert stands
                assert store.count_unread("b:y", model.now_iso()) == 1
        finally:
            store.close()

    @pytest.mark.fast
    def test_a_read_transaction_sees_one_snapshot(self):
        reader = open_store(resolve_location()[0])
        writer = open_store(resolve_location()[0])
        try:
            with writer.transaction(write=True):
                writer.insert_message(_message(1))
            with reader.transaction():
                before = reader.count_unread("b:y", model.now_iso())
                with writer.transaction(write=True):
                    writer.insert_message(_message(2))
                assert reader.count_unread("b:y", model.now_iso()) == before == 1
            with reader.transaction():
                assert reader.count_unread("b:y", model.now_iso()) == 2
        finally:
            reader.close()
            writer.close()

    @pytest.mark.fast
    def test_ordering_is_by_arrival_then_insertion(self):
        store = open_store(resolve_location()[0])
        try:
            stamp = model.now_iso()
            ids = []
            for i in range(5):
                message = {**_message(i), "created": stamp}  # the same instant: insertion order decides
                ids.append(message["id"])
                with store.transaction(write=True):
                    store.insert_message(message)
            with store.transaction():
                assert [m["id"] for m in store.unread("b:y", model.now_iso())] == ids
                assert [m["id"] for m in store.unread("b:y", model.now_iso(), limit=2, newest=True)] == ids[-2:]
        finally:
            store.close()

    # -- every public method, called directly -----------------------------------------------------
    @pytest.mark.fast
    @exercises("close", "transaction", "relax_durability", "insert_message", "get_message", "addressed", "unread",
               "latest", "count_unread", "count_unacked", "set_flags", "read_unacked", "archived", "visible_to",
               "thread")
    def test_messages_and_their_state(self, store):
        now = model.now_iso()
        first, broadcast = _message(1), _message(2, "*", type="broadcast")
        reply = _message(3, "a:x", sender="b:y", reply_to=first["id"], refs=["/tmp/x"])
        store.relax_durability()
        with store.transaction(write=True):
            for message in (first, broadcast, reply):
                store.insert_message(message)
        with store.transaction():
            assert store.get_message(first["id"])["subject"] == "m1" and store.get_message("nope") is None
            assert store.get_message(reply["id"])["refs"] == ["/tmp/x"]
            assert [m["id"] for m in store.unread("b:y", now)] == [first["id"], broadcast["id"]]
            assert [m["id"] for m in store.unread("b:y", now, lean=True, sender="a:x", limit=1)] == [first["id"]]
            assert [m["id"] for m in store.latest("b:y", now, limit=1)] == [broadcast["id"]]
            assert (store.count_unread("b:y", now), store.count_unacked("b:y", now)) == (2, 2)
            found = store.addressed("b:y", [first["id"], broadcast["id"], reply["id"]], now)
            assert set(found) == {first["id"], broadcast["id"]}
            assert store.visible_to("c:z", [first["id"], broadcast["id"]], now) == {broadcast["id"]}
            assert [m["id"] for m in store.thread(reply["id"], "a:x", now)] == [first["id"], reply["id"]]
        with store.transaction(write=True):
            store.set_flags("b:y", list(found.values()), now, ("read",))
        with store.transaction():
            assert store.count_unread("b:y", now) == 0
            assert {m["id"] for m in store.read_unacked("b:y", now)} == {first["id"], broadcast["id"]}
        with store.transaction(write=True):
            store.set_flags("b:y", list(found.values()), now, ("archive",))
        with store.transaction():
            assert {m["id"] for m in store.archived("b:y", now)} == {first["id"], broadcast["id"]}
            assert store.count_unacked("b:y", now) == 0 and store.read_unacked("b:y", now) == []

    @pytest.mark.fast
    @exercises("due_unpublished", "mark_published", "next_due", "cancel")
    def test_scheduled_delivery(self, store):
        due, later = _message(1, deliver_at=_ago(1)), _message(2, deliver_at=_ago(-60))
        with store.transaction(write=True):
            store.insert_message(due)
            store.insert_message(later)
        now = model.now_iso()
        with store.transaction(write=True):
            assert [d["message_id"] for d in store.due_unpublished(now)] == [due["id"]]
            store.mark_published([due["id"]], now)
            assert store.due_unpublished(now) == []
            assert store.next_due("b:y", now) == later["deliver_at"]
            store.cancel(later["id"], now)
        with store.transaction():
            assert store.next_due("b:y", now) is None and store.get_message(later["id"])["cancelled_at"] == now

    @pytest.mark.fast
    @exercises("unread_of_many", "next_due_of_many")
    def test_looks_of_many_identities_are_each_ones_look(self, store):
        """One statement for many identities finds exactly what a look of each finds: its unread direct mail and the
        broadcasts from others it has not read, due and not withdrawn, in arrival order; and each one's next due."""
        direct, broadcast = _message(1, "b:y", created=_ago(3)), _message(2, "*", type="broadcast", created=_ago(2))
        own = _message(3, "*", sender="c:z", type="broadcast", created=_ago(1))  # not for its sender
        read, cancelled = _message(4, "c:z"), _message(5, "b:y")
        scheduled, later = _message(6, "c:z", deliver_at=_ago(-30)), _message(7, "*", deliver_at=_ago(-60))
        late = _message(8, "b:y", created=_ago(10), deliver_at=_ago(0.5))  # arrived when it fell due: after the rest
        with store.transaction(write=True):
            for message in (direct, broadcast, own, read, cancelled, scheduled, later, late):
                store.insert_message(message)
            store.set_flags("c:z", [read, broadcast], model.now_iso(), ("read",))
            store.cancel(cancelled["id"], model.now_iso())
        agents = ["b:y", "c:z", "d:w", "b:y", "a:x"]  # repeated: each key once
        now = model.now_iso()
        with store.transaction():
            found = store.unread_of_many(agents, now)
            assert found == {agent: store.unread(agent, now, lean=True) for agent in agents}
            assert [m["id"] for m in found["b:y"]] == [direct["id"], broadcast["id"], own["id"], late["id"]]
            assert [m["id"] for m in found["c:z"]] == [] and [m["id"] for m in found["d:w"]] == [broadcast["id"],
                                                                                                own["id"]]
            assert set(found["b:y"][0]) == {"id", "sender", "subject", "type", "created"}
            due = store.next_due_of_many(agents, now)
            assert due == {agent: store.next_due(agent, now) for agent in agents}
            assert due["c:z"] == scheduled["deliver_at"] and due["b:y"] == later["deliver_at"]
            assert store.unread_of_many([], now) == {} and store.next_due_of_many([], now) == {}
            many = [f"n:{i}" for i in range(1200)]  # more than one statement's worth where each is a parameter
            assert all(len(envelopes) == 2 for envelopes in store.unread_of_many(many, now).values())

    @pytest.mark.fast
    @exercises("own_file")
    def test_own_files_are_the_sqlite_database_and_its_neighbours_only(self, store, mailbox_path, tmp_path):
        mailbox_path = str(mailbox_path)
        if "://" in mailbox_path:  # a server's database has no file on this machine
            assert not store.own_file(str(tmp_path / "mail.db"))
            return
        mine = os.path.realpath(mailbox_path)
        assert all(store.own_file(mine + end) for end in ("", "-wal", "-shm", "-journal"))
        folder = os.path.dirname(mine)
        assert not store.own_file(os.path.join(folder, "notes.txt"))
        assert not store.own_file(os.path.join(str(tmp_path / "elsewhere"), os.path.basename(mine)))

    @pytest.mark.fast
    @exercises("add_attachment", "attachments_of", "attachment_content", "attachment_blob", "blob_size")
    def test_attachments(self, store):
        message, content = _message(1), b"\x00hello"
        sha = hashlib.sha256(content).hexdigest()
        with store.transaction(write=True):
            store.insert_message(message, ["a.bin"])
            store.add_attachment(message["id"], 0, "a.bin", content, sha, model.now_iso())
        with store.transaction():
            assert store.attachments_of([message["id"]]) == {message["id"]: [{"name": "a.bin", "size": 6,
                                                                              "sha256": sha}]}
            assert store.attachment_content(sha) == content and store.attachment_content("0" * 64) is None
            assert store.attachment_blob(sha)["content"] == content and store.attachment_blob("0" * 64) is None
            assert (store.blob_size(sha), store.blob_size("0" * 64)) == (6, None)

    @pytest.mark.fast
    @exercises("profile", "save_profile", "mirrored_agents", "humans", "add_event", "events", "dismiss_events",
               "open_bounces", "stored_profiles", "stored_events", "events_since")
    def test_profiles_and_the_system_channel(self, store):
        now = model.now_iso()
        with store.transaction(write=True):
            store.save_profile({"agent": "h:u", "human": True, "mirror_dir": "/tmp/m", "max_entries": 5,
                                "updated_at": now})
            store.add_event("e1", "a:x", "email.bounce", {"reason": "r"}, now)
        with store.transaction():
            assert store.profile("h:u")["human"] is True and store.profile("n:o") is None
            assert store.mirrored_agents() == ["h:u"] and store.humans() == {"h:u"}
            assert store.stored_profiles()[0]["agent"] == "h:u" and store.stored_profiles("n:o") == []
            assert [(e["id"], e["reason"]) for e in store.events("a:x")] == [("e1", "r")]
            assert store.open_bounces() == {"a:x": 1}
            events, newest = store.events_since("a:x", 0)
            assert [e["id"] for e in events] == ["e1"] and newest >= 1
        with store.transaction(write=True):
            assert store.dismiss_events("a:x", ["e1", "e2"], now) == ["e1"]
        with store.transaction():
            assert store.events("a:x") == [] and store.open_bounces() == {}
            assert [(e["id"], e["payload"], e["dismissed_at"]) for e in store.stored_events("a:x")] == \
                [("e1", {"reason": "r"}, now)]
            assert store.stored_events(since=_ago(-1)) == []

    @pytest.mark.fast
    @exercises("agent_counts", "cleanup", "leftovers", "remove_leftovers")
    def test_counts_and_cleanup(self, store):
        with store.transaction(write=True):
            store.insert_message(_message(1, created=_ago(60 * 24 * 10)))
            store.insert_message(_message(2, "*", type="broadcast"))
        with store.transaction():
            counts = store.agent_counts(model.now_iso())
        assert counts["b:y"] == {"unread": 2, "unacked": 2} and counts["a:x"] == {"unread": 0, "unacked": 0}
        cutoff = _ago(60 * 24)
        with store.transaction():
            assert store.cleanup(cutoff, dry_run=True)["deleted_count"] == 1
        with store.transaction(write=True):
            assert store.cleanup(cutoff, dry_run=False)["deleted_count"] == 1
        with store.transaction():
            assert store.count_unread("b:y", model.now_iso()) == 1
        assert store.leftovers() == []
        store.remove_leftovers([])

    @pytest.mark.fast
    @exercises("open_session", "touch_session", "touch_sessions", "refresh_session", "release_session",
               "release_sessions", "release_session_alone", "record_heartbeat", "liveness")
    def test_liveness(self, store):
        now = model.now_iso()
        with store.transaction(write=True):
            store.open_session("s1", "a:x", now)
            store.open_session("s2", "a:x", now)
            store.touch_session("s1", now)
            store.release_session("s1", now, "done")
            store.record_heartbeat("b:y", now)
            # A server's sessions (INSTANCE.UUID) are refreshed together, its released ones and others' not.
            for session in ("srv_1.a", "srv_1.b", "srv_10.c", "srvX1.d"):
                store.open_session(session, "c:z", _ago(1))
            store.release_session("srv_1.b", now, "done")
            assert store.touch_sessions("srv_1.", now) == 1
            store.release_sessions(["srv_1.a", "srv_10.c", "srvX1.d", "srv_1.b"], now, "done")
            assert store.touch_sessions("srv", now) == 0  # released, every one
        store.refresh_session("s2", model.now_iso())
        with store.transaction():
            facts = store.liveness()
        assert facts["a:x"]["sessions"] == 2 and facts["a:x"]["armed_seen"] is not None
        assert facts["a:x"]["released_at"] is not None and facts["b:y"]["heartbeat"] is not None
        store.release_session_alone("s2", model.now_iso(), "done")
        with store.transaction():
            assert store.liveness("a:x")["a:x"]["armed_seen"] is None and "b:y" not in store.liveness("a:x")

    @pytest.mark.fast
    @exercises("note_active", "activity")
    def test_activity(self, store):
        """Activity is written with the commit, one row per identity and machine, only ever moved forward; a read
        transaction or a rolled-back one writes none; armed watch sessions name their machines however old, and
        what an identity did counts among its hosts only since `since`."""
        old, now, later = _ago(60 * 48), model.now_iso(), _ago(-1)
        with store.transaction(write=True):
            store.note_active("a:x", "laptop", now)
            store.note_active("a:x", "laptop", old)  # earlier: no change
            store.note_active("a:x", "desk", old)
            store.note_active("b:y", None, now)  # a machine nobody named
            store.open_session("s1", "c:z", old, "rack-7")  # armed, and two days old
            store.open_session("s2", "c:z", now, None)
        with store.transaction():
            store.note_active("d:w", "laptop", now)  # a look: nothing written
        with pytest.raises(RuntimeError), store.transaction(write=True):
            store.note_active("e:v", "laptop", now)
            raise RuntimeError("rolled back")
        with store.transaction(write=True):
            store.note_active("a:x", "laptop", later)
            store.note_active("a:x", "laptop", now)  # the same transaction, earlier: the later one stands
        with store.transaction():
            everyone = store.activity(since=_ago(60 * 24))
            one = store.activity("a:x", since=_ago(60 * 24 * 3))
        assert everyone == {"a:x": {"last_active": later, "hosts": {"laptop": later}},
                            "b:y": {"last_active": now, "hosts": {}},
                            "c:z": {"last_active": None, "hosts": {"rack-7": old}}}
        assert one == {"a:x": {"last_active": later, "hosts": {"laptop": later, "desk": old}}}
        with store.transaction(write=True):
            store.release_session("s1", now, "done")
        with store.transaction():
            assert "c:z" not in store.activity(since=_ago(60 * 24))  # released: only activity counts now

    @pytest.mark.fast
    @exercises("abandon_sessions", "release_keyed_session", "session_state")
    def test_a_servers_sessions_stopped_by_key_or_abandoned(self, store):
        """A server's session (HOLDER.KEY) is released by its identity and key wherever its holder is, abandoned
        ones too; abandoning names the holder gone (released ones are left as they are), and an abandoned session
        reads as a killed watch's: stale at once, still watching, never released."""
        from agent_mail.parts.liveness import describe_liveness

        now, later = model.now_iso(), _ago(-1)
        with store.transaction(write=True):
            for session in ("srv1.k1.n", "srv1.k2.n", "srv1.k3.n", "srv22.k4.n", "srv1.a-uuid"):
                store.open_session(session, "c:z", now)
            store.release_session("srv1.k3.n", now, "done")
            store.abandon_sessions(["srv1.k2.n", "srv1.k3.n", "srv22.k4.n", "srv1.a-uuid"])
            store.abandon_sessions(["gone.k2.n"])  # again: as it is
            assert [store.session_state(s) for s in ("srv1.k2.n", "gone.k2.n", "gone.k4.n", "gone.a-uuid",
                                                     "srv1.k3.n", "gone.k3.n")] == \
                [None, "armed", "armed", "armed", "released", None]
            assert store.release_keyed_session("c:z", "k9", now, "signal 15") is None  # no such key
            assert store.release_keyed_session("a:x", "k1", now, "signal 15") is None  # another identity's
            assert store.release_keyed_session("c:z", "k2", later, "signal 15") == \
                {"sessions": ["gone.k2.n"], "released": True, "released_at": later}  # abandoned, then stopped
            assert store.release_keyed_session("c:z", "k2", now, "signal 15") == \
                {"sessions": [], "released": False, "released_at": later}  # said again: no change
            assert store.release_keyed_session("c:z", "k1", now, "signal 2")["sessions"] == ["srv1.k1.n"]
            assert store.session_state("srv1.k1.n") == "released"
            store.open_session("srv3.k5.n", "d:w", now)
            store.abandon_sessions(["srv3.k5.n"])
        with store.transaction():
            state = describe_liveness(store.liveness("d:w")["d:w"], model.now())
        assert (state["watch_state"], state["watching"], state["released_at"]) == ("stale", True, None)

    @pytest.mark.fast
    @exercises("harness_session", "save_harness_session", "harness_sessions_of", "untold", "newest_seq")
    def test_harness_sessions(self, store):
        now = model.now_iso()
        session = {"id": "h1", "harness": "claude", "agent": "b:y", "pid": 1, "host": "here", "started_at": now,
                   "last_seen": now, "told_seq": 0, "told_at": None, "told_event": 0, "waiter": None,
                   "ended_at": None}
        with store.transaction(write=True):
            assert store.newest_seq() == 0
            store.save_harness_session(session)
            store.insert_message(_message(1))
        with store.transaction():
            assert store.harness_session("h1") == session and store.harness_session("h2") is None
            assert [s["id"] for s in store.harness_sessions_of("b:y")] == ["h1"]
            assert store.harness_sessions_of("c:z") == []
            seq = store.newest_seq()
            envelopes, total = store.untold("b:y", model.now_iso(), 0, None, 10)
            assert total == 1 and envelopes[0]["seq"] == seq
            assert store.untold("b:y", model.now_iso(), seq, model.now_iso(), 10) == ([], 0)

    @pytest.mark.fast
    @exercises("mail_marker", "check_still_there", "listen", "listen_everything", "wait_for_wake", "reusable")
    def test_waiting(self, store):
        assert store.reusable()  # a pool may lend it again: idle, not listening
        with store.transaction(write=True):
            assert not store.reusable()  # a transaction open
        marker = store.mail_marker()
        store.check_still_there()
        store.listen("b:y")
        assert store.wait_for_wake(0.01) is False
        with store.transaction(write=True):
            store.insert_message(_message(1))
        assert store.wait_for_wake(5) is True and store.mail_marker() != marker
        store.listen_everything()
        assert store.wait_for_wake(0.01) is False

    @pytest.mark.fast
    @exercises("listen", "wait_for_wake")
    def test_a_wait_also_wakes_for_a_descriptor_it_watches(self, store):
        """Issue 33 #6: a harness's waiter sleeps on its harness's pidfd with the mailbox's wake-ups (`also`), so it
        wakes when the harness ends, well before its timeout; until then mail still wakes it."""
        import os
        import subprocess
        import sys
        import time

        store.listen("b:y")
        harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        handle = os.pidfd_open(harness.pid)
        try:
            assert store.wait_for_wake(0.01, (handle,)) is False  # alive, and no mail
            with store.transaction(write=True):
                store.insert_message(_message(1))
            assert store.wait_for_wake(5, (handle,)) is True  # mail wakes it as before
            harness.kill()
            started = time.monotonic()
            assert store.wait_for_wake(60, (handle,)) is True
            assert time.monotonic() - started < 30  # woken by the harness's end, not by the timeout
        finally:
            if harness.poll() is None:
                harness.kill()
            harness.wait()
            os.close(handle)

    @pytest.mark.fast
    @exercises("searchable", "index_missing", "index_behind", "search_rows", "whole_thread", "recent_rows",
               "batch_rows", "broadcast_tallies")
    def test_search_and_supervision(self, store):
        from agent_mail.parts import query_language

        first = _message(1, subject="deploy the release", batch_id="b1")
        copy = {**_message(1, "c:z", subject="deploy the release", batch_id="b1"), "id": model.new_message_id()}
        reply = _message(2, "a:x", sender="b:y", reply_to=first["id"])
        broadcast = _message(3, "*", type="broadcast")
        with store.transaction(write=True):
            for message in (first, copy, reply, broadcast):
                store.insert_message(message)
            store.set_flags("b:y", [broadcast], model.now_iso(), ("read",))
        assert store.searchable()
        with store.transaction(write=True):
            assert not store.index_behind() and store.index_missing() == 0
        with store.transaction():
            hits = store.search_rows(query_language.parse("deploy"), subject_only=False, now=model.now_iso(), limit=10)
            assert {h["id"] for h in hits} == {first["id"], copy["id"]}
            assert store.search_rows(query_language.parse("deploy"), subject_only=True, now=model.now_iso(), limit=10,
                                     agent="c:z") == [h for h in hits if h["id"] == copy["id"]]
            assert {r["id"] for r in store.whole_thread(reply["id"])} == {first["id"], copy["id"], reply["id"]}
            assert [r["id"] for r in store.recent_rows(2)] == [broadcast["id"], reply["id"]]
            assert [r["id"] for r in store.batch_rows(["b1"])] == [first["id"], copy["id"]]
            assert store.broadcast_tallies([broadcast["id"]]) == {broadcast["id"]: {"read": 1, "acked": 0}}

    @pytest.mark.fast
    @exercises("oldest_unacked", "sends_per_hour", "open_over_time")
    def test_supervision_over_time(self, store):
        sent = _ago(30)
        with store.transaction(write=True):
            store.insert_message(_message(1, created=sent, batch_id="b1"))
            store.insert_message(_message(2, "c:z", created=sent, batch_id="b1"))
            store.insert_message(_message(3, "*", type="broadcast", created=sent))
        now = model.now_iso()
        with store.transaction():
            assert store.oldest_unacked(now, ["b:y", "c:z"]) == {"b:y": sent, "c:z": sent}
            assert store.sends_per_hour(_ago(120)) == [(sent[:13], "a:x", 2)]
            assert store.open_over_time([_ago(60), now]) == [(0, 0), (2, 2)]

    @pytest.mark.fast
    @exercises("table_counts", "read_rows", "write_rows", "after_bulk_insert", "after_copy", "count_stored",
               "stored_messages")
    def test_whole_tables_and_records(self, store, tmp_path):
        message = _message(1, refs=["/tmp/r"])
        with store.transaction(write=True):
            store.insert_message(message, ["f.txt"])
        with store.transaction():
            counts = store.table_counts()
            assert counts["messages"] == 1 and set(counts) >= {"broadcast_acks", "system_events", "profiles"}
            assert store.count_stored(agent=None, since=None, now=model.now_iso()) == 1
            assert store.count_stored(agent="c:z", since=None, now=model.now_iso()) == 0
            stored = store.stored_messages(agent="b:y", since=None, now=model.now_iso(), after=-1, limit=10)
            assert [(m["id"], m["refs"], m["schedule"], m["attachments"]) for m in stored] == \
                [(message["id"], '["/tmp/r"]', None, [])]
            assert store.stored_messages(agent=None, since=None, now=model.now_iso(), after=stored[0]["seq"],
                                         limit=10) == []
            batches = list(store.read_rows("messages", with_seq=True, batch=10))
        assert len(batches) == 1 and batches[0][0][0] == stored[0]["seq"] and batches[0][0][1] == message["id"]
        other = open_store(str(tmp_path / "other.db"))  # a SQLite target whatever this backend
        try:
            for target, source in ((other, store), (store, other)):
                with source.transaction(), target.transaction(write=True):
                    for table in ("messages", "broadcast_acks"):
                        rows = [r for batch in source.read_rows(table, with_seq=True, batch=10) for r in batch]
                        assert target.write_rows(table, rows, with_seq=True,
                                                 attachments_of=source.attachments_of) == (0 if target is store
                                                                                           else len(rows))
                    target.after_bulk_insert()
                target.after_copy()
            with other.transaction():
                assert other.get_message(message["id"])["refs"] == ["/tmp/r"]
        finally:
            other.close()

    @pytest.mark.fast
    @exercises("restore_messages", "restore_blob", "restore_profile", "restore_event", "last_seq")
    def test_restoring_records(self, store):
        from agent_mail.parts import query_language

        now = model.now_iso()
        content = b"blob"
        sha = hashlib.sha256(content).hexdigest()
        record = {**_message(1, "*", type="broadcast", refs=["/tmp/r"]), "batch_id": None,
                  "deliver_at": None, "cancelled_at": None, "read_at": None, "acked_at": None, "archived_at": None,
                  "deleted_at": None, "attachments": [{"name": "b.txt", "size": 4, "sha256": sha}],
                  "broadcast_states": [{"agent": "b:y", "read_at": now, "acked_at": None, "archived_at": None,
                                        "deleted_at": None}], "schedule": None}
        with store.transaction():
            before = store.last_seq()
        with store.transaction(write=True):
            assert store.restore_blob(sha, content, now) and not store.restore_blob(sha, content, now)
            assert store.restore_messages([record, record]) == 1 and store.restore_messages([record]) == 0
            profile = {"agent": "a:x", "human": False, "mirror_dir": None, "max_entries": None, "updated_at": now}
            assert store.restore_profile(profile) and not store.restore_profile(profile)
            event = {"id": "e1", "agent": "a:x", "source": "email.bounce", "payload": {"k": 1}, "created": now,
                     "dismissed_at": None}
            assert store.restore_event(event) and not store.restore_event(event)
        with store.transaction():
            stored = store.stored_messages(agent=None, since=None, now=model.now_iso(), after=-1, limit=10)
            assert stored[0]["broadcast_states"] == record["broadcast_states"] and "ttl_hours" not in stored[0]
            assert store.last_seq() == stored[-1]["seq"] > before
            # what was stored after a point, by id
            assert [r["id"] for r in store.stored_messages(agent=None, since=None, now=now, after=before, limit=5,
                                                           ids=[record["id"], "nothing"])] == [record["id"]]
            assert store.stored_messages(agent=None, since=None, now=now, after=stored[-1]["seq"], limit=5,
                                         ids=[record["id"]]) == []
            assert stored[0]["attachments"] == record["attachments"]
            assert store.count_unread("b:y", model.now_iso()) == 0 and store.count_unread("c:z", model.now_iso()) == 1
            assert store.stored_profiles() == [profile] and store.stored_events()[0]["payload"] == {"k": 1}
            assert store.search_rows(query_language.parse("b.txt"), subject_only=False,
                                     now=model.now_iso(), limit=5)[0]["id"] == record["id"]


    @pytest.mark.fast
    @exercises("add_token", "tokens", "token", "revoke_token")
    def test_tokens_keep_a_hash_list_without_it_and_revoke_once(self):
        store = open_store(resolve_location()[0])
        try:
            at = model.now_iso()
            secret_hash = hashlib.sha256(b"secret").hexdigest()
            with store.transaction(write=True):
                store.add_token({"id": "t1", "secret_hash": secret_hash, "agents": ["p:a", "q:*"], "supervisor": True,
                                 "note": "ops", "created": at})
                store.add_token({"id": "t2", "secret_hash": "00" * 32, "agents": ["*"], "supervisor": False,
                                 "note": None, "created": at})
            with store.transaction():
                listed = store.tokens()
                one = store.token("t1")
                assert store.token("nope") is None
            assert [t["id"] for t in listed] == ["t1", "t2"]
            assert all("secret_hash" not in t for t in listed)
            assert one["secret_hash"] == secret_hash and one["revoked_at"] is None
            assert sorted(one["agents"]) == ["p:a", "q:*"] and bool(one["supervisor"]) is True
            with store.transaction(write=True):
                assert store.revoke_token("t1", at) is True
                assert store.revoke_token("t1", at) is False  # revoked already
                assert store.revoke_token("nope", at) is False
            with store.transaction():
                assert store.token("t1")["revoked_at"] == at and store.token("t2")["revoked_at"] is None
        finally:
            store.close()

    @pytest.mark.fast
    @exercises("end_token", "note_token_use")
    def test_a_token_expires_is_rotated_and_notes_its_last_use_never_backwards(self):
        store = open_store(resolve_location()[0])
        try:
            at, later = "2026-01-01T00:00:00.000000+00:00", "2026-01-01T00:05:00.000000+00:00"
            with store.transaction(write=True):
                store.add_token({"id": "t1", "secret_hash": "00" * 32, "agents": ["p:a"], "supervisor": False,
                                 "note": None, "created": at, "expires_at": later})
                store.add_token({"id": "t2", "secret_hash": "11" * 32, "agents": ["p:a"], "supervisor": False,
                                 "note": None, "created": at})
            with store.transaction():
                one, two = store.token("t1"), store.token("t2")
            assert one["expires_at"] == later and two["expires_at"] is None
            assert one["last_used"] is None and one["rotated_to"] is None
            with store.transaction(write=True):
                store.end_token("t1", at, rotated_to="t2")
                store.note_token_use("t2", later)
                store.note_token_use("t2", at)  # an older time never replaces a newer one
            with store.transaction():
                listed = {t["id"]: t for t in store.tokens()}
            assert listed["t1"]["expires_at"] == at and listed["t1"]["rotated_to"] == "t2"
            assert listed["t2"]["last_used"] == later and "secret_hash" not in listed["t2"]
        finally:
            store.close()

    @exercises("wake_waits")
    def test_waking_every_wait_wakes_a_blocked_watch(self):
        with open_mailbox() as mailbox:
            mailbox.heartbeat(agent="w:a")
        woken: list[float] = []

        def waiter() -> None:
            with open_mailbox() as mailbox:
                started = model.now()
                # A wait that asks whether it is still wanted each time it is woken: the wake makes it ask.
                asked = []

                def wanted() -> bool:
                    asked.append(1)
                    return len(asked) < 2
                mailbox.watch(agent="w:a", timeout_seconds=20, wanted=wanted)
                woken.append((model.now() - started).total_seconds())

        thread = threading.Thread(target=waiter)
        thread.start()
        armed("w:a", timeout=20)
        store = open_store(resolve_location()[0])
        try:
            with store.transaction(write=True):
                store.wake_waits()
        finally:
            store.close()
        thread.join(timeout=30)
        assert woken and woken[0] < 15, woken  # woken, well before its 20 s

    @pytest.mark.fast
    @exercises("reservations_in", "save_reservations", "delete_reservations", "expire_reservations")
    def test_reservations_are_saved_renewed_listed_expired_and_deleted(self):
        store = open_store(resolve_location()[0])
        now = model.now()
        at, soon, later = (model.iso(now), model.iso(now + dt.timedelta(minutes=1)),
                           model.iso(now + dt.timedelta(minutes=60)))

        def row(rid, agent, pattern, expires, exclusive=True, reason="r"):
            return {"id": rid, "repo": "github.com/o/r", "agent": agent, "pattern": pattern, "exclusive": exclusive,
                    "reason": reason, "created": at, "renewed_at": at, "expires_at": expires}
        try:
            with store.transaction(write=True):
                store.save_reservations([row("r1", "p:a", "/src/**", later), row("r2", "p:b", "/docs/", soon, False)])
                store.save_reservations([row("r3", "p:a", "/src/**", later, reason="renewed")])  # same key: renews
            with store.transaction():
                held = store.reservations_in("github.com/o/r", at)
                mine = store.reservations_in("github.com/o/r", at, agent="p:a")
                assert store.reservations_in("elsewhere", at) == []
            assert [(r["id"], r["agent"], r["exclusive"]) for r in held] == [("r1", "p:a", True), ("r2", "p:b", False)]
            assert [r["reason"] for r in mine] == ["renewed"] and mine[0]["id"] == "r1"  # id and created kept
            later_than_soon = model.iso(now + dt.timedelta(minutes=2))
            with store.transaction(write=True):
                assert store.expire_reservations("github.com/o/r", later_than_soon) == 1
                assert store.delete_reservations(["r1", "nope"]) == 1
                assert store.delete_reservations([]) == 0
            with store.transaction():
                assert store.reservations_in("github.com/o/r", at) == []
        finally:
            store.close()

    @pytest.mark.fast
    @exercises("leased_ids", "holds_of_many", "lease_deliveries", "lease_of", "end_lease")
    def test_deliveries_are_held_replaced_once_expired_listed_and_ended(self):
        store = open_store(resolve_location()[0])
        now = model.now()
        at, soon, later = (model.iso(now), model.iso(now + dt.timedelta(minutes=1)),
                           model.iso(now + dt.timedelta(minutes=60)))
        after_soon = model.iso(now + dt.timedelta(minutes=2))
        try:
            with store.transaction(write=True):
                store.lease_deliveries("d1", "b:y", [("m1", "read"), ("m2", "read,ack")], at, soon)
                store.lease_deliveries("d2", "c:z", [("m1", "read")], at, later)  # another identity's own hold
            with store.transaction():
                assert store.leased_ids("b:y", at) == {"m1", "m2"} and store.leased_ids("b:y", after_soon) == set()
                assert store.holds_of_many(["b:y", "c:z", "d:w"], at) == {"b:y": {"m1": soon, "m2": soon},
                                                                          "c:z": {"m1": later}}
                assert store.holds_of_many(["b:y"], after_soon) == {}
                assert [(h["message_id"], h["flags"], h["agent"]) for h in store.lease_of("d1")] == \
                    [("m1", "read", "b:y"), ("m2", "read,ack", "b:y")]
            with store.transaction(write=True):  # d1 expired: a new delivery of m2 replaces its hold
                store.lease_deliveries("d3", "b:y", [("m2", "read")], after_soon, later)
            with store.transaction():
                assert store.lease_of("d1") == [] and [h["message_id"] for h in store.lease_of("d3")] == ["m2"]
            with store.transaction(write=True):
                assert store.end_lease("d3") == 1 and store.end_lease("d3") == 0
            with store.transaction():
                assert store.holds_of_many(["b:y"], at) == {} and store.leased_ids("c:z", at) == {"m1"}
            with store.transaction(write=True):  # cleanup sweeps holds that ended before its cutoff, no others
                store.lease_deliveries("d4", "e:v", [("m9", "read")], _ago(60 * 24 * 9), _ago(60 * 24 * 8))
                store.cleanup(_ago(60 * 24 * 7), dry_run=False)
            with store.transaction():
                assert store.lease_of("d4") == [] and store.leased_ids("c:z", at) == {"m1"}
        finally:
            store.close()


    @pytest.mark.fast
    @exercises("add_webhook", "webhooks", "remove_webhook", "queue_webhook_events", "claim_webhook_deliveries",
               "settle_webhook_delivery", "next_webhook_due", "webhook_deliveries", "webhook_tallies")
    def test_webhook_deliveries_are_queued_once_claimed_by_one_holder_and_settled(self):
        store = open_store(resolve_location()[0])
        now = model.now()
        at, lease = model.iso(now), model.iso(now + dt.timedelta(seconds=30))
        later = model.iso(now + dt.timedelta(seconds=60))
        hook = {"id": "h1", "url": "http://127.0.0.1:9/x", "agents": ["b:y"], "events": ["mail", "deaf"],
                "secret": "0123456789abcdef", "format": "json", "after_minutes": 2.5, "with_body": True,
                "created": _ago(1)}

        def event(n, key=None):
            return {"id": f"d{n}", "webhook_id": "h1", "event_key": key or f"mail:m{n}", "kind": "mail",
                    "payload": {"id": f"d{n}", "n": n}, "created": model.iso(now - dt.timedelta(seconds=10 - n))}
        try:
            with store.transaction(write=True):
                store.add_webhook(hook)
                assert store.queue_webhook_events([event(1), event(2)]) == 2
                assert store.queue_webhook_events([event(3, key="mail:m1")]) == 0  # the same event: queued once
                assert store.queue_webhook_events([]) == 0
            with store.transaction():
                listed = store.webhooks()
                assert listed == [{k: v for k, v in hook.items() if k != "secret"}]  # never the secret
                assert store.next_webhook_due() == event(1)["created"]
            with store.transaction(write=True):
                mine = store.claim_webhook_deliveries("A", at, lease, 1)
                assert [(d["id"], d["payload"], d["secret"], d["url"]) for d in mine] == \
                    [("d1", {"id": "d1", "n": 1}, hook["secret"], hook["url"])]
                theirs = store.claim_webhook_deliveries("B", at, lease, 5)  # d1 is A's until its lease ends
                assert [d["id"] for d in theirs] == ["d2"]
                assert store.claim_webhook_deliveries("C", at, lease, 5) == []
                again = store.claim_webhook_deliveries("C", later, later, 1)  # A's lease ran out
                assert [d["id"] for d in again] == ["d1"]
            with store.transaction(write=True):
                assert not store.settle_webhook_delivery("d1", "A", "delivered", 200, None, None, at)  # lost it
                assert store.settle_webhook_delivery("d1", "C", "pending", 500, "HTTP 500", later, at)
                assert store.settle_webhook_delivery("d2", "B", "delivered", 204, None, None, at)
            with store.transaction():
                assert store.next_webhook_due() == later
                assert store.webhook_tallies() == {"h1": {"pending": 1, "delivered": 1}}
                recent = store.webhook_deliveries("h1", 5)
                assert [(d["id"], d["state"], d["attempts"], d["last_status"]) for d in recent] == \
                    [("d2", "delivered", 1, 204), ("d1", "pending", 1, 500)]
                assert store.webhook_deliveries(None, 5, "failed") == []
            with store.transaction(write=True):
                assert store.remove_webhook("h1") == 1 and store.remove_webhook("h1") is None
            with store.transaction():
                assert store.webhooks() == [] and store.webhook_tallies() == {"h1": {"delivered": 1}}
        finally:
            store.close()


class TestSQLiteStore(StoreContract):
    @pytest.fixture
    def backend(self):
        return "sqlite"


class TestPostgreSQLStore(StoreContract):
    @pytest.fixture
    def backend(self):
        return "postgresql"


@pytest.mark.fast
def test_every_public_store_method_is_exercised():
    """A method added to the interface (store/base.py) without a contract test calling it fails here."""
    public = {name for name, value in inspect.getmembers(base.Store, callable) if not name.startswith("_")}
    assert public - EXERCISED == set(), "store methods no contract test calls directly"
    assert EXERCISED - public == set(), "names in @exercises that are not store methods"
