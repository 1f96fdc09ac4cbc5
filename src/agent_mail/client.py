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

import json
import os
import time

from agent_mail import calls, errors, spec

TOKEN_VAR, TOKEN_FILE_VAR, CA_VAR = "AGENT_MAIL_TOKEN", "AGENT_MAIL_TOKEN_FILE", "AGENT_MAIL_CA"
EXIT_HEADER = "X-Agent-Mail-Exit"
CALL_TIMEOUT_SECONDS = 300.0
# How long a watch keeps reconnecting to a server that is down (restarting) before it gives up (exit 1).
RECONNECT_SECONDS = float(os.environ.get("AGENT_MAIL_RECONNECT_SECONDS", "60"))

# What cannot go through a server, and why (exit 2, naming AGENT_MAIL_DB).
_ON_THE_MAILBOX = "works on a mailbox itself, not through a server: run it where the mailbox is, with AGENT_MAIL_DB " \
                  "naming its file or postgresql:// URL"
_NOT_YET = "is not supported through a server yet: run it where the mailbox is, with AGENT_MAIL_DB naming its " \
           "file or postgresql:// URL"
NOT_REMOTE = {"copy": _ON_THE_MAILBOX, "token": _ON_THE_MAILBOX, "serve": _ON_THE_MAILBOX,
              "mcp": _NOT_YET, "hook": _NOT_YET}
NOT_REMOTE_FLAGS = {("doctor", "repair"): _ON_THE_MAILBOX}


class Answered(errors.AgentMailError):
    """The server's refusal, as the command would have refused: its payload and exit code, already named as the
    command line names arguments."""

    def __init__(self, payload: dict, exit_code: int):
        super().__init__(str(payload.get("error", "the server refused the call.")))
        self._payload = payload
        self.exit_code = exit_code

    def renamed(self, namer) -> Answered:
        return self

    def payload(self) -> dict:
        return dict(self._payload)


class Unreachable(errors.AgentMailError):
    """The server could not be reached, or stopped answering."""


def _refuse(field: str, why: str) -> errors.InvalidInput:
    return errors.InvalidInput([(field, why + ".")])


def read_token() -> str:
    """The token: AGENT_MAIL_TOKEN, or the first line of the file AGENT_MAIL_TOKEN_FILE names (which only its
    owner may read)."""
    token = os.environ.get(TOKEN_VAR, "").strip()
    if token:
        return token
    path = os.environ.get(TOKEN_FILE_VAR, "").strip()
    if not path:
        raise errors.Forbidden(f"AGENT_MAIL_DB names an agent-mail server, and no token is set: export {TOKEN_VAR}, "
                               f"or {TOKEN_FILE_VAR} naming a 0600 file that holds it (the mailbox's operator makes "
                               "one with agent-mail token create).", unauthenticated=True)
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if mode & 0o077:
                raise _refuse(TOKEN_FILE_VAR, f"names {path}, which others can read (mode {mode & 0o777:o}): anyone "
                                              f"who reads it can act as you. chmod 600 {path}")
            text = handle.read(4096).decode("utf-8", "replace")
    except OSError as exc:
        raise _refuse(TOKEN_FILE_VAR, f"names {path}, which cannot be read ({exc.strerror or exc})") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise _refuse(TOKEN_FILE_VAR, f"names {path}, which holds no token")
    return token


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


def _connection(url: str, timeout: float | None):
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "https":
        import ssl

        context = ssl.create_default_context(cafile=os.environ.get(CA_VAR) or None)
        return http.client.HTTPSConnection(parts.hostname, parts.port, context=context, timeout=timeout), parts.path
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout), parts.path


