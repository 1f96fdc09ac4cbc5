"""Who is there: watch sessions and heartbeats read as states, process checks, reachability.

The stored facts (sessions, heartbeats, human profiles) come from the store; what they mean
(watching, armed, stale, reachable) is decided here, once, for every front end.
"""

from __future__ import annotations

import os

from agent_mail import harnesses, model

TYPE_CHECKING = False
if TYPE_CHECKING:
    import datetime as _dt

    from agent_mail.store.base import Store

_NEVER = {"armed_seen": None, "released_at": None, "session_seen": None, "heartbeat": None, "sessions": 0}

# How a live harness session hears of new mail, in words that start with how soon: "woken now" (its idle
# session is started by a waiter its hooks run), "woken within ..." (a waker hands the envelopes over through the
# harness's own primitive, which is slower), "told at its next ..." (no waiter: the model is told when the session
# next runs a hook), "not listening" (nothing will tell it). Each harness's words are its record's
# (agent_mail.harnesses): `woken` for a live session whose waiter is armed (hooks.py, operations.telling), `told`
# for a live session without one (at work, or a harness that cannot be woken while idle);
# and, for a live session of a harness that wakes, idle with no waiter armed (before its first turn ended, or after
# its waiter's wait ran out), idle_words. A session at work (its turn's start stood its waiter down) says `told`.
ARMED_WATCH = "woken now (an armed watch: `watch`, or a harness under `agent-mail run`, woken at its idle prompt)"
HUMAN = "read by a person (human profile): reads the inbox"
NOT_LISTENING = "not listening"
WAITING = "/waiting"  # harnesses_of's mark on a live session whose waiter is armed
UNARMED = "/idle"  # and on one of a harness that wakes, idle with no waiter armed
# What a harness session's waiter column holds instead of a waiter's process token (operations.telling): AT_WORK,
# a turn started (its prompt or tool hooks ran) and stood the waiter down; HELD, its stop was held (the turn goes
# on), so a waiter armed by the same stop stands down too. Neither is a process.
AT_WORK = "at-work"
HELD = "held"
MARKS = (AT_WORK, HELD)


def idle_words(kind) -> str:
    """How a live session of the harness `kind` (its record) hears of mail while idle with no waiter armed."""
    return f"told at its next prompt (a live {kind.title} session, idle with no waiter armed: one arms when a turn " \
           "ends)"


def _words(way: str) -> str | None:
    """The words of one of harnesses_of's entries (a harness's name, marked)."""
    name, slash, rest = way.partition("/")
    kind = harnesses.get(name)
    if kind is None:
        return None
    if slash + rest == WAITING and kind.woken is not None:
        return kind.woken
    if slash + rest == UNARMED:
        return idle_words(kind)
    return kind.told


def _soonest(ways: list[str]) -> str | None:
    """The words of the soonest of a live identity's harness sessions (harnesses_of's entries), or None."""
    words = [w for w in map(_words, ways) if w is not None]
    order = ("woken now", "woken within a second", "woken within about a second", "woken within seconds", "told")
    return min(words, key=lambda w: next((i for i, o in enumerate(order) if w.startswith(o)), len(order)),
               default=None)


def describe_liveness(facts: dict | None, at: _dt.datetime, harnesses: list[str] | tuple = (),
                      human: bool = False) -> dict:
    """watching / last_seen / watch_state / released_at / reachable / reached_by from stored liveness facts
    and the identity's live harness sessions (harnesses_of's entries: a session whose hooks will tell the model is
    listening, whether or not a watch is armed at this moment; one whose waiter is armed will be woken); a human
    is always reachable. reached_by says how soon, in words (a harness's woken or told words, ...), or "not
    listening" and why."""
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
    session = _soonest(list(harnesses))
    if human:
        reached_by = HUMAN
    elif session is not None and session.startswith("woken"):
        reached_by = session
    elif state == "armed":
        reached_by = ARMED_WATCH
    elif session is not None:
        reached_by = session
    elif within(facts["heartbeat"], model.LIVENESS_SECONDS):
        reached_by = f"told when it next looks (a heartbeat in the last {model.LIVENESS_SECONDS:.0f} s)"
    else:
        reached_by = None
    return {
        "watching": within(last_seen, model.LIVENESS_SECONDS),
        "last_seen": model.iso(last_seen) if last_seen else None,
        "watch_state": state,
        "released_at": model.iso(released_at) if released_at else None,
        "reachable": reached_by is not None,
        "reached_by": reached_by if reached_by is not None else f"{NOT_LISTENING} ({_deaf(state)})",
    }


