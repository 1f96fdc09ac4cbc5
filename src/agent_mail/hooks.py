"""`agent-mail hook HARNESS EVENT`: mail put in the model's context from inside its harness.

A harness (Claude Code, Codex, Gemini CLI) runs a hook command at points of a session and passes it a
JSON document on stdin (session_id, hook_event_name, ...). The events:

- context: SessionStart, UserPromptSubmit / BeforeAgent, PostToolUse / AfterTool. Adds to the model's
  context what is new since this session was last told: envelopes (never bodies), the unread count,
  bounces, and the next steps. Quiet when there is nothing new; never marks anything read. At session
  start: the inbox as it stands, and a warning when another live session holds the same identity.
- stop (Stop; Gemini CLI's AfterAgent): holds the session's stop once when mail it was not told of
  arrived during the turn (the envelopes become the reason for one more turn); a second stop
  (stop_hook_active) always passes.
- wait (Claude Code only: the others have no hook that can wake an idle session): the asyncRewake
  waiter, armed when a turn ends. Blocks like `watch` (it counts as one for liveness) until mail the
  session was not told of arrives, then exits 2 with the envelopes on stderr, which wakes the idle
  session. One per session: a newer waiter ends the older, which exits 0 quietly. Never blocks a
  non-interactive run (claude -p, the SDK), and ends when the harness process does.
- end: SessionEnd. The session stops counting as live; its waiter is ended.
- pretool (Claude Code PreToolUse on Edit|Write|MultiEdit|NotebookEdit; Codex PreToolUse on apply_patch|Bash;
  Gemini CLI BeforeTool on write_file|replace): denies an edit of a file another live identity holds
  exclusively (agent_mail.reservations), telling the model who holds it, why, until when, and the `send` that
  asks them. Any other tool, a read, a file outside a git repository or one nobody holds passes silently.

What a session was told is kept in the mailbox (harness_sessions): the newest message row it was told
of and when, so each message is told once per session, and a new check reads only what came since.
"""

from __future__ import annotations

import os
import sys

from agent_mail import calls, errors, jsonout, model
from agent_mail.liveness import host_name as _host
from agent_mail.liveness import harness_pid, live_sessions, pid_alive

SHOWN = 10  # envelopes listed in one context note; the rest are counted
INPUT_MAX_BYTES = 4 * 1024 * 1024
LAST_SEEN_EVERY_SECONDS = 60.0  # a quiet check refreshes the session's last_seen at most this often
_NON_INTERACTIVE = ("sdk-cli", "sdk-ts", "sdk-py", "mcp")  # CLAUDE_CODE_ENTRYPOINT values of headless runs
EXIT_WAKE = 2  # what an asyncRewake hook exits with to wake its session


def read_input(stream=None) -> dict:
    """The hook's JSON input from stdin; InvalidInput naming stdin if it is not a JSON object with a
    session_id."""
    if stream is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise errors.InvalidInput([("stdin", "is a terminal (or closed), not the harness's hook input: this "
                                                 "command is run by a harness's hooks, which pass a JSON object on "
                                                 "stdin. See agent-mail setup.")])
        stream = sys.stdin.buffer
    raw = stream.read(INPUT_MAX_BYTES + 1)
    if len(raw) > INPUT_MAX_BYTES:
        raise errors.InvalidInput([("stdin", f"the hook input is over {INPUT_MAX_BYTES} bytes; the harness "
                                             "sends a small JSON object.")])
    try:
        document = jsonout.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise errors.InvalidInput([("stdin", f"is not the harness's hook input (a JSON object): {exc}. This "
                                             "command is run by the harness; see agent-mail setup.")]) from None
    if not isinstance(document, dict):
        raise errors.InvalidInput([("stdin", "must be a JSON object (the harness's hook input).")])
    session = document.get("session_id")
    if not isinstance(session, str) or not session.strip() or len(session) > 200:
        raise errors.InvalidInput([("stdin", "has no usable session_id: the harness passes one to every hook.")])
    return document


def _checked(harness: str, event: str, agent: str | None) -> str:
    """The hook's identity (given, or AGENT_MAIL_AGENT), checked with its harness and event by the call layer."""
    agent = agent or os.environ.get("AGENT_MAIL_AGENT") or None
    problems = []
    if agent is None:
        problems.append(("agent", "is required: this session's identity (project:name), given by agent-mail setup "
                                  "in the hook command, or AGENT_MAIL_AGENT."))
    calls.check("hook", {"harness": harness, "event": event, "agent": agent}, also=problems, with_inputs=False)
    return agent


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


