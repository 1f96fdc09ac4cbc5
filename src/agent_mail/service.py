"""The operations: send, read, ack, status, cleanup. They return plain data.

Every mutating operation takes `emit`, a function that delivers the result to
the caller (the CLI prints it). `emit` runs inside the transaction, before the
commit, so a result that could not be delivered changes nothing.
"""

from __future__ import annotations

import datetime as _dt
import os
from contextlib import contextmanager

from agent_mail import errors, model, spec
from agent_mail.store.base import Store

DEFAULT_PATH = os.path.join("~", ".agent-mail", "mail.db")
ENV_VAR = "AGENT_MAIL_DB"


def _no_emit(document: dict) -> None:
    """Used when the caller wants the returned value only."""


# Annotations are never evaluated (see the __future__ import); the names they use are
# imported for type checkers only, so the CLI does not pay for importing typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    Emit = Callable[[dict], None]  # receives the result document, inside the transaction


# ---------------------------------------------------------------- locating the mailbox


def resolve_location() -> tuple[str, str]:
    """(where the mailbox is, how it was chosen): a PostgreSQL URL as given, or the real path of a SQLite
    file (symbolic links resolved, so the permission check and the wake-up both look at the directory the
    mailbox really lives in)."""
    from agent_mail.store import scheme_of

    override = os.environ.get(ENV_VAR, "")
    if override:  # set but empty counts as unset, as shells make it easy to write
        if not override.strip():
            raise errors.InvalidInput([(ENV_VAR, f"is set to {override!r}, which names no file. Unset it for the "
                                                 f"default mailbox ({DEFAULT_PATH}), or give a path.")])
        if scheme_of(override.strip()) is not None:
            return override.strip(), ENV_VAR
        return os.path.realpath(os.path.expanduser(override)), ENV_VAR
    return os.path.realpath(os.path.expanduser(DEFAULT_PATH)), "default"


def storage_report() -> dict:
    """What `describe` says about the mailbox; never creates it, never shows a password."""
    from agent_mail.store import backend_module, backend_name

    try:
        location, source = resolve_location()
    except errors.InvalidInput as exc:
        return {"backend": "sqlite", "path": None, "source": ENV_VAR, "exists": False, "problem": exc.message}
    backend = backend_name(location)
    if backend != "sqlite":
        from agent_mail.store import redact_url

        report = {"backend": backend, "url": redact_url(location), "source": source}
        try:
            module = backend_module(location)
        except errors.AgentMailError as exc:
            return {**report, "exists": None, "problem": exc.message}
        try:
            return {**report, **module.inspect(location)}
        except errors.InvalidInput as exc:
            return {**report, "exists": None, "problem": exc.message}
    from agent_mail.store import sqlite

    report = {"backend": "sqlite", "path": location, "source": source}
    given = os.environ.get(ENV_VAR) if source == ENV_VAR else DEFAULT_PATH
    if given and os.path.abspath(os.path.expanduser(given)) != location:
        report["link"] = os.path.abspath(os.path.expanduser(given))
    return {**report, **sqlite.inspect(location)}


def doctor(*, repair: bool = False, emit: Emit = _no_emit) -> dict:
    """Check the mailbox this invocation resolves (never creating it); rebuild it with `repair` if damaged."""
    from agent_mail import doctor as checkup
    from agent_mail.store import backend_module, backend_name

    location, _ = resolve_location()
    if backend_name(location) != "sqlite":
        return checkup.doctor_server(location, backend_module(location), emit)
    return checkup.doctor(location, repair, emit)


def copy_mailbox(*, from_: str, to: str | None = None, merge: bool = False, dry_run: bool = False,
                 emit: Emit = _no_emit) -> dict:
    """Copy the mailbox at `from_` into `to` (default: the one this invocation resolves)."""
    from agent_mail import copying
    from agent_mail.store import scheme_of

    def located(value: str, field: str) -> str:
        if not value.strip():
            raise errors.InvalidInput([(field, "is empty; give a SQLite file path or a postgresql:// URL.")])
        if scheme_of(value.strip()) is not None:
            return value.strip()
        path = os.path.realpath(os.path.expanduser(value))
        if field == "--from" and not os.path.isfile(path):
            raise errors.InvalidInput([(field, f"{path} is not a mailbox file; nothing was copied.")])
        return path

    source = located(from_, "--from")
    target = located(to, "--to") if to is not None else resolve_location()[0]
    result = copying.copy(source, target, merge=merge, dry_run=dry_run)
    emit(result)
    return result


@contextmanager
def open_mailbox() -> Iterator["Mailbox"]:
    """Open (creating on first use) the mailbox this invocation resolves."""
    from agent_mail.store import open_store

    location, _ = resolve_location()
    store = open_store(location)
    try:
        mailbox = Mailbox(store)
        mailbox.publish_due()
        yield mailbox
    finally:
        store.close()


# ---------------------------------------------------------------- input preparation (no storage)


