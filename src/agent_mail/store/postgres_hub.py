"""The one LISTEN connection of an `agent-mail serve` process on PostgreSQL (issue 21): it carries the wake-ups of
every wait the server serves, so a thousand waits cost one connection, not a thousand.

The hub LISTENs the broadcast channel for as long as it runs, and an identity's channel while at least one wait
for that identity is in progress (subscribe / unsubscribe count them), and LINGER_SECONDS after the last one
ended: a watch that answered arms again at once, and finds its channel LISTENed already (no round trip); and a
broadcast that ends a thousand waits at once costs no thousand interruptions of the hub, only one UNLISTEN of
them all LINGER_SECONDS later. A notification wakes exactly the waits it concerns: a direct message its
recipient's, a broadcast (and a revoked token, which `Store.wake_waits` announces there) every wait (a
notification on a lingering channel wakes nobody).

It is a thread that sleeps in poll() (files.wait_readable; never select(), which fails on a descriptor numbered
1,024 or more: issue 27) on the connection's socket and on a pipe of its own: the pipe interrupts
the sleep at once when a LISTEN is asked for (a wait must be listening before its first look), which psycopg's
AsyncConnection.notifies() cannot offer (it holds the connection's lock while it waits, so a LISTEN from another
task would wait for it to time out: latency, or idle wake-ups). An idle hub costs nothing: no poll, and a timeout
only while a channel lingers (one wake-up LINGER_SECONDS after the last wait of a burst ended).

Its connection is also the presence of the waits it carries (see postgres._presence): its application_name names
the server instance (`agent-mail serve INSTANCE`), the watch sessions the server holds are named
`INSTANCE.UUID`, and a session of an instance whose hub connection is there is alive. When the server process
dies its connection ends and PostgreSQL forgets it at once; a partitioned one is ended by the server-side
keepalives within seconds. A dropped connection (a PostgreSQL restart, pg_terminate_backend) is made again, the
channels LISTENed again, and every wait told to look again: nothing committed meanwhile is missed. Failures in a
row (a connection refused, or one that fails again within STEADY_SECONDS of being made) are retried after pauses
that double up to RETRY_SECONDS[1], and logged once per run of them (on_log), with one more line when it recovers.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future

import psycopg

from agent_mail import errors
from agent_mail.files import wait_readable
from agent_mail.urls import redact_url, url_secrets
from agent_mail.store.postgres import CONNECT_DEFAULTS, RELEASED_NOTE, SERVE_APP, error_text, channel, split_url

RETRY_SECONDS = (0.05, 2.0)  # the first and the longest pause between two attempts to connect again
STEADY_SECONDS = 10.0  # a connection that served this long before failing starts the pauses afresh
LINGER_SECONDS = 5.0  # an identity's channel stays LISTENed this long after its last wait ended


class Hub:
    """One server process's LISTEN connection; `on_wake(agents)` is called in the hub's thread with the identities
    whose waits are to look again, or None for every wait (a broadcast, a revoked token, a reconnection);
    `on_released(sessions)` with the sessions their clients' stop calls released (a notification on an identity's
    channel naming one: Store.announce_release), whose waits end."""

    def __init__(self, url: str, instance: str, on_wake, on_released=None, on_log=None):
        self._conninfo, self.schema = split_url(url)
        self.display, self._secrets = redact_url(url), url_secrets(url)
        self.instance, self._on_wake, self._on_released = instance, on_wake, on_released
        self._on_log = on_log  # on_log(**fields): a line for the server's log (a failure, once per run of them)
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}  # identity: waits in progress
        self._lingering: dict[str, float] = {}  # identity without waits: when its channel may be UNLISTENed
        self._channels: dict[str, str] = {}  # identity: its channel's name (made once)
        self._pending: list[tuple[str, Future]] = []  # subscriptions to confirm once their LISTEN is in effect
        self._listened: dict[str, str] = {}  # channel: identity, LISTENed on the connection now
        self._broadcast = channel(self.schema, "*")
        self._interrupt_r, self._interrupt_w = os.pipe()
        os.set_blocking(self._interrupt_r, False)
        self._stopping = False
        self.db = None
        self.reconnects = 0  # connections made again after one was lost (the server's /metrics counts them)
        self._thread: threading.Thread | None = None

    # -- the waits' side (any thread) ------------------------------------------------
    def start(self) -> None:
        """Connect (StorageError if PostgreSQL cannot be reached) and start the hub's thread."""
        self._connect()
        self._thread = threading.Thread(target=self._run, name="agent-mail hub", daemon=True)
        self._thread.start()

    def subscribe(self, agent: str) -> Future:
        """Count a wait for `agent` in; the future is done once `agent`'s channel is LISTENed (at once if it
        is already): mail committed after that wakes the wait."""
        done: Future = Future()
        with self._lock:
            self._counts[agent] = self._counts.get(agent, 0) + 1
            self._lingering.pop(agent, None)
            if self._channel(agent) in self._listened and self._healthy():
                done.set_result(True)
                return done
            self._pending.append((agent, done))
        self._interrupt()
        return done

    def unsubscribe(self, agent: str) -> None:
        """Count a wait for `agent` out; its channel lingers when it was the last (UNLISTENed LINGER_SECONDS later,
        unless a wait for it comes first). The hub is interrupted only when nothing lingered yet: it sleeps until
        the first channel's time is up, and UNLISTENs every channel whose time is up then."""
        with self._lock:
            left = self._counts.get(agent, 0) - 1
            if left > 0:
                self._counts[agent] = left
                return
            self._counts.pop(agent, None)
            first = not self._lingering
            self._lingering[agent] = time.monotonic() + LINGER_SECONDS
        if first:
            self._interrupt()  # it sleeps with no timeout: give it one

    def stop(self) -> None:
        self._stopping = True
        self._interrupt()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close()
        for fd in (self._interrupt_r, self._interrupt_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the hub's thread --------------------------------------------------------------
    def _interrupt(self) -> None:
        try:
            os.write(self._interrupt_w, b".")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the thread will wake anyway) or closed (stopping)

    def _channel(self, agent: str) -> str:
        name = self._channels.get(agent)
        if name is None:
            name = self._channels[agent] = channel(self.schema, agent)
        return name

    def _healthy(self) -> bool:
        return self.db is not None and not self.db.closed and not self.db.broken

    def _close(self) -> None:
        db, self.db = self.db, None
        with self._lock:
            self._listened = {}
        if db is not None:
            try:
                db.close()
            except psycopg.Error:
                pass

    def _connect(self) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        try:
            given = conninfo_to_dict(self._conninfo)
            extra = {key: value for key, (env, value) in CONNECT_DEFAULTS.items()
                     if key not in given and not (env and os.environ.get(env))}
            extra["application_name"] = SERVE_APP + self.instance  # the presence of its waits: always ours
            db = psycopg.connect(make_conninfo(self._conninfo, **extra), autocommit=True)
            # The server probes this client every few seconds, so a hub cut off by a partition stops counting.
            db.execute(b"SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3; "
                       + f'LISTEN "{self._broadcast}"'.encode())
        except psycopg.Error as exc:
            raise errors.StorageError(f"the server cannot listen for wake-ups on the PostgreSQL mailbox {self.display}"
                                      f" (schema {self.schema}): {error_text(exc, self._secrets)}. Check that it is "
                                      "running and reachable.", told=errors.CANNOT_REACH) from None
        self.db = db
        with self._lock:
            self._listened = {self._broadcast: "*"}

    def _reconcile(self) -> None:
        """LISTEN the channels of the identities waited for, UNLISTEN the others (one round trip), then confirm
        the subscriptions waiting for it."""
        with self._lock:
            now = time.monotonic()
            for agent in [agent for agent, until in self._lingering.items() if until <= now]:
                del self._lingering[agent]
                self._channels.pop(agent, None)
            wanted = {self._channel(agent): agent for agent in (*self._counts, *self._lingering)}
            wanted[self._broadcast] = "*"
            pending, self._pending = self._pending, []
            start = [name for name in wanted if name not in self._listened]
            end = [name for name in self._listened if name not in wanted]
        if start or end:
            statements = [f'LISTEN "{name}"' for name in start] + [f'UNLISTEN "{name}"' for name in end]
            try:
                self.db.execute("; ".join(statements).encode())
            except BaseException:
                with self._lock:
                    self._pending = pending + self._pending  # confirmed after the reconnection instead
                raise
            with self._lock:
                self._listened = {name: wanted[name] for name in self._listened if name in wanted}
                self._listened.update({name: wanted[name] for name in start})
        for _, done in pending:
            if not done.done():
                done.set_result(True)

    def _drain(self) -> None:
        woken: set[str] = set()
        released: list[str] = []
        everyone = False
        for note in self.db.notifies(timeout=0):
            agent = self._listened.get(note.channel)
            if note.payload.startswith(RELEASED_NOTE):  # one wait's session, no mail: that wait ends
                released.append(note.payload[len(RELEASED_NOTE):])
            elif agent == "*":
                everyone = True
            elif agent is not None:
                woken.add(agent)
        if released and self._on_released is not None:
            self._on_released(released)
        if everyone:
            self._on_wake(None)
        elif woken:
            self._on_wake(woken)

    def _run(self) -> None:
        pause = RETRY_SECONDS[0]
        failures = 0  # in a row: a connection that fails again before STEADY_SECONDS counts on
        connected_at = 0.0
        while not self._stopping:
            if not self._healthy():
                self._close()
                try:
                    self._connect()
                    self.reconnects += 1
                    connected_at = time.monotonic()
                    self._reconcile()
                except (errors.StorageError, psycopg.Error) as exc:
                    failures = self._failed(failures, exc, pause)
                    self._sleep(pause)
                    pause = min(pause * 2, RETRY_SECONDS[1])
                    continue
                self._on_wake(None)  # every wait looks again: mail may have come while the connection was down
                continue
            try:
                self._reconcile()
                self._drain()
                with self._lock:
                    until = min(self._lingering.values(), default=None)
                timeout = None if until is None else max(0.0, until - time.monotonic()) + 0.05  # past it
                ready = wait_readable([self.db.fileno(), self._interrupt_r], timeout)
                if self._interrupt_r in ready:
                    self._read_interrupts()
                if self.db.fileno() in ready:
                    self._drain()
                if failures and time.monotonic() - connected_at >= STEADY_SECONDS:
                    self._log(event="hub recovered", failures=failures)
                    failures, pause = 0, RETRY_SECONDS[0]
            except Exception as exc:  # psycopg's, the socket's, or a bug: the hub must not die of it
                self._close()  # made again at the top of the loop, and every wait looks again
                if time.monotonic() - connected_at >= STEADY_SECONDS:
                    if failures:
                        self._log(event="hub recovered", failures=failures)
                    failures, pause = 0, RETRY_SECONDS[0]  # a connection that served a while: a fresh start
                failures = self._failed(failures, exc, pause)
                self._sleep(pause)
                pause = min(pause * 2, RETRY_SECONDS[1])

    def _failed(self, failures: int, exc: BaseException, pause: float) -> int:
        """Count a failure; the first of a run is logged (once: not each retry), the pauses doubling meanwhile up
        to RETRY_SECONDS[1], so a failure that repeats costs at most one session every RETRY_SECONDS[1] (issue 27:
        a hub that failed at once after each connection made ~240 sessions a second)."""
        if failures == 0:
            self._log(event="hub connection failed", error=_described(exc, self._secrets),
                      retrying=f"after {pause:g} s, then backing off to every {RETRY_SECONDS[1]:g} s; logged once "
                               "until it recovers")
        return failures + 1

    def _log(self, **fields) -> None:
        if self._on_log is not None:
            try:
                self._on_log(**fields, database=self.display)
            except Exception:
                pass

    def _read_interrupts(self) -> None:
        try:
            while os.read(self._interrupt_r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def _sleep(self, seconds: float) -> None:
        """A pause before connecting again, cut short by stop() (and only by it: poll, whatever the descriptors'
        numbers, so the pause is never skipped)."""
        deadline = time.monotonic() + seconds
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            if self._interrupt_r in wait_readable([self._interrupt_r], left):
                self._read_interrupts()


def _described(exc: BaseException, secrets) -> str:
    if isinstance(exc, psycopg.Error):
        return error_text(exc, secrets)
    return f"{type(exc).__name__}: {exc}"
