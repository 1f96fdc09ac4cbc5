"""The operations: send, read, ack, status, cleanup. They return plain data.

Every mutating operation takes `emit`, a function that delivers the result to
the caller (the CLI prints it). `emit` runs inside the transaction, before the
commit, so a result that could not be delivered changes nothing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from contextlib import contextmanager

from agent_mail import errors, model
from agent_mail.store.base import Store

DEFAULT_PATH = os.path.join("~", ".agent-mail", "mail.db")
ENV_VAR = "AGENT_MAIL_DB"


def _no_emit(document: dict) -> None:
    """Used when the caller wants the returned value only."""


# Annotations below are never evaluated (see the __future__ import), so `Emit`
# (a callable taking the result document) needs no runtime import of typing.


# ---------------------------------------------------------------- locating the mailbox


def resolve_path() -> tuple[str, str]:
    """(path, how it was chosen) for this invocation."""
    override = os.environ.get(ENV_VAR, "")
    if override.strip():
        return os.path.abspath(os.path.expanduser(override)), ENV_VAR
    return os.path.expanduser(DEFAULT_PATH), "default"


def storage_report() -> dict:
    """What `describe` says about the mailbox; never creates it."""
    from agent_mail.store import sqlite

    path, source = resolve_path()
    return {"backend": "sqlite", "path": path, "source": source, **sqlite.inspect(path)}


@contextmanager
def open_mailbox() -> Iterator["Mailbox"]:
    """Open (creating on first use) the mailbox this invocation resolves."""
    from agent_mail.store.sqlite import SQLiteStore

    path, _ = resolve_path()
    store = SQLiteStore(path)
    try:
        yield Mailbox(store)
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
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        return None, f"{path!r} does not exist (resolved to {absolute}). Refs must exist when you send."
    return absolute, None


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
        try:
            listed = json.loads(values["refs"])
        except ValueError as exc:
            listed = None
            problems.append(("--refs", f"is not valid JSON ({exc}). Prefer --ref PATH, once per path."))
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
    prepared = {
        "subject": subject,
        "body": body or "",
        "refs": list(dict.fromkeys(refs)),
    }
    return prepared, problems


def input_problems(command: str, values: dict) -> list[tuple[str, str]]:
    """Problems found without the mailbox, for reporting alongside parse errors."""
    if command == "send":
        return prepare_send(values)[1]
    if command == "status" and values.get("project") is not None:
        return _project_problems(values["project"])
    return []


def _project_problems(project: str) -> list[tuple[str, str]]:
    if model.IDENTITY_RE.fullmatch(f"{project}:x"):
        return []
    return [("--project", f"{project!r} is not a project name: lowercase letters, digits and hyphens.")]


def _project(message: dict, fields: list[str] | None) -> dict:
    message = {k: v for k, v in message.items() if k != "seq"}
    if fields:
        return {f: message.get(f) for f in fields}
    return message


# ---------------------------------------------------------------- liveness

_NEVER = {"armed_seen": None, "released_at": None, "session_seen": None, "heartbeat": None, "sessions": 0}


def describe_liveness(facts: dict | None, at: _dt.datetime) -> dict:
    """watching / last_seen / watch_state / released_at / reachable from stored liveness facts."""
    from agent_mail import spec

    facts = facts or _NEVER

    def within(moment, seconds):
        return moment is not None and (at - moment).total_seconds() <= seconds

    seen = [m for m in (facts["session_seen"], facts["heartbeat"]) if m is not None]
    last_seen = max(seen) if seen else None
    armed_seen, released_at = facts["armed_seen"], facts["released_at"]
    if not facts["sessions"]:
        state = "never"
    elif within(armed_seen, spec.STALE_SECONDS):
        state = "armed"
    elif armed_seen is not None and (released_at is None or armed_seen > released_at):
        state = "stale"  # the newest session stopped refreshing without ever exiting: killed
    else:
        state = "released"
    return {
        "watching": within(last_seen, spec.LIVENESS_SECONDS),
        "last_seen": model.iso(last_seen) if last_seen else None,
        "watch_state": state,
        "released_at": model.iso(released_at) if released_at else None,
        "reachable": state == "armed" or within(facts["heartbeat"], spec.LIVENESS_SECONDS),
    }


def next_steps(agent: str, *, unread: int = 0, ack_ids: list[str] | tuple = (), reachable: bool) -> list[str]:
    """Literal commands, in order: take delivery, settle what was acted on, re-arm."""
    steps = []
    if unread:
        steps.append(f"agent-mail read {agent}")
    if ack_ids:
        if len(ack_ids) <= 10:
            steps.append(f"agent-mail ack {agent} " + " ".join(ack_ids))
        else:
            steps.append(f"agent-mail ack {agent} --all")
    if not reachable:
        steps.append(f"agent-mail watch {agent}")
    return steps


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

    def send(self, *, from_: str, to: str, subject: str, body: str | None = None, body_file: str | None = None,
             ref: list[str] | tuple = (), refs: str | None = None, reply_to: str | None = None,
             no_ack: bool = False, emit: Emit = _no_emit) -> dict:
        """Store one message for `to` ('*' for everyone but the sender)."""
        prepared, problems = prepare_send({
            "subject": subject, "body": body, "body_file": body_file, "ref": ref, "refs": refs,
            "reply_to": reply_to, "no_ack": no_ack,
        })
        problems = _identity_problems({"--from": from_, "--to": to}) + problems
        if problems:
            raise errors.InvalidInput(problems)
        created = model.now_iso()
        message = {
            "id": model.new_message_id(),
            "sender": from_,
            "recipient": to,
            "subject": prepared["subject"],
            "body": prepared["body"],
            "refs": prepared["refs"],
            "reply_to": reply_to,
            "type": "broadcast" if to == model.BROADCAST else "direct",
            "created": created,
        }
        with self.store.transaction(write=True):
            acknowledged = None
            if reply_to is not None:
                if self.store.get_message(reply_to) is None:
                    raise errors.NotFound([("--reply-to", f"no message has id {reply_to}. Use an id from read.")])
                answered = self.store.addressed(from_, [reply_to]).get(reply_to)
                if answered is not None:
                    if no_ack:
                        self.store.mark_read(from_, [answered], created)
                    else:
                        self.store.mark_acked(from_, [answered], created)
                        acknowledged = reply_to
            self.store.insert_message(message)
            receipt = {k: message[k] for k in ("id", "sender", "recipient", "subject", "type", "created",
                                                "refs", "reply_to")}
            receipt["acknowledged"] = acknowledged
            presence = self._presence(from_)
            receipt["sender_reachable"] = presence["reachable"]
            lapsed = presence["watch_state"] in ("released", "stale") and not presence["reachable"]
            receipt["next"] = [f"agent-mail watch {from_}"] if lapsed else []
            emit(receipt)
        return receipt

    def _presence(self, agent: str) -> dict:
        return describe_liveness(self.store.liveness(agent).get(agent), model.now())

    def read(self, *, agent: str, all: bool = False, from_: str | None = None, limit: int = 50,
             thread: str | None = None, no_mark_read: bool = False, ack: bool = False,
             fields: list[str] | None = None, emit: Emit = _no_emit) -> dict:
        """Take delivery of `agent`'s mail; see spec.COMMANDS['read'] for the modes."""
        if thread is not None:
            with self.store.transaction():
                messages = self.store.thread(thread)
                if not messages:
                    raise errors.NotFound([("--thread", f"no message has id {thread}.")])
                result = self._read_result(agent, messages, fields, remaining=self.store.count_unread(agent),
                                           suggest_ack=False)
                emit(result)
            return result
        marking = not no_mark_read
        with self.store.transaction(write=marking or ack):
            if all:
                newest = self.store.inbox(agent, unread_only=False, sender=from_, limit=None)
                messages = newest[-limit:]
            else:
                messages = self.store.inbox(agent, unread_only=True, sender=from_, limit=limit)
            at = model.now_iso()
            if marking:
                fresh = [m for m in messages if m["read_at"] is None]
                self.store.mark_read(agent, fresh, at)
                for m in fresh:
                    m["read_at"] = at
            if ack:
                fresh = [m for m in messages if m["acked_at"] is None]
                self.store.mark_acked(agent, fresh, at)
                for m in fresh:
                    m["acked_at"] = at
                    m["read_at"] = m["read_at"] or at
            result = self._read_result(agent, messages, fields, remaining=self.store.count_unread(agent))
            emit(result)
        return result

    def _read_result(self, agent: str, messages: list[dict], fields: list[str] | None, remaining: int,
                     suggest_ack: bool = True) -> dict:
        listed = [_project(m, fields) for m in messages]
        reachable = self._presence(agent)["reachable"]
        to_ack = [m["id"] for m in messages if m["acked_at"] is None and m["recipient"] in (agent, model.BROADCAST)
                  and m["sender"] != agent] if suggest_ack else []
        return {"agent": agent, "messages": listed, "count": len(listed), "remaining": remaining,
                "reachable": reachable,
                "next": next_steps(agent, unread=remaining, ack_ids=to_ack, reachable=reachable)}

    def ack(self, *, agent: str, ids: list[str] | tuple = (), all: bool = False, emit: Emit = _no_emit) -> dict:
        """Record that `agent` acted on these messages (all outstanding ones with all=True)."""
        wanted = list(dict.fromkeys(ids))
        with self.store.transaction(write=True):
            if all:
                fresh, already = self.store.unacked(agent), []
            else:
                found = self.store.addressed(agent, wanted)
                missing = [i for i in wanted if i not in found]
                if missing:
                    problems = []
                    for message_id in missing:
                        if self.store.get_message(message_id) is None:
                            problems.append(("ids", f"no message has id {message_id}; nothing was acknowledged."))
                        else:
                            problems.append(("ids", f"message {message_id} is not addressed to {agent}; "
                                                    "nothing was acknowledged."))
                    raise errors.NotFound(problems)
                fresh = [found[i] for i in wanted if found[i]["acked_at"] is None]
                already = [i for i in wanted if found[i]["acked_at"] is not None]
            at = model.now_iso()
            self.store.mark_acked(agent, fresh, at)
            reachable = self._presence(agent)["reachable"]
            result = {
                "agent": agent,
                "acked_at": at if fresh else None,
                "acked": [m["id"] for m in fresh],
                "already_acked": already,
                "count": len(fresh),
                "reachable": reachable,
                "next": next_steps(agent, unread=self.store.count_unread(agent), reachable=reachable),
            }
            emit(result)
        return result

    def heartbeat(self, *, agent: str, emit: Emit = _no_emit) -> dict:
        """Record that `agent` is present without a blocked watch."""
        at = model.now_iso()
        with self.store.transaction(write=True):
            self.store.record_heartbeat(agent, at)
            unread = self.store.count_unread(agent)
            reachable = self._presence(agent)["reachable"]
            result = {"agent": agent, "last_seen": at, "unread": unread, "reachable": reachable,
                      "next": next_steps(agent, unread=unread, reachable=True)}
            emit(result)
        return result

    def watch(self, *, agent: str, timeout_minutes: float | None = None, once: bool = False,
              emit: Emit = _no_emit) -> dict:
        """Block until `agent` has unread mail (or the timeout passes); return envelopes, consume nothing."""
        from agent_mail import spec

        if once:
            return self._watch_result(agent, self._envelopes(agent), session=None, emit=emit, heartbeat=True)
        minutes = spec.WATCH_MINUTES_DEFAULT if timeout_minutes is None else timeout_minutes
        self.store.relax_durability()  # this connection writes liveness only; skip its syncs
        session = model.new_message_id()
        # Handlers first: a signal that arrives once the session exists must still release it.
        previous = _install_stop_handlers()
        try:
            with self.store.transaction(write=True):
                self.store.open_session(session, agent, model.now_iso())
            messages = self._wait_for_mail(agent, session, minutes * 60.0)
            self._release(session, "mail" if messages else "timeout")
        except _Stopped as stop:
            self._release(session, f"signal {stop.signum}", quietly=True)
            import signal

            name = signal.Signals(stop.signum).name
            raise errors.Interrupted(f"watch for {agent} was stopped by {name}; its session was released, "
                                     "so status shows it as released, not armed.", 128 + stop.signum) from None
        except BaseException:
            self._release(session, "error", quietly=True)
            raise
        finally:
            _restore_handlers(previous)
        return self._watch_result(agent, messages, session=session, emit=emit)

    def _release(self, session: str, reason: str, quietly: bool = False) -> None:
        """Mark the session released (a no-op if it never got stored or is released already)."""
        try:
            with self.store.transaction(write=True):
                self.store.release_session(session, model.now_iso(), reason)
        except errors.StorageError:
            if not quietly:  # on the way out of another failure, that failure is the one to report
                raise

    def _envelopes(self, agent: str) -> list[dict]:
        from agent_mail import spec

        with self.store.transaction():
            messages = self.store.inbox(agent, unread_only=True, sender=None, limit=None)
        return [{f: m[f] for f in spec.ENVELOPE_FIELDS} for m in messages]

    def _wait_for_mail(self, agent: str, session: str, seconds: float) -> list[dict]:
        """The blocking loop: sleep until a commit elsewhere adds mail for `agent`, refreshing liveness."""
        import time

        from agent_mail import spec

        now = time.monotonic()
        deadline, refresh_at = now + seconds, now + spec.REFRESH_SECONDS
        token = self.store.change_token()
        marker = object()  # forces the first full check
        while True:
            current = self.store.mail_marker()
            if current != marker or time.monotonic() >= refresh_at:
                # Full check only when a message was added (or at each refresh, as a safety net).
                marker = current
                messages = self._envelopes(agent)
                if messages:
                    return messages
            now = time.monotonic()
            if now >= deadline:
                return []
            if now >= refresh_at:
                with self.store.transaction(write=True):
                    self.store.touch_session(session, model.now_iso())
                refresh_at = now + spec.REFRESH_SECONDS
            token = self.store.wait_for_change(token, min(deadline, refresh_at) - now)

    def _watch_result(self, agent: str, messages: list[dict], *, session: str | None, emit: Emit,
                      heartbeat: bool = False) -> dict:
        if heartbeat:
            with self.store.transaction(write=True):
                self.store.record_heartbeat(agent, model.now_iso())
        with self.store.transaction():
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

    def status(self, *, agent: str | None = None, project: str | None = None, fields: list[str] | None = None,
               emit: Emit = _no_emit) -> dict:
        """One row per identity seen in traffic (or just `agent`, or one project's)."""
        if project is not None and _project_problems(project):
            raise errors.InvalidInput(_project_problems(project))
        with self.store.transaction():
            counts = self.store.agent_counts()
            liveness = self.store.liveness(agent)
        at = model.now()
        if agent is not None:
            names = [agent]
        else:
            names = sorted(counts)
            if project is not None:
                names = [n for n in names if n.split(":", 1)[0] == project]
        rows = []
        for name in names:
            row = {"agent": name, **counts.get(name, {"unread": 0, "unacked": 0})}
            row.update(describe_liveness(liveness.get(name), at))
            del row["reachable"]
            rows.append({f: row[f] for f in fields} if fields else row)
        result = {"agents": rows, "count": len(rows)}
        emit(result)
        return result

    def cleanup(self, *, older_than: int, dry_run: bool = False, emit: Emit = _no_emit) -> dict:
        """Delete messages (and liveness records) older than `older_than` days."""
        cutoff = model.iso(model.now() - _dt.timedelta(days=older_than))
        with self.store.transaction(write=not dry_run):
            counts = self.store.cleanup(cutoff, dry_run)
            result = {"dry_run": dry_run, "cutoff": cutoff, **counts}
            emit(result)
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


def _identity_problems(identities: dict[str, str]) -> list[tuple[str, str]]:
    """Identity checks for callers that bypass the CLI parser (library use)."""
    problems = []
    for flag, value in identities.items():
        problem = model.identity_problem(value, allow_broadcast=flag == "--to")
        if problem:
            problems.append((flag, problem))
    return problems
