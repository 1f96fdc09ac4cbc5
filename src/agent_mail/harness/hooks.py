"""`agent-mail hook HARNESS EVENT`: mail put in the model's context from inside its harness.

A harness runs a hook command at points of a session and passes it a JSON document on stdin (session_id,
hook_event_name, ...); what each harness sends and takes, its events and its tools are its record's
(agent_mail.harnesses, loaded for the one harness the hook is for). The events, in Claude Code's words:

- context: SessionStart, UserPromptSubmit / BeforeAgent, PostToolUse / AfterTool. Adds to the model's
  context what is new since this session was last told: envelopes (never bodies), the unread count,
  bounces, and the next steps. Quiet when there is nothing new; never marks anything read. At session
  start: the inbox as it stands, and a warning when another live session holds the same identity.
- stop (Stop; Gemini CLI's AfterAgent): holds the session's stop once when mail it was not told of
  arrived during the turn (the envelopes become the reason for one more turn); a second stop
  (stop_hook_active) always passes.
- wait: the waiter, armed at a session's start and when a turn ends (Claude Code's asyncRewake hook on SessionStart
  and Stop; OpenCode's plugin, which starts a turn with the note, and in its TUI one of its own from its start until
  the first session begins). Blocks like `watch` (it counts as one for liveness) until mail the session was not
  told of arrives, then exits 2 with the envelopes on stderr, which wakes the idle session. One per session: a
  newer waiter ends the older, which exits 0 quietly. Never blocks a non-interactive run (claude -p, the SDK), and
  ends when the harness process does. Codex and Qwen Code (SessionStart and Stop): starts the session's waker
  detached and returns once it is armed (harness.waker: the same wait, run by wake_once, the envelopes handed over
  as a prompt through the harness's own way in). A harness woken only under `agent-mail run` has no waiter.
- end: SessionEnd. The session stops counting as live; its waiter is ended. Through a server, which cannot see the
  harness's process, a detached watcher started by the session's first hook ends the session when the harness
  exits, killed mid-turn or with no session-end hook (harness.ends).

A hook of a subagent (its input carries the record's subagent_key) tells nothing: its parent session is told; its
edits are guarded all the same.
- pretool (PreToolUse, Gemini CLI's BeforeTool, ..., on the tools that edit: the record's edit_tools): denies an
  edit of a file another live identity holds
  exclusively (agent_mail.operations.reservations), telling the model who holds it, why, until when, and the `send` that
  asks them. Any other tool, a read, a file outside a git repository or one nobody holds passes silently.

What a session was told is kept in the mailbox (operations.telling, which makes the notes and the documents each
harness takes). When AGENT_MAIL_DB names an agent-mail server, the client starts this front end with a caller
(`served`): what belongs to this machine stays here (the hook's stdin and stdout, the harness's process, the
files and the repository of the checkout) and the server carries the mailbox's side: pretool as reservations
--check of the paths located here, the other events as one served `hook` call each (the waiter as a long request
that outlives a server restart), so the output is the same with or without a server.
"""

from __future__ import annotations

import os
import sys

from agent_mail import calls, errors, harnesses, jsonout, model
from agent_mail.parts.liveness import harness_pid
from agent_mail.parts.liveness import host_name as _host

INPUT_MAX_BYTES = 4 * 1024 * 1024
_NON_INTERACTIVE = ("sdk-cli", "sdk-ts", "sdk-py", "mcp")  # CLAUDE_CODE_ENTRYPOINT values of headless runs
EXIT_WAKE = 2  # what an asyncRewake hook exits with to wake its session
WATCH_HARNESS_SECONDS = 0.5  # how often a waiter looks at its harness's process where it cannot sleep on a pidfd
_TOLD: list[bool] = []  # this waiter process's note is out (on stderr): an exit from now on must still wake


def read_input(stream=None, harness: str | None = None) -> dict:
    """The hook's JSON input from stdin; InvalidInput naming stdin if it is not a JSON object with a
    session_id (an input in other words, Copilot CLI's camelCase, is first said in Claude Code's: the record's
    read_input)."""
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
    if harness is not None:
        document = harnesses.of(harness).read_input(document)
    session = document.get("session_id")
    if not isinstance(session, str) or not session.strip() or len(session) > 200 or model.has_surrogates(session):
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


_PATCH_HEADS = ("*** Update File: ", "*** Add File: ", "*** Delete File: ", "*** Move to: ")