def _tool(harness: str, name: str) -> str:
    """How the harness names our MCP tool `name` to its model (as seen in their requests to the model:
    Claude Code mcp__agent-mail__read, Gemini CLI mcp_agent-mail_read, Codex `read` in the namespace
    mcp__agent_mail)."""
    if harness == "claude-code":
        return f"mcp__agent-mail__{name}"
    if harness == "gemini":
        return f"mcp_agent-mail_{name}"
    return f"the agent-mail MCP tool {name}"


def render(harness: str, agent: str, envelopes: list[dict], new: int, unread: int, events: list[dict],
           others: int = 0, start: bool = False) -> str:
    """The note for the model: what is new, how much is waiting, and the literal next steps."""
    now = model.now()
    lines = []
    if start:
        lines.append(f"agent-mail: you are {agent} on the team mailbox; {unread} unread message"
                     f"{'' if unread == 1 else 's'} waiting.")
    else:
        lines.append(f"agent-mail: {new} new message{'' if new == 1 else 's'} for {agent} "
                     f"({unread} unread in all).")
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
    if unread:
        lines.append(f"Next: take delivery with {_tool(harness, 'read')} (or `agent-mail read {agent}`); after "
                     f"acting on a message, {_tool(harness, 'ack')} with its id (`agent-mail ack {agent} ID`); "
                     f"reply with {_tool(harness, 'send')} and reply_to=ID.")
    return "\n".join(lines)


def user_line(agent: str, envelopes: list[dict]) -> str:
    """The one line a person watching the session is shown: who wrote and the subject."""
    if not envelopes:
        return f"agent-mail: news for {agent} (a bounce): see the model's next turn."
    first = envelopes[0]
    more = len(envelopes) - 1
    return (f"agent-mail: mail for {agent} from {first['sender']}: {jsonout.quoted(first['subject'])}"
            + (f" (+{more} more)" if more else ""))


# Where each harness takes the hooks' output. All three read hookSpecificOutput.additionalContext on their
# context events (Claude Code and Codex: SessionStart, UserPromptSubmit, PostToolUse; Gemini CLI:
# SessionStart, BeforeAgent, AfterTool); a held stop is {"decision": "block"} on Stop (Claude Code, Codex)
# and {"decision": "deny"} on AfterAgent (Gemini CLI), the reason becoming the next prompt either way.
STOP_DECISION = {"claude-code": "block", "codex": "block", "gemini": "deny"}
DEFAULT_EVENT = {"claude-code": "PostToolUse", "codex": "PostToolUse", "gemini": "AfterTool"}
WAKES_IDLE = ("claude-code",)  # asyncRewake: the only harness whose hooks can wake an idle session
QUIET = {"gemini": {}}  # Gemini CLI parses a hook's stdout as JSON: an empty object, not nothing


def _output(harness: str, event_name: str, note: str) -> dict:
    """The context note in the harness's hook output."""
    return {"hookSpecificOutput": {"hookEventName": event_name, "additionalContext": note}}




# Codex 0.171 reports an edit made with `apply_patch <<EOF` in its shell as tool_name "Bash" (tool_input.command:
# the patch; seen under `codex exec`), and a model given the apply_patch tool calls it "apply_patch".
EDIT_TOOLS = {"claude-code": ("Edit", "Write", "MultiEdit", "NotebookEdit"), "codex": ("apply_patch", "Bash"),
              "gemini": ("write_file", "replace")}
_PATCH_HEADS = ("*** Update File: ", "*** Add File: ", "*** Delete File: ", "*** Move to: ")


def edited_paths(harness: str, document: dict) -> list[str]:
    """The files the tool call in a pre-tool hook's input would change ([] for any other tool)."""
    if document.get("tool_name") not in EDIT_TOOLS[harness]:
        return []
    given = document.get("tool_input")
    if harness == "codex":  # apply_patch: the files are named in the patch's headers, wherever its text rides
        texts = [given] if isinstance(given, str) else [v for v in (given or {}).values() if isinstance(v, str)] \
            if isinstance(given, dict) else []
        return [line[len(head):].strip() for text in texts if "*** Begin Patch" in text
                for line in text.splitlines() for head in _PATCH_HEADS if line.startswith(head)]
    if not isinstance(given, dict):
        return []
    return [p for p in (given.get("file_path"), given.get("notebook_path")) if isinstance(p, str) and p]


def denial(harness: str, note: str) -> dict:
    """The harness's documented way to refuse a tool call, with the reason the model is shown."""
    if harness == "gemini":  # BeforeTool: decision deny, the reason sent to the agent as the tool's error
        return {"decision": "deny", "reason": note}
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                   "permissionDecisionReason": note}}


