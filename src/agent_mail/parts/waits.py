"""The blocking waits: a watch (or a hook's waiter) blocked until mail for its agent arrives, and
`notifications --follow` keeping a mirror current. Each holds a liveness session or a listen, turns
SIGTERM / SIGHUP / SIGINT into a clean exit that releases it, and holds no transaction while it waits.
"""

from __future__ import annotations

from agent_mail import errors, model

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Emit = Callable[[dict], None]

# A blocked watch looks at the mailbox itself this often, whatever woke it or not (see Waits.wait_for_mail).
SAFETY_CHECK_SECONDS = 15.0
RELEASE_PATIENCE_SECONDS = 0.3  # how long a stopped watch waits for the write lock to release its session
FOUND_RELEASE_PATIENCE_SECONDS = 1.0  # how long a watch that found mail waits for it (then answers all the same)


class HungUp(errors.AgentMailError):
    """A server's watch whose client hung up without stopping it (killed, or its connection dropped): the wait
    ends, its session is left armed and abandoned (Store.abandon_sessions: stale at once, as a killed watch's on
    the mailbox's machine), and there is nobody to answer."""

    def __init__(self):
        super().__init__("the client hung up without stopping its wait; the wait ended and its session reads as "
                         "stale (stopped without exiting).")


class Released(errors.AgentMailError):
    """A server's watch whose session its client released (POST /v1/watch/stop, through any replica, when a
    signal stopped it): the wait ends with nothing found, its session left released."""

    http_status = 409

    def __init__(self):
        super().__init__("this wait's session was released by its client (POST /v1/watch/stop); the wait ended "
                         "with nothing found.")


def asked_when_woken(wanted):
    """Mark `wanted` (a blocking wait's "go on?") as asked when the wait is woken and at its refreshes only, not
    every REFRESH_SECONDS: every change it looks for comes with a wake-up (a token revoked, the server stopping,
    the client hanging up, a stop call: Store.wake_waits, Store.announce_release). A thousand idle waits then cost
    no transaction every few seconds each (issue 27: ~5 % of a core doing nothing)."""
    wanted.when_woken = True
    return wanted


