"""The command line's calls carried to an agent-mail server, when AGENT_MAIL_DB is an http:// or https:// URL.

Started by the command line for every command but describe (which reports the server itself): the values it
parsed and checked are checked again by the call layer by argument name and sent as JSON to POST
/v1/call/COMMAND with the token (AGENT_MAIL_TOKEN, or the 0600 file AGENT_MAIL_TOKEN_FILE names); what comes
back is printed as the command would print it, with its exit code. Files stay on this machine: a send's body
file, refs and attachments are read here (refs checked here, sent as text; attachments uploaded), and
`attachments --save-to` writes here, staged as it is without a server. A watch is a long request that outlives
a server restart: it reconnects and looks again.

The standard library only (http.client, ssl, json): a client machine needs no driver and no server stack.
"""

from __future__ import annotations

import os
import time

from agent_mail import calls, errors, jsonout, spec
from agent_mail.protocols import http_api
from agent_mail.protocols.http_client import (CALL_TIMEOUT_SECONDS, Refused, Unreachable, accepted, read_token,
                                              request)

# How long a watch stopped by a signal waits to tell the server (to connect, then for the answer) before it exits
# anyway: its session then reads as stale (the server sees the client hang up), unless the call reached it after all.
STOP_SECONDS = 2.0

# How long a watch (and --follow, a hook's waiter) keeps reconnecting to a server that is down (restarting, cut off,
# its storage down), a send keeps repeating itself (with its idempotency key) and a read asking again (a read is
# safe to repeat: one that marks holds its marks until it is confirmed), before it gives up (exit 1).
RECONNECT_SECONDS = float(os.environ.get("AGENT_MAIL_RECONNECT_SECONDS", "60"))

# What cannot go through a server, and why (exit 2, naming AGENT_MAIL_DB).
_ON_THE_MAILBOX = "works on a mailbox itself, not through a server: run it where the mailbox is, with AGENT_MAIL_DB " \
                  "naming its file or postgresql:// URL"
NOT_REMOTE = {"copy": _ON_THE_MAILBOX, "token": _ON_THE_MAILBOX, "serve": _ON_THE_MAILBOX,
              "mcp": "serves MCP over stdio from a mailbox itself; through a server, harnesses speak MCP to the "
                     f"server's {http_api.MCP_PATH} (agent-mail setup HARNESS --agent P:N writes that entry)"}
NOT_REMOTE_FLAGS = {("doctor", "repair"): _ON_THE_MAILBOX}


def main(name: str, values: dict, emit) -> int:
    """Carry out the command line's checked call `name` through the server; print its result; its exit code."""
    from agent_mail.operations import location

    url = location.server_url()
    if name in NOT_REMOTE:
        raise errors.InvalidInput([("AGENT_MAIL_DB", f"names an agent-mail server ({url}); {name} "
                                                     f"{NOT_REMOTE[name]}.")])
    for (command, key), why in NOT_REMOTE_FLAGS.items():
        if command == name and values.get(key) not in (None, False, []):
            raise errors.InvalidInput([("AGENT_MAIL_DB", f"names an agent-mail server ({url}); {name} "
                                                         f"--{key.replace('_', '-')} {why}.")])
    token = read_token()
    given = _given(name, values)
    calls.check(name, given, with_inputs=False)  # what is sent is what the call layer accepts
    if name == "send":
        given = _with_uploads(values, given)
    if name in ("reserve", "release", "reservations"):
        given = _located(values, given)
    if name == "webhook" and given.get("secret_file") is not None:  # read here: the server never opens a file of ours
        from agent_mail.parts.inputs import read_secret

        secret, problem = read_secret(given.pop("secret_file"))
        if problem:
            raise errors.InvalidInput([("secret_file", problem)])
        given["secret"] = secret
    _check_stdout()
    emitted, emit = emit, _said_after(name, values, emit)
    if name == "watch":
        return _watch_told_when_stopped(url, token, values, given, emit)
    if name == "export":
        return _export(url, token, values, given, emit)
    if name == "import":
        return _import(url, token, values, emit)
    if name == "attachments" and values.get("save_to") is not None:
        return _save(url, token, values, given, emit)
    if name == "profile":
        return _profile(url, token, values, given, emit)
    if name == "notifications":
        return _notifications(url, token, values, given, emit)
    if _marks(name, values):  # deliver, then confirm
        from agent_mail.client import deliveries

        code = deliveries.read(url, token, given, emitted, lambda ask: _asked_again(url, ask))
        _refresh_mirrors(url, token)
        return code
    if name == "read":  # looks only: asked again while no server answers, as a marking read is
        status, code, document = _asked_again(url, lambda: request(url, token, name, given))
    else:
        status, code, document = _sent(url, token, given) if name == "send" else request(url, token, name, given)
    if code in (errors.EXIT_OK, errors.EXIT_PARTIAL):
        # Any call may have published mail that fell due, as on the mailbox's machine, where whatever touches
        # the mailbox renders its recipients' mirrors: the mirrors kept here are rendered again after each one.
        written = _refresh_mirrors(url, token)
        if name == "send" and isinstance(document.get("mirrors"), list):
            document["mirrors"] = _sent_mirrors(document, written, bool(values.get("no_ack")))
    return _answer(status, code, document, emit)


