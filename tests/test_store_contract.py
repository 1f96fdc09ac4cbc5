"""The store contract (store/base.py, store/sql.py), proved on every backend.

Writers are serialised; insertion order is commit order; readers racing for the same unread mail never
both take a message; a transaction is all or nothing; only the project's own StorageError leaves a store.
"""

from __future__ import annotations

import threading

import pytest

from agent_mail import errors, model
from agent_mail.service import open_mailbox, resolve_location
from agent_mail.store import open_store

pytestmark = pytest.mark.backends


def _message(i: int, recipient: str = "b:y") -> dict:
    return {"id": model.new_message_id(), "sender": "a:x", "recipient": recipient, "subject": f"m{i}", "body": "",
            "refs": [], "reply_to": None, "type": "direct", "created": model.now_iso()}


class TestStoreContract:
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