def request(url: str, token: str, name: str, given: dict, timeout: float | None = CALL_TIMEOUT_SECONDS, *,
            path: str = "", body=None, content_type: str = "application/json", into=None):
    """POST the call; (status, exit code, document). Unreachable when no answer came. `path`, `body`: another
    endpoint than /v1/call/NAME, and a body other than `given` as JSON (bytes, a file, an iterable of chunks);
    `into(response)`: takes a successful answer's body itself (then the document is None)."""
    import http.client

    connection, base = _connection(url, timeout)
    headers = {"Content-Type": content_type, "Authorization": f"Bearer {token}", "X-Agent-Mail-Names": "flags"}
    chunked = body is not None and not isinstance(body, bytes) and not hasattr(body, "fileno")
    if body is None:
        body = json.dumps(given).encode("utf-8")
    elif hasattr(body, "fileno"):
        headers["Content-Length"] = str(os.fstat(body.fileno()).st_size)
    sent = False
    try:
        connection.request("POST", f"{base.rstrip('/')}{path or f'/v1/call/{name}'}", body=body, headers=headers,
                           encode_chunked=chunked)
        sent = True
        response = connection.getresponse()
        code = response.getheader(EXIT_HEADER)
        if into is not None and response.status == 200:
            into(response)
            return response.status, int(code), None
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        after = (" The call was sent but its answer was lost: it may have been carried out; look (read --all, "
                 "status) before repeating it.") if sent else " Nothing was sent."
        raise Unreachable(f"cannot reach the agent-mail server at {url} ({exc or type(exc).__name__}).{after}",
                          ) from None
    finally:
        connection.close()
    try:
        document = json.loads(data)
        code = int(code)
    except (TypeError, ValueError):
        # A proxy's own page for a server that went away behind it may follow a call the server carried out.
        gateway = (" A proxy answers so when the server behind it went away: the call may have been carried out; "
                   "look (read --all, status) before repeating it.") if response.status in (502, 503, 504) else ""
        raise Unreachable(f"the server at {url} answered HTTP {response.status} with something that is not an "
                          "agent-mail answer (is AGENT_MAIL_DB the agent-mail server, not a proxy's page?)."
                          f"{gateway}") from None
    return response.status, code, document


def main(name: str, values: dict, emit) -> int:
    """Carry out the command line's checked call `name` through the server; print its result; its exit code."""
    from agent_mail import location

    url = location.server_url()
    if name == "dashboard":  # a front end of its own, started by name as the command line starts it; it reads and
        front_end = spec.COMMANDS[name].front_end  # acts through this server (agent_mail.dashboard.served)
        __import__(front_end)
        import sys

        return sys.modules[front_end].main({**values, "served": (url, read_token())}, emit)
    if name in NOT_REMOTE:
        raise _refuse("AGENT_MAIL_DB", f"names an agent-mail server ({url}); {name} {NOT_REMOTE[name]}")
    for (command, key), why in NOT_REMOTE_FLAGS.items():
        if command == name and values.get(key) not in (None, False, []):
            raise _refuse("AGENT_MAIL_DB", f"names an agent-mail server ({url}); {name} --{key.replace('_', '-')} "
                                           f"{why}")
    token = read_token()
    given = _given(name, values)
    calls.check(name, given, with_inputs=False)  # what is sent is what the call layer accepts
    if name == "send":
        given = _with_uploads(values, given)
    _check_stdout()
    emit = _said_after(name, values, emit)
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
    status, code, document = request(url, token, name, given)
    if code in (errors.EXIT_OK, errors.EXIT_PARTIAL):
        # Any call may have published mail that fell due, as on the mailbox's machine, where whatever touches
        # the mailbox renders its recipients' mirrors: the mirrors kept here are rendered again after each one.
        written = _refresh_mirrors(url, token)
        if name == "send" and isinstance(document.get("mirrors"), list):
            document["mirrors"] = _sent_mirrors(document, written, bool(values.get("no_ack")))
    return _answer(status, code, document, emit)


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


def _said_after(name: str, values: dict, emit):
    """`emit`, whose failure, after a call that changed mail, says the truth: the server carried it out."""
    changes = spec.COMMANDS[name].mutating or (name == "read" and not values.get("no_mark_read")
                                              and values.get("thread") is None and not values.get("archived"))
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
    if code not in (errors.EXIT_OK, errors.EXIT_PARTIAL):
        raise Answered(document, code)
    emit(document)
    return code