def _given(name: str, values: dict) -> dict:
    """Checked values (by the operation's keywords) -> values by argument name, as the API takes them."""
    given = {}
    for arg in spec.COMMANDS[name].args:
        value = values.get(arg.dest)
        if value is None or value is False or value == [] or arg.kind == spec.REMOVED or \
                (arg.default is not None and value == arg.default):  # a default the server fills in the same
            continue
        key = arg.name.lstrip("-").replace("-", "_")
        given[key] = ",".join(value) if arg.kind == spec.FIELDS and isinstance(value, list) else value
    return given


def _check_stdout() -> None:
    """On the mailbox's machine a result that cannot be written undoes its command; through a server the call is
    carried out before its answer comes back. So a standard output that cannot take a result (closed, a pipe or
    socket whose reader is gone, a device that takes nothing such as /dev/full) is found before anything is sent:
    the command fails as it would there, and nothing is changed."""
    import stat
    import sys

    stream = sys.stdout
    try:
        if stream is None:
            raise OSError("standard output is closed")
        try:
            descriptor = stream.fileno()
        except (OSError, ValueError, AttributeError):
            return  # not a file (a stream of the caller's own): nothing to look at before
        mode = os.fstat(descriptor).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            import select

            poller = select.poll()
            poller.register(descriptor, select.POLLOUT)
            if any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
                raise OSError("the reader of standard output is gone")
        elif stat.S_ISCHR(mode):
            os.write(descriptor, b"")  # a device that refuses every write refuses this one too (a terminal takes it)
    except OSError as exc:
        raise errors.OutputError(f"could not write the result to standard output ({exc}); nothing was changed.") \
            from None


def _marks(name: str, values: dict) -> bool:
    """Whether the call is a read that marks mail (read, or acknowledged with --ack)."""
    return name == "read" and (not values.get("no_mark_read") or bool(values.get("ack"))) and \
        values.get("thread") is None and not values.get("archived")


def _said_after(name: str, values: dict, emit):
    """`emit`, whose failure, after a call that changed mail, says the truth: the server carried it out."""
    changes = spec.COMMANDS[name].mutating or _marks(name, values)
    if not changes:
        return emit

    def emitting(document) -> None:
        try:
            emit(document)
        except errors.OutputError as exc:
            said = str(exc).rsplit("; nothing was changed.", 1)[0]
            raise errors.OutputError(f"{said}; the server had carried out the call already: look (read --all, "
                                     "status) before repeating it.") from None
    return emitting


def _answer(status: int, code: int, document: dict, emit) -> int:
    emit(accepted(code, document))
    return code


