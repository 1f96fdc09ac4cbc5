"""The waits `agent-mail serve` carries (issues 21 and 27): a blocked watch, follow or dashboard look, MCP watch or
hook's waiter holds neither a thread nor a database connection while it waits.

A wait looks (on a pooled store, in a worker thread), then awaits, on the server's event loop, the wake-up that
the server's one watcher of the mailbox's changes hands it (PostgreSQL: its one LISTEN connection,
store/postgres_hub.Hub; SQLite: its wake-up pipes, watched by the event loop, store/sqlite_bells.BellHub, which
every process writing the file rings), or its deadline, or a scheduled message falling due, then looks again. The
guarantees of a watch on its own connection hold (on SQLite a stop call's release rings the identity's pipe, and the
woken wait asks whether its session was released; the server's lock on its own pipe is its sessions' presence):

- mail committed after the wait starts always wakes it: the wait is registered, and its identity's channel
  LISTENed, before its session is written and before its first look;
- a direct message wakes its recipient's waits only, a broadcast every wait;
- a revoked token ends its waits at once: `token revoke` notifies the broadcast channel, every wait is woken,
  and a wait whose token was last found valid before the last such wake-up has it asked about again, in the
  same transaction as its look (once per token for all the waits looking together);
- the server stopping (SIGTERM) ends the wait at once, its session released; its client's stop call (POST
  /v1/watch/stop, taken by this server or another replica: agent_mail.server.stops) releases its session in the
  database and names it on the identity's channel, and the wait ends without writing to it again; the client
  hanging up without that call (killed) ends it at once, its session abandoned (stale at once, as a killed
  watch's);
- the hub's connection dropping (a PostgreSQL restart) is made again, and every wait looks again;
- the safety net for mail no wake-up announced (another tool writing the mailbox): once every
  HELD_REFRESH_SECONDS the server compares the mailbox's marker, for all its waits in one statement, and wakes
  them all if it moved. The same beat refreshes every session the server holds in one statement.

The sessions are named INSTANCE.DIGEST.NONCE (DIGEST from the client's stop_key: stops.session_id),
INSTANCE naming the hub connection (its application_name): `status` counts them alive exactly while that
connection lives (store/postgres._presence), and an abandoned one, renamed gone.DIGEST.NONCE, never.
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
        said = ("the server is stopping; this wait ended with nothing found. Look again (the client reconnects by "
                "itself).")
        super().__init__(said, told=said)  # it names nothing of the database: callers are told as it is


class _Waiter:
    """One wait's wake-ups, set on the event loop: `woken` says something came for it (mail, a broadcast, a
    revocation, a reconnection, the client hanging up, the server stopping); `future`, while it sleeps, ends the
    sleep (as does its own timer: its deadline, or a scheduled message falling due). A future and a timer handle
    rather than an Event under a cancel scope: a broadcast wakes a thousand of them at once, and each costs a few
    microseconds instead of a cancel scope's tens."""

    __slots__ = ("agent", "woken", "future", "released")

    def __init__(self, agent: str):
        self.agent, self.woken, self.future, self.released = agent, False, None, False

    def wake(self) -> None:
        self.woken = True
        self.ring()

    def ring(self) -> None:
        future = self.future
        if future is not None and not future.done():
            future.set_result(None)

    async def sleep(self, seconds: float) -> None:
        """Until woken, or `seconds` pass (at once if woken already)."""
        if self.woken:
            return
        loop = asyncio.get_running_loop()
        self.future = loop.create_future()
        timer = loop.call_later(seconds, self.ring)
        try:
            await self.future
        finally:
            timer.cancel()
            self.future = None