def pretool_note(agent: str, result: dict) -> str:
    """Why the edit is refused: each file, who holds it, why, until when; and the literal command to ask."""
    lines = ["agent-mail: this edit is refused: another live identity holds the file exclusively (a file "
             "reservation). Do not change it another way."]
    for c in result["conflicts"]:
        why = f", reason {jsonout.quoted(c['reason'])}" if c["reason"] else ""
        lines.append(f"- {c['pattern']} is held by {c['holder']} (pattern {c['holder_pattern']}{why}, until "
                     f"{c['expires_at']}).")
    lines += [f"Ask them: {step}" for step in result["next"]]
    lines.append(f"Meanwhile work on something else; you are {agent}. Reads are not blocked.")
    return "\n".join(lines)


class Hook:
    def __init__(self, mailbox, harness: str, agent: str, document: dict):
        self.mailbox, self.store = mailbox, mailbox.store
        self.harness, self.agent, self.document = harness, agent, document
        self.key = f"{harness}:{document['session_id']}"
        self.event_name = str(document.get("hook_event_name") or "")

    def _new_session(self, now: str) -> dict:
        return {"id": self.key, "harness": self.harness, "agent": self.agent, "pid": harness_pid(),
                "host": _host(), "started_at": now, "last_seen": now, "told_seq": 0, "told_at": now,
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
        if not start:
            with self.store.transaction():
                session = self.store.harness_session(self.key)
                if session is not None and session["agent"] == self.agent and not session["ended_at"]:
                    envelopes, new, events, _ = self._untold(session, now)
                    seen = model.parse_iso(session["last_seen"])
                    fresh = seen is not None and (model.now() - seen).total_seconds() < LAST_SEEN_EVERY_SECONDS
                    if not new and not events and fresh:
                        return None  # the common case: one read transaction, nothing written
        with self.store.transaction(write=True):
            session = self.store.harness_session(self.key)
            if session is None or start or session["agent"] != self.agent or session["ended_at"]:
                note = self._start_note(session, now)
            else:
                note = self._tell(session, now)
            output = None if note is None else _output(self.harness, self.event_name or DEFAULT_EVENT[self.harness],
                                                       note)
            if output is not None:
                emit(output)
        return output

    def _start_note(self, previous: dict | None, now: str) -> str:
        session = self._new_session(now)
        if previous is not None and previous["agent"] == self.agent:
            session["started_at"], session["waiter"] = previous["started_at"], previous["waiter"]
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

    def pretool(self, emit) -> dict | None:
        """Deny the edit if another live identity holds a file it changes; None (silence) otherwise."""
        from agent_mail import repos

        paths = edited_paths(self.harness, self.document)
        cwd = self.document.get("cwd") if isinstance(self.document.get("cwd"), str) else None
        grouped: dict[str, tuple] = {}
        for path in paths:
            full = path if os.path.isabs(path) else os.path.join(cwd or os.getcwd(), path)
            try:
                repository = repos.locate(cwd=os.path.dirname(full) if os.path.isdir(os.path.dirname(full)) else cwd)
                relative = repository.path(full)
            except errors.InvalidInput:
                continue  # outside any repository: nothing to hold
            grouped.setdefault(repository.key, (repository, []))[1].append(relative)
        conflicts: dict = {"conflicts": [], "next": []}
        for repository, relative in grouped.values():
            os.chdir(repository.root)  # this process's last act: the check takes paths from the repository's root
            result = calls.call("reservations", {"agent": self.agent, "paths": relative, "check": True},
                                mailbox=self.mailbox)
            conflicts["conflicts"] += result["conflicts"]
            conflicts["next"] += [step for step in result["next"] if step not in conflicts["next"]]
        if not conflicts["conflicts"]:
            return None
        output = denial(self.harness, pretool_note(self.agent, conflicts))
        emit(output)
        return output

    def stop(self, emit) -> dict | None:
        if self.document.get("stop_hook_active"):
            return None  # held once already: let it stop
        now = model.now_iso()
        with self.store.transaction(write=True):
            session = self.store.harness_session(self.key)
            if session is None or session["agent"] != self.agent or session["ended_at"]:
                self._start_note(session, now)  # first contact: the baseline; nothing arrived "during" a turn
                return None
            told: list[dict] = []
            note = self._tell(session, now, told)
            if note is None:
                return None
            # The reason goes to the model as the next prompt: mail, said as mail. systemMessage is the line each
            # harness shows the user (Claude Code and Codex under the hook's name; Gemini CLI after its fixed
            # "Agent execution blocked:"), which would otherwise be the whole reason or nothing.
            output = {"decision": STOP_DECISION[self.harness], "reason": note + "\nThis arrived while you worked: "
                      "it is mail for you, not an error; deal with it (or say why not) before you stop.",
                      "systemMessage": user_line(self.agent, told)}
            emit(output)
        return output

    def end(self) -> None:
        now = model.now_iso()
        with self.store.transaction(write=True):
            session = self.store.harness_session(self.key)
            if session is None or session["agent"] != self.agent:
                return  # a hook acts only for its own identity: another's session and waiter are left alone
            waiter = session["waiter"]
            session["ended_at"], session["last_seen"], session["waiter"] = now, now, None
            self.store.save_harness_session(session)
        _end_waiter(waiter)

    def wait(self, minutes: float) -> str | None:
        """Block until mail this session was not told of arrives (the note to wake it with) or until the
        wait ends (None): timeout, a newer waiter, the harness gone, or a non-interactive run."""
        if self.harness not in WAKES_IDLE or not _waits_here():
            return None
        me = _process_token(os.getpid())
        now = model.now_iso()
        with self.store.transaction(write=True):
            session = self.store.harness_session(self.key)
            if session is None or session["agent"] != self.agent or session["ended_at"]:
                self._start_note(session, now)
                session = self.store.harness_session(self.key)
            older = session["waiter"]
            session["waiter"] = me
            session["pid"] = harness_pid() or session["pid"]
            self.store.save_harness_session(session)
        _end_waiter(older)
        harness = harness_pid()
        note: list[str] = []

        def look_for() -> list[dict]:
            with self.store.transaction(write=True):
                current = self.store.harness_session(self.key)
                if current is None or current["waiter"] != me or current["ended_at"]:
                    raise _Superseded()
                told = self._tell(current, model.now_iso())
                if told is not None:  # on stderr before the commit: if it cannot be written, it was not told
                    sys.stderr.write(told + "\n")
                    sys.stderr.flush()
                    note.append(told)
            return [{"told": True}] if note else []

        def wanted() -> bool:
            return pid_alive(harness)

        try:
            found = self.mailbox.wait_armed(self.agent, minutes * 60.0, look_for, wanted)
        except (_Superseded, errors.Interrupted):
            # Replaced by a newer waiter (which SIGTERMs this one) or ended with its session: its liveness
            # session is released; a quiet exit 0, since any other status is a hook failure the harness
            # would show the user at every turn.
            return None
        finally:
            self._forget_waiter(me)
        return note[0] if found and note else None

    def _forget_waiter(self, me: str) -> None:
        try:
            with self.store.transaction(write=True, patience=1.0):
                session = self.store.harness_session(self.key)
                if session is not None and session["waiter"] == me:
                    session["waiter"] = None
                    self.store.save_harness_session(session)
        except errors.AgentMailError:
            pass


class _Superseded(Exception):
    """A newer waiter took over this session."""


def _waits_here() -> bool:
    """False for runs nobody waits on: claude -p and SDK runs wait for background hooks before exiting."""
    if os.environ.get("CLAUDE_CODE_ENTRYPOINT", "") in _NON_INTERACTIVE:
        return False
    return os.environ.get("CLAUDE_CODE_SESSION_ATTENDED", "") != "0"


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None


def _process_token(pid: int) -> str:
    return f"{pid}:{_start_time(pid) or ''}@{_host()}"


def _end_waiter(token: str | None) -> None:
    """SIGTERM the waiter `token` names, if it is still that process on this machine."""
    if not token:
        return
    pid_text, _, rest = token.partition(":")
    started, _, host = rest.partition("@")
    if host != _host() or not pid_text.isdigit() or int(pid_text) == os.getpid():
        return
    pid = int(pid_text)
    if started and _start_time(pid) != started:
        return  # that process is gone; the number was reused
    try:
        import signal

        os.kill(pid, signal.SIGTERM)
    except OSError:
        pass


def main(values: dict, emit) -> int:
    """`agent-mail hook HARNESS EVENT [--agent P:N]`, as the command line starts it."""
    return run(values["harness"], values["event"], values["agent"], emit)


def run(harness: str, event: str, agent: str | None, emit) -> int:
    """Run one hook; the exit status (0, or EXIT_WAKE for a waiter that found mail)."""
    from agent_mail import service

    agent = _checked(harness, event, agent)
    document = read_input()
    printed = []
    if event == "pretool" and not edited_paths(harness, document):
        if harness in QUIET:  # not an edit: answered without opening the mailbox
            emit(QUIET[harness])
        return errors.EXIT_OK

    def emit_once(document: dict) -> None:
        emit(document)
        printed.append(True)

    with service.open_mailbox() as mailbox:
        hook = Hook(mailbox, harness, agent, document)
        if event == "context":
            hook.context(emit_once)
        elif event == "stop":
            hook.stop(emit_once)
        elif event == "end":
            hook.end()
        elif event == "pretool":
            hook.pretool(emit_once)
        elif hook.wait(model.WATCH_MINUTES_DEFAULT) is not None:
            return EXIT_WAKE
    if not printed and harness in QUIET and event != "wait":
        emit(QUIET[harness])
    return errors.EXIT_OK