def _with_uploads(values: dict, given: dict) -> dict:
    """A send's files read here: the body file's text, the refs resolved and checked here, attachments as content."""
    from agent_mail.parts import inputs

    prepared, problems = inputs.prepare_send(values)
    if problems:
        raise errors.InvalidInput(problems)
    for key in ("body_file", "ref", "refs", "attach"):
        given.pop(key, None)
    if values.get("body_file") is not None:
        given["body"] = prepared["body"]
    given["client_refs"] = prepared["refs"]
    given["upload_attachments"] = []
    if prepared["attachments"]:  # base64 loads `re`: only for a send that has attachments
        import base64

        given["upload_attachments"] = [{"name": a["name"], "content_base64": base64.b64encode(a["content"]).decode()}
                                       for a in prepared["attachments"]]
    return given


def _sent(url: str, token: str, given: dict) -> tuple:
    """A send carried at most once: it carries an idempotency key (a UUID made here), and while no answer comes
    (the server restarting, the network cut, the server's storage down: 503) it is sent again with the same key,
    for up to RECONNECT_SECONDS; the server stores a key's send once and answers a repeat with its receipt."""
    from agent_mail import model

    given = {**given, "idempotency_key": model.new_message_id()}
    lost_at, sent = None, False
    while True:
        try:
            status, code, document = request(url, token, "send", given)
        except Unreachable as exc:
            if not exc.passing():
                raise
            status, lost, sent = 0, exc, sent or exc.sent
        if status not in (0, 502, 503, 504):
            return status, code, document
        lost_at = lost_at or time.monotonic()
        if time.monotonic() - lost_at > RECONNECT_SECONDS:
            if not sent:  # the last answer, or why none came, is the whole story
                raise Refused(document, code) if status else lost
            raise Unreachable(f"cannot reach the agent-mail server at {url}: the send went out but no answer came "
                              f"back for {RECONNECT_SECONDS:.0f} s; it may have been stored (once: its idempotency "
                              f"key was {given['idempotency_key']}). Look (read, status) before sending it again.")
        time.sleep(0.5)


def _asked_again(url: str, ask):
    """A read's answer, `ask()` -> (status, exit code, document, ...): asked again every half second while no
    server answers (unreachable, or 502, 503, 504), for up to RECONNECT_SECONDS. Safe: a read that marks holds its
    marks until it is confirmed, so an answer lost on the way marks nothing. Then the last answer, when a server
    gave one (its 503 says why: its storage is down), else Unreachable."""
    lost_at = None
    while True:
        try:
            answer, lost = ask(), None
            status = answer[0]
        except Unreachable as exc:
            if not exc.passing():
                raise
            answer, lost, status = None, exc, 0
        if status not in (0, 502, 503, 504):
            return answer
        lost_at = lost_at or time.monotonic()
        if time.monotonic() - lost_at > RECONNECT_SECONDS:
            if answer is not None:
                return answer
            raise Unreachable(f"no agent-mail server answered at {url} for {RECONNECT_SECONDS:.0f} s (the last try: "
                              f"{lost.message}). Nothing was marked read (a read's marks wait for it to be printed); "
                              "run the read again once the server is back.")
        time.sleep(0.5)


def _reconnecting(url: str, ask, gave_up: str):
    """The first answer of a server to a long request, made by `ask()` -> (status, exit code, document), or None
    when `ask()` says there is nothing left to ask for (it returns None). While no server answers (it restarts, is
    cut off, or is stopping: unreachable, or 502, 503, 504) it is asked again every half second, for up to
    RECONNECT_SECONDS without a server (a request that was sent and waited over a second had one: the time without
    starts again), then Unreachable, ending with `gave_up`. What answers otherwise is not a server: raised at once."""
    lost_at = None
    while True:
        began = time.monotonic()
        try:
            answer = ask()
            if answer is None:
                return None
            status = answer[0]
        except Unreachable as exc:
            if not exc.passing():
                raise
            answer, status = None, 0
            if exc.sent and time.monotonic() - began > 1:  # it had a server, waiting: a new loss starts now
                lost_at = None
        if status not in (0, 502, 503, 504):
            return answer
        lost_at = lost_at or time.monotonic()  # no server now, or one stopping: ask again once it is back
        if time.monotonic() - lost_at > RECONNECT_SECONDS:
            raise Unreachable(f"the agent-mail server at {url} has not answered for {RECONNECT_SECONDS:.0f} s; "
                              f"{gave_up}")
        time.sleep(0.5)