def edited_paths(harness: str, document: dict) -> list[str]:
    """The files the tool call in a pre-tool hook's input would change ([] for any other tool)."""
    kind = harnesses.of(harness)
    if document.get("tool_name") not in kind.edit_tools:
        return []
    given = document.get("tool_input")
    if document.get("tool_name") in kind.patch_tools:
        # apply_patch: the files are named in the patch's headers, wherever its text rides (OpenCode: patchText)
        texts = [given] if isinstance(given, str) else [v for v in (given or {}).values() if isinstance(v, str)] \
            if isinstance(given, dict) else []
        return [line[len(head):].strip() for text in texts if "*** Begin Patch" in text
                for line in text.splitlines() for head in _PATCH_HEADS if line.startswith(head)]
    if not isinstance(given, dict):
        return []
    return [p for p in (given.get("file_path"), given.get("notebook_path"), given.get("path"), given.get("filePath"))
            if isinstance(p, str) and p]


def pretool_note(agent: str, result: dict) -> str:
    """Why the edit is refused: each file, who holds it, why, until when; and the literal command to ask."""
    lines = ["agent-mail: this edit is refused: another live identity holds the file exclusively (a file "
             "reservation). Do not change it another way."]
    for c in result["conflicts"]:
        why = f", reason {jsonout.quoted(c['reason'])}" if c["reason"] else ""
        lines.append(f"- {model.visible(c['pattern'])} is held by {c['holder']} (pattern "
                     f"{model.visible(c['holder_pattern'])}{why}, until "
                     f"{c['expires_at']}).")
    lines += [f"Ask them: {step}" for step in result["next"]]
    lines.append(f"Meanwhile work on something else; you are {agent}. Reads are not blocked.")
    return "\n".join(lines)


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


def main(values: dict, emit, served=None) -> int:
    """`agent-mail hook HARNESS EVENT [--agent P:N]`, as the command line starts it (`served`: as the client
    starts it, when AGENT_MAIL_DB names an agent-mail server: agent_mail.client.commands.Served)."""
    return run(values["harness"], values["event"], values["agent"], emit, served)


def run(harness: str, event: str, agent: str | None, emit, served=None) -> int:
    """Run one hook; the exit status (0, or EXIT_WAKE for a waiter that found mail)."""
    agent = _checked(harness, event, agent)
    kind = harnesses.of(harness)
    document = read_input(harness=harness)
    printed = []
    if kind.subagent_key and document.get(kind.subagent_key) and event != "pretool":
        return errors.EXIT_OK  # a subagent's hooks: its parent session is told (a subagent's edits are guarded)
    if event == "pretool" and not edited_paths(harness, document):
        if kind.quiet is not None:  # not an edit: answered without opening the mailbox
            emit(kind.quiet)
        return errors.EXIT_OK

    if event == "wait" and kind.woken_by_our_waker:  # a waker of its own, detached: the hook returns once it armed
        from agent_mail.harness import waker

        return waker.start(harness, document, lambda deliver, pid, armed, again: wake_once(
            harness, agent, document, served, deliver, pid, armed, again))
    if event == "wait":
        _stand_down_quietly()

    def emit_once(document: dict) -> None:
        emit(document)
        printed.append(True)

    if served is not None:
        code = _served(served, harness, event, agent, document, emit_once)
    else:
        code = _local(harness, event, agent, document, emit_once)
    if not printed and kind.quiet is not None and event != "wait":
        emit(kind.quiet)
    return code


def _local(harness: str, event: str, agent: str, document: dict, emit) -> int:
    """The hook on the mailbox this process opens."""
    from agent_mail.operations import mail, telling

    with mail.open_mailbox() as mailbox:
        if event == "pretool":
            pretool(harness, agent, document, emit, lambda located, relative: calls.call(
                "reservations", {"agent": agent, "paths": relative, "check": True}, mailbox=mailbox))
            return errors.EXIT_OK
        session = telling.Session(mailbox, harness, agent, document)
        if event == "context":
            session.context(emit)
            _end_waiter(session.stood_down)  # the turn started: its idle waiter stands down
        elif event == "stop":
            session.stop(emit, bool(document.get("stop_hook_active")))
            _end_waiter(session.stood_down)  # held: the turn goes on, without a waiter
        elif event == "end":
            _end_waiter(session.end())
        elif wait(session, model.WATCH_MINUTES_DEFAULT) is not None:
            return EXIT_WAKE
    return errors.EXIT_OK


