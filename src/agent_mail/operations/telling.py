"""What a harness session is told of its mail: the mailbox side of `agent-mail hook` (harness.hooks, the front
end that reads the harness's input and prints its output), shared by a hook that opens the mailbox itself and by
`agent-mail serve`, which carries a hook's step for a client whose mailbox is an agent-mail server.

What a session was told is kept in the mailbox (harness_sessions): the newest message row it was told of and
when, so each message is told once per session, and a new check reads only what came since. The notes and the
documents each harness takes are made here, once, so a hook's output is the same through a server as without one.

A session whose hooks reach the mailbox through a server is recorded with its machine's name marked as served
(liveness.SERVED): the server cannot see the harness's process, so it counts as live while its hooks show signs
of life (see liveness.live_sessions), and its waiter, which holds a long request while the session is idle, keeps
it fresh; the client ends the session when its harness dies.
"""

from __future__ import annotations


from agent_mail import errors, harnesses, jsonout, model, spec
from agent_mail.parts.liveness import AT_WORK, HELD, MARKS, SERVED, harness_pid, live_sessions
from agent_mail.parts.liveness import host_name as _host
from agent_mail.operations.results import no_emit

SHOWN = 10  # envelopes listed in one context note; the rest are counted
LAST_SEEN_EVERY_SECONDS = 60.0  # a quiet check refreshes the session's last_seen at most this often

# What each harness takes and how its idle session is woken (its context output, the decision that holds its stop,
# what it prints when quiet, how it names our MCP tools, whether a waiter wakes it) are its record's
# (agent_mail.harnesses); a Session asks the record of its harness, loaded for that harness only.
# A waiter of a harness that wakes is armed when a turn ends and stood down when the next starts (its prompt hook, or
# the first tool hook of a turn the waiter itself started): the session's waiter column then says AT_WORK
# (liveness), so status and a send's receipt say it is at work, and mail during the turn is told by its hooks
# (after the next tool call, or by holding its stop), not as an idle wake after the turn. A held stop marks it
# HELD: the waiter that the same Stop starts stands down (the turn goes on), unless that Stop is the second
# (stop_hook_active).


def _age(created: str, now) -> str:
    moment = model.parse_iso(created)
    if moment is None:
        return "at an unknown time"
    seconds = max(0, int((now - moment).total_seconds()))
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 172800:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} days ago"


def render(harness: str, agent: str, envelopes: list[dict], new: int, unread: int, events: list[dict],
           others: int = 0, start: bool = False) -> str:
    """The note for the model: what is new, how much is waiting, and the literal next steps."""
    now = model.now()
    lines = []
    if start:
        lines.append(f"agent-mail: you are {agent} on the team mailbox; {unread} unread message"
                     f"{'' if unread == 1 else 's'} waiting. {spec.MAIL_IS_DATA}")
    else:
        lines.append(f"agent-mail: {new} new message{'' if new == 1 else 's'} for {agent} "
                     f"({unread} unread in all). {spec.MAIL_IS_DATA}")
    for envelope in envelopes:
        lines.append(f"- {envelope['id']} from {envelope['sender']}, {_age(envelope['created'], now)}: "
                     f"{jsonout.quoted(envelope['subject'])}"
                     + (" (broadcast)" if envelope.get("recipient") == "*" else ""))
    if new > len(envelopes):
        lines.append(f"- ... and {new - len(envelopes)} more.")
    for event in events:
        if event.get("source") == "email.bounce":
            lines.append(f"- bounce {event['id']}: your message {jsonout.quoted(event.get('subject'))} "
                         f"to {event.get('recipient')} was refused ({event.get('reason')}); dismiss it with "
                         f"`agent-mail notifications {agent} --dismiss {event['id']}` once handled.")
    if others:
        sessions = "1 other live session uses" if others == 1 else f"{others} other live sessions use"
        lines.append(f"Warning: {sessions} the identity {agent}; you will take each other's unread mail. Use a "
                     "distinct identity (agent-mail setup --agent) unless this is intended.")
    kind = harnesses.of(harness) if unread else None
    if kind is not None and not kind.mcp:  # no MCP client: the commands, for its shell tool
        lines.append(f"Next: take delivery with `agent-mail read {agent}` (in your bash tool); after acting on a "
                     f"message, `agent-mail ack {agent} ID`; reply with `agent-mail send --from {agent} --to SENDER "
                     "--subject ... --body ... --reply-to ID`.")
    elif kind is not None:
        lines.append(f"Next: take delivery with {kind.tool_named('read')} (or `agent-mail read {agent}`); after "
                     f"acting on a message, {kind.tool_named('ack')} with its id (`agent-mail ack {agent} ID`); "
                     f"reply with {kind.tool_named('send')} and reply_to=ID.")
    return "\n".join(lines)