def _watch(url: str, token: str, values: dict, given: dict, emit, keys: list) -> int:
    """A blocked watch as one long request; when the server goes away (a restart) it reconnects and looks again
    for the rest of its wait (_reconnecting). Each request carries a stop_key made here (the latest appended to
    `keys`), with which a signal's stop releases that wait's session."""
    from agent_mail import model

    if values["once"]:
        return _answer(*request(url, token, "watch", given), emit)
    minutes = values.get("timeout_minutes") or model.WATCH_MINUTES_DEFAULT
    deadline = time.monotonic() + minutes * 60.0
    given.pop("timeout_minutes", None)

    def ask():
        wait = max(1.0, deadline - time.monotonic())
        keys.append(model.new_message_id())
        return request(url, token, "watch", {**given, "wait_seconds": round(wait, 3), "stop_key": keys[-1]},
                       timeout=wait + 60.0)
    return _answer(*_reconnecting(url, ask, "the watch gave up. Nothing was marked read."), emit)


def _watch_told_when_stopped(url: str, token: str, values: dict, given: dict, emit) -> int:
    """A blocked watch stopped by SIGTERM, SIGHUP or SIGINT releases its session before it exits, as on the
    mailbox's machine: its signal handler tells the server (POST /v1/watch/stop with the stop_key of its last
    request; any replica can take it) while the wait's connection is still open, waiting at most STOP_SECONDS, and
    only then ends the wait and exits with the signal's code. A server that does not confirm it in time sees the
    client hang up, and its session reads as stale, as a killed watch's (unless the call reached it after all).
    Another signal while it tells the server gives up on that."""
    if values["once"]:
        return _watch(url, token, values, given, emit, [])
    import _signal

    keys: list = []
    stopped: list = []  # [signal number, why the server could not be told (None: it was)], once one came

    def stop(signum, frame):
        if stopped:  # again, while telling the server: _stop_told gives up
            raise KeyboardInterrupt
        stopped.append(signum)
        stopped.append(_stop_told(url, token, values["agent"], keys[-1], signum) if keys else None)
        raise errors.Interrupted("stopped", 128 + signum)
    previous = {}
    for number in (1, 2, 15):  # SIGHUP, SIGINT, SIGTERM
        try:
            previous[number] = _signal.signal(number, stop)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        return _watch(url, token, values, given, emit, keys)
    except (errors.Interrupted, KeyboardInterrupt):
        if len(stopped) < 2:
            raise
        signum, untold = stopped
        name = {1: "SIGHUP", 2: "SIGINT", 15: "SIGTERM"}.get(signum, f"signal {signum}")
        said = "its session was released, so status shows it as released, not armed." if untold is None else \
            f"the server did not confirm its release ({untold}), so its session may read as stale (stopped without " \
            "exiting), not released."
        raise errors.Interrupted(f"the wait for {values['agent']} was stopped by {name}; {said}",
                                 128 + signum) from None
    finally:
        for number, handler in previous.items():
            _signal.signal(number, handler)


def _stop_told(url: str, token: str, agent: str, key: str, signum: int) -> str | None:
    """Release the stopped wait's session (POST /v1/watch/stop): None once done, else why not. Bounded by
    STOP_SECONDS to connect and as long for the answer; another signal meanwhile gives up at once."""
    try:
        status, _, document = request(url, token, "", {"agent": agent, "key": key, "signal": signum},
                                      STOP_SECONDS, path=http_api.STOP_PATH, connect_timeout=STOP_SECONDS)
    except (errors.Interrupted, KeyboardInterrupt):
        return "stopped again while telling it"
    except errors.AgentMailError as exc:  # unreachable, or something else answered: its first sentence
        return str(exc).split(". ", 1)[0].rstrip(".")
    return None if status == 200 else str(document.get("error", f"HTTP {status}"))