def _with_uploads(values: dict, given: dict) -> dict:
    """A send's files read here: the body file's text, the refs resolved and checked here, attachments as content."""
    import base64

    from agent_mail import inputs

    prepared, problems = inputs.prepare_send(values)
    if problems:
        raise errors.InvalidInput(problems)
    for key in ("body_file", "ref", "refs", "attach"):
        given.pop(key, None)
    if values.get("body_file") is not None:
        given["body"] = prepared["body"]
    given["client_refs"] = prepared["refs"]
    given["upload_attachments"] = [{"name": a["name"], "content_base64": base64.b64encode(a["content"]).decode()}
                                   for a in prepared["attachments"]]
    return given


def _watch(url: str, token: str, values: dict, given: dict, emit) -> int:
    """A blocked watch as one long request; when the server goes away (a restart) it reconnects and looks again
    for the rest of its wait, up to RECONNECT_SECONDS without a server."""
    from agent_mail import model

    if values["once"]:
        return _answer(*request(url, token, "watch", given), emit)
    minutes = values.get("timeout_minutes") or model.WATCH_MINUTES_DEFAULT
    deadline = time.monotonic() + minutes * 60.0
    given.pop("timeout_minutes", None)
    lost_at = None
    while True:
        wait = max(1.0, deadline - time.monotonic())
        try:
            status, code, document = request(url, token, "watch", {**given, "wait_seconds": round(wait, 3)},
                                              timeout=wait + 60.0)
        except Unreachable:
            status, code, document = 0, errors.EXIT_FAILED, None
        if status in (0, 502, 503, 504):  # no server now, or one stopping: look again once it is back
            lost_at = lost_at or time.monotonic()
            if time.monotonic() - lost_at > RECONNECT_SECONDS:
                raise Unreachable(f"the agent-mail server at {url} has not answered for {RECONNECT_SECONDS:.0f} s; "
                                  "the watch gave up. Nothing was marked read.")
            time.sleep(0.5)
            continue
        return _answer(status, code, document, emit)


def _watch_told_when_stopped(url: str, token: str, values: dict, given: dict, emit) -> int:
    """A blocked watch stopped by SIGTERM, SIGHUP or SIGINT says what became of its session, as on the mailbox's
    machine: its connection closes with the process, and the server, seeing the client hang up, ends the wait and
    releases the session."""
    try:
        return _watch(url, token, values, given, emit)
    except (errors.Interrupted, KeyboardInterrupt) as stop:
        if values["once"]:
            raise
        code = stop.exit_code if isinstance(stop, errors.Interrupted) else 130
        name = {129: "SIGHUP", 130: "SIGINT", 143: "SIGTERM"}.get(code, f"signal {code - 128}")
        raise errors.Interrupted(f"the wait for {values['agent']} was stopped by {name}; the server releases its "
                                 "session as the connection closes, so status shows it as released, not armed.",
                                 code) from None


def _save(url: str, token: str, values: dict, given: dict, emit) -> int:
    """attachments --save-to: the content fetched, then written here exactly as without a server (staged under
    temporary names, moved into place after the result is printed)."""
    import base64

    from agent_mail import files

    given.pop("save_to", None)
    given.pop("overwrite", None)
    status, code, document = request(url, token, "attachments", {**given, "with_content": True})
    if code != errors.EXIT_OK:
        raise Answered(document, code)
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
        summary.update(json.loads(response.getheader("X-Agent-Mail-Result") or "{}"))
        progress = _Progress(f"exported {summary.get('messages')} messages, writing", response.length)
        while chunk := response.read(1 << 20):
            raw.write(chunk)
            progress.step(len(chunk))
        progress.end()
        if response.length:  # the connection ended early: the file would be cut short
            raise Unreachable(f"the export from {url} was cut off; nothing was written.")
    output = values.get("output")
    if output is None or output == "-":
        status, code, document = request(url, token, "export", given, None, path="/v1/export",
                                          into=lambda response: copy(response, sys.stdout.buffer))
        if document is not None:
            raise Answered(document, code)
        sys.stdout.buffer.flush()
        return errors.EXIT_OK
    answered: list = []

    def write(raw) -> None:
        answered.extend(request(url, token, "export", given, None, path="/v1/export",
                                into=lambda response: copy(response, raw)))
        if answered[2] is not None:
            raise Answered(answered[2], answered[1])
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
        status, code, document = request(url, token, "import", {}, None, path=f"/v1/import{query}", body=source,
                                          content_type="application/x-ndjson")
    else:
        shown = os.path.abspath(os.path.expanduser(path))
        try:
            handle = open(shown, "rb")
        except OSError as exc:
            raise _refuse("file", f"cannot open {shown} ({exc.strerror}); nothing was imported") from None
        with handle:
            status, code, document = request(url, token, "import", {}, None, path=f"/v1/import{query}",
                                              body=handle, content_type="application/x-ndjson")
    if code != errors.EXIT_OK:
        raise Answered(document, code)
    document["file"] = shown
    document["next"] = [f"agent-mail import {shown}"] if values["dry_run"] and any(document["added"].values()) \
        else []
    emit(document)
    return errors.EXIT_OK