def user_line(agent: str, envelopes: list[dict]) -> str:
    """The one line a person watching the session is shown: who wrote and the subject."""
    if not envelopes:
        return f"agent-mail: news for {agent} (a bounce): see the model's next turn."
    first = envelopes[0]
    more = len(envelopes) - 1
    return (f"agent-mail: mail for {agent} from {first['sender']}: {jsonout.quoted(first['subject'])}"
            + (f" (+{more} more)" if more else ""))


class Superseded(Exception):
    """A newer waiter took over this session (or the session ended)."""


class Session:
    """One harness session's dealings with the mailbox. `pid`, `host`: the harness's process and machine (those of
    this process by default; a client's, through a server)."""

    def __init__(self, mailbox, harness: str, agent: str, document: dict, pid: int | None = None,
                 host: str | None = None):
        self.mailbox, self.store = mailbox, mailbox.store
        self.harness, self.agent, self.document = harness, agent, document
        self.kind = harnesses.of(harness)
        self.key = f"{harness}:{document['session_id']}"
        self.event_name = str(document.get("hook_event_name") or "")
        self.pid, self.host = (harness_pid(), _host()) if host is None else (pid, host)
        self.wakes = self.kind.wakes_idle
        self.stood_down: str | None = None  # the waiter a turn's start (or a held stop) stood down, to end

    def _active(self, now: str) -> None:
        """A hook of this session ran (in a write transaction: the common context hook that finds nothing new
        writes nothing, and leaves no trace; it refreshes the session, and so this, once a minute)."""
        self.store.note_active(self.agent, self.mailbox.host, now)

    def _new_session(self, now: str) -> dict:
        return {"id": self.key, "harness": self.harness, "agent": self.agent, "pid": self.pid,
                "host": self.host, "started_at": now, "last_seen": now, "told_seq": 0, "told_at": now,
                "told_event": 0, "waiter": None, "ended_at": None}

    def _untold(self, session: dict, now: str) -> tuple[list[dict], int, list[dict], int]:
        envelopes, new = self.store.untold(self.agent, now, session["told_seq"], session["told_at"], SHOWN)
        events, newest_event = self.store.events_since(self.agent, session["told_event"])
        return envelopes, new, events, newest_event

    def context(self, emit) -> dict | None:
        """Emit the context note to add, if there is anything new (inside the transaction that marks it told:
        if it cannot be printed, it was not told)."""
        now = model.now_iso()
        start = self.event_name == "SessionStart"
        turn = self.wakes and not start  # a prompt or a tool: the session is at work, its waiter stands down
        if not start:
            with self.store.transaction():
                session = self.store.harness_session(self.key)
                if session is not None and session["agent"] == self.agent and not session["ended_at"]:
                    envelopes, new, events, _ = self._untold(session, now)
                    seen = model.parse_iso(session["last_seen"])
                    fresh = seen is not None and (model.now() - seen).total_seconds() < LAST_SEEN_EVERY_SECONDS
                    if not new and not events and fresh and (not turn or session["waiter"] == AT_WORK):
                        return None  # the common case: one read transaction, nothing written
        with self.store.transaction(write=True):
            self._active(now)
            session = self.store.harness_session(self.key)
            if session is None or start or session["agent"] != self.agent or session["ended_at"]:
                note = self._start_note(session, now, at_work=turn)
            else:
                if turn:
                    self._stand_down(session, AT_WORK)
                note = self._tell(session, now)
            output = None if note is None else self.kind.context_output(self.event_name or self.kind.context_event,
                                                                        note)
            if output is not None:
                emit(output)
        return output

    def _stand_down(self, session: dict, mark: str) -> None:
        """Mark the session (AT_WORK, HELD; saved by the caller); the waiter it held is stood down (ended by the
        caller on its machine: stood_down)."""
        if session["waiter"] not in MARKS and session["waiter"] is not None:
            self.stood_down = session["waiter"]
        session["waiter"] = mark

    def _start_note(self, previous: dict | None, now: str, at_work: bool = False) -> str:
        session = self._new_session(now)
        if previous is not None and previous["agent"] == self.agent:
            session["started_at"], session["waiter"] = previous["started_at"], previous["waiter"]
        if at_work:
            self._stand_down(session, AT_WORK)
        session["told_seq"] = self.store.newest_seq()
        events, session["told_event"] = self.store.events_since(self.agent, 0)
        unread = self.store.count_unread(self.agent, now)
        envelopes = self.store.unread(self.agent, now, limit=SHOWN)
        others = [s for s in live_sessions(self.store.harness_sessions_of(self.agent), model.now())
                  if s["id"] != self.key]
        self.store.save_harness_session(session)
        return render(self.harness, self.agent, envelopes, unread, unread, events, len(others), start=True)

    def _tell(self, session: dict, now: str, told: list | None = None) -> str | None:
        """Mark what is new as told (in the caller's write transaction); the note, or None. `told`, when given,
        receives the envelopes (for the line the user is shown)."""
        envelopes, new, events, newest_event = self._untold(session, now)
        session["told_seq"] = max(session["told_seq"], self.store.newest_seq())
        session["told_at"], session["told_event"], session["last_seen"] = now, newest_event, now
        self.store.save_harness_session(session)
        if not new and not events:
            return None
        if told is not None:
            told.extend(envelopes)
        unread = self.store.count_unread(self.agent, now)
        return render(self.harness, self.agent, envelopes, new, unread, events)

    def stop(self, emit, active: bool = False) -> dict | None:
        now = model.now_iso()
        if active:  # held once already: let it stop (the turn ends; the Stop's waiter arms)
            if self.wakes:
                with self.store.transaction(write=True):
                    session = self.store.harness_session(self.key)
                    if session is not None and session["agent"] == self.agent and session["waiter"] in MARKS:
                        session["waiter"] = None
                        self.store.save_harness_session(session)
            return None
        with self.store.transaction(write=True):
            self._active(now)
            session = self.store.harness_session(self.key)
            told: list[dict] = []
            if session is None or session["agent"] != self.agent or session["ended_at"]:
                note = self._start_note(session, now)  # first contact: the baseline; nothing arrived "during" a turn
                if self.kind.starts:
                    return None
                told = self.store.unread(self.agent, now, limit=SHOWN)  # no session start told it: the stop does
                if not told:
                    return None
            else:
                if session["waiter"] in MARKS:
                    session["waiter"] = None  # the turn ends (unless held, below): idle until the Stop's waiter arms
                note = self._tell(session, now, told)
            if note is None:
                return None
            if self.wakes:  # held: the turn goes on, and a waiter the same Stop armed stands down
                self._stand_down(session, HELD)
                self.store.save_harness_session(session)
            # The reason goes to the model as the next prompt: mail, said as mail. systemMessage is the line each
            # harness shows the user (Claude Code and Codex under the hook's name; Gemini CLI after its fixed
            # "Agent execution blocked:"), which would otherwise be the whole reason or nothing; the record's
            # stop_output says it all in the harness's words.
            output = self.kind.stop_output(self.kind.stop_decision, note + "\nThis arrived while you worked: it is "
                                           "mail for you, not an error; deal with it (or say why not) before you stop.",
                                           user_line(self.agent, told))
            emit(output)
        return output

    def end(self) -> str | None:
        """The session ended: it stops counting as live. Its waiter's process token (for the caller to end it on
        its machine), or None."""
        now = model.now_iso()
        with self.store.transaction(write=True):
            session = self.store.harness_session(self.key)
            if session is None or session["agent"] != self.agent:
                return None  # a hook acts only for its own identity: another's session and waiter are left alone
            self._active(now)
            waiter = session["waiter"]
            session["ended_at"], session["last_seen"], session["waiter"] = now, now, None
            self.store.save_harness_session(session)
        return None if waiter in MARKS else waiter

    def arm(self, me: str, again: bool = False) -> str | None:
        """Make `me` (a waiter's process token) the session's waiter; the older waiter's token, which ends.
        Superseded when the session is not idle: its stop was held (HELD, and this is not the second stop), or a
        turn started since the session start that started this waiter (AT_WORK); `again` (this waiter was armed
        before: its first short request through a server, or its last wait, which ran out): a mark at all, which a
        turn since then left."""
        now = model.now_iso()
        with self.store.transaction(write=True):
            self._active(now)  # a waiter is armed as a turn ends
            session = self.store.harness_session(self.key)
            if session is None or session["agent"] != self.agent or session["ended_at"]:
                self._start_note(session, now)
                session = self.store.harness_session(self.key)
            if (session["waiter"] == HELD and self.document.get("stop_hook_active") is not True) or \
                    (session["waiter"] == AT_WORK and self.event_name == "SessionStart") or \
                    (again and session["waiter"] in MARKS):
                raise Superseded()
            older = session["waiter"]
            older = None if older in MARKS else older
            session["waiter"] = me
            session["pid"] = self.pid or session["pid"]
            session["last_seen"] = now
            self.store.save_harness_session(session)
        return older

    def look(self, me: str, note: list[str], write_note=None) -> list[dict]:
        """A waiter's look: mail this session was not told of, told now (the note appended, and written by
        `write_note` before the commit: if it cannot be written, it was not told). Superseded when `me` is no
        longer the session's waiter."""
        with self.store.transaction(write=True):
            current = self.store.harness_session(self.key)
            if current is None or current["waiter"] != me or current["ended_at"]:
                raise Superseded()
            told = self._tell(current, model.now_iso())
            if told is not None:
                if write_note is not None:
                    write_note(told)
                note.append(told)
        return [{"told": True}] if note else []

    def still_waiting(self, me: str, touch: bool) -> bool:
        """Whether `me` is still the session's waiter; with `touch`, its last_seen refreshed (a served waiter
        is the session's sign of life while it is idle)."""
        with self.store.transaction(write=touch):
            current = self.store.harness_session(self.key)
            if current is None or current["waiter"] != me or current["ended_at"]:
                return False
            if touch:
                current["last_seen"] = model.now_iso()
                self.store.save_harness_session(current)
        return True

    def forget_waiter(self, me: str, woke: bool = False) -> None:
        """`me` is no longer the session's waiter: it woke the session (`woke`: at work from now), or its wait
        ended."""
        try:
            with self.store.transaction(write=True, patience=1.0):
                session = self.store.harness_session(self.key)
                if session is not None and session["waiter"] == me:
                    session["waiter"] = AT_WORK if woke else None
                    self.store.save_harness_session(session)
        except errors.AgentMailError:
            pass