def pretool(harness: str, agent: str, document: dict, emit, check) -> dict | None:
    """Deny the edit if another live identity holds a file it changes; None (silence) otherwise. `check(located,
    paths)`: reservations --check of paths said from the root of the repository located here (`located`: {key,
    fold}), on the mailbox or through a server."""
    from agent_mail.parts import repos

    paths = edited_paths(harness, document)
    cwd = document.get("cwd") if isinstance(document.get("cwd"), str) else None
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
        result = check({"key": repository.key, "fold": repository.fold}, relative)
        conflicts["conflicts"] += result["conflicts"]
        conflicts["next"] += [step for step in result["next"] if step not in conflicts["next"]]
    if not conflicts["conflicts"]:
        return None
    output = harnesses.of(harness).denial(pretool_note(agent, conflicts))
    emit(output)
    return output


def wait(session, minutes: float, deliver=None, harness: int | None = None, armed=None,
         again: bool = False) -> str | None:
    """Block until mail this session was not told of arrives (the note to wake it with) or until the wait ends
    (None): timeout, a newer waiter, a turn's start, the harness gone, or a non-interactive run. `deliver(note)`: how
    the note reaches the session before it counts as told (stderr by default, asyncRewake's); `harness`: its
    process, which the wait watches (a pidfd slept on with the mailbox's wake-ups; where there is none, a look at
    the process every WATCH_HARNESS_SECONDS), so the waiter ends, and stops counting as an armed watch, at once
    when the harness does. `armed()`: called once the waiter is armed (its watch open, its first look taken), or
    found it has nothing to wait for; `again`: this waiter was armed before (its last wait ran out), so a turn's
    mark found now stands it down."""
    from agent_mail.operations import telling

    if not session.kind.wakes_idle or not _waits_here():
        return None
    me = _process_token(os.getpid())
    try:
        _end_waiter(session.arm(me, again))
    except telling.Superseded:
        if armed is not None:
            armed()
        return None  # not idle: its stop was held, or a turn started since the session start that started this
    from agent_mail.files import pid_alive, process_handle  # a waiter's, not every hook's start

    harness = harness or harness_pid()
    handle = process_handle(harness)
    note: list[str] = []

    def write_note(told: str) -> None:  # on stderr before the commit: if it cannot be written, it was not told
        sys.stderr.write(told + "\n")
        sys.stderr.flush()
        _TOLD.append(True)

    def alive() -> bool:
        return pid_alive(harness)
    if handle is None:
        alive.every = WATCH_HARNESS_SECONDS

    def look() -> list[dict]:
        try:
            return session.look(me, note, deliver or write_note)
        finally:
            if armed is not None:
                armed()  # its first look: armed (status shows it), or stood down already
    found: list[dict] = []
    try:
        found = session.mailbox.wait_armed(session.agent, minutes * 60.0, look, alive,
                                           also=(handle,) if handle is not None else ())
    except (telling.Superseded, errors.Interrupted):
        # Replaced by a newer waiter (which SIGTERMs this one), stood down by a turn's start or ended with its
        # session: its liveness session is released; a quiet exit 0, since any other status is a hook failure
        # the harness would show the user at every turn.
        return None
    finally:
        session.forget_waiter(me, woke=bool(found and note))
        if handle is not None:
            os.close(handle)
    return note[0] if found and note else None


def wake_once(harness: str, agent: str, document: dict, served, deliver, pid: int, armed=None,
              again: bool = False) -> bool:
    """One wait of a detached waker (harness.waker) for the harness process `pid`, on the mailbox or through a
    server: whether it woke the session, the note handed over by `deliver`; `armed()` called once it is armed (or
    will not be); `again`: not its first wait."""
    if served is not None:
        return served_wait(served, harness, agent, document, deliver, pid, armed, again) == EXIT_WAKE
    from agent_mail.operations import mail, telling

    with mail.open_mailbox() as mailbox:
        session = telling.Session(mailbox, harness, agent, document, pid=pid, host=_host())
        return wait(session, model.WATCH_MINUTES_DEFAULT, deliver, pid, armed, again) is not None


# -- through an agent-mail server (AGENT_MAIL_DB=http(s)://) ------------------------------------------------------
def _served(served, harness: str, event: str, agent: str, document: dict, emit) -> int:
    """The hook on this machine (its input and output, the harness's process, the files of the checkout), its
    mailbox steps carried by the server: pretool as reservations --check, the others as one served hook call."""
    if event == "pretool":
        pretool(harness, agent, document, emit, lambda located, relative: served.reservations_check(
            agent, located, relative))
        return errors.EXIT_OK
    if event == "wait":
        return served_wait(served, harness, agent, document)
    result = served.call("hook", {"harness": harness, "event": event, "agent": agent,
                                  "session": _session(document)})[1]
    if result.get("output") is not None:
        emit(result["output"])
    _end_waiter(result.get("waiter"))
    if event != "end":  # the server cannot see this machine: a watcher here ends the session when the harness does
        from agent_mail.harness import ends

        pid = harness_pid()
        ends.watch(pid, document["session_id"], lambda: served.call("hook", {
            "harness": harness, "event": "end", "agent": agent, "session": _session(document, None, pid)},
            timeout=10.0))
    return errors.EXIT_OK