def _save(url: str, token: str, values: dict, given: dict, emit) -> int:
    """attachments --save-to: the content fetched, then written here exactly as without a server (staged under
    temporary names, moved into place after the result is printed)."""
    import base64

    from agent_mail import files

    given.pop("save_to", None)
    given.pop("overwrite", None)
    status, code, document = request(url, token, "attachments", {**given, "with_content": True})
    if code != errors.EXIT_OK:
        raise Refused(document, code)
    contents = {sha: base64.b64decode(text) for sha, text in document.pop("contents", {}).items()}
    staged = files.stage_attachments(values["save_to"], document["attachments"], contents, values["overwrite"])
    result = {**document, "directory": staged.target, "saved": staged.saved}
    try:
        emit(result)
    except BaseException:
        staged.discard()
        raise
    staged.publish()
    return errors.EXIT_OK


def _export(url: str, token: str, values: dict, given: dict, emit) -> int:
    """The export streamed from the server and written here: to a new file (--output, never replacing one, written
    aside and linked into place: all or nothing) or to stdout."""
    import sys

    from agent_mail import files

    given.pop("output", None)
    summary: dict = {}

    def copy(response, raw) -> None:
        summary.update(jsonout.loads(response.getheader(http_api.RESULT_HEADER) or "{}"))
        progress = _Progress(f"exported {summary.get('messages')} messages, writing", response.length)
        while chunk := response.read(1 << 20):
            raw.write(chunk)
            progress.step(len(chunk))
        progress.end()
        if response.length:  # the connection ended early: the file would be cut short
            raise Unreachable(f"the export from {url} was cut off; nothing was written.")
    output = values.get("output")
    if output is None or output == "-":
        status, code, document = request(url, token, "export", given, None, path=http_api.EXPORT_PATH,
                                          into=lambda response: copy(response, sys.stdout.buffer))
        if document is not None:
            raise Refused(document, code)
        sys.stdout.buffer.flush()
        return errors.EXIT_OK
    answered: list = []

    def write(raw) -> None:
        answered.extend(request(url, token, "export", given, None, path=http_api.EXPORT_PATH,
                                into=lambda response: copy(response, raw)))
        if answered[2] is not None:
            raise Refused(answered[2], answered[1])
    target = files.write_new(output, "output", write)
    emit({"file": target, **summary, "bytes": os.path.getsize(target),
          "next": [f"agent-mail import {target} --dry-run"] if summary.get("format") == "jsonl" else []})
    return errors.EXIT_OK


class _Progress:
    """'exported 7 messages, writing 1200 of 5000 bytes' on stderr, a few times a second, only when stderr is a
    terminal (as an export shows its progress on the mailbox's machine)."""

    def __init__(self, what: str, total: int | None):
        import sys

        self.what, self.total, self.done, self.shown_at = what, total, 0, 0.0
        try:
            self.on = sys.stderr is not None and sys.stderr.isatty()
        except (OSError, ValueError):
            self.on = False

    def step(self, size: int) -> None:
        self.done += size
        if self.on and time.monotonic() - self.shown_at > 0.2:
            self.shown_at = time.monotonic()
            of = f" of {self.total}" if self.total is not None else ""
            self._show(f"\ragent-mail: {self.what} {self.done}{of} bytes")

    def end(self) -> None:
        if self.on and self.shown_at:
            self._show("\r\033[K")

    def _show(self, text: str) -> None:
        import sys

        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            self.on = False  # a terminal gone: the export goes on without it


def _import(url: str, token: str, values: dict, emit) -> int:
    """The local export uploaded whole (or stdin, in chunks) and imported there, all or nothing."""
    import sys

    path = values["file"]
    query = "?dry_run=true" if values["dry_run"] else ""
    if path == "-":
        shown = "stdin"
        source = iter(lambda: sys.stdin.buffer.read(1 << 20), b"")
        status, code, document = request(url, token, "import", {}, None, path=http_api.IMPORT_PATH + query, body=source,
                                          content_type=http_api.JSON_LINES)
    else:
        shown = os.path.abspath(os.path.expanduser(path))
        try:
            handle = open(shown, "rb")
        except OSError as exc:
            raise errors.InvalidInput([("file", f"cannot open {shown} ({exc.strerror}); nothing was imported.")]) \
                from None
        with handle:
            status, code, document = request(url, token, "import", {}, None, path=http_api.IMPORT_PATH + query,
                                              body=handle, content_type=http_api.JSON_LINES)
    if code != errors.EXIT_OK:
        raise Refused(document, code)
    document["file"] = shown
    document["next"] = [f"agent-mail import {shown}"] if values["dry_run"] and any(document["added"].values()) \
        else []
    emit(document)
    return errors.EXIT_OK