# -- a hook's step carried by `agent-mail serve` -------------------------------------------------------------------
def _session_input(session) -> dict:
    """The session as the client sent it, checked: InvalidInput naming `session` otherwise."""
    def fail(why: str) -> errors.InvalidInput:
        return errors.InvalidInput([("session", f"{why}; the client sends the harness session's "
                                                "{session_id, hook_event_name, stop_hook_active, pid, host, "
                                                "waiter, again} (agent-mail hook does, when AGENT_MAIL_DB names a "
                                                "server).")])
    if not isinstance(session, dict) or not session:
        raise fail("is required")
    known = {"session_id", "hook_event_name", "stop_hook_active", "pid", "host", "waiter", "again"}
    if set(session) - known:
        raise fail(f"has unknown keys {sorted(set(session) - known)}")
    sid, event, pid = session.get("session_id"), session.get("hook_event_name"), session.get("pid")
    host, waiter = session.get("host"), session.get("waiter")
    if not isinstance(sid, str) or not sid.strip() or len(sid) > 200 or model.has_surrogates(sid):
        raise fail("has no usable session_id (1-200 characters of UTF-8 text)")
    if event is not None and (not isinstance(event, str) or len(event) > 200 or model.has_surrogates(event)):
        raise fail("hook_event_name must be a short text")
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < 1):
        raise fail("pid must be a process id")
    for name, value, most in (("host", host, 300), ("waiter", waiter, 400)):
        if value is not None and (not isinstance(value, str) or not value or len(value) > most
                                  or model.has_surrogates(value)):
            raise fail(f"{name} must be a text of at most {most} characters")
    for name in ("stop_hook_active", "again"):
        if not isinstance(session.get(name, False), bool):
            raise fail(f"{name} must be true or false")
    return session


