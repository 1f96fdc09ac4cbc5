"""Reads and actions the dashboard runs when asked (a thread, an inbox, a send), off the app's thread.

They run on one dedicated thread with a connection of its own, never the feeder's: a SQLite connection
belongs to the thread that made it, and the screen never waits on the mailbox. Through a server, that thread
makes its requests (agent_mail.dashboard.served).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from agent_mail import errors
from agent_mail.operations import mail
from agent_mail.dashboard import data


class OnDemand:
    """One thread and one connection, opened at the first call and re-opened after a storage error."""

    def __init__(self, served: tuple[str, str] | None = None):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agent-mail dashboard io")
        self._store = None
        self._supervisor: data.Supervisor | None = None
        self.served = served  # (url, token): through an agent-mail server (agent_mail.dashboard.served)

    def call(self, what, *args, **kwargs):
        """Run `what(supervisor, ...)` on the on-demand connection and wait for it: (result, None), or
        (None, the error) - an error is returned, never raised. Called from a worker, not the app's thread."""
        return self._executor.submit(self._call_here, what, *args, **kwargs).result()

    def close(self) -> None:
        """Close the connection on its own thread and end that thread."""
        self._executor.submit(self._close_here)
        self._executor.shutdown(wait=True)

    def _call_here(self, what, *args, **kwargs):
        try:
            if self._supervisor is None and self.served is not None:
                from agent_mail.dashboard.served import ServedSupervisor

                self._supervisor = ServedSupervisor(*self.served)
            if self._supervisor is None:
                from agent_mail.store import open_store

                self._store = open_store(mail.resolve_location()[0])
                self._supervisor = data.Supervisor(mail.Mailbox(self._store))
            return what(self._supervisor, *args, **kwargs), None
        except errors.AgentMailError as exc:
            if isinstance(exc, errors.StorageError):
                self._close_here()  # reopened at the next call
            return None, exc

    def _close_here(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001 - a broken connection is gone anyway
                pass
        self._store = self._supervisor = None
