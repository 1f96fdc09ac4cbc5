"""The dashboard's feed: a background thread that reads what the screen in view shows, as mail lands.

The Feeder holds a store of its own and sleeps on the same wake-up a `watch` uses, listening to every
message; it re-reads when mail lands or every REFRESH_SECONDS (ages, liveness). It knows nothing of the
application: the app tells it what is in view by replacing `wanted`, and it hands back what it read as
messages posted to the app (FeedRead, FeedProblem).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from textual.message import Message

from agent_mail import errors
from agent_mail.operations import mail
from agent_mail.dashboard import data

#: How often the Feeder re-reads with no mail landing: ages, liveness and states others change.
REFRESH_SECONDS = 10.0
#: How often the charts are recomputed while shown (they change by the hour).
CHART_SECONDS = 60.0
#: The least time between two reads: a busy fleet's sends are drawn in batches, a few times a second.
GATHER_SECONDS = 0.25


@dataclass(frozen=True)
class Wanted:
    """What to read: replaced whole by the app on its thread, read by the feeder on its own."""

    tab: str | None = None  # the screen in view; None before the first is shown: everything
    overdue_minutes: float = data.DEFAULT_OVERDUE_MINUTES
    inbox_agent: str | None = None
    chart_by: str = "project"


class FeedRead(Message):
    """What the feeder read: some of fleet, feed, inbox, hourly and backlog."""

    def __init__(self, snapshot: dict):
        super().__init__()
        self.snapshot = snapshot


class FeedProblem(Message):
    """The mailbox cannot be read just now (the feeder retries): `text` says why."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text


class Feeder(threading.Thread):
    """Reads what `wanted` names and posts it: at once, then whenever mail lands (the wake-up every message
    rings), when poked, and every REFRESH_SECONDS. A lost connection is posted and retried, never raised."""

    def __init__(self, post: Callable[[Message], object], wanted: Wanted, served: tuple[str, str] | None = None):
        super().__init__(name="agent-mail dashboard feeder", daemon=True)
        self.post = post  # the app's post_message, which may be called from any thread
        self.wanted = wanted
        self.served = served  # (url, token): the mailbox is an agent-mail server's (agent_mail.dashboard.served)
        self.stopping = threading.Event()
        self.poke = threading.Event()
        self.backoff = 1.0  # the wait before reading again after a problem; back to 1 s after each read

    def run(self) -> None:
        from agent_mail.store import open_store

        remote = None
        if self.served is not None:
            from agent_mail.dashboard.served import ServedSupervisor

            remote = ServedSupervisor(*self.served)
        while not self.stopping.is_set():
            store = None
            try:
                if remote is not None:  # read through the server; woken by its waiting look
                    self._loop(remote, remote)
                    continue
                store = open_store(mail.resolve_location()[0])
                store.reconnect_seconds = 1.0  # a lost server is shown at once; this loop keeps retrying
                supervisor = data.Supervisor(mail.Mailbox(store))
                store.listen_everything()
                self._loop(supervisor, store)
            except errors.AgentMailError as exc:
                self._post(FeedProblem(exc.message))
                self.stopping.wait(self.backoff)
                self.backoff = min(self.backoff * 2, 15.0)
            except Exception as exc:  # noqa: BLE001 - a bug: shown on screen and retried, never a dead feed
                self._post(FeedProblem(f"internal error ({type(exc).__name__}: {exc}); please report this"))
                self.stopping.wait(self.backoff)
                self.backoff = min(self.backoff * 2, 15.0)
            finally:
                if remote is not None and self.stopping.is_set():
                    remote.close()
                if store is not None:
                    try:
                        store.close()
                    except Exception:  # noqa: BLE001 - closing a broken connection may fail; it is gone anyway
                        pass

    def _loop(self, supervisor: data.Supervisor, store) -> None:
        """Read what is in view, then sleep on `store`'s wake-up (a ServedSupervisor's, through a server)."""
        charts_at = 0.0
        while not self.stopping.is_set():
            self.poke.clear()
            # What the screen in view shows is read; the others are read when they are shown (a poke).
            wanted = self.wanted
            shown = wanted.tab
            snapshot = {}
            if shown in ("fleet", None):
                snapshot["fleet"] = supervisor.fleet(wanted.overdue_minutes)
            if shown in ("traffic", None):
                snapshot["feed"] = supervisor.feed()
            if wanted.inbox_agent and shown in ("inbox", None):
                snapshot["inbox"] = supervisor.inbox(wanted.inbox_agent)
            if shown == "charts" and time.monotonic() - charts_at > CHART_SECONDS:
                snapshot["hourly"] = supervisor.hourly(by=wanted.chart_by)
                snapshot["backlog"] = supervisor.backlog()
                charts_at = time.monotonic()
            self._post(FeedRead(snapshot))
            self.backoff = 1.0  # read: the next problem is retried soon again
            # Sleep on the mailbox's wake-up in short slices so a stop or a poke (a changed threshold,
            # the charts opened) acts within a fraction of a second; no query runs while nothing happens.
            read_at = time.monotonic()
            deadline = read_at + REFRESH_SECONDS
            while not self.stopping.is_set() and not self.poke.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if store.wait_for_wake(min(left, 0.5)):
                    # Mail landed: gather what else lands in the next moment into the same read.
                    self.stopping.wait(max(0.0, read_at + GATHER_SECONDS - time.monotonic()))
                    break
            if self.poke.is_set():
                charts_at = 0.0

    def _post(self, message: Message) -> None:
        if self.stopping.is_set():
            return
        try:
            self.post(message)
        except RuntimeError:
            pass  # the app has stopped (its loop is closed)
