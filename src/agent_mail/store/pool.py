"""A bounded pool of open stores of one mailbox, for a long-lived process that carries out many short calls (the
server on PostgreSQL): a call borrows a connected store instead of connecting for itself, and gives it back.

Our own stores rather than psycopg_pool's connections: a call needs a Store (its error translation, reconnection,
search_path, the server's clock, the migration check done once), not a bare connection, and a pool of stores
serves every backend alike, with no dependency. A store that comes back unhealthy (its connection broken, a
transaction left open, wake-ups pending) is closed, not kept; at most `size` are ever open at once.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager


class StorePool:
    def __init__(self, location: str, size: int):
        self.location, self.size = location, size
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list = []
        self._lock = threading.Lock()
        self._closed = False

    @contextmanager
    def store(self):
        """A store of the pool's own for the duration of the block (waiting for one while all `size` are out)."""
        from agent_mail.store import open_store

        self._slots.acquire()
        try:
            with self._lock:
                store = self._idle.pop() if self._idle else None
            if store is None:
                store = open_store(self.location, any_thread=True)
            try:
                yield store
            except BaseException:
                self._give_back(store)
                raise
            self._give_back(store)
        finally:
            self._slots.release()

    def _give_back(self, store) -> None:
        keep = not self._closed and store.reusable()
        if keep:
            with self._lock:
                self._idle.append(store)
        else:
            store.close()

    def open_count(self) -> int:
        """The stores open and idle now."""
        with self._lock:
            return len(self._idle)

    def drop_idle(self) -> None:
        """Close the idle stores: the next calls open new ones (a SQLite file replaced under a server's waits)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for store in idle:
            store.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            idle, self._idle = self._idle, []
        for store in idle:
            store.close()
