"""Waiting for a state by looking at it, never by a fixed sleep: until() polls a predicate; armed() and
disarmed() wait for watches to be blocked on their identities (or not any more); presences() reads them."""

from __future__ import annotations

import os
import time

from tests.lib.mailbox import THE_MAILBOX


def until(predicate, timeout: float = 30.0, what=None, interval: float = 0.05):
    """Poll `predicate` until it returns something true, and return that. After `timeout` seconds the test
    fails, saying `what` (a string, or a function giving one at that moment: the state it found)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g} s: {said or getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)


def presences(agents, mailbox=None) -> dict[str, dict]:
    """{identity: its presence as `status` shows it (watching, watch_state, reachable...)} for `agents` (one
    identity or several), read in this process from `mailbox` (a file path or a PostgreSQL URL; by default the
    running test's own mailbox, the file or schema itself, also under AGENT_MAIL_TEST_THROUGH=server)."""
    from agent_mail.parts.liveness import presence
    from agent_mail.store import open_store

    agents = [agents] if isinstance(agents, str) else list(agents)
    location = str(mailbox if mailbox is not None else THE_MAILBOX["location"])
    if "://" not in location and not os.path.exists(location):  # not made yet: looking must not make it
        return {agent: {"watching": False, "watch_state": "never"} for agent in agents}
    store = open_store(location)
    try:
        with store.transaction():
            return {agent: presence(store, agent) for agent in agents}
    finally:
        store.close()


def _watches_reach(agents, mailbox, timeout: float, procs, armed: bool) -> float:
    started = time.monotonic()
    seen: dict = {}

    def reached() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                if proc.stdin is not None and proc.stdin.closed:
                    proc.stdin = None  # written and closed already: communicate() would flush it
                out, err = proc.communicate()
                raise AssertionError(f"a watch ended (exit {proc.returncode}) before the state: {out!r} {err!r}")
        seen.update({a: p["watch_state"] for a, p in presences(agents, mailbox).items()})
        return all((state == "armed") == armed for state in seen.values())

    until(reached, timeout, lambda: f"watch states {seen}, waiting for them {'' if armed else 'not '}to be armed")
    return time.monotonic() - started


def armed(agents, mailbox=None, *, timeout: float = 30.0, procs=()) -> float:
    """Until every one of `agents` (one identity or several) reads as armed in `status` (a watch blocked on it:
    mail committed from now on wakes it), on `mailbox` (the test's own by default); how long that took. Fails
    at once, with its output, if one of `procs` (the watch processes) ends first."""
    return _watches_reach(agents, mailbox, timeout, procs, armed=True)


def disarmed(agents, mailbox=None, *, timeout: float = 30.0) -> float:
    """Until none of `agents` reads as armed any more (its watch released, or gone stale); how long that took."""
    return _watches_reach(agents, mailbox, timeout, (), armed=False)