def _read_body_file(path: str) -> tuple[str | None, str | None]:
    limit = model.BODY_MAX_CHARS * 4 + 3  # UTF-8 needs at most 4 bytes a character, plus a BOM
    try:
        if path == "-":
            import sys

            stream = sys.stdin.buffer if sys.stdin is not None else None
            if stream is None:
                return None, "standard input is closed; pass --body or a file."
            data = stream.read(limit + 1)
        else:
            if os.path.isdir(path):
                return None, f"{path!r} is a directory; give a UTF-8 text file."
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
    except FileNotFoundError:
        return None, f"{path!r} does not exist (resolved to {os.path.abspath(path)})."
    except OSError as exc:
        return None, f"cannot read {path!r}: {exc.strerror or exc}."
    if len(data) > limit:
        return None, (
            f"is larger than the {model.BODY_MAX_CHARS}-character body limit. A message is coordination, "
            "not content: pass the file with --ref instead."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"{path!r} is not UTF-8 (invalid byte at offset {exc.start}). Convert it to UTF-8."
    return text.removeprefix("\ufeff"), None


def _resolve_ref(path: str) -> tuple[str | None, str | None]:
    if not isinstance(path, str) or not path:
        return None, f"{path!r} is not a path; refs are non-empty strings."
    if "\x00" in path:
        return None, "a ref contains a NUL character."
    problem = _shown_path_problem(path)
    if problem:
        return None, problem
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        return None, f"{path!r} does not exist (resolved to {absolute}). Refs must exist when you send."
    return absolute, None


def _shown_path_problem(path: str) -> str | None:
    """Why a path cannot be passed on as text for others to read and open, or None."""
    if model.has_surrogates(path):
        return (f"{path!r} is not valid UTF-8, so it cannot be passed on as text (another agent could not open "
                "what it was shown). Rename the file to a UTF-8 name.")
    problem = model.bidi_problem(path)
    return f"{path!r} {problem}" if problem else None


def prepare_send(values: dict) -> tuple[dict, list[tuple[str, str]]]:
    """Check and normalise send's inputs without touching the mailbox: (fields, problems)."""
    problems: list[tuple[str, str]] = []
    subject = values.get("subject")
    if subject is not None:
        problem = model.subject_problem(subject)
        if problem:
            problems.append(("--subject", problem))
    body, body_flag = values.get("body"), "--body"
    if values.get("body_file") is not None:
        body_flag = "--body-file"
        body, problem = _read_body_file(values["body_file"])
        if problem:
            problems.append((body_flag, problem))
    if body is not None:
        problem = model.body_problem(body)
        if problem:
            problems.append((body_flag, problem))
    refs: list[str] = []
    for path in values.get("ref") or []:
        absolute, problem = _resolve_ref(path)
        if problem:
            problems.append(("--ref", problem))
        else:
            refs.append(absolute)
    if values.get("refs") is not None:
        import json  # decoding is needed only here: the output side uses jsonout

        try:
            listed = json.loads(values["refs"])
        except ValueError as exc:
            listed = None
            problems.append(("--refs", f"is not valid JSON ({exc}). Prefer --ref PATH, once per path."))
        except RecursionError:
            listed = None
            problems.append(("--refs", "is nested too deeply; give a flat JSON array of paths, e.g. "
                                       "[\"docs/plan.md\"] (or --ref PATH, once per path)."))
        if listed is not None and not isinstance(listed, list):
            problems.append(("--refs", "must be a JSON array of paths, e.g. [\"docs/plan.md\"]."))
            listed = None
        for path in listed or []:
            absolute, problem = _resolve_ref(path)
            if problem:
                problems.append(("--refs", problem))
            else:
                refs.append(absolute)
    if values.get("no_ack") and not values.get("reply_to"):
        problems.append(("--no-ack", "only applies with --reply-to; drop it."))
    recipients = list(dict.fromkeys(_as_list(values.get("to"))))
    if model.BROADCAST in recipients and len(recipients) > 1:
        problems.append(("--to", "'*' already means everyone; give it alone, or list the recipients instead."))
    if len(recipients) > model.RECIPIENTS_MAX:
        problems.append(("--to", f"{len(recipients)} recipients; the limit is {model.RECIPIENTS_MAX} a send. Use '*' "
                                 "or split the send."))
    attachments, attach_problems = _read_attachments(_as_list(values.get("attach")))
    problems += attach_problems
    prepared = {
        "subject": subject,
        "body": body or "",
        "refs": list(dict.fromkeys(refs)),
        "recipients": recipients,
        "attachments": attachments,
    }
    return prepared, problems


def _as_list(value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _read_attachments(paths: list[str]) -> tuple[list[dict], list[tuple[str, str]]]:
    """Read every --attach file now, so what is stored is exactly what was checked."""
    problems: list[tuple[str, str]] = []
    attachments: list[dict] = []
    if not paths:
        return attachments, problems
    import hashlib  # loads OpenSSL: only when something is attached
    import stat
    if len(paths) > model.ATTACHMENTS_MAX_COUNT:
        problems.append(("--attach", f"{len(paths)} files; the limit is {model.ATTACHMENTS_MAX_COUNT} a send."))
        return [], problems
    total, seen = 0, set()
    for path in paths:
        absolute = os.path.abspath(os.path.expanduser(path))
        real = os.path.realpath(absolute)
        if real in seen:
            continue  # the same file named twice is attached once, as refs are listed once
        seen.add(real)
        try:
            info = os.stat(absolute)
        except FileNotFoundError:
            problems.append(("--attach", f"{path!r} does not exist (resolved to {absolute})."))
            continue
        except OSError as exc:
            problems.append(("--attach", f"cannot read {path!r}: {exc.strerror or exc}."))
            continue
        if not stat.S_ISREG(info.st_mode):
            problems.append(("--attach", f"{path!r} is not a regular file; attach files, not directories or devices."))
            continue
        if info.st_size > model.ATTACHMENT_MAX_BYTES:
            problems.append(("--attach", f"{path!r} is {info.st_size} bytes; the limit is {model.ATTACHMENT_MAX_BYTES} "
                                         "a file. Put it somewhere shared and --ref it instead."))
            continue
        try:
            with open(absolute, "rb") as handle:
                content = handle.read(model.ATTACHMENT_MAX_BYTES + 1)
        except OSError as exc:
            problems.append(("--attach", f"cannot read {path!r}: {exc.strerror or exc}."))
            continue
        if len(content) > model.ATTACHMENT_MAX_BYTES:  # it grew while we looked
            problems.append(("--attach", f"{path!r} is over the {model.ATTACHMENT_MAX_BYTES}-byte limit."))
            continue
        total += len(content)
        # A name that is not UTF-8 keeps what it can, so the file still travels; the content is exact.
        name = os.fsencode(os.path.basename(absolute)).decode("utf-8", "replace") or "attachment"
        problem = model.bidi_problem(name)
        if problem:
            problems.append(("--attach", f"the file name {name!r} {problem}"))
            continue
        attachments.append({"name": name, "content": content, "size": len(content),
                            "sha256": hashlib.sha256(content).hexdigest()})
    if total > model.ATTACHMENTS_MAX_BYTES_PER_SEND:
        problems.append(("--attach", f"{total} bytes in all; the limit is {model.ATTACHMENTS_MAX_BYTES_PER_SEND} a "
                                     "send. Split it, or --ref large files."))
    return attachments, problems


def input_problems(command: str, values: dict) -> list[tuple[str, str]]:
    """Problems found without the mailbox, for reporting alongside parse errors."""
    if command == "send":
        return prepare_send(values)[1]
    if command == "status" and values.get("project") is not None:
        return _project_problems(values["project"])
    if command == "profile":
        return _profile_problems(values)
    if command == "export" and values.get("format") not in ("jsonl", "mbox"):
        return [("--format", f"{values.get('format')!r} is not a format: jsonl (to import elsewhere) or mbox (for a "
                             "mail client).")]
    return []


PROFILE_SETTINGS = ("human", "mirror-dir", "max-entries")


def _profile_problems(values: dict) -> list[tuple[str, str]]:
    problems = []
    for name in values.get("clear") or []:
        if name not in PROFILE_SETTINGS:
            problems.append(("--clear", f"{name!r} is not a setting; use one of: {', '.join(PROFILE_SETTINGS)}."))
        elif values.get(name.replace("-", "_")):
            problems.append(("--clear", f"cannot both set and clear {name}."))
    directory = values.get("mirror_dir")
    if directory is not None:
        from agent_mail import notify

        expanded = os.path.expanduser(directory)
        if not os.path.isdir(expanded):
            problems.append(("--mirror-dir", f"{directory!r} is not an existing directory; create it first."))
        elif model.has_surrogates(expanded):
            problems.append(("--mirror-dir", f"{directory!r} is not a UTF-8 path; choose a directory with a UTF-8 "
                                             "name."))
        else:
            problem = notify.mirror_problem(os.path.realpath(expanded))
            if problem:
                problems.append(("--mirror-dir", problem))
    return problems


def _project_problems(project: str) -> list[tuple[str, str]]:
    if model.is_name(project):
        return []
    return [("--project", f"{project!r} is not a project name: lowercase letters, digits and hyphens.")]


def _project(message: dict, fields: list[str] | None) -> dict:
    return {f: message.get(f) for f in (fields or spec.MESSAGE_FIELDS)}


# ---------------------------------------------------------------- liveness

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


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` (on this machine) still runs; True when unknown."""
    if not pid:
        return True  # unknown: assume so
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
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


def next_steps(agent: str, *, unread: int = 0, ack_ids: list[str] | tuple = (), reachable: bool) -> list[str]:
    """The steps, in order: take delivery, settle what was acted on, re-arm (spec.Step: literal commands
    to the CLI, tool calls to the MCP server)."""
    steps = []
    if unread:
        steps.append(spec.Step("read", agent=agent))
    if ack_ids:
        if len(ack_ids) <= 10:
            steps.append(spec.Step("ack", agent=agent, ids=list(ack_ids)))
        else:
            steps.append(spec.Step("ack", agent=agent, all=True))
    if not reachable:
        steps.append(spec.Step("watch", agent=agent))
    return steps


# A blocked watch looks at the mailbox itself this often, whatever woke it or not (see _wait_for_mail).
SAFETY_CHECK_SECONDS = 15.0
RELEASE_PATIENCE_SECONDS = 0.3  # how long a stopped watch waits for the write lock to release its session


class _Stopped(Exception):
    """A signal ended a blocked watch."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


# ---------------------------------------------------------------- operations


class Mailbox:
    """The operations over one store."""

    def __init__(self, store: Store):
        self.store = store
        self._rendered: set[str] = set()  # agents whose files the current transaction rewrote
        # (directory, file name) -> its bytes before the current transaction first wrote it
        self._journal: dict[tuple[str, str], bytes | None] | None = None

    @contextmanager
    def _changing(self, write: bool = True):
        """A transaction whose notification files are put back if it rolls back.

        Files are rendered inside the transaction (from the state about to be committed, and
        serialised by the write lock). If the result then cannot be emitted (or the commit
        fails), every file the transaction wrote gets its earlier bytes back, and the files of
        identities still mirrored are redrawn from the state that stands: a failed command
        leaves no file behind, not even in a mirror directory it failed to record.
        """
        self._rendered, self._journal = set(), {}
        try:
            with self.store.transaction(write=write):
                yield
        except BaseException:
            journal, rendered = self._journal, self._rendered
            self._journal = None
            if journal:
                from agent_mail import notify

                try:
                    with self.store.transaction(write=True):
                        for (directory, name), before in journal.items():
                            notify.write_bytes(directory, name, before)
                        self._render(rendered, system=True)
                except errors.AgentMailError:
                    pass
            raise
        finally:
            self._rendered, self._journal = set(), None

    def _write_mirror(self, directory: str, name: str, document: dict | None) -> dict:
        """Write one notification file, remembering what it held in case the transaction rolls back."""
        from agent_mail import notify

        if self._journal is not None and (directory, name) not in self._journal:
            self._journal[(directory, name)] = notify.read_document(directory, name)
        return notify.write_document(directory, name, document)

    # -- presence --------------------------------------------------------------
    def _presence(self, agent: str) -> dict:
        return describe_liveness(self.store.liveness(agent).get(agent), model.now())

    def _reachability(self, agents: list[str]) -> dict[str, bool]:
        """Whether each identity can be reached now: armed watch, fresh heartbeat, or a human."""
        if not agents:
            return {}
        at = model.now()
        facts = self.store.liveness(agents[0]) if len(agents) == 1 else self.store.liveness()
        humans = self.store.humans()
        return {a: a in humans or describe_liveness(facts.get(a), at)["reachable"] for a in agents}

    def _anyone_reachable(self, besides: str) -> bool:
        """Whether any identity but `besides` can be reached: only those with liveness or a human
        profile can be, so there is no need to list every identity in the mailbox."""
        at = model.now()
        if self.store.humans() - {besides}:
            return True
        return any(describe_liveness(facts, at)["reachable"]
                   for agent, facts in self.store.liveness().items() if agent != besides)

    # -- notification files ---------------------------------------------------------
    def _render(self, agents, *, email: bool = True, system: bool = False) -> list[dict]:
        """Rewrite the notification files of those `agents` that have a mirror directory."""
        from agent_mail import notify

        results = []
        for agent in sorted(set(agents)):
            profile = self.store.profile(agent)
            if not profile or not profile["mirror_dir"]:
                continue
            if self.store.kind != "sqlite" and not os.path.isdir(profile["mirror_dir"]):
                # A shared mailbox: the directory is on the machine of the identity, kept current there by its
                # watch or `notifications --follow`, not on this one.
                results.append({"agent": agent, "path": profile["mirror_dir"], "status": "elsewhere"})
                continue
            self._rendered.add(agent)
            if email:
                outcome = self._write_mirror(profile["mirror_dir"], notify.EMAIL_FILE,
                                             self._unread_mirror(agent, profile))
                results.append({"agent": agent, **outcome})
            if system:
                events = self.store.events(agent)
                document = notify.system_channel(events) if events else None
                results.append({"agent": agent, **self._write_mirror(profile["mirror_dir"], notify.SYSTEM_FILE,
                                                                      document)})
        return results

    def _render_all_mirrors(self, except_agent: str | None = None) -> list[dict]:
        return self._render([a for a in self.store.mirrored_agents() if a != except_agent])

    def _unread_mirror(self, agent: str, profile: dict | None) -> dict | None:
        from agent_mail import notify

        limit = (profile or {}).get("max_entries") or notify.DEFAULT_MAX_ENTRIES
        now = model.now_iso()
        # The newest entries through the index, an exact count beside them; whole rows only for those listed.
        listed = [m["id"] for m in reversed(self.store.unread(agent, now, limit=limit, newest=True))]
        if not listed:
            return None
        found = self.store.addressed(agent, listed, now)
        newest = [found[i] for i in listed]
        attachments = self.store.attachments_of(listed)
        return notify.unread_mirror(agent, newest, self.store.count_unread(agent, now), attachments)

    def publish_due(self) -> list[dict]:
        """Announce scheduled messages that fell due: render their recipients' mirrors. Needs no daemon:
        every command runs this first, and a blocked watch runs it when a message for it falls due."""
        now = model.now_iso()
        with self.store.transaction():
            pending = self.store.due_unpublished(now)
        if not pending:
            return []
        with self._changing():
            due = self.store.due_unpublished(now)
            self.store.mark_published([d["message_id"] for d in due], now)
            direct = [d["recipient"] for d in due if d["recipient"] != model.BROADCAST]
            if any(d["recipient"] == model.BROADCAST for d in due):
                direct += self.store.mirrored_agents()
            return self._render(direct)

    # -- send ----------------------------------------------------------------
    def send(self, *, from_: str, to, subject: str, body: str | None = None, body_file: str | None = None,
             ref=(), refs: str | None = None, reply_to: str | None = None, no_ack: bool = False,
             delay_minutes: float | None = None, attach=(), require_reachable: bool = False,
             emit: Emit = _no_emit) -> dict:
        """Store one copy of the message per recipient ('*' for everyone but the sender), in one transaction."""
        import datetime as dt

        recipients = _as_list(to)
        prepared, problems = prepare_send({
            "subject": subject, "body": body, "body_file": body_file, "ref": ref, "refs": refs,
            "reply_to": reply_to, "no_ack": no_ack, "to": recipients, "attach": attach,
        })
        checks = [("--from", from_)] + [("--to", r) for r in recipients]
        problems = _identity_problems(checks) + problems
        if not recipients:
            problems.append(("--to", "give at least one recipient."))
        if delay_minutes is not None and not 0 <= delay_minutes <= model.DELAY_MINUTES_MAX:
            problems.append(("--delay-minutes", f"use a value from 0 to {model.DELAY_MINUTES_MAX:.0f}."))
        if reply_to is not None and not model.message_id_problem(reply_to) and not model.identity_problem(from_):
            with self.store.transaction():  # found with the other problems, so all are reported at once
                problems += self._reply_to_problems(from_, reply_to)
        if problems:
            raise errors.InvalidInput(problems)
        recipients = prepared["recipients"]  # duplicates collapsed
        moment = model.now()
        created = model.iso(moment)
        deliver_at = model.iso(moment + dt.timedelta(minutes=delay_minutes)) if delay_minutes else None
        batch = model.new_message_id()
        with self._changing():
            gone = self._reply_to_problems(from_, reply_to) if reply_to is not None else []
            if gone:  # deleted (cleanup) since the check above
                raise errors.NotFound(gone)
            reachable = self._reachability([r for r in recipients if r not in (from_, model.BROADCAST)])
            if model.BROADCAST in recipients:
                reachable[model.BROADCAST] = self._anyone_reachable(besides=from_)
            reachable[from_] = True  # a note to yourself needs no check
            deliveries, published = [], []
            for recipient in recipients:
                entry = {"recipient": recipient, "id": None, "status": "delivered",
                         "reachable": reachable[recipient]}
                if require_reachable and not reachable[recipient]:
                    entry["status"] = "refused"
                    entry["reason"] = self._refusal(recipient)
                    self.store.add_event(model.new_message_id(), from_, "email.bounce", {
                        "recipient": recipient, "subject": prepared["subject"], "reason": entry["reason"],
                    }, created)
                    deliveries.append(entry)
                    continue
                message = {
                    "id": model.new_message_id(), "sender": from_, "recipient": recipient,
                    "subject": prepared["subject"], "body": prepared["body"], "refs": prepared["refs"],
                    "reply_to": reply_to, "type": "broadcast" if recipient == model.BROADCAST else "direct",
                    "created": created, "deliver_at": deliver_at, "batch_id": batch,
                }
                self.store.insert_message(message, [a["name"] for a in prepared["attachments"]])
                for position, attachment in enumerate(prepared["attachments"]):
                    self.store.add_attachment(message["id"], position, attachment["name"], attachment["content"],
                                              attachment["sha256"], created)
                entry["id"] = message["id"]
                if deliver_at:
                    entry["status"] = "scheduled"
                    entry["deliver_at"] = deliver_at
                else:
                    published.append(recipient)
                deliveries.append(entry)
            refused = [d for d in deliveries if d["status"] == "refused"]
            # The reply settles what it answers only if it went out to someone.
            acknowledged, touched = (self._settle_reply(from_, reply_to, no_ack, created)
                                     if len(refused) < len(deliveries) else (None, []))
            mirrors = []
            if model.BROADCAST in published:
                mirrors += self._render_all_mirrors(except_agent=from_)
            mirrors += self._render([r for r in published if r != model.BROADCAST] + touched)
            if refused:
                mirrors += self._render([from_], email=False, system=True)
            presence = self._presence(from_)
            single = deliveries[0] if len(deliveries) == 1 else None
            lapsed = presence["watch_state"] in ("released", "stale") and not presence["reachable"]
            receipt = {
                "id": single["id"] if single else None,
                "recipient": single["recipient"] if single else None,
                "sender": from_,
                "subject": prepared["subject"],
                "type": "broadcast" if recipients == [model.BROADCAST] else "direct",
                "created": created,
                "refs": prepared["refs"],
                "attachments": [{k: a[k] for k in ("name", "size", "sha256")} for a in prepared["attachments"]],
                "reply_to": reply_to,
                "acknowledged": acknowledged,
                "batch_id": batch,
                "deliveries": deliveries,
                "delivered": sum(d["status"] == "delivered" for d in deliveries),
                "scheduled": sum(d["status"] == "scheduled" for d in deliveries),
                "refused": len(refused),
                "mirrors": mirrors,
                "sender_reachable": presence["reachable"],
                "next": [spec.Step("watch", agent=from_)] if lapsed else [],
            }
            emit(receipt)
        return receipt

    def _reply_to_problems(self, replier: str, reply_to: str) -> list[tuple[str, str]]:
        if self.store.visible_to(replier, [reply_to], model.now_iso()):
            return []
        return [("--reply-to", _invisible(reply_to, replier) + " Use an id from read.")]

    def _settle_reply(self, replier: str, reply_to: str | None, no_ack: bool, at: str) -> tuple[str | None, list]:
        """A reply marks the answered message read and acknowledged for the replier."""
        if reply_to is None:
            return None, []
        answered = self.store.addressed(replier, [reply_to], at).get(reply_to)
        if answered is None:
            return None, []
        self.store.set_flags(replier, [answered], at, ("read",) if no_ack else ("read", "ack"))
        return (None if no_ack else reply_to), [replier]

    def _refusal(self, recipient: str) -> str:
        if recipient == model.BROADCAST:
            return "nobody is reachable now: no identity has an armed watch, a recent heartbeat or a human profile."
        presence = self._presence(recipient)
        state = presence["watch_state"]
        seen = f", last seen {presence['last_seen']}" if presence["last_seen"] else ""
        if state == "never":
            return f"{recipient} is not reachable: it has never watched and sent no recent heartbeat{seen}."
        if state == "stale":
            return f"{recipient} is not reachable: its watch stopped refreshing without exiting (killed?){seen}."
        return f"{recipient} is not reachable: its last watch ended at {presence['released_at']} and was not " \
               f"re-armed{seen}."

    def cancel(self, *, sender: str, ids, emit: Emit = _no_emit) -> dict:
        """Withdraw scheduled messages of `sender` that have not fallen due."""
        wanted = list(dict.fromkeys(ids))
        now = model.now_iso()
        with self.store.transaction(write=True):
            problems = []
            for message_id in wanted:
                message = self.store.get_message(message_id)
                if message is None:
                    problems.append(("ids", f"no message has id {message_id}."))
                elif message["sender"] != sender:
                    problems.append(("ids", f"message {message_id} was sent by {message['sender']}, not {sender}; "
                                            "only its sender can cancel it."))
                elif message["cancelled_at"] is not None:
                    problems.append(("ids", f"message {message_id} was already cancelled at "
                                            f"{message['cancelled_at']}."))
                elif message["deliver_at"] is None or message["deliver_at"] <= now:
                    when = message["deliver_at"] or message["created"]
                    problems.append(("ids", f"message {message_id} was delivered at {when}; a delivered message "
                                            "cannot be withdrawn (send a correction instead)."))
            if problems:
                raise errors.InvalidInput([(f, m + " Nothing was cancelled.") for f, m in problems])
            for message_id in wanted:
                self.store.cancel(message_id, now)
            result = {"sender": sender, "cancelled": wanted, "count": len(wanted)}
            emit(result)
        return result

    # -- read and handling --------------------------------------------------------
    def read(self, *, agent: str, all: bool = False, from_: str | None = None, limit: int = 50,
             thread: str | None = None, archived: bool = False, no_mark_read: bool = False, ack: bool = False,
             fields: list[str] | None = None, emit: Emit = _no_emit) -> dict:
        """Take delivery of `agent`'s mail; see spec.COMMANDS['read'] for the modes."""
        now = model.now_iso()
        if thread is not None or archived:
            with self.store.transaction():
                if thread is not None:
                    if not self.store.visible_to(agent, [thread], now):
                        raise errors.NotFound([("--thread", _invisible(thread, agent))])
                    messages = self.store.thread(thread, agent, now)
                else:
                    messages = self.store.archived(agent, now, sender=from_)[-limit:]
                result = self._read_result(agent, messages, fields, remaining=self.store.count_unread(agent, now),
                                           suggest_ack=False)
                emit(result)
            return result
        marking = not no_mark_read
        with self._changing(write=marking or ack):
            # The page comes from arrival-ordered indexes, and whole rows only for it: the cost is the
            # page's, not the backlog's. The unread total is counted, not listed.
            if all:
                listed = self.store.latest(agent, now, limit=limit, sender=from_)
            else:
                listed = self.store.unread(agent, now, limit=limit, sender=from_)
            found = self.store.addressed(agent, [m["id"] for m in listed], now)
            messages = [found[m["id"]] for m in listed]
            unread = self.store.count_unread(agent, now)
            page_unread = sum(m["read_at"] is None for m in messages)
            fresh = [m for m in messages if m["read_at"] is None] if marking else []
            unacked = [m for m in messages if m["acked_at"] is None] if ack else []
            if fresh:
                self.store.set_flags(agent, fresh, now, ("read",))
            if unacked:
                self.store.set_flags(agent, unacked, now, ("read", "ack"))
            for m in fresh + unacked:
                m["read_at"] = m["read_at"] or now
            for m in unacked:
                m["acked_at"] = now
            # Marking (or --ack) takes delivery of every unread message on the page; --no-mark-read of none.
            remaining = unread - (page_unread if marking or ack else 0)
            result = self._read_result(agent, messages, fields, remaining=remaining)
            changed = bool(fresh or unacked)
            if changed:
                self._render([agent])
            emit(result)
        return result

    def _read_result(self, agent: str, messages: list[dict], fields: list[str] | None, remaining: int,
                     suggest_ack: bool = True) -> dict:
        attachments = self.store.attachments_of([m["id"] for m in messages])
        for message in messages:
            message["attachments"] = attachments.get(message["id"], [])
        listed = [_project(m, fields) for m in messages]
        reachable = self._presence(agent)["reachable"]
        # Only what has been delivered to the agent (read) is offered for acknowledging: `ack --all`
        # settles read mail only, so the hint can never settle mail the agent was not shown.
        to_ack = [m["id"] for m in messages if m["acked_at"] is None and m["read_at"] is not None
                  and m["sender"] != agent] if suggest_ack else []
        return {"agent": agent, "messages": listed, "count": len(listed), "remaining": remaining,
                "reachable": reachable,
                "next": next_steps(agent, unread=remaining, ack_ids=to_ack, reachable=reachable)}

    def _addressed_or_fail(self, agent: str, wanted: list[str], now: str) -> dict[str, dict]:
        """The messages, all of them addressed to `agent`, or an error naming each one that is not."""
        found = self.store.addressed(agent, wanted, now)
        problems = []
        for message_id in wanted:
            if message_id in found:
                continue
            if self.store.visible_to(agent, [message_id], now):
                problems.append(("ids", f"message {message_id} was sent by {agent}, not addressed to it; nothing was "
                                        "changed."))
            else:
                problems.append(("ids", _invisible(message_id, agent) + " Nothing was changed."))
        if problems:
            raise errors.NotFound(problems)
        return found

    def ack(self, *, agent: str, ids=(), all: bool = False, emit: Emit = _no_emit) -> dict:
        """Record that `agent` acted on these messages (all outstanding ones with all=True)."""
        return self._handle(agent, ids, emit, "ack", "acked", "already_acked", "acked_at",
                            outstanding=self.store.read_unacked if all else None, stamp="acked_at",
                            count_unread_left=True)

    def _handle(self, agent: str, ids, emit: Emit, flag: str, done: str, already_key: str, state: str, *,
                outstanding=None, stamp: str | None = None, count_unread_left: bool = False) -> dict:
        """Stamp `flag` (and read) on messages addressed to `agent`: the given ids, all or nothing,
        or every message `outstanding(agent, now)` lists that was delivered (read) already: mail
        nobody was shown is never settled in bulk."""
        wanted = list(dict.fromkeys(ids))
        now = model.now_iso()
        with self._changing():
            if outstanding is not None:
                fresh, already = outstanding(agent, now), []
            else:
                found = self._addressed_or_fail(agent, wanted, now)
                fresh = [found[i] for i in wanted if found[i][state] is None]
                already = [i for i in wanted if found[i][state] is not None]
            self.store.set_flags(agent, fresh, now, tuple(dict.fromkeys(("read", flag))))
            unread = self.store.count_unread(agent, now)  # after: what is left unread
            reachable = self._presence(agent)["reachable"]
            result = {"agent": agent}
            if stamp:
                result[stamp] = now if fresh else None
            result.update({
                done: [m["id"] for m in fresh],
                already_key: already,
                "count": len(fresh),
            })
            if count_unread_left:
                # with --all: unread mail is never settled in bulk, so all of it was left alone
                result["unread_left"] = unread if outstanding is not None else 0
            result.update({
                "reachable": reachable,
                "next": next_steps(agent, unread=unread, reachable=reachable),
            })
            if fresh:
                self._render([agent])
            emit(result)
        return result

    def dismiss(self, *, agent: str, ids, emit: Emit = _no_emit) -> dict:
        """Mark messages read without returning them."""
        return self._handle(agent, ids, emit, "read", "dismissed", "already_read", "read_at")

    def archive(self, *, agent: str, ids, emit: Emit = _no_emit) -> dict:
        """Take messages out of the inbox; `read --archived` still lists them."""
        return self._handle(agent, ids, emit, "archive", "archived", "already_archived", "archived_at")

    def delete(self, *, agent: str, ids, emit: Emit = _no_emit) -> dict:
        """Remove messages from every view of `agent`; the other parties keep theirs."""
        return self._handle(agent, ids, emit, "delete", "deleted", "already_deleted", "deleted_at")

    # -- attachments -------------------------------------------------------------
    def attachments(self, *, agent: str, id: str, save_to: str | None = None, overwrite: bool = False,
                    emit: Emit = _no_emit) -> dict:
        """List a message's attachments, or write them into `save_to`.

        Saving writes every file under a temporary name first and moves them into place only after
        the result has been emitted: a save that cannot print, fails or is killed leaves nothing
        under a final name and replaces nothing.
        """
        now = model.now_iso()
        with self.store.transaction():
            if not self.store.visible_to(agent, [id], now):
                raise errors.NotFound([("id", _invisible(id, agent))])
            listed = self.store.attachments_of([id]).get(id, [])
            contents = {}
            if save_to is not None:
                for attachment in listed:
                    contents[attachment["sha256"]] = self.store.attachment_content(attachment["sha256"])
        staged = None
        if save_to is not None:
            from agent_mail import files

            staged = files.stage_attachments(save_to, listed, contents, overwrite)
        result = {"agent": agent, "id": id, "attachments": listed, "count": len(listed),
                  "directory": staged.target if staged else None, "saved": staged.saved if staged else []}
        if staged is None:
            emit(result)
            return result
        try:
            emit(result)
        except BaseException:
            staged.discard()
            raise
        staged.publish()
        return result

    # -- profiles and notifications ------------------------------------------------
    def profile(self, *, agent: str, human: bool = False, mirror_dir: str | None = None,
                max_entries: int | None = None, clear=(), emit: Emit = _no_emit) -> dict:
        """Show, or change, `agent`'s optional settings."""
        values = {"human": human, "mirror_dir": mirror_dir, "max_entries": max_entries, "clear": list(clear)}
        problems = _profile_problems(values)
        if problems:
            raise errors.InvalidInput(problems)
        changing = human or mirror_dir is not None or max_entries is not None or bool(clear)
        with self._changing(write=changing):
            current = self.store.profile(agent) or {"agent": agent, "human": False, "mirror_dir": None,
                                                     "max_entries": None, "updated_at": None}
            mirrors = []
            if changing:
                updated = dict(current)
                if human:
                    updated["human"] = True
                if mirror_dir is not None:
                    updated["mirror_dir"] = os.path.realpath(os.path.expanduser(mirror_dir))
                if max_entries is not None:
                    updated["max_entries"] = max_entries
                for name in clear:
                    updated[name.replace("-", "_")] = False if name == "human" else None
                updated["updated_at"] = model.now_iso()
                self.store.save_profile(updated)
                old_dir = current["mirror_dir"]
                if old_dir and old_dir != updated["mirror_dir"]:
                    from agent_mail import notify

                    for name in (notify.EMAIL_FILE, notify.SYSTEM_FILE):
                        mirrors.append({"agent": agent, **self._write_mirror(old_dir, name, None)})
                mirrors += self._render([agent], system=True)
                current = updated
            from agent_mail import notify

            result = {**{k: current[k] for k in ("agent", "human", "mirror_dir", "max_entries", "updated_at")},
                      "mirrors": mirrors,
                      "mirror_problem": notify.mirror_problem(current["mirror_dir"]) if current["mirror_dir"] else None}
            emit(result)
        return result

    def notifications(self, *, agent: str, dismiss=(), clear_email: bool = False, follow: bool = False,
                      emit: Emit = _no_emit) -> dict:
        """The unread mirror and the system channel of `agent`; optionally dismiss events or clear the file,
        or (follow) keep its mirror current until stopped."""
        from agent_mail import notify

        if follow:

            if dismiss or clear_email:
                raise errors.InvalidInput([("--follow", "runs until stopped; give --dismiss and --clear-email in a "
                                                        "call of their own.")])
            return self._follow(agent, emit)
        wanted = list(dict.fromkeys(dismiss))
        with self._changing(write=bool(wanted)):
            dismissed = []
            if wanted:
                dismissed = self.store.dismiss_events(agent, wanted, model.now_iso())
                unknown = [i for i in wanted if i not in dismissed]
                if unknown:
                    raise errors.NotFound([("--dismiss", f"{i} is not an open event of {agent}; nothing was "
                                                         "dismissed.") for i in unknown])
                self._render([agent], email=False, system=True)
            profile = self.store.profile(agent)
            cleared = False
            if clear_email and profile and profile["mirror_dir"]:
                cleared = self._write_mirror(profile["mirror_dir"], notify.EMAIL_FILE, None)["status"] == "removed"
            result = {
                "agent": agent,
                "email": self._unread_mirror(agent, profile),
                "system": notify.system_channel(self.store.events(agent)),
                "dismissed": dismissed,
                "cleared": cleared,
            }
            emit(result)
        return result

    def _follow(self, agent: str, emit: Emit) -> dict:
        """Re-render `agent`'s mirror whenever a wake-up for it arrives (mail committed by anyone, on any
        machine), a delayed message falls due, or the safety-net look finds new mail; until a signal."""
        import time

        from agent_mail import jsonout

        with self.store.transaction():
            profile = self.store.profile(agent)
        if not profile or not profile["mirror_dir"]:
            raise errors.InvalidInput([("--follow", f"{agent} has no mirror directory to keep current; set one "
                                                    f"first: agent-mail profile {agent} --mirror-dir DIR")])
        previous = _install_stop_handlers()
        updates = 0
        try:
            self.store.listen(agent)
            marker = self.store.mail_marker()
            check_every = SAFETY_CHECK_SECONDS * self.store.idle_scale
            check_at = time.monotonic() + check_every
            while True:
                self.publish_due()
                with self.store.transaction():
                    mirrors = self._render([agent], system=True)
                    unread = self.store.count_unread(agent, model.now_iso())
                emit(jsonout.OneLine(agent=agent, unread=unread, mirrors=mirrors, at=model.now_iso()))
                updates += 1
                until_due = self._next_due(agent)
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
        except _Stopped as stop:
            import signal

            result = jsonout.OneLine(agent=agent, updates=updates, stopped_by=signal.Signals(stop.signum).name)
            emit(result)
            return result
        finally:
            _restore_handlers(previous)

    # -- liveness ----------------------------------------------------------------
    def heartbeat(self, *, agent: str, emit: Emit = _no_emit) -> dict:
        """Record that `agent` is present without a blocked watch."""
        at = model.now_iso()
        with self.store.transaction(write=True):
            self.store.record_heartbeat(agent, at)
            unread = self.store.count_unread(agent, at)
            # The heartbeat just recorded makes it reachable for the next LIVENESS_SECONDS.
            result = {"agent": agent, "last_seen": at, "unread": unread, "reachable": True,
                      "next": next_steps(agent, unread=unread, reachable=True)}
            emit(result)
        return result

    def wait_armed(self, agent: str, seconds: float, look_for=None, wanted=None) -> list[dict]:
        """Block as a watch does (an armed liveness session, released on the way out, signals included) until
        look_for() finds something, wanted() turns False, or `seconds` pass; what was found, or []."""
        self.store.relax_durability()  # this connection writes liveness only; skip its syncs
        session = model.new_message_id()
        previous = _install_stop_handlers()
        try:
            with self.store.transaction(write=True):
                self.store.open_session(session, agent, model.now_iso())
            found = self._wait_for_mail(agent, session, seconds, look_for, wanted)
            self._release(session, "mail" if found else "timeout")
            return found
        except _Stopped as stop:
            self._release(session, f"signal {stop.signum}", quietly=True)
            import signal

            name = signal.Signals(stop.signum).name
            raise errors.Interrupted(f"the wait for {agent} was stopped by {name}; its session was released, "
                                     "so status shows it as released, not armed.", 128 + stop.signum) from None
        except BaseException:
            self._release(session, "error", quietly=True)
            raise
        finally:
            _restore_handlers(previous)

    def watch(self, *, agent: str, timeout_minutes: float | None = None, once: bool = False,
              timeout_seconds: float | None = None, wanted=None, emit: Emit = _no_emit) -> dict:
        """Block until `agent` has unread mail (or the timeout passes); return envelopes, consume nothing.
        timeout_seconds: a shorter wait than the command line allows (the MCP tool's bounded wait);
        wanted(): checked at each refresh, False ends the wait early (the MCP call was cancelled)."""
        if once:
            return self._watch_result(agent, self._envelopes(agent), emit=emit, heartbeat=True)
        minutes = model.WATCH_MINUTES_DEFAULT if timeout_minutes is None else timeout_minutes
        if timeout_seconds is not None:
            minutes = timeout_seconds / 60.0
        # Handlers first (in wait_armed): a signal that arrives once the session exists must still release it.
        messages = self.wait_armed(agent, minutes * 60.0, wanted=wanted)
        # On a shared mailbox the sender may be on another machine, where this agent's mirror directory is not:
        # the watch, on the agent's machine, brings the mirror up to date (files only, best effort).
        return self._watch_result(agent, messages, emit=emit, render=bool(messages) and self.store.kind != "sqlite")

    def _release(self, session: str, reason: str, quietly: bool = False) -> None:
        """Mark the session released (a no-op if it never got stored or is released already).

        On the way out of a failure or a signal (quietly) the lock is waited for briefly only: a
        signal must end the process promptly, and a session left armed turns stale by itself.
        """
        try:
            self.store.release_session_alone(session, model.now_iso(), reason,
                                             patience=RELEASE_PATIENCE_SECONDS if quietly else None)
        except errors.StorageError:
            if not quietly:  # on the way out of another failure, that failure is the one to report
                raise

    def _envelopes(self, agent: str) -> list[dict]:
        with self.store.transaction():
            return self.store.unread(agent, model.now_iso(), lean=True, layout_level=2)  # result.messages[i]

    def _next_due(self, agent: str) -> float | None:
        """Seconds until the next scheduled message for `agent` falls due, or None."""
        now = model.now()
        with self.store.transaction():
            due = self.store.next_due(agent, model.iso(now))
        moment = model.parse_iso(due)
        return None if moment is None else max(0.0, (moment - now).total_seconds())

    def _wait_for_mail(self, agent: str, session: str, seconds: float, look_for=None, wanted=None) -> list[dict]:
        """The blocking loop: sleep until `agent` is woken (mail for it, or a broadcast, was committed) or a
        scheduled message for it falls due, refreshing liveness; return the envelopes, or [] at the deadline.

        look_for(): what to look for instead of every unread envelope (a hook's waiter: mail its session was
        not told of); wanted(): checked at each refresh, False ends the wait as a timeout (its harness is gone).

        Nothing else wakes it: not other watches' refreshes, heartbeats, reads or mail for others. Every
        SAFETY_CHECK_SECONDS it also checks that its mailbox is still there and whether any message was
        added at all, and looks if so: the safety net for mail whose wake-up was lost (a sender killed
        between its commit and its wake-up, another tool writing the mailbox).
        """
        import time

        now = time.monotonic()
        # A backend whose open connection already tells that the watch is there (PostgreSQL) refreshes its row
        # and looks for lost wake-ups less often (idle_scale): fewer wake-ups for a hundred idle watches.
        refresh_every = model.REFRESH_SECONDS * self.store.idle_scale
        check_every = SAFETY_CHECK_SECONDS * self.store.idle_scale
        deadline, refresh_at, check_at = now + seconds, now + refresh_every, now + check_every
        # wanted() is asked every REFRESH_SECONDS whatever the backend: it costs no round trip.
        ask_at = now + model.REFRESH_SECONDS if wanted is not None else deadline
        self.store.listen(agent, session)  # before the first look: mail committed after it always wakes us
        marker = self.store.mail_marker()
        look, due_at = True, None
        while True:
            if due_at is not None and time.monotonic() >= due_at:
                self.publish_due()
                look = True
            if look:
                messages = self._envelopes(agent) if look_for is None else look_for()
                if messages:
                    return messages
                until_due = self._next_due(agent)
                due_at = None if until_due is None else time.monotonic() + until_due
                look = False
            now = time.monotonic()
            if now >= deadline:
                return []
            if now >= ask_at:
                if not wanted():
                    return []
                ask_at = now + model.REFRESH_SECONDS
            if now >= refresh_at:
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
            if self.store.wait_for_wake(max(0.0, wake - now)):
                look = True

    def _watch_result(self, agent: str, messages: list[dict], *, emit: Emit, heartbeat: bool = False,
                      render: bool = False) -> dict:
        # A --once check records its heartbeat in the same transaction as its result: if the result
        # cannot be printed, the agent was not seen.
        with self.store.transaction(write=heartbeat):
            if render:
                self._render([agent])
            if heartbeat:
                self.store.record_heartbeat(agent, model.now_iso())
            facts = self.store.liveness(agent).get(agent)
            # Reachable after this call: another watch is armed (a --once check counts as presence).
            presence = describe_liveness(facts, model.now())
            reachable = presence["reachable"] if heartbeat else presence["watch_state"] == "armed"
            result = {
                "agent": agent,
                "messages": messages,
                "count": len(messages),
                "timeout": not messages,
                "reachable": reachable,
                "next": next_steps(agent, unread=len(messages), reachable=reachable),
            }
            emit(result)
        return result

    # -- search -------------------------------------------------------------------
    _SEARCH_CHUNK = 200  # rows asked of the index at a time (a send to several is several rows)

    def search(self, *, query: str, agent: str | None = None, from_: str | None = None, to: str | None = None,
               since_days: float | None = None, thread: str | None = None, limit: int = 20,
               fields: list[str] | None = None, emit: Emit = _no_emit) -> dict:
        """Messages matching `query`, ranked: subject matches first, then the rest, newest first in each."""
        from agent_mail import search as words

        parsed = words.parse(query)
        if not self.store.searchable():
            raise errors.AgentMailError(
                "this mailbox has no search index: the SQLite library Python uses here was built without FTS5. "
                "Run agent-mail with a Python whose sqlite3 has FTS5 (python.org and most distributions' do).")
        now = model.now_iso()
        since = model.iso(model.now() - _dt.timedelta(days=since_days)) if since_days is not None else None
        if self.store.index_behind():  # rows another tool stored since: indexed before looking
            with self.store.transaction(write=True):
                self.store.index_missing()
        with self.store.transaction():
            thread_ids = None
            if thread is not None:
                if agent is not None and not self.store.visible_to(agent, [thread], now):
                    raise errors.NotFound([("--thread", _invisible(thread, agent))])
                thread_ids = [row["id"] for row in self.store.whole_thread(thread)]
                if thread not in thread_ids:
                    raise errors.NotFound([("--thread", f"no message {thread} exists in this mailbox.")])
            found: dict[str, tuple[dict, str]] = {}  # one per send (its batch), in ranked order
            more = False
            for subject_only in (True, False):
                before = None
                while not more:
                    rows = self.store.search_rows(parsed, subject_only=subject_only, now=now, before=before,
                                                  limit=self._SEARCH_CHUNK, agent=agent, sender=from_, recipient=to,
                                                  since=since, thread_ids=thread_ids)
                    for row in rows:
                        key = row["batch_id"] or row["id"]
                        if key in found:
                            continue
                        if len(found) == limit:
                            more = True
                            break
                        found[key] = (row, "subject" if subject_only else "text")
                    if len(rows) < self._SEARCH_CHUNK:
                        break
                    before = rows[-1]["seq"]
                if more:
                    break
            results = self._search_results(list(found.values()), parsed, agent)
        listed = [{f: r[f] for f in (fields or spec.SEARCH_FIELDS)} for r in results]
        reader = agent or (results[0]["sender"] if results else None)
        result = {"query": _shown_query(parsed), "results": listed, "count": len(listed), "more": more,
                  "next": [spec.Step("read", agent=reader, thread=results[0]["id"])] if results else []}
        emit(result)
        return result

    def _search_results(self, hits: list[tuple[dict, str]], parsed, agent: str | None) -> list[dict]:
        from agent_mail import search as words

        # A send to several: its recipients (all of them for its sender or the supervisor; a recipient sees its
        # own copy only), and the first copy's id for those who see them all.
        batches = {row["batch_id"] for row, _ in hits if row["batch_id"] and row["type"] != "broadcast"
                   and (agent is None or row["sender"] == agent)}
        copies: dict[str, list[dict]] = {}
        for row in self.store.batch_rows(sorted(batches)):
            copies.setdefault(row["batch_id"], []).append(row)
        names = self.store.attachments_of([row["id"] for row, _ in hits])
        results = []
        for row, matched in hits:
            shown_id, recipients = row["id"], [row["recipient"]]
            if row["batch_id"] in copies:
                shown_id = copies[row["batch_id"]][0]["id"]
                recipients = [c["recipient"] for c in copies[row["batch_id"]]]
            results.append({"id": shown_id, "sender": row["sender"], "recipients": recipients,
                            "subject": row["subject"], "attachments": [a["name"] for a in names.get(row["id"], [])],
                            "matched": matched, "type": row["type"], "created": row["created"],
                            "deliver_at": row["deliver_at"], "reply_to": row["reply_to"],
                            "withdrawn": row["cancelled_at"] is not None})
            results[-1]["snippet"] = words.snippet(row["subject"], row["body"], parsed, results[-1]["attachments"])
        return results

    # -- overview -----------------------------------------------------------------
    def status(self, *, agent: str | None = None, project: str | None = None, fields: list[str] | None = None,
               emit: Emit = _no_emit) -> dict:
        """One row per identity seen in traffic, watches, heartbeats or profiles (or just `agent`)."""
        if project is not None and _project_problems(project):
            raise errors.InvalidInput(_project_problems(project))
        now = model.now_iso()
        with self.store.transaction():
            if agent is not None:  # one identity: its own counts, not everyone's
                counts = {agent: {"unread": self.store.count_unread(agent, now),
                                  "unacked": self.store.count_unacked(agent, now)}}
            else:
                counts = self.store.agent_counts(now)
            liveness = self.store.liveness(agent)
            harness = live_sessions(self.store.harness_sessions_of(agent), model.now())
        at = model.now()
        sessions: dict[str, int] = {}
        for session in harness:
            sessions[session["agent"]] = sessions.get(session["agent"], 0) + 1
        if agent is not None:
            names = [agent]
        else:
            names = sorted(set(counts) | set(sessions))
            if project is not None:
                names = [n for n in names if n.split(":", 1)[0] == project]
        rows = []
        for name in names:
            row = {"agent": name, **counts.get(name, {"unread": 0, "unacked": 0})}
            row.update(describe_liveness(liveness.get(name), at))
            del row["reachable"]
            row["sessions"] = sessions.get(name, 0)
            rows.append({f: row[f] for f in fields} if fields else row)
        result = {"agents": rows, "count": len(rows)}
        emit(result)
        return result

    def cleanup(self, *, older_than: int, dry_run: bool = False, emit: Emit = _no_emit) -> dict:
        """Delete messages (and what hangs off them, and old liveness rows and events) older than `older_than` days."""
        cutoff = model.iso(model.now() - _dt.timedelta(days=older_than))
        leftovers = self.store.leftovers()
        with self.store.transaction(write=not dry_run):
            counts = self.store.cleanup(cutoff, dry_run)
            result = {"dry_run": dry_run, "cutoff": cutoff, **counts, "temporary_files_deleted": len(leftovers)}
            emit(result)
        if not dry_run:
            self.store.remove_leftovers(leftovers)  # files of killed processes: nothing to roll back
        if not dry_run and counts["deleted_count"]:
            with self.store.transaction():
                self._render(self.store.mirrored_agents())
        return result


def _install_stop_handlers() -> dict:
    """Turn SIGTERM / SIGHUP / SIGINT into an exception, so a stopped watch releases its session."""
    import signal

    def stop(signum, frame):
        raise _Stopped(signum)

    previous = {}
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        number = getattr(signal, name, None)
        if number is None:
            continue
        try:
            previous[number] = signal.signal(number, stop)
        except (ValueError, OSError):  # not the main thread, or not allowed here
            pass
    return previous


def _restore_handlers(previous: dict) -> None:
    import signal

    for number, handler in previous.items():
        signal.signal(number, handler)


def _shown_query(parsed) -> str:
    """The query as understood, in the language's own forms."""
    shown = [" OR ".join(t.shown() for t in group) for group in parsed.groups]
    return " ".join(shown + [f"-{t.shown()}" for t in parsed.excluded])


def _invisible(message_id: str, agent: str) -> str:
    """The one answer for a message an identity may not see, whether or not it exists."""
    return (f"no message {message_id} is visible to {agent} (it does not exist, or {agent} neither sent nor "
            "received it).")


def _identity_problems(identities: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Identity checks for callers that bypass the CLI parser (library use)."""
    problems = []
    for flag, value in identities:
        problem = model.identity_problem(value, allow_broadcast=flag == "--to")
        if problem:
            problems.append((flag, problem))
    return problems
