"""The waits `agent-mail serve` carries on PostgreSQL (issue 21): a blocked watch holds neither a thread nor a
database connection while it waits.

A wait looks (on a pooled store, in a worker thread), then awaits, on the server's event loop, the wake-up that
the server's one LISTEN connection (store/postgres_hub.Hub) hands it, or its deadline, or a scheduled message
falling due, then looks again. The guarantees of a watch on its own connection hold:

- mail committed after the wait starts always wakes it: the wait is registered, and its identity's channel
  LISTENed, before its session is written and before its first look;
- a direct message wakes its recipient's waits only, a broadcast every wait;
- a revoked token ends its waits at once: `token revoke` notifies the broadcast channel, every wait is woken,
  and a wait whose token's validity is older than the last such wake-up asks again (one look-up per token, shared
  by the waits made with it) before it looks;
- the server stopping (SIGTERM) or the client hanging up ends the wait at once, its session released;
- the hub's connection dropping (a PostgreSQL restart) is made again, and every wait looks again;
- the safety net for mail no wake-up announced (another tool writing the mailbox): once every
  HELD_REFRESH_SECONDS the server compares the mailbox's marker, for all its waits in one statement, and wakes
  them all if it moved. The same beat refreshes every session the server holds in one statement.

The sessions are named INSTANCE.UUID, INSTANCE naming the hub connection (its application_name): `status` counts
them alive exactly while that connection lives (store/postgres._presence).
"""

from __future__ import annotations

import asyncio
import secrets

import anyio

from agent_mail import errors, model

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Stopping(errors.StorageError):
    """The server is stopping: a wait in progress ends (the client reconnects and looks again)."""

    def __init__(self):
        super().__init__("the server is stopping; this wait ended with nothing found. Look again (the client "
                         "reconnects by itself).")


class _Waiter:
    __slots__ = ("agent", "event")

    def __init__(self, agent: str):
        self.agent, self.event = agent, asyncio.Event()