def served_step(mailbox, *, harness: str, event: str, agent: str, session: dict, once: bool = False, wanted=None,
                timeout_minutes=None, timeout_seconds=None, emit=no_emit) -> dict:
    """One hook step for a client whose mailbox is this server: {output: what the hook prints (or null), wake,
    note: a waiter's, waiter: a waiter the client ends on its machine}. `wanted`: the server's own end to a wait
    (a client that hung up, a revoked token, a stopping server)."""
    given = _session_input(session)
    host = (given.get("host") or "unknown") + SERVED
    step = Session(mailbox, harness, agent, given, pid=given.get("pid"), host=host)
    result: dict = {"output": None, "wake": False, "note": None, "waiter": None}
    if event == "context":
        result["output"] = step.context(no_emit)
        result["waiter"] = step.stood_down  # a turn's start stands the waiter down: the client ends it
    elif event == "stop":
        result["output"] = step.stop(no_emit, bool(given.get("stop_hook_active")))
        result["waiter"] = step.stood_down
    elif event == "end":
        result["waiter"] = step.end()
    elif event == "wait":
        result.update(_served_wait(step, given, wanted, timeout_seconds or (timeout_minutes or
                                                                           model.WATCH_MINUTES_DEFAULT) * 60.0))
    else:  # pretool: the client asks reservations --check for the paths it located on its machine
        raise errors.InvalidInput([("event", "pretool is carried as reservations --check (the client locates the "
                                             "files in its own checkout); the server carries context, stop, wait "
                                             "and end.")])
    emit(result)
    return result