def _deaf(state: str) -> str:
    """Why an identity is not listening, by its watch state."""
    if state == "never":
        return "no live harness session, no watch, no recent heartbeat"
    if state == "stale":
        return "its watch stopped refreshing without exiting (killed?); no live harness session"
    return "its last watch ended and was not re-armed; no live harness session"


def harnesses_of(store: Store, agent: str | None = None, live: list[dict] | None = None) -> dict[str, list[str]]:
    """{identity: the harnesses of its live harness sessions} (of `agent`, or of everyone; `live`: those sessions,
    when the caller has them), each of a harness that wakes marked WAITING where the session's waiter is armed (it
    will be woken when idle), UNARMED where it is idle with none (told at its next prompt), and left unmarked while
    it is at work (told by its hooks)."""
    found: dict[str, list[str]] = {}
    if live is None:
        live = live_sessions(store.harness_sessions_of(agent), model.now())
    for session in live:
        kind, waiter, mark = harnesses.get(session["harness"]), session.get("waiter"), ""
        if kind is not None and kind.woken is not None and waiter not in MARKS:
            mark = WAITING if _waiting(waiter) else UNARMED
        found.setdefault(session["agent"], []).append(session["harness"] + mark)
    return found


def hosts_of(active: dict | None, live: list[dict]) -> list[str]:
    """The machines an identity is on, the latest first: where it did anything in the last model.HOSTS_SECONDS
    and where a watch of its is armed (Store.activity's entry, `active`), and where a harness session of its is
    live (`live`: those sessions; one reached through a server by the machine its client named)."""
    latest = dict(active["hosts"]) if active else {}
    for session in live:
        host = model.host_shown((session.get("host") or "").removesuffix(SERVED))
        if host is not None:
            latest[host] = max(latest.get(host, ""), session.get("last_seen") or "")
    return sorted(latest, key=lambda host: (latest[host], host), reverse=True)


def recent_since(at: _dt.datetime) -> str:
    """The moment from which what an identity did counts among its hosts (hosts_of)."""
    return model.iso(at - model.timedelta(seconds=model.HOSTS_SECONDS))


def _waiting(waiter: str | None) -> bool:
    """Whether a session's waiter (its process token, pid:start@host) is still there: on this machine, while
    that process runs; elsewhere, while the session names it (a served waiter is forgotten when its request ends)."""
    if not waiter or waiter in MARKS:
        return False
    pid, _, rest = waiter.partition(":")
    if rest.partition("@")[2] != host_name() or not pid.isdigit():
        return True
    from agent_mail.files import pid_alive  # here, not at the top: files is no part of a brief command's start

    return pid_alive(int(pid))


def presence(store: Store, agent: str) -> dict:
    """describe_liveness of `agent` now."""
    return describe_liveness(store.liveness(agent).get(agent), model.now(), harnesses_of(store, agent).get(agent, ()),
                             agent in store.humans())


def reachability(store: Store, agents: list[str]) -> dict[str, str | None]:
    """How each identity can be reached now (describe_liveness's reached_by: a live harness session, an armed
    watch, a fresh heartbeat, or a human), or None where it cannot (not listening)."""
    if not agents:
        return {}
    at = model.now()
    one = agents[0] if len(agents) == 1 else None
    facts, harnesses = store.liveness(one), harnesses_of(store, one)
    humans = store.humans()
    found = {a: describe_liveness(facts.get(a), at, harnesses.get(a, ()), a in humans) for a in agents}
    return {a: seen["reached_by"] if seen["reachable"] else None for a, seen in found.items()}


def anyone_reachable(store: Store, besides: str) -> bool:
    """Whether any identity but `besides` can be reached: only those with liveness, a live harness session or
    a human profile can be, so there is no need to list every identity in the mailbox."""
    at = model.now()
    if store.humans() - {besides}:
        return True
    if set(harnesses_of(store)) - {besides}:
        return True
    return any(describe_liveness(facts, at)["reachable"]
               for agent, facts in store.liveness().items() if agent != besides)