def _session(document: dict, waiter: str | None = None, pid: int | None = None, again: bool = False) -> dict:
    """The harness session as this machine knows it, for the server (`again`: its waiter was armed before)."""
    found = {"session_id": document["session_id"], "pid": pid or harness_pid(), "host": _host(),
             "stop_hook_active": document.get("stop_hook_active") is True}
    if isinstance(document.get("hook_event_name"), str):
        found["hook_event_name"] = document["hook_event_name"][:200]
    if waiter is not None:
        found["waiter"] = waiter
    if again:
        found["again"] = True
    return found


def served_wait(served, harness: str, agent: str, document: dict, deliver=None, pid: int | None = None,
                armed=None, again: bool = False) -> int:
    """The waiter as a long request the server holds (armed there like a watch, refreshing the session), reconnecting
    across a server restart. This process watches the harness: when it dies, the session is ended through the
    server (so it stops counting as live at once) and this process exits, which ends the request. It replaces the
    session's older waiter: a first short request names it, and it is SIGTERMed here, as without a server.
    `deliver(note)`, `pid`, `armed()`, `again`: as wait's (the note is delivered once the server told it; armed by the
    first short request, so the long one is armed again: a turn that started in between, its prompt hook run after
    the short request, keeps it from arming)."""
    import threading

    if not harnesses.of(harness).wakes_idle or not _waits_here():
        return errors.EXIT_OK
    from agent_mail.files import pid_alive, process_handle

    me, harness_process = _process_token(os.getpid()), pid or harness_pid()
    given = {"harness": harness, "event": "wait", "agent": agent, "session": _session(document, me, harness_process)}
    done = threading.Event()
    handle = process_handle(harness_process)

    def watch_harness() -> None:  # asleep on the harness's pidfd where there is one (a look every half second)
        from agent_mail.files import wait_readable

        while not done.is_set():
            if handle is not None:
                wait_readable([handle], WATCH_HARNESS_SECONDS)
            else:
                done.wait(WATCH_HARNESS_SECONDS)
            if not done.is_set() and harness_process is not None and not pid_alive(harness_process):
                try:
                    served.call("hook", {**given, "event": "end", "session": _session(document, None, harness_process)},
                                timeout=10.0)
                except errors.AgentMailError:
                    pass  # the session stops counting by itself once it stops showing signs of life
                os._exit(errors.EXIT_OK)
    watcher = threading.Thread(target=watch_harness, daemon=True)
    watcher.start()
    try:
        # First a glance (armed, then a look at once): the older waiter it replaces is named, and ended here.
        result = served.glance("hook", {**given, "wait_seconds": 0.05, "session": _session(
            document, me, harness_process, again)})  # rides out a restart, as the wait does
        if armed is not None:
            armed()  # armed there (or not idle: nothing to wait for)
        if not result.get("wake") and result.get("idle") is not False:  # idle false: its stop held, or at work
            _end_waiter(result.get("waiter"))
            result = served.wait("hook", {**given, "session": _session(document, me, harness_process, True)},
                                 model.WATCH_MINUTES_DEFAULT * 60.0)
    except errors.Interrupted:
        return errors.EXIT_OK  # ended by a newer waiter or the session's end: quietly, as without a server
    finally:
        done.set()
        if handle is not None:
            watcher.join(2 * WATCH_HARNESS_SECONDS)
            os.close(handle)
    if not result or not result.get("wake"):
        return errors.EXIT_OK
    if deliver is not None:
        deliver(result["note"])
        return EXIT_WAKE
    sys.stderr.write(result["note"] + "\n")
    sys.stderr.flush()
    _TOLD.append(True)
    return EXIT_WAKE


def _stand_down_quietly() -> None:
    """A hook's waiter is ended by SIGTERM (a newer waiter, a turn's start, the session's end): outside its wait,
    which releases its liveness session first, the signal ends the process at once with 0, not 143 (any other
    status is a hook failure the harness shows the user); with EXIT_WAKE once its note is out, so it still wakes."""
    import signal

    signal.signal(signal.SIGTERM, lambda *_: os._exit(EXIT_WAKE if _TOLD else errors.EXIT_OK))