class ServedWaiter:
    """A waiter's wait that a server carries on its event loop (agent_mail.server.waits: no thread, no connection
    held while it waits), in steps each run on a store of the server's pool: armed here (the older waiter it
    replaced noted), then look(), still() (once every LAST_SEEN_EVERY_SECONDS: the session's sign of life) and
    end(), each with a Mailbox of the store at hand. The same waiter as _served_wait's, step by step."""

    def __init__(self, step: Session, me: str):
        self.harness, self.agent, self.document = step.harness, step.agent, step.document
        self.pid, self.host, self.me = step.pid, step.host, me
        self.note: list[str] = []
        try:
            self.older, self.idle = step.arm(me, step.document.get("again") is True), True
        except Superseded:  # not idle (its stop held, or a turn started): nothing to wait for
            self.older, self.idle = None, False

    def _step(self, mailbox) -> Session:
        return Session(mailbox, self.harness, self.agent, self.document, pid=self.pid, host=self.host)

    def look(self, mailbox) -> list[dict] | None:
        """Mail this session was not told of, told now; None when a newer waiter took over (the wait ends)."""
        if not self.idle:
            return None
        try:
            return self._step(mailbox).look(self.me, self.note)
        except Superseded:
            return None

    def still(self, mailbox) -> bool:
        return self._step(mailbox).still_waiting(self.me, True)

    def end(self, mailbox, found) -> dict:
        self._step(mailbox).forget_waiter(self.me, woke=bool(found and self.note))
        return {"output": None, "wake": bool(found and self.note), "note": self.note[0] if found and self.note
                else None, "waiter": self.older if self.older not in (None, self.me) else None, "idle": self.idle}


def served_waiter(mailbox, *, harness: str, event: str, agent: str, session: dict, once: bool = False,
                  **_) -> ServedWaiter | None:
    """A hook step's wait to carry on a server's event loop, armed: a waiter's (`wait`) of a harness whose hooks can
    wake it; None for any other step (served_step carries it)."""
    if event != "wait" or not harnesses.of(harness).waits_in_its_hook:
        return None
    given = _session_input(session)
    me = given.get("waiter")
    if not me:
        raise errors.InvalidInput([("session", "wait needs the waiter's process token (waiter).")])
    step = Session(mailbox, harness, agent, given, pid=given.get("pid"), host=(given.get("host") or "unknown") + SERVED)
    return ServedWaiter(step, me)


def _served_wait(step: Session, given: dict, wanted, seconds: float) -> dict:
    """The waiter's blocking wait, held here while the client holds its request: armed like a watch (status
    shows it), ended by the client hanging up (its harness died, or a newer waiter ended it), by a newer waiter
    (its client ends this one's process; failing that, seen here within a minute) or by the server's own end.
    `waiter` in the answer: the older waiter this one replaced, for the client to end."""
    import time

    if not step.kind.wakes_idle:
        return {}
    me = given.get("waiter")
    if not me:
        raise errors.InvalidInput([("session", "wait needs the waiter's process token (waiter).")])
    try:
        older = step.arm(me, given.get("again") is True)
    except Superseded:  # not idle (its stop held, or a turn started): nothing to wait for
        return {"wake": False, "note": None, "waiter": None, "idle": False}
    note: list[str] = []
    touched = [time.monotonic()]

    def still() -> bool:  # asked every 5 s; the session row is read (and refreshed) once a minute
        if wanted is not None and not wanted():
            return False
        if time.monotonic() - touched[0] < LAST_SEEN_EVERY_SECONDS:
            return True
        touched[0] = time.monotonic()
        return step.still_waiting(me, True)
    found: list[dict] = []
    try:
        found = step.mailbox.wait_armed(step.agent, seconds, lambda: step.look(me, note), still)
    except Superseded:
        found = []
    finally:
        step.forget_waiter(me, woke=bool(found and note))
    # The older waiter's process is the client's to end (it is on the harness's machine): its request here would
    # otherwise see at its next look that it was superseded.
    return {"wake": bool(found and note), "note": note[0] if found and note else None,
            "waiter": older if older not in (None, me) else None}