class Stopped(Exception):
    """A signal ended a blocked watch."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT")


def install_stop_handlers(names: tuple[str, ...] = STOP_SIGNALS) -> dict:
    """Turn SIGTERM / SIGHUP / SIGINT (or those of `names`) into an exception, so a stopped watch releases its
    session."""
    import signal

    def stop(signum, frame):
        raise Stopped(signum)

    previous = {}
    for name in names:
        number = getattr(signal, name, None)
        if number is None:
            continue
        try:
            previous[number] = signal.signal(number, stop)
        except (ValueError, OSError):  # not the main thread, or not allowed here
            pass
    return previous


def restore_handlers(previous: dict) -> None:
    import signal

    for number, handler in previous.items():
        signal.signal(number, handler)


def hush_handlers(previous: dict) -> None:
    """Ignore the signals install_stop_handlers took (`previous`) until restore_handlers: on the way out of a stopped
    wait, a second signal must not break off the release with an exception nobody catches."""
    import signal

    for number in previous:
        signal.signal(number, signal.SIG_IGN)


def _not_held(found, held: dict | None):
    """Envelopes `found` (a list, or jsonout.Rendered) without those whose ids are `held`."""
    if not held or not found:
        return found
    return [envelope for envelope in found if envelope["id"] not in held]


class Waits:
    """The blocking operations of one mailbox."""

    def __init__(self, mailbox):  # the agent_mail.operations.mail.Mailbox whose operations these are
        self.mailbox = mailbox
        self.store = mailbox.store

    def wait_armed(self, agent: str, seconds: float, look_for=None, wanted=None, session: str | None = None,
                   also: tuple[int, ...] = (), stop_on: tuple[str, ...] = STOP_SIGNALS) -> list[dict]:
        """Block as a watch does (an armed liveness session, released on the way out, signals included) until
        look_for() finds something, wanted() turns False, one of `also` reads as ready (a pidfd: the harness the
        waiter serves ended) or `seconds` pass; what was found, or []. `session`: the session's id (a server's, made
        from its client's key), else a new one. wanted() raising HungUp leaves the session armed and abandoned
        instead. `stop_on`: the signals that end it (agent-mail run's helper leaves SIGINT to its own handler and
        is told of a change by `also`, its control pipe)."""
        self.store.relax_durability()  # this connection writes liveness only; skip its syncs
        session = session or model.new_message_id()
        previous = install_stop_handlers(stop_on)
        try:
            # Listening first: where the listener holds the session's presence (a lock, a connection), the
            # session's row never exists without it, so a reader never takes a starting watch for a dead one.
            self.store.listen(agent, session)
            with self.store.transaction(write=True):
                at = model.now_iso()
                self.store.open_session(session, agent, at, self.mailbox.host or None)
                self.store.note_active(agent, self.mailbox.host, at)
            found = self.wait_for_mail(agent, session, seconds, look_for, wanted, also)
            if found:  # the mail is the answer: a release that cannot take the write lock in time must not lose it
                # (a thousand waits woken at once through a SQLite-backed server: issue 27); the session is left
                # armed, and reads as stale once its wake-up pipe is gone with the wait
                self.release(session, "mail", quietly=True, patience=FOUND_RELEASE_PATIENCE_SECONDS)
            else:
                self.release(session, "timeout")
            return found
        except Stopped as stop:
            hush_handlers(previous)
            self.release(session, f"signal {stop.signum}", quietly=True)
            import signal

            name = signal.Signals(stop.signum).name
            raise errors.Interrupted(f"the wait for {agent} was stopped by {name}; its session was released, "
                                     "so status shows it as released, not armed.", 128 + stop.signum) from None
        except HungUp:
            try:
                with self.store.transaction(write=True):
                    self.store.abandon_sessions([session])
            except errors.StorageError:
                pass  # the hang-up is what to report; an armed session left as it is turns stale by itself
            raise
        except BaseException:
            hush_handlers(previous)
            self.release(session, "error", quietly=True)
            raise
        finally:
            restore_handlers(previous)

    def wait_unarmed(self, agent: str, seconds: float, look_for=None, wanted=None, also: tuple[int, ...] = (),
                     stop_on: tuple[str, ...] = STOP_SIGNALS) -> list[dict]:
        """Block as wait_armed does, woken by the same wake-ups, but holding no liveness session: the wait of a
        process that wants to know of mail without telling senders it will be woken (agent-mail run while it
        cannot type into its program). A signal of `stop_on` ends it with errors.Interrupted (128+N)."""
        self.store.relax_durability()
        previous = install_stop_handlers(stop_on)
        try:
            self.store.listen(agent)
            return self.wait_for_mail(agent, None, seconds, look_for, wanted, also)
        except Stopped as stop:
            import signal

            name = signal.Signals(stop.signum).name
            raise errors.Interrupted(f"the wait for {agent} was stopped by {name}.", 128 + stop.signum) from None
        finally:
            restore_handlers(previous)

    def release(self, session: str, reason: str, quietly: bool = False, patience: float | None = None) -> None:
        """Mark the session released (a no-op if it never got stored or is released already).

        On the way out of a failure or a signal (quietly) the lock is waited for briefly only: a
        signal must end the process promptly, and a session left armed turns stale by itself.
        """
        try:
            self.store.release_session_alone(session, model.now_iso(), reason,
                                             patience=patience or (RELEASE_PATIENCE_SECONDS if quietly else None))
        except errors.StorageError:
            if not quietly:  # on the way out of another failure, that failure is the one to report
                raise

    def envelopes(self, agent: str) -> list[dict]:
        """`agent`'s unread envelopes, but for those held for a reader that has not confirmed them yet
        (operations.deliveries): that mail is being delivered, not waiting (a watch woken by it would wake its
        agent for a read that finds nothing)."""
        with self.store.transaction():
            now = model.now_iso()
            found = self.store.unread(agent, now, lean=True, layout_level=2)  # result.messages[i]
            holds = self.store.holds_of_many([agent], now) if found else {}
        return _not_held(found, holds.get(agent))

    def looks(self, agents: list[str]) -> dict[str, tuple[list[dict], float | None]]:
        """What a look of each of `agents` finds, in one transaction of three statements: {agent: (its envelopes,
        or [] and the seconds until its next scheduled message falls due or a hold on its mail ends, or None)} (a
        server's waits woken together)."""
        now = model.now()
        at = model.iso(now)
        with self.store.transaction():
            unread = self.store.unread_of_many(agents, at)  # one statement for them all, not one each
            holds = self.store.holds_of_many(agents, at)
            unread = {agent: _not_held(unread[agent], holds.get(agent)) for agent in agents}
            nothing = [agent for agent in agents if not unread[agent]]
            dues = self.store.next_due_of_many(nothing, at) if nothing else {}
        found = {}
        for agent in agents:
            due = model.parse_iso(min((d for d in (dues.get(agent), *holds.get(agent, {}).values()) if d),
                                      default=None))
            found[agent] = (unread[agent], None if due is None else max(0.0, (due - now).total_seconds()))
        return found

    def next_due(self, agent: str) -> float | None:
        """Seconds until the next scheduled message for `agent` falls due, or a hold on its mail ends (then it is
        waiting again), or None."""
        now = model.now()
        with self.store.transaction():
            at = model.iso(now)
            due = self.store.next_due(agent, at)
            holds = self.store.holds_of_many([agent], at).get(agent, {})
        moment = model.parse_iso(min((d for d in (due, *holds.values()) if d), default=None))
        return None if moment is None else max(0.0, (moment - now).total_seconds())

    def wait_for_mail(self, agent: str, session: str | None, seconds: float, look_for=None, wanted=None,
                      also: tuple[int, ...] = ()) -> list[dict]:
        """The blocking loop: sleep until `agent` is woken (mail for it, or a broadcast, was committed) or a
        scheduled message for it falls due, refreshing liveness; return the envelopes, or [] at the deadline.
        The caller has called store.listen(agent, session) already (before the first look here: mail committed
        after it always wakes us).

        look_for(): what to look for instead of every unread envelope (a hook's waiter: mail its session was
        not told of); wanted(): checked at each refresh (every `wanted.every` seconds where it says), False ends
        the wait as a timeout (its harness is gone); `also`: descriptors slept on with the wake-ups, one that reads
        as ready ends the wait as a timeout at once, before any look (the pidfd of a waiter's harness: it ended).

        Nothing else wakes it: not other watches' refreshes, heartbeats, reads or mail for others. Every
        HELD_REFRESH_SECONDS (SAFETY_CHECK_SECONDS where its presence is not held) it also checks that its
        mailbox is still there and whether any message was added at all, and looks if so: the safety net
        for mail whose wake-up was lost (a sender killed between its commit and its wake-up, another tool
        writing the mailbox).
        """
        import time

        now = time.monotonic()
        if self.store.presence_held:
            # What the watch holds says it is alive and is freed when it dies, so idle costs one wake-up every
            # HELD_REFRESH_SECONDS (a refresh that shows it is not hung, and the look for lost wake-ups), not
            # one every few seconds: a thousand idle watches make a handful of wake-ups a second.
            refresh_every = check_every = model.HELD_REFRESH_SECONDS
        else:
            refresh_every = model.REFRESH_SECONDS * self.store.idle_scale
            check_every = SAFETY_CHECK_SECONDS * self.store.idle_scale
        deadline, refresh_at, check_at = now + seconds, now + refresh_every, now + check_every
        # wanted() is asked every REFRESH_SECONDS whatever the backend (it costs no round trip), or, marked
        # asked_when_woken, at each wake-up and refresh only.
        ask_every = refresh_every if getattr(wanted, "when_woken", False) else getattr(wanted, "every",
                                                                                        model.REFRESH_SECONDS)
        ask_at = now + ask_every if wanted is not None else deadline
        marker = self.store.mail_marker()
        look, due_at = True, None
        while True:
            if due_at is not None and time.monotonic() >= due_at:
                self.mailbox.publish_due()
                look = True
            if look:
                messages = self.envelopes(agent) if look_for is None else look_for()
                if messages:
                    return messages
                until_due = self.next_due(agent)
                due_at = None if until_due is None else time.monotonic() + until_due
                look = False
            now = time.monotonic()
            if now >= deadline:
                return []
            if now >= ask_at:
                if not wanted():
                    return []
                ask_at = now + ask_every
            if now >= refresh_at:
                if session is not None:  # None: a wait that holds no session (wait_unarmed)
                    self.store.refresh_session(session, model.now_iso())
                refresh_at = now + refresh_every
            if now >= check_at:
                self.store.check_still_there()
                check_at = now + check_every
                current = self.store.mail_marker()
                if current != marker:
                    marker, look = current, True
                    continue
            wake = min(deadline, refresh_at, check_at, ask_at, due_at if due_at is not None else deadline)
            if self.store.wait_for_wake(max(0.0, wake - now), also) if also else \
                    self.store.wait_for_wake(max(0.0, wake - now)):
                if also:
                    from agent_mail.files import wait_readable

                    if wait_readable(list(also), 0):
                        return []  # what it also watches ended: no look, nothing told to a harness that is gone
                look = True
                if wanted is not None:  # asked again at once: a wake-up may also say the caller is gone (a
                    ask_at = 0.0  # server stopping, a token revoked)

    def follow(self, agent: str, emit: Emit) -> dict:
        """Re-render `agent`'s mirror whenever a wake-up for it arrives (mail committed by anyone, on any
        machine), a delayed message falls due, or the safety-net look finds new mail; until a signal."""
        import time

        from agent_mail import jsonout

        with self.store.transaction():
            profile = self.store.profile(agent)
        if not profile or not profile["mirror_dir"]:
            raise errors.InvalidInput([("follow", f"{agent} has no mirror directory to keep current; set one "
                                                    f"first: agent-mail profile {agent} --mirror-dir DIR")])
        previous = install_stop_handlers()
        updates = 0
        try:
            self.store.listen(agent)
            marker = self.store.mail_marker()
            check_every = SAFETY_CHECK_SECONDS * self.store.idle_scale
            check_at = time.monotonic() + check_every
            while True:
                self.mailbox.publish_due()
                with self.store.transaction():
                    mirrors = self.mailbox.mirrors.render([agent], system=True)
                    unread = self.store.count_unread(agent, model.now_iso())
                emit(jsonout.OneLine(agent=agent, unread=unread, mirrors=mirrors, at=model.now_iso()))
                updates += 1
                until_due = self.next_due(agent)
                while True:
                    now = time.monotonic()
                    wait = check_at - now if until_due is None else min(check_at - now, until_due)
                    if self.store.wait_for_wake(max(0.0, wait)):
                        break
                    if time.monotonic() >= check_at:
                        check_at = time.monotonic() + check_every
                        self.store.check_still_there()
                        current = self.store.mail_marker()
                        if current != marker:
                            marker = current
                            break
                    if until_due is not None:
                        break
        except Stopped as stop:
            import signal

            result = jsonout.OneLine(agent=agent, updates=updates, stopped_by=signal.Signals(stop.signum).name)
            emit(result)
            return result
        finally:
            restore_handlers(previous)