class ServedWaits:
    """Every wait one server process carries on a PostgreSQL mailbox, over a pool of its stores (`pool`, used at
    most `limiter`'s capacity at once) and one hub, started on the first wait."""

    def __init__(self, location: str, pool, limiter: anyio.CapacityLimiter, mailbox_for: Callable):
        self.location, self.pool, self.limiter, self.mailbox_for = location, pool, limiter, mailbox_for
        self.instance = secrets.token_hex(6)
        self.hub = None
        self.stopping = False
        self.generation = 0  # counts the wake-ups of every wait (a broadcast, a revocation, a reconnection)
        self._waiters: dict[str, set[_Waiter]] = {}
        self._valid: dict[str, int] = {}  # token id: the generation at which it was last found valid
        self._revoked: dict[str, errors.Forbidden] = {}
        self._checking: dict[str, tuple[int, asyncio.Future]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None
        self._keeper: asyncio.Task | None = None
        self._unreleased: set[str] = set()  # sessions whose release failed: released at the next beat

    # -- the server's side ----------------------------------------------------------------
    def count(self) -> int:
        return sum(len(waiters) for waiters in self._waiters.values())

    async def db(self, action: Callable, *args):
        """`action(store, *args)` on a pooled store, in a worker thread."""
        def run():
            with self.pool.store() as store:
                return action(store, *args)
        return await anyio.to_thread.run_sync(run, limiter=self.limiter)

    def stop_all(self) -> None:
        """End every wait (the server is stopping): each answers Stopping. Safe from a signal handler."""
        self.stopping = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake, None)

    def close(self) -> None:
        if self.hub is not None:
            self.hub.stop()

    async def _started(self) -> None:
        """The hub, connected (the first wait starts it; StorageError when PostgreSQL cannot be reached)."""
        if self.hub is not None:
            return
        if self._starting is None:
            self._loop, self._starting = asyncio.get_running_loop(), asyncio.Lock()
        async with self._starting:
            if self.hub is not None:
                return
            from agent_mail.store.postgres_hub import Hub

            hub = Hub(self.location, self.instance, self._woken_from_hub)
            await anyio.to_thread.run_sync(hub.start)
            self.hub = hub
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def _woken_from_hub(self, agents: set[str] | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, agents)

    def _wake(self, agents: set[str] | None) -> None:
        if agents is None:
            self.generation += 1
            for waiters in self._waiters.values():
                for waiter in waiters:
                    waiter.event.set()
            return
        for agent in agents:
            for waiter in self._waiters.get(agent, ()):
                waiter.event.set()

    async def _keep(self) -> None:
        """Every HELD_REFRESH_SECONDS: refresh every session this server holds (one statement: they are not hung)
        and look for mail no wake-up announced (one statement for all its waits)."""
        def beat(store, marker):
            store.check_still_there()
            now = model.now_iso()
            with store.transaction(write=True):
                for session in list(self._unreleased):  # else refreshed below for as long as the server runs
                    store.release_session(session, now, "error")
                    self._unreleased.discard(session)
                store.touch_sessions(self.instance + ".", now)
            return store.mail_marker()

        marker = None
        while True:
            await asyncio.sleep(model.HELD_REFRESH_SECONDS)
            try:
                current = await self.db(beat, marker)
            except errors.AgentMailError:
                self._wake(None)  # each wait looks, and ends with the error if the mailbox is gone
                continue
            if marker is not None and current != marker:
                self._wake(None)
            marker = current

    # -- one wait ---------------------------------------------------------------------------
    async def wait(self, agent: str, seconds: float, grant: dict, since: int, gone: anyio.Event,
                   finish: Callable):
        """Block as a watch does, for `agent`, until mail for it is there, `seconds` pass, the client is gone or
        the server stops; then release its session and return finish(store, found) run on the same pooled store
        (None when the client is gone). `since`: the generation read before the token was authenticated."""
        await self._started()
        waiter = _Waiter(agent)
        self._waiters.setdefault(agent, set()).add(waiter)
        session = f"{self.instance}.{model.new_message_id()}"
        opened = False
        subscribed = self.hub.subscribe(agent)
        try:
            try:
                with anyio.fail_after(self.hub_patience()):
                    await asyncio.wrap_future(subscribed)
            except TimeoutError:
                raise errors.StorageError("the server lost its connection to the PostgreSQL mailbox and could not "
                                          "listen for this wait; nothing was changed. The client looks again by "
                                          "itself.") from None

            def open_session(store):
                with store.transaction(write=True):
                    store.open_session(session, agent, model.now_iso())
            await self.db(open_session)
            opened = True
            outcome: list = []
            async with anyio.create_task_group() as group:
                async def hung_up():
                    await gone.wait()
                    waiter.event.set()
                group.start_soon(hung_up)
                try:
                    outcome.append(await self._until_mail(waiter, seconds, grant, since, gone))
                except Exception as exc:  # raised below, out of the task group (which would wrap it)
                    outcome.append(exc)
                finally:
                    group.cancel_scope.cancel()
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            found = outcome[0]
            reason = "client gone" if found is None else "mail" if found else "timeout"

            def end(store):
                store.release_session_alone(session, model.now_iso(), reason)
                return None if found is None else finish(store, found)
            answer = await self.db(end)
            opened = False
            return answer
        finally:
            waiters = self._waiters.get(agent)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[agent]
            self.hub.unsubscribe(agent)
            if opened:
                with anyio.CancelScope(shield=True):
                    await self._release_quietly(session)

    def hub_patience(self) -> float:
        from agent_mail.store.base import Store

        return Store.reconnect_seconds

    async def _release_quietly(self, session: str) -> None:
        def release(store):
            store.release_session_alone(session, model.now_iso(), "error")
        try:
            await self.db(release)
        except errors.AgentMailError:
            self._unreleased.add(session)

    async def _until_mail(self, waiter: _Waiter, seconds: float, grant: dict, since: int, gone: anyio.Event):
        """The loop of Waits.wait_for_mail, awaiting instead of blocking: the envelopes found, [] at the deadline,
        None when the client is gone."""
        from agent_mail.waits import Waits

        def look(store, publish: bool):
            waits = Waits(self.mailbox_for(store))
            if publish:
                waits.mailbox.publish_due()
            found = waits.envelopes(waiter.agent)
            return found, (None if found else waits.next_due(waiter.agent))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        look_now, publish, due_at = True, False, None
        while True:
            if self.stopping:
                raise Stopping()
            if gone.is_set():
                return None
            if look_now:
                waiter.event.clear()  # a wake-up during the look sets it again: looked at after
                await self._token_still_valid(grant, since)
                found, until_due = await self.db(look, publish)
                if found:
                    return found
                due_at = None if until_due is None else loop.time() + until_due
                look_now = publish = False
                continue  # asked again: stopping, gone, or revoked while it looked
            now = loop.time()
            if now >= deadline:
                return []
            if due_at is not None and now >= due_at:
                look_now = publish = True
                continue
            with anyio.move_on_after(min(deadline, due_at if due_at is not None else deadline) - now):
                await waiter.event.wait()
            look_now = waiter.event.is_set()

    async def _token_still_valid(self, grant: dict, since: int) -> None:
        """errors.Forbidden when the wait's token was revoked: asked of the mailbox only when a wake-up of every
        wait came since it was last found valid, once per token however many waits it has."""
        from agent_mail import tokens

        token = grant["id"]
        while True:
            if token in self._revoked:
                raise self._revoked[token]
            generation = self.generation
            if max(since, self._valid.get(token, -1)) >= generation:
                return
            asked = self._checking.get(token)
            if asked is not None and asked[0] >= generation:
                await asyncio.shield(asked[1])
                continue
            answer = asyncio.get_running_loop().create_future()
            self._checking[token] = (generation, answer)
            try:
                await self.db(tokens.still_valid, grant)
                self._valid[token] = max(self._valid.get(token, -1), generation)
            except errors.Forbidden as refused:
                self._revoked[token] = refused
            finally:
                if self._checking.get(token, (None, None))[1] is answer:
                    del self._checking[token]
                answer.set_result(None)
