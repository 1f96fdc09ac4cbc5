"""Who is there: watch sessions and heartbeats read as states, process checks, reachability.

The stored facts (sessions, heartbeats, human profiles) come from the store; what they mean
(watching, armed, stale, reachable) is decided here, once, for every front end.
"""

from __future__ import annotations

import datetime as _dt
import os

from agent_mail import model

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent_mail.store.base import Store

_NEVER = {"armed_seen": None, "released_at": None, "session_seen": None, "heartbeat": None, "sessions": 0}


def describe_liveness(facts: dict | None, at: _dt.datetime) -> dict:
    """watching / last_seen / watch_state / released_at / reachable from stored liveness facts."""
    facts = facts or _NEVER

    def within(moment, seconds):
        return moment is not None and (at - moment).total_seconds() <= seconds

    seen = [m for m in (facts["session_seen"], facts["heartbeat"]) if m is not None]
    last_seen = max(seen) if seen else None
    armed_seen, released_at = facts["armed_seen"], facts["released_at"]
    if not facts["sessions"]:
        state = "never"
    elif within(armed_seen, model.STALE_SECONDS):
        state = "armed"
    elif armed_seen is not None and (released_at is None or armed_seen > released_at):
        state = "stale"  # the newest session stopped refreshing without ever exiting: killed
    else:
        state = "released"
    return {
        "watching": within(last_seen, model.LIVENESS_SECONDS),
        "last_seen": model.iso(last_seen) if last_seen else None,
        "watch_state": state,
        "released_at": model.iso(released_at) if released_at else None,
        "reachable": state == "armed" or within(facts["heartbeat"], model.LIVENESS_SECONDS),
    }


def presence(store: Store, agent: str) -> dict:
    """describe_liveness of `agent` now."""
    return describe_liveness(store.liveness(agent).get(agent), model.now())


def reachability(store: Store, agents: list[str]) -> dict[str, bool]:
    """Whether each identity can be reached now: armed watch, fresh heartbeat, or a human."""
    if not agents:
        return {}
    at = model.now()
    facts = store.liveness(agents[0]) if len(agents) == 1 else store.liveness()
    humans = store.humans()
    return {a: a in humans or describe_liveness(facts.get(a), at)["reachable"] for a in agents}


def anyone_reachable(store: Store, besides: str) -> bool:
    """Whether any identity but `besides` can be reached: only those with liveness or a human
    profile can be, so there is no need to list every identity in the mailbox."""
    at = model.now()
    if store.humans() - {besides}:
        return True
    return any(describe_liveness(facts, at)["reachable"]
               for agent, facts in store.liveness().items() if agent != besides)


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` (on this machine) still runs; True when unknown."""
    if not pid:
        return True  # unknown: assume so
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def host_name() -> str:
    return os.uname().nodename


def live_sessions(sessions: list[dict], now: _dt.datetime) -> list[dict]:
    """Of harness sessions not ended, those still live: on this machine, while their harness process runs;
    elsewhere (or of unknown process), seen within the last day."""
    host = host_name()
    live = []
    for session in sessions:
        if session.get("host") == host and session.get("pid"):
            if pid_alive(session["pid"]):
                live.append(session)
        else:
            seen = model.parse_iso(session.get("last_seen"))
            if seen is not None and (now - seen).total_seconds() < 86400:
                live.append(session)
    return live