# -- the notification mirror, written on this machine (agent_mail.remote_mirrors) ---------------------------------

def _look_at_mirror(url: str, token: str, agent: str, after: str | None = None, wait: float | None = None,
                    timeout: float | None = CALL_TIMEOUT_SECONDS):
    """POST /v1/follow: `agent`'s mirror documents (as acting as `agent`: the token must name it)."""
    from agent_mail import api

    body = {"agent": agent} if after is None else {"agent": agent, "after": after, "wait_seconds": wait}
    return request(url, token, "follow", body, timeout, path=api.FOLLOW_PATH)


def _mirror_documents(url: str, token: str, agent: str) -> dict:
    status, code, document = _look_at_mirror(url, token, agent)
    if code != errors.EXIT_OK:
        raise Answered(document, code)
    return document


def _refresh_mirrors(url: str, token: str) -> dict[str, list[dict]]:
    """After a call (it may have changed mail, or published mail that fell due), the mirrors kept on this machine
    for this server rendered again, as the mailbox renders its own in the transaction that changed them: each one
    this token may act as (an identity it does not name is kept current by its own agent's commands or --follow).
    Never fails the command, done already. What was written, by identity."""
    from agent_mail import remote_mirrors

    written: dict[str, list[dict]] = {}
    try:
        kept = remote_mirrors.kept(url)
    except errors.AgentMailError:
        return written
    for agent, directory in sorted(kept.items()):
        try:
            status, code, document = _look_at_mirror(url, token, agent)
        except Unreachable:
            break
        if code == errors.EXIT_OK:
            written[agent] = remote_mirrors.write(agent, directory, document["email"], document["system"])
    return written


def _sent_mirrors(receipt: dict, written: dict[str, list[dict]], no_ack: bool = False) -> list[dict]:
    """A send's receipt lists the mirror files it rewrote on this machine, as a send on the mailbox's machine lists
    its own: its recipients' email mirrors (everyone's but the sender's for a broadcast), and the sender's system
    channel when a recipient was refused, and the replier's email mirror when its reply settled what it answers."""
    from agent_mail import notify

    sender = receipt.get("sender")
    to = {d.get("recipient") for d in receipt.get("deliveries") or [] if d.get("status") == "delivered"}
    if receipt.get("acknowledged") is not None or (no_ack and receipt.get("reply_to") and receipt.get("refused", 0)
                                                    < len(receipt.get("deliveries") or [])):
        to.add(sender)  # a reply that went out settled what it answers: the replier's own mirror changed too
    listed = []
    for agent, results in written.items():
        for result in results:
            if result["path"].endswith(os.sep + notify.EMAIL_FILE):
                if agent in to or (receipt.get("type") == "broadcast" and agent != sender):
                    listed.append(result)
            elif agent == sender and receipt.get("refused"):
                listed.append(result)
    return listed