def for_send(store: Store, sender: str, recipients: list[str], require: bool) -> dict:
    """What a send needs to know of liveness, asked once before it writes: how each recipient can be reached
    (`reached`: the words, or None), whether it can (`reachable`, '*' for anyone but the sender, the sender
    itself always), why not where the send requires it (`refusals`), and the sender's own presence."""
    reached = reachability(store, [r for r in recipients if r not in (sender, model.BROADCAST)])
    reachable = {recipient: how is not None for recipient, how in reached.items()}
    if model.BROADCAST in recipients:
        reachable[model.BROADCAST] = anyone_reachable(store, besides=sender)
    reachable[sender] = True  # a note to yourself needs no check
    refusals = {r: refusal(store, r) for r in recipients if require and not reachable[r]}
    return {"reached": reached, "reachable": reachable, "refusals": refusals, "sender": presence(store, sender)}


def refusal(store: Store, recipient: str) -> str:
    """Why a send that requires a reachable recipient refuses `recipient`."""
    if recipient == model.BROADCAST:
        return "nobody is reachable now: no identity has an armed watch, a recent heartbeat or a human profile."
    found = presence(store, recipient)
    state = found["watch_state"]
    seen = f", last seen {found['last_seen']}" if found["last_seen"] else ""
    if state == "never":
        return f"{recipient} is not reachable: it has never watched and sent no recent heartbeat{seen}."
    if state == "stale":
        return f"{recipient} is not reachable: its watch stopped refreshing without exiting (killed?){seen}."
    return f"{recipient} is not reachable: its last watch ended at {found['released_at']} and was not " \
           f"re-armed{seen}."


def host_name() -> str:
    return os.uname().nodename


# The mark on the machine name of a harness session whose hooks reach the mailbox through `agent-mail serve`
# (agent_mail.operations.telling): nobody here can see its process, so it is live while its hooks show signs of life.
SERVED = " (through agent-mail serve)"
SERVED_SESSION_SECONDS = 600.0


def live_sessions(sessions: list[dict], now: _dt.datetime) -> list[dict]:
    """Of harness sessions not ended, those still live: on this machine, while their harness process runs;
    through a server, seen within SERVED_SESSION_SECONDS (any hook of it; its waiter refreshes it every minute
    while it is idle, and ends it when its harness dies); elsewhere (or of unknown process), seen within the last
    day."""
    host = host_name()
    live = []
    for session in sessions:
        if (session.get("host") or "").endswith(SERVED):
            seen = model.parse_iso(session.get("last_seen"))
            if seen is not None and (now - seen).total_seconds() < SERVED_SESSION_SECONDS:
                live.append(session)
        elif session.get("host") == host and session.get("pid"):
            from agent_mail.files import pid_alive

            if pid_alive(session["pid"]):
                live.append(session)
        else:
            seen = model.parse_iso(session.get("last_seen"))
            if seen is not None and (now - seen).total_seconds() < 86400:
                live.append(session)
    return live


_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "fish"}


def harness_pid() -> int | None:
    """The harness process this process (a hook, or the MCP server) runs for: CLAUDE_PID where Claude Code
    gives it; otherwise the parent,
    or the parent's parent when the parent is the shell the harness ran the hook command with."""
    text = os.environ.get("CLAUDE_PID", "")
    if text.isdigit():
        return int(text)
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm") as handle:
            name = handle.read().strip()
        if name in _SHELLS:
            with open(f"/proc/{parent}/stat", "rb") as handle:
                return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return parent


def told_by_tool(store, agent: str, shown: list[str], shown_max: int = 10) -> int:
    """What a tool result showed the model (the MCP server's watch or read, in a harness session) counts as
    told to that session: the live sessions of `agent` whose harness process is this process's (the server is
    the harness's child, as each hook is) are marked told, so no hook tells the same mail again. Only when
    the result showed everything the session had not been told of (mail that came after it stays untold).
    How many sessions were marked."""
    if not shown:
        return 0
    pid, host, shown_ids, marked = harness_pid(), host_name(), set(shown), 0
    if pid is None:
        return 0
    now = model.now_iso()
    with store.transaction(write=True):
        for row in store.harness_sessions_of(agent):
            if row["host"] != host or row["pid"] != pid:
                continue
            session = store.harness_session(row["id"])
            envelopes, new = store.untold(agent, now, session["told_seq"], session["told_at"], shown_max + 1)
            if new > len(envelopes) or any(e["id"] not in shown_ids for e in envelopes):
                continue
            session["told_seq"] = max(session["told_seq"], store.newest_seq())
            session["told_at"] = session["last_seen"] = now
            store.save_harness_session(session)
            marked += 1
    return marked