# -- the notification mirror, written on this machine (agent_mail.client.mirrors) ---------------------------------

def _look_at_mirror(url: str, token: str, agent: str, after: str | None = None, wait: float | None = None,
                    timeout: float | None = CALL_TIMEOUT_SECONDS):
    """POST /v1/follow: `agent`'s mirror documents (as acting as `agent`: the token must name it)."""
    body = {"agent": agent} if after is None else {"agent": agent, "after": after, "wait_seconds": wait}
    return request(url, token, "follow", body, timeout, path=http_api.FOLLOW_PATH)


def _mirror_documents(url: str, token: str, agent: str) -> dict:
    status, code, document = _look_at_mirror(url, token, agent)
    if code != errors.EXIT_OK:
        raise Refused(document, code)
    return document


def _refresh_mirrors(url: str, token: str) -> dict[str, list[dict]]:
    """After a call (it may have changed mail, or published mail that fell due), the mirrors kept on this machine
    for this server rendered again, as the mailbox renders its own in the transaction that changed them: each one
    this token may act as (an identity it does not name is kept current by its own agent's commands or --follow).
    Never fails the command, done already. What was written, by identity."""
    from agent_mail.client import mirrors

    written: dict[str, list[dict]] = {}
    try:
        kept = mirrors.kept(url)
    except errors.AgentMailError:
        return written
    for agent, directory in sorted(kept.items()):
        try:
            status, code, document = _look_at_mirror(url, token, agent)
        except Unreachable:
            break
        if code == errors.EXIT_OK:
            written[agent] = mirrors.write(agent, directory, document["email"], document["system"])
    return written


def _sent_mirrors(receipt: dict, written: dict[str, list[dict]], no_ack: bool = False) -> list[dict]:
    """A send's receipt lists the mirror files it rewrote on this machine, as a send on the mailbox's machine lists
    its own: its recipients' email mirrors (everyone's but the sender's for a broadcast), and the sender's system
    channel when a recipient was refused, and the replier's email mirror when its reply settled what it answers."""
    from agent_mail.parts import notifications

    sender = receipt.get("sender")
    to = {d.get("recipient") for d in receipt.get("deliveries") or [] if d.get("status") == "delivered"}
    if receipt.get("acknowledged") is not None or (no_ack and receipt.get("reply_to") and receipt.get("refused", 0)
                                                    < len(receipt.get("deliveries") or [])):
        to.add(sender)  # a reply that went out settled what it answers: the replier's own mirror changed too
    listed = []
    for agent, results in written.items():
        for result in results:
            if result["path"].endswith(os.sep + notifications.EMAIL_FILE):
                if agent in to or (receipt.get("type") == "broadcast" and agent != sender):
                    listed.append(result)
            elif agent == sender and receipt.get("refused"):
                listed.append(result)
    return listed