def _profile(url: str, token: str, values: dict, given: dict, emit) -> int:
    """profile through the server: the mailbox keeps the identity's other settings; the mirror directory is this
    machine's (set, cleared and shown here), its files written here from the server's documents."""
    from agent_mail import inputs, remote_mirrors

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
        raise Answered(document, code)
    old_dir = remote_mirrors.recorded(url, agent)
    mirrors: list[dict] = []
    if wanted_dir is not None or clearing:
        documents = _mirror_documents(url, token, agent)  # acting as the identity: refused (exit 4) before writing
        new_dir = wanted_dir if wanted_dir is not None else None
        remote_mirrors.record(url, agent, new_dir)
        if old_dir and old_dir != new_dir:
            mirrors += remote_mirrors.remove(agent, old_dir)
        if new_dir:
            mirrors += remote_mirrors.write(agent, new_dir, documents["email"], documents["system"])
        old_dir = new_dir
    emit({**document, "mirror_dir": old_dir, "mirrors": mirrors, "mirror_problem": remote_mirrors.problem(old_dir)})
    return errors.EXIT_OK


def _notifications(url: str, token: str, values: dict, given: dict, emit) -> int:
    """notifications through the server: the documents (and dismissals) there; the mirror on this machine rendered
    from them (--clear-email removes its email file here), or kept current (--follow)."""
    from agent_mail import remote_mirrors

    agent = values["agent"]
    if values.get("follow"):
        if values.get("dismiss") or values.get("clear_email"):
            raise _refuse("follow", "runs until stopped; give --dismiss and --clear-email in a call of their own")
        return _follow(url, token, agent, emit)
    clear_email = bool(given.pop("clear_email", False))
    if clear_email:
        _mirror_documents(url, token, agent)  # clearing is acting as the identity, as it is on the mailbox
    status, code, document = request(url, token, "notifications", given)
    if code != errors.EXIT_OK:
        raise Answered(document, code)
    directory = remote_mirrors.recorded(url, agent)
    cleared = False
    if directory:
        system = document["system"] if document["system"].get("events") else None
        remote_mirrors.write(agent, directory, document["email"], system, email_too=not clear_email)
        if clear_email:
            cleared = remote_mirrors.remove(agent, directory)[0]["status"] == "removed"
    emit({**document, "cleared": cleared})
    return errors.EXIT_OK


def _follow(url: str, token: str, agent: str, emit) -> int:
    """notifications --follow through the server: a long look (POST /v1/follow) that answers when the mirror's
    documents change, written here at each change; survives a server restart by looking again; a signal ends it
    with the same final line as on the mailbox's machine."""
    import signal

    from agent_mail import api, jsonout, remote_mirrors, waits

    directory = remote_mirrors.recorded(url, agent)
    if not directory:
        _mirror_documents(url, token, agent)  # a token that may not act as the identity is refused first (exit 4)
        raise _refuse("follow", f"{agent} has no mirror directory on this machine to keep current; set one first: "
                                f"agent-mail profile {agent} --mirror-dir DIR")
    wait = api.LOOK_WAIT_MAX / 5  # a minute a request: a half-open connection is noticed soon
    previous = waits.install_stop_handlers()
    updates, after, lost_at = 0, None, None
    try:
        while True:
            try:
                status, code, document = _look_at_mirror(url, token, agent, after, wait, timeout=wait + 60.0)
            except Unreachable:
                status, code, document = 0, errors.EXIT_FAILED, None
            if status in (0, 502, 503, 504):  # no server now, or one stopping: look again once it is back
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at > RECONNECT_SECONDS:
                    raise Unreachable(f"the agent-mail server at {url} has not answered for {RECONNECT_SECONDS:.0f} "
                                      "s; --follow gave up. The mirror holds what was last written.")
                time.sleep(0.5)
                continue
            lost_at = None
            if code != errors.EXIT_OK:
                raise Answered(document, code)
            if document["fingerprint"] != after:
                mirrors = remote_mirrors.write(agent, directory, document["email"], document["system"])
                updates, after = updates + 1, document["fingerprint"]  # counted as written, before it is said
                emit(jsonout.OneLine(agent=agent, unread=document["unread"], mirrors=mirrors, at=document["at"]))
    except waits.Stopped as stop:
        result = jsonout.OneLine(agent=agent, updates=updates, stopped_by=signal.Signals(stop.signum).name)
        emit(result)
        return errors.EXIT_OK
    finally:
        waits.restore_handlers(previous)