class _Batches:
    """The same step of many waits carried out together: `action(store, items)` gives each item's result (or the
    exception it met). Items that come while a batch runs go in the next one, spread over the pool's stores: a
    broadcast that wakes a thousand waits costs a few transactions and one commit, not a thousand of each."""

    def __init__(self, owner: ServedWaits, action: Callable, first: Callable | None = None, spread: bool = True):
        self.owner, self.action, self.first = owner, action, first  # first(store, items): once for the whole batch
        self.spread = spread  # over the pool's stores, or the whole batch on one
        self.pending: list[tuple[object, asyncio.Future]] = []
        self.running = False

    async def do(self, item):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.pending.append((item, future))
        if not self.running:
            self.running = True
            loop.create_task(self._run())
        result = await future
        if isinstance(result, Exception):
            raise result
        return result

    async def _run(self) -> None:
        try:
            while self.pending:
                taken, self.pending = self.pending, []
                if self.first is not None:
                    try:
                        await self.owner.db(self.first, [item for item, _ in taken])
                    except Exception as exc:
                        for _, future in taken:
                            if not future.done():
                                future.set_result(exc)
                        continue
                size = -(-len(taken) // self.owner.pool.size) if self.spread else len(taken)
                async with anyio.create_task_group() as group:
                    for start in range(0, len(taken), size):
                        group.start_soon(self._chunk, taken[start:start + size])
        finally:
            self.running = False

    async def _chunk(self, chunk: list) -> None:
        try:
            results = await self.owner.db(self.action, [item for item, _ in chunk])
        except Exception as exc:
            results = [exc] * len(chunk)
        for (_, future), result in zip(chunk, results, strict=True):
            if not future.done():
                future.set_result(result)


class ServedWaits:
    """Every wait one server process carries, over a pool of its stores (`pool`, used at most `limiter`'s capacity
    at once) and one hub (PostgreSQL's LISTEN connection, or SQLite's BellHub), started on the first wait."""

    def __init__(self, location: str, pool, limiter: anyio.CapacityLimiter, mailbox_for: Callable,
                 instance: str | None = None):
        self.location, self.pool, self.limiter, self.mailbox_for = location, pool, limiter, mailbox_for
        self.instance = instance or secrets.token_hex(6)
        self.hub = None
        self.stopping = False
        self.generation = 0  # counts the wake-ups of every wait (a broadcast, a revocation, a reconnection)
        self._waiters: dict[str, set[_Waiter]] = {}
        self._held: dict[str, _Waiter] = {}  # session: its wait's waiter
        self._valid: dict[str, int] = {}  # token id: the generation at which it was last found valid
        self._revoked: dict[str, errors.Forbidden] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: asyncio.Lock | None = None
        self._keeper: asyncio.Task | None = None
        self._unreleased: set[str] = set()  # sessions whose release failed: released at the next beat
        # The looks of a batch are one statement on one store (Store.unread_of_many): spread over the pool's stores
        # they would be as many statements, each as dear, that the engine's few cores run side by side anyway.
        self._opens, self._looks = _Batches(self, self._open_all), _Batches(self, self._look_all, spread=False)
        # The answers of a batch come from one liveness look-up of everyone: on one store, not once per store.
        self._ends = _Batches(self, self._answers, first=self._release_all, spread=False)

    # -- the server's side ----------------------------------------------------------------
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
            from agent_mail.store import backend_name

            if backend_name(self.location) == "sqlite":  # the wake-up pipes, watched on this loop (no thread)
                from agent_mail.store.sqlite_bells import BellHub

                path = await self.db(lambda store: store.path)
                hub = BellHub(path, self.instance, self._woken_from_hub, self._loop)
                hub.start()
            else:
                from agent_mail.server.edge import log
                from agent_mail.store.postgres_hub import Hub

                hub = Hub(self.location, self.instance, self._woken_from_hub, self._released_from_hub, log)
                await anyio.to_thread.run_sync(hub.start)
            self.hub = hub
            self._keeper = asyncio.get_running_loop().create_task(self._keep())

    def _woken_from_hub(self, agents: set[str] | None) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake, agents)

    def _released_from_hub(self, sessions: list[str]) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._end_released, sessions)

    def _end_released(self, sessions: list[str]) -> None:
        """The waits whose sessions their clients' stop calls released (here or on another replica) end."""
        for session in sessions:
            waiter = self._held.get(session)
            if waiter is not None:
                waiter.released = True
                waiter.wake()

    def _wake(self, agents: set[str] | None) -> None:
        if agents is None:
            self.generation += 1
            for waiters in self._waiters.values():
                for waiter in waiters:
                    waiter.wake()
            return
        for agent in agents:
            for waiter in self._waiters.get(agent, ()):
                waiter.wake()

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
                # Each wait looks, on stores opened anew (a SQLite file replaced: the waits look at the new one), and
                # ends with the error if the mailbox is gone.
                self.pool.drop_idle()
                self._wake(None)
                continue
            if marker is not None and current != marker:
                self._wake(None)
            marker = current

    # -- one wait ---------------------------------------------------------------------------
    async def wait(self, agent: str, seconds: float, grant: dict, since: int, gone: anyio.Event,
                   key: str | None = None, waiter_steps=None, host: str = ""):
        """Block as a watch does, for `agent`, until mail for it is there, `seconds` pass, the client is gone or
        the server stops; then release its session and return the watch's result (None when the client is
        gone: its session abandoned). waits.Released when its client's stop call released its session. `since`:
        the generation read before the token was authenticated; `key`: the client's stop_key (or None); `host`:
        the client's machine as it named it ("": unknown), recorded with its session.

        `waiter_steps`: a hook's waiter (operations.telling.ServedWaiter, armed) instead of a watch: its own look
        (mail its session was not told of), its session's sign of life once every LAST_SEEN_EVERY_SECONDS, its
        end (the answer: the hook's {output, wake, note, waiter}); its session released when its client hangs up
        (a harness ends its waiter routinely)."""
        if waiter_steps is not None:
            return await self._hook_wait(agent, seconds, grant, since, gone, waiter_steps, host)
        from agent_mail.server import stops

        await self._started()
        waiter, subscribed, watching = self._enlist(agent, gone)
        session = stops.session_id(self.instance, key)
        self._held[session] = waiter
        opened = False
        try:
            await self._listening(subscribed, "The client looks again by itself.")
            await self._opens.do((session, agent, host))
            opened = True
            found = await self._until_mail(waiter, seconds, grant, since, gone, session)
            if waiter.released:  # by its client's stop call, in the database: nothing more to write
                from agent_mail.parts.waits import Released

                opened = False
                raise Released()
            reason = "client gone" if found is None else "mail" if found else "timeout"
            answer = await self._ends.do((session, reason, agent, found))
            opened = False
            return answer
        finally:
            self._held.pop(session, None)
            self._delist(agent, waiter, watching)
            if opened:
                with anyio.CancelScope(shield=True):
                    await self._release_quietly(session)

    async def _hook_wait(self, agent: str, seconds: float, grant: dict, since: int, gone: anyio.Event, steps,
                         host: str):
        from agent_mail.operations import tokens
        from agent_mail.operations.telling import LAST_SEEN_EVERY_SECONDS
        from agent_mail.server import stops

        def look(store, ask: bool, publish: bool):
            if ask:
                tokens.still_valid(store, grant)
            mailbox = self.mailbox_for(store)
            if publish:
                mailbox.publish_due()
            found = steps.look(mailbox)
            if found is None or found:
                return found, None
            from agent_mail.parts.waits import Waits

            return [], Waits(mailbox).next_due(agent)

        def end(store, session: str, reason: str, found):
            try:
                with store.transaction(write=True):
                    store.release_sessions([session], model.now_iso(), reason)
            except errors.StorageError:
                self._unreleased.add(session)  # released at the next beat; the answer (a note of mail) stands
            return steps.end(self.mailbox_for(store), found)

        await self._started()
        waiter, subscribed, watching = self._enlist(agent, gone)
        session = stops.session_id(self.instance, None)
        found, reason, opened, ended = [], "error", False, False
        loop = asyncio.get_running_loop()
        try:
            await self._listening(subscribed, "The client looks again by itself.")
            await self._opens.do((session, agent, host))
            opened = True
            deadline, touch_at = loop.time() + seconds, loop.time() + LAST_SEEN_EVERY_SECONDS
            look_now, publish, due_at = "first", False, None
            while True:
                if self.stopping:
                    raise Stopping()
                if gone.is_set():
                    found, reason = None, "client gone"
                    break
                now = loop.time()
                if look_now:
                    waiter.woken = False
                    token, generation = grant["id"], self.generation
                    if token in self._revoked:
                        raise self._revoked[token]
                    ask = max(since, self._valid.get(token, -1)) < generation  # woken by a revocation since
                    try:
                        found, until_due = await self.db(look, ask, publish)
                    except errors.Forbidden as refused:
                        self._revoked[token] = refused
                        raise
                    if ask:
                        self._valid[token] = max(self._valid.get(token, -1), generation)
                    if found is None or found:  # superseded by a newer waiter, or told of mail
                        found, reason = found or [], "mail" if found else "superseded"
                        break
                    due_at = None if until_due is None else loop.time() + until_due
                    look_now = publish = False
                    continue
                if now >= deadline:
                    reason = "timeout"
                    break
                if due_at is not None and now >= due_at:
                    look_now = publish = True
                    continue
                if now >= touch_at:  # the session's sign of life; False: a newer waiter took over, or it ended
                    if not await self.db(lambda store: steps.still(self.mailbox_for(store))):
                        reason = "superseded"
                        break
                    touch_at = loop.time() + LAST_SEEN_EVERY_SECONDS
                    continue
                await waiter.sleep(min(deadline, touch_at, due_at if due_at is not None else deadline) - now)
                look_now = waiter.woken
            opened = ended = False
            try:
                return await self.db(end, session, reason, found)
            finally:
                ended = True
        finally:
            self._delist(agent, waiter, watching)
            if opened or not ended:  # ended by an error, the server stopping, or cancelled
                with anyio.CancelScope(shield=True):
                    if opened:
                        await self._release_quietly(session)
                    try:
                        await self.db(lambda store: steps.end(self.mailbox_for(store), []))
                    except errors.AgentMailError:
                        pass

    # -- a look that waits (follow, dashboard) ----------------------------------------------------
    async def until_changed(self, key: str, seconds: float, look: Callable, gone: anyio.Event):
        """A look that waits on the hub, holding neither a thread nor a connection (issue 27): `await look()` (its
        database work on a pooled store) gives (its answer, or None while nothing changed; the seconds until a
        delayed message falls due, or None). Asked at once, then at each wake-up for `key` (an identity, or "" for
        every message: the channel every commit notifies) or for every wait (a broadcast, a revoked token: the look
        re-checks its token, a reconnection), and when that delay is up; None at the end of `seconds` or when the
        client is gone, Stopping when the server stops."""
        await self._started()
        waiter, subscribed, watching = self._enlist(key, gone)
        loop = asyncio.get_running_loop()
        try:
            await self._listening(subscribed, "Ask again.")
            deadline = loop.time() + seconds
            while True:
                if self.stopping:
                    raise Stopping()
                if gone.is_set():
                    return None
                waiter.woken = False  # a wake-up during the look sets it again
                answer, until_due = await look()
                if answer is not None:
                    return answer
                now = loop.time()
                if now >= deadline:
                    return None
                await waiter.sleep(min(deadline, now + until_due if until_due is not None else deadline) - now)
        finally:
            self._delist(key, waiter, watching)

    async def changes(self, key: str, seconds: float, gone: anyio.Event):
        """Wake-ups for `key` ("": every message, and what Store.tell_supervisors announces; a broadcast, a revoked
        token, a reconnection wake it too) as they come, for a stream that holds one enlistment (a console's live
        updates): yields True after each wake-up (those that came while the consumer was busy, as one), False after
        `seconds` without one; ends when the client is gone, Stopping when the server stops. Nothing is missed
        between two yields: the waiter stays enlisted."""
        await self._started()
        waiter, subscribed, watching = self._enlist(key, gone)
        try:
            await self._listening(subscribed, "Load the page again.")
            while True:
                if self.stopping:
                    raise Stopping()
                if gone.is_set():
                    return
                await waiter.sleep(seconds)
                if self.stopping:
                    raise Stopping()
                woken, waiter.woken = waiter.woken, False
                yield woken
        finally:
            self._delist(key, waiter, watching)

    def _enlist(self, key: str, gone: anyio.Event) -> tuple[_Waiter, object, asyncio.Task]:
        """A wait's waiter for `key` (an identity, or "" for every message), counted among the server's waits,
        its channel subscribed on the hub, and a task that wakes it when its client is gone: a plain task,
        cancelled by _delist (a task group's cancel scope costs ~20 times as much, a thousand times over when a
        broadcast ends every wait at once); it only waits, so it has nothing to raise."""
        waiter = _Waiter(key)
        self._waiters.setdefault(key, set()).add(waiter)
        subscribed = self.hub.subscribe(key)

        async def hung_up():
            await gone.wait()
            waiter.wake()
        return waiter, subscribed, asyncio.get_running_loop().create_task(hung_up())

    def _delist(self, key: str, waiter: _Waiter, watching: asyncio.Task) -> None:
        """Undo _enlist once the wait is over."""
        watching.cancel()
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._waiters[key]
        self.hub.unsubscribe(key)

    # -- the steps of many waits, batched ---------------------------------------------------------
    @staticmethod
    def _open_all(store, items: list[tuple[str, str, str]]) -> list:
        """Write the sessions of (session, agent, the client's machine), and each identity's activity (one
        transaction, one commit)."""
        with store.transaction(write=True):
            now = model.now_iso()
            for session, agent, host in items:
                store.open_session(session, agent, now, host or None)
                store.note_active(agent, host, now)
        return [None] * len(items)

    def _look_all(self, store, items: list[tuple[str, bool, dict | None, str | None]]) -> list:
        """Look for each (agent, publish due mail first, the grant whose token is to be asked about first, or
        None, the session to ask about first, or None): (envelopes, seconds until the next due) each, or
        errors.Forbidden where that token was revoked (asked once per token), or (None, None) where that session was
        released (by its client's stop call: where the hub does not say so itself)."""
        from agent_mail.operations import tokens
        from agent_mail.parts.waits import Waits

        released = set()
        if any(session is not None for _, _, _, session in items):
            with store.transaction():
                released = {session for _, _, _, session in items
                            if session is not None and store.session_state(session) == "released"}
        refused: dict[str, Exception | None] = {}
        for _, _, grant, _ in items:
            if grant is not None and grant["id"] not in refused:
                try:
                    tokens.still_valid(store, grant)
                    refused[grant["id"]] = None
                except errors.Forbidden as exc:
                    refused[grant["id"]] = exc
        waits = Waits(self.mailbox_for(store))
        if any(publish for _, publish, _, _ in items):
            waits.mailbox.publish_due()
        looking = [agent for agent, _, grant, _ in items if grant is None or refused[grant["id"]] is None]
        found = waits.looks(list(dict.fromkeys(looking)))
        return [refused[grant["id"]] if grant is not None and refused[grant["id"]] is not None else
                (None, None) if session in released else found[agent] for agent, _, grant, session in items]

    @staticmethod
    def _release_all(store, items: list[tuple[str, str, str, list | None]]) -> None:
        """Release the sessions of every (session, reason, agent, found) ending together, and abandon those whose
        clients hung up ("client gone": Store.abandon_sessions): one commit."""
        by_reason: dict[str, list[str]] = {}
        for session, reason, _, _ in items:
            by_reason.setdefault(reason, []).append(session)
        with store.transaction(write=True):
            now = model.now_iso()
            for reason, sessions in by_reason.items():
                if reason == "client gone":
                    store.abandon_sessions(sessions)
                else:
                    store.release_sessions(sessions, now, reason)

    def _answers(self, store, ended: list[tuple[str, str, str, list | None]]) -> list:
        """Each wait's answer as `watch` gives it (operations/mail.py: Mailbox._watch_result, whose every step this
        takes), for many waits in one read transaction, once their sessions are released: the mirrors of those told of
        mail brought up to date, and whether each is reachable after its wait (another watch of its armed) from
        one liveness look-up. None where the client is gone."""
        from agent_mail.parts.liveness import describe_liveness
        from agent_mail.operations.results import next_steps

        items = [(agent, found) for _, _, agent, found in ended]
        agents = {agent for agent, _ in items}
        with store.transaction():
            told = {agent for agent, found in items if found}
            if told and store.kind != "sqlite":
                mirrored = sorted(told & set(store.mirrored_agents()))
                if mirrored:
                    self.mailbox_for(store).mirrors.render(mirrored)
            facts = store.liveness(next(iter(agents)) if len(agents) == 1 else None)
            now = model.now()
            answers = []
            for agent, found in items:
                if found is None:
                    answers.append(None)
                    continue
                reachable = describe_liveness(facts.get(agent), now)["watch_state"] == "armed"
                answers.append({"agent": agent, "messages": found, "count": len(found), "timeout": not found,
                                "reachable": reachable,
                                "next": next_steps(agent, unread=len(found), reachable=reachable)})
        return answers

    async def _listening(self, subscribed, then: str) -> None:
        """Until the hub LISTENs for a wait (`subscribed`), at most hub_patience(); StorageError saying `then`
        after it."""
        try:
            with anyio.fail_after(self.hub_patience()):
                await asyncio.wrap_future(subscribed)
        except TimeoutError:
            said = f"the server lost its connection to its database and could not listen for this wait; nothing was " \
                   f"changed. {then}"
            raise errors.StorageError(said, told=said) from None

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

    async def _until_mail(self, waiter: _Waiter, seconds: float, grant: dict, since: int, gone: anyio.Event,
                          session: str):
        """The loop of Waits.wait_for_mail, awaiting instead of blocking: the envelopes found, [] at the deadline,
        None when the client is gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        look_now, publish, due_at = "first", False, None
        while True:
            if self.stopping:
                raise Stopping()
            if gone.is_set() or waiter.released:
                return None
            if look_now:
                waiter.woken = False  # a wake-up during the look sets it again: looked at after
                token, generation = grant["id"], self.generation
                if token in self._revoked:
                    raise self._revoked[token]
                ask = max(since, self._valid.get(token, -1)) < generation
                asked = session if look_now is True and not getattr(self.hub, "announces_releases", True) \
                    else None  # woken: was its session released by its client's stop call? (SQLite)
                try:
                    found, until_due = await self._looks.do((waiter.agent, publish, grant if ask else None, asked))
                except errors.Forbidden as refused:
                    self._revoked[token] = refused
                    raise
                if found is None:  # released
                    waiter.released = True
                    return None
                if ask:
                    self._valid[token] = max(self._valid.get(token, -1), generation)
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
            await waiter.sleep(min(deadline, due_at if due_at is not None else deadline) - now)
            look_now = waiter.woken