def _profile(url: str, token: str, values: dict, given: dict, emit) -> int:
    """profile through the server: the mailbox keeps the identity's other settings; the mirror directory is this
    machine's (set, cleared and shown here), its files written here from the server's documents."""
    from agent_mail.parts import inputs
    from agent_mail.client import mirrors

    agent = values["agent"]
    wanted_dir = given.pop("mirror_dir", None)
    clear = list(values.get("clear") or [])
    clearing = "mirror-dir" in clear
    if clear:
        given["clear"] = [name for name in clear if name != "mirror-dir"]
        if not given["clear"]:
            given.pop("clear")
    if wanted_dir is not None:
        problems = inputs.profile_problems({"mirror_dir": wanted_dir, "clear": clear})
        if problems:
            raise errors.InvalidInput(problems)
        wanted_dir = os.path.realpath(os.path.expanduser(wanted_dir))
    status, code, document = request(url, token, "profile", given)  # the settings the mailbox keeps
    if code != errors.EXIT_OK:
        raise Refused(document, code)
    old_dir = mirrors.recorded(url, agent)
    written: list[dict] = []
    if wanted_dir is not None or clearing:
        documents = _mirror_documents(url, token, agent)  # acting as the identity: refused (exit 4) before writing
        new_dir = wanted_dir if wanted_dir is not None else None
        mirrors.record(url, agent, new_dir)
        if old_dir and old_dir != new_dir:
            written += mirrors.remove(agent, old_dir)
        if new_dir:
            written += mirrors.write(agent, new_dir, documents["email"], documents["system"])
        old_dir = new_dir
    emit({**document, "mirror_dir": old_dir, "mirrors": written, "mirror_problem": mirrors.problem(old_dir)})
    return errors.EXIT_OK


def _notifications(url: str, token: str, values: dict, given: dict, emit) -> int:
    """notifications through the server: the documents (and dismissals) there; the mirror on this machine rendered
    from them (--clear-email removes its email file here), or kept current (--follow)."""
    from agent_mail.client import mirrors

    agent = values["agent"]
    if values.get("follow"):
        if values.get("dismiss") or values.get("clear_email"):
            raise errors.InvalidInput([("follow", "runs until stopped; give --dismiss and --clear-email in a call "
                                                  "of their own.")])
        return _follow(url, token, agent, emit)
    clear_email = bool(given.pop("clear_email", False))
    if clear_email:
        _mirror_documents(url, token, agent)  # clearing is acting as the identity, as it is on the mailbox
    status, code, document = request(url, token, "notifications", given)
    if code != errors.EXIT_OK:
        raise Refused(document, code)
    directory = mirrors.recorded(url, agent)
    cleared = False
    if directory:
        system = document["system"] if document["system"].get("events") else None
        mirrors.write(agent, directory, document["email"], system, email_too=not clear_email)
        if clear_email:
            cleared = mirrors.remove(agent, directory)[0]["status"] == "removed"
    emit({**document, "cleared": cleared})
    return errors.EXIT_OK


def _follow(url: str, token: str, agent: str, emit) -> int:
    """notifications --follow through the server: a long look (POST /v1/follow) that answers when the mirror's
    documents change, written here at each change; survives a server restart by looking again; a signal ends it
    with the same final line as on the mailbox's machine."""
    import signal

    from agent_mail.client import mirrors
    from agent_mail.parts import waits

    directory = mirrors.recorded(url, agent)
    if not directory:
        _mirror_documents(url, token, agent)  # a token that may not act as the identity is refused first (exit 4)
        raise errors.InvalidInput([("follow", f"{agent} has no mirror directory on this machine to keep current; "
                                              f"set one first: agent-mail profile {agent} --mirror-dir DIR.")])
    wait = http_api.LOOK_WAIT_MAX / 5  # a minute a request: a half-open connection is noticed soon
    previous = waits.install_stop_handlers()
    updates, after = 0, None
    try:
        while True:  # each look answered by a server (_reconnecting): across its restarts
            status, code, document = _reconnecting(
                url, lambda seen=after: _look_at_mirror(url, token, agent, seen, wait, timeout=wait + 60.0),
                "--follow gave up. The mirror holds what was last written.")
            if code != errors.EXIT_OK:
                raise Refused(document, code)
            if document["fingerprint"] != after:
                written = mirrors.write(agent, directory, document["email"], document["system"])
                updates, after = updates + 1, document["fingerprint"]  # counted as written, before it is said
                emit(jsonout.OneLine(agent=agent, unread=document["unread"], mirrors=written, at=document["at"]))
    except waits.Stopped as stop:
        result = jsonout.OneLine(agent=agent, updates=updates, stopped_by=signal.Signals(stop.signum).name)
        emit(result)
        return errors.EXIT_OK
    finally:
        waits.restore_handlers(previous)

# -- hooks, the git guard and reservations: what stays on this machine ---------------------------------------------
# The front ends run on the client's machine (they read the harness's stdin, the git checkout, the processes here)
# and carry their mailbox steps to the server through a Served: started by name, as the command line starts them.
# Front ends of their own that run on this machine with the server as their mailbox (the command line starts them
# with what `backing` gives): the dashboard, a harness's hook, the git guard, `run` (a harness in its own terminal).
STARTED_HERE = ("dashboard", "hook", "guard", "run")


def backing(name: str, url: str):
    """What a front end started here (STARTED_HERE) is given to reach the mailbox through the server at `url`: the
    dashboard its (URL, token), which it reads and acts through (agent_mail.dashboard.served); a hook, the git
    guard or run a Served, which carries their mailbox steps."""
    return (url, read_token()) if name == "dashboard" else Served(url)


def _located(values: dict, given: dict) -> dict:
    """A reservation command's repository located here, in the git checkout (agent_mail.parts.repos): its key and case
    folding sent as values, with the patterns anchored and the paths said from its root. The server never looks
    at its own files for it."""
    from agent_mail.parts import repos

    asked = [("paths", p) for p in values.get("paths") or ()] + [("path", p) for p in values.get("path") or ()]
    located, patterns, paths = repos.for_server(values.get("repo"), values.get("patterns") or (), asked)
    given = {key: value for key, value in given.items() if key not in ("repo", "path", "paths", "patterns")}
    if values.get("patterns"):
        given["patterns"] = patterns
    relative = iter(paths)
    for key in ("paths", "path"):
        if values.get(key):
            given[key] = [next(relative) for _ in values[key]]
    return {**given, "located": located}


class Served:
    """What a front end started by the client (hook, guard) calls the server with: checked values by argument name
    in, the result document out (Refused for a refusal; Unreachable when no server answered). The token is read
    at the first call, so what needs no mailbox (guard install) needs no token."""

    Unreachable = Unreachable

    def __init__(self, url: str):
        self.url = url
        self._token: str | None = None

    def call(self, name: str, given: dict, timeout: float | None = CALL_TIMEOUT_SECONDS) -> tuple[int, dict]:
        """(exit code, document) of the served call `name`."""
        if self._token is None:
            self._token = read_token()
        status, code, document = request(self.url, self._token, name, given, timeout)
        return code, accepted(code, document)

    def reservations_check(self, agent: str, located: dict, paths: list[str]) -> dict:
        """reservations --check of paths already said from the root of the repository located here."""
        return self.call("reservations", {"agent": agent, "paths": paths, "check": True, "located": located})[1]

    def glance(self, name: str, given: dict) -> dict:
        """A short call that rides out a server restart as a wait does (_reconnecting): a waiter's first look."""
        answer = _reconnecting(self.url, lambda: request(self.url, self._token or self._read(), name, given),
                               "the wait gave up.")
        return accepted(answer[1], answer[2])

    def wait(self, name: str, given: dict, seconds: float) -> dict | None:
        """A blocking call as one long request that outlives a server restart (as a watch does, _reconnecting): it
        asks again for the rest of its wait; its document, or None when the wait ran out while the server was
        away."""
        deadline = time.monotonic() + seconds

        def ask():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            return request(self.url, self._token or self._read(), name,
                           {**given, "wait_seconds": round(max(1.0, left), 3)}, timeout=left + 60.0)
        answer = _reconnecting(self.url, ask, "the wait gave up.")
        return None if answer is None else accepted(answer[1], answer[2])

    def watch(self, agent: str) -> dict:
        """A blocked watch of `agent`, as `agent-mail watch` makes it through the server (its default wait, riding out
        a restart): its result document; errors.Interrupted when a signal stopped it, its session released on the
        server first (agent-mail run's helper)."""
        found: list = []
        values = {"agent": agent, "once": False, "timeout_minutes": None}
        _watch_told_when_stopped(self.url, self._token or self._read(), values, _given("watch", values), found.append)
        return found[0] if found else {}

    def _read(self) -> str:
        self._token = read_token()
        return self._token
