"""Take the history out and bring it back: `export` (JSON Lines, or mbox for a mail client) and `import`.

The JSON Lines format (version 1) holds everything needed to rebuild each stored message exactly: one
header line, then records in a fixed order with a fixed key order, so that exporting, importing into an
empty mailbox and exporting again gives the same bytes, on either backend:

    {"agent_mail_export": 1}
    {"type": "blob", ...}       an attachment's content (base64), just before the first message using it
    {"type": "message", ...}    one stored row (a send to several is one row per recipient), in stored order
    {"type": "profile", ...}    by identity
    {"type": "event", ...}      system-channel events (bounces), in stored order

Both directions stream: a batch of rows at a time, so memory stays flat however large the mailbox.
Import is one transaction (all or nothing), validates every record with the same rules as `send` (and
refuses what no export holds: ids in upper case, times without an offset or out of their order, one id with two
contents), and skips what is already there by its id (importing the same file twice changes nothing).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import sys
import time

from agent_mail.parts import checks
from agent_mail import errors, model
from agent_mail.store.schema import STATE_COLUMNS as _STATE
from agent_mail.store.sql_values import decode_refs

VERSION = 1
BATCH = 500
MAX_PROBLEMS = 50
MESSAGE_KEYS = ("type", "id", "batch_id", "kind", "sender", "recipient", "subject", "body", "refs", "reply_to",
                "created", "deliver_at", "cancelled_at", *_STATE, "schedule", "broadcast_states", "attachments")
#: What exports of earlier builds also carried in each message: the seed lineage's inert per-message lifetime (spec
#: 008: no record carries one). Such files still import; the value is checked (what its column could hold) and dropped.
LEGACY_MESSAGE_KEY = "ttl_hours"
LEGACY_TTL_MAX = 2**31 - 1
#: The times a record may hold: none before this, none (but a schedule's) later than a day from now.
EARLIEST = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
#: Processes sample the server's clock on connecting: a state may read a little before its message's creation.
CLOCK_SLACK = datetime.timedelta(minutes=1)
BLOB_KEYS = ("type", "sha256", "size", "created", "content_base64")
PROFILE_KEYS = ("type", "agent", "human", "mirror_dir", "max_entries", "updated_at")
EVENT_KEYS = ("type", "id", "agent", "source", "payload", "created", "dismissed_at")


def _line(keys: tuple[str, ...], values: dict) -> str:
    return json.dumps({k: values[k] for k in keys}, ensure_ascii=False, separators=(",", ":")) + "\n"


class Progress:
    """'exported 12000 of 50000 messages' on stderr, a few times a second, only when stderr is a terminal."""

    def __init__(self, verb: str, total: int | None):
        self.verb, self.total, self.done, self.shown_at = verb, total, 0, 0.0
        self.on = sys.stderr.isatty()

    def step(self, n: int = 1) -> None:
        self.done += n
        if self.on and time.monotonic() - self.shown_at > 0.2:
            self.shown_at = time.monotonic()
            of = f" of {self.total}" if self.total is not None else ""
            sys.stderr.write(f"\ragent-mail: {self.verb} {self.done}{of} messages")
            sys.stderr.flush()

    def end(self) -> None:
        if self.on and self.shown_at:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# ---------------------------------------------------------------- reading what to export


def messages(store, agent: str | None, since: str | None):
    """Yield (row, broadcast states, attachments, schedule) of each message to export, in stored order, a
    batch at a time."""
    now = model.now_iso()
    after = -1
    while True:
        rows = store.stored_messages(agent=agent, since=since, now=now, after=after, limit=BATCH)
        if not rows:
            return
        after = rows[-1]["seq"]
        for row in rows:
            # An identity's own export carries only its own state.
            states = [s for s in row.pop("broadcast_states") if agent is None or s["agent"] == agent]
            yield row, states, row.pop("attachments"), row.pop("schedule")


def count(store, agent: str | None, since: str | None) -> int:
    return store.count_stored(agent=agent, since=since, now=model.now_iso())


def profiles(store, agent: str | None):
    for profile in store.stored_profiles(agent):
        yield {"type": "profile", **profile}


def events(store, agent: str | None, since: str | None):
    for event in store.stored_events(agent, since):
        yield {"type": "event", **event}


# ---------------------------------------------------------------- export


def export_jsonl(store, out, agent: str | None, since: str | None) -> dict:
    counts = {"messages": 0, "blobs": 0, "profiles": 0, "events": 0}
    out.write(json.dumps({"agent_mail_export": VERSION}, separators=(",", ":")) + "\n")
    written: set[str] = set()
    progress = Progress("exported", count(store, agent, since))
    for row, states, files, schedule in messages(store, agent, since):
        for f in files:
            if f["sha256"] not in written:
                written.add(f["sha256"])
                blob = store.attachment_blob(f["sha256"])
                if blob is not None:
                    out.write(_line(BLOB_KEYS, {"type": "blob", "sha256": f["sha256"], "size": blob["size"],
                                                "created": blob["created"],
                                                "content_base64": base64.b64encode(blob["content"]).decode()}))
                    counts["blobs"] += 1
        out.write(_line(MESSAGE_KEYS, _record(row, states, files, schedule)))
        counts["messages"] += 1
        progress.step()
    progress.end()
    for record in profiles(store, agent):
        out.write(_line(PROFILE_KEYS, record))
        counts["profiles"] += 1
    for record in events(store, agent, since):
        out.write(_line(EVENT_KEYS, record))
        counts["events"] += 1
    return counts


def _record(row: dict, states: list, files: list, schedule) -> dict:
    """A stored row as a message record."""
    return {**row, "type": "message", "kind": row["type"], "refs": decode_refs(row["refs"]) if row["refs"] else None,
            "schedule": schedule, "broadcast_states": states, "attachments": files}


def address(identity: str) -> str:
    """An identity as an email address: `"ops:lead" <lead@ops.agent-mail.invalid>` (.invalid: never routed)."""
    if identity == model.BROADCAST:
        return '"everyone" <everyone@agent-mail.invalid>'
    project, _, name = identity.partition(":")
    return f'"{identity}" <{name}@{project}.agent-mail.invalid>'


def message_id(value: str) -> str:
    return f"<{value}@agent-mail.invalid>"


def export_mbox(store, out, agent: str | None, since: str | None) -> dict:
    """Each stored row as an email in an mbox (mboxrd: body lines beginning with '>*From ' get one more '>')."""
    import email.policy
    import email.utils
    import mimetypes
    import re
    from email.message import EmailMessage

    quoted = re.compile(rb"^(>*From )", re.MULTILINE)
    counts = {"messages": 0}
    progress = Progress("exported", count(store, agent, since))
    policy = email.policy.SMTP.clone(linesep="\n")
    for row, _states, files, _schedule in messages(store, agent, since):
        arrived = model.parse_iso(row["deliver_at"] or row["created"])
        headers = [("From", address(row["sender"])), ("To", address(row["recipient"])), ("Subject", row["subject"]),
                   ("Date", email.utils.format_datetime(arrived)), ("Message-ID", message_id(row["id"]))]
        if row["reply_to"]:
            headers += [("In-Reply-To", message_id(row["reply_to"])), ("References", message_id(row["reply_to"]))]
        headers.append(("X-Agent-Mail-Id", row["id"]))
        if row["batch_id"]:
            headers.append(("X-Agent-Mail-Batch", row["batch_id"]))
        headers.append(("X-Agent-Mail-Type", row["type"]))
        if row["type"] == "direct":
            headers.append(("X-Agent-Mail-State", next((w for c, w in (
                ("deleted_at", "deleted"), ("archived_at", "archived"), ("acked_at", "acked"), ("read_at", "read"))
                if row[c]), "unread")))
        if row["refs"]:
            headers.append(("X-Agent-Mail-Refs", " ".join(decode_refs(row["refs"]))))
        body = row["body"] or ""
        data = _plain_mail(headers, body) if not files else None
        if data is None:  # attachments, long lines, carriage returns: the email package lays it out
            mail = EmailMessage(policy=policy)
            for name, value in headers:
                mail[name] = value
            mail.set_content(body)
            for f in files:
                blob = store.attachment_content(f["sha256"])
                if blob is None:
                    continue
                kind = (mimetypes.guess_type(f["name"])[0] or "application/octet-stream").split("/", 1)
                mail.add_attachment(blob, maintype=kind[0], subtype=kind[1], filename=f["name"])
            data = mail.as_bytes()
        out.write(b"From " + row["sender"].replace(" ", "").encode() + b"@agent-mail.invalid " +
                  arrived.strftime("%a %b %d %H:%M:%S %Y").encode() + b"\n")
        out.write(quoted.sub(rb">\1", data).rstrip(b"\n") + b"\n\n")
        counts["messages"] += 1
        progress.step()
    progress.end()
    return counts


def _plain_mail(headers: list[tuple[str, str]], body: str) -> bytes | None:
    """A text-only message laid out directly (the email package takes ~1 ms a message): UTF-8 as 8bit, or
    quoted-printable where a line is long, non-ASCII headers as RFC 2047 words. None for a body with carriage
    returns (kept exactly by the email package's own layout)."""
    from email.header import Header

    import binascii

    if "\r" in body:
        return None
    encoded = body.encode("utf-8")
    transfer = "8bit"
    if any(len(line) > 900 for line in encoded.split(b"\n")):  # soft line breaks keep every line legal
        encoded, transfer = binascii.b2a_qp(encoded, istext=True), "quoted-printable"
    lines = []
    for name, value in headers:
        if not value.isascii():
            value = Header(value, "utf-8", header_name=name).encode(linesep="\n")
        elif len(name) + len(value) > 900:
            return None
        lines.append(f"{name}: {value}")
    lines += ["MIME-Version: 1.0", 'Content-Type: text/plain; charset="utf-8"',
              f"Content-Transfer-Encoding: {transfer}"]
    return ("\n".join(lines) + "\n\n").encode("ascii") + encoded + (b"" if encoded.endswith(b"\n") else b"\n")


def export(store, *, format: str, output: str | None, agent: str | None, since_days: float | None) -> dict | None:
    """Write the export to `output` (a new file, written aside and renamed into place) or to stdout (None)."""
    checks.guard("export", {"format": format, "output": output, "agent": agent, "since_days": since_days})
    since = model.iso(model.now() - datetime.timedelta(days=since_days)) if since_days is not None else None
    if output is not None and output != "-":
        from agent_mail import files

        counts: dict = {}

        def write(raw) -> None:
            with store.transaction():
                counts.update(_write(store, raw, format, agent, since))
        target = files.write_new(output, "output", write)
        return {"file": target, "format": format, "bytes": os.path.getsize(target), **counts,
                "next": [f"agent-mail import {target} --dry-run"] if format == "jsonl" else []}
    sink = sys.stdout.buffer
    with store.transaction():
        _write(store, sink, format, agent, since)
    sink.flush()
    return None


def _write(store, raw, format: str, agent, since) -> dict:
    if format == "mbox":
        return export_mbox(store, raw, agent, since)
    import io

    text = io.TextIOWrapper(raw, encoding="utf-8", newline="\n", write_through=False)
    try:
        return export_jsonl(store, text, agent, since)
    finally:
        text.flush()
        text.detach()


# ---------------------------------------------------------------- import


class _Problems:
    def __init__(self):
        self.found: list[tuple[int, str, str]] = []
        self.total = 0

    def add(self, line: int, field: str | None, message: str) -> None:
        self.total += 1
        if len(self.found) < MAX_PROBLEMS:
            self.found.append((line, f"line {line}" + (f": {field}" if field else ""), message))

    @property
    def listed(self) -> list[tuple[str, str]]:
        """In line order (an id seen twice is found when its batch is compared, after later lines)."""
        return [(field, message) for _, field, message in sorted(self.found, key=lambda p: p[0])]


def _stamp(value, field: str, problems, line: int, required: bool = False, *, after=None,
           latest: datetime.datetime | None = None) -> datetime.datetime | None:
    """The moment `value` names, or None (a problem added when it is not a time an export holds): an ISO 8601
    time with its UTC offset, from 2000 on, not later than `latest` (a day from now unless given), and not
    before `after` (a message's creation, give or take the slack of sampled clocks)."""
    if value is None:
        if required:
            problems.add(line, field, "is missing; give an ISO 8601 time such as 2026-12-01T09:30:00+00:00.")
        return None
    try:
        moment = datetime.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None:
        problems.add(line, field, f"{value!r} is not an ISO 8601 time such as 2026-12-01T09:30:00+00:00.")
        return None
    if moment.tzinfo is None:
        problems.add(line, field, f"{value!r} has no UTC offset (such as +00:00): it names no one moment. agent-mail "
                                  "writes every time with its offset.")
        return None
    latest = latest or datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    try:
        if not EARLIEST <= moment <= latest:
            problems.add(line, field, f"{value!r} is not a time an export holds (from 2000 to "
                                      f"{latest.date().isoformat()}).")
            return None
        if after is not None and moment < after - CLOCK_SLACK:
            problems.add(line, field, f"{value!r} is before created: nothing happens to a message before it exists.")
    except OverflowError:  # an offset that takes it past year 1 or 9999
        problems.add(line, field, f"{value!r} is not a time an export holds.")
        return None
    return moment


def _id_problem(value) -> str | None:
    """Why `value` is not an id as agent-mail writes them (a UUID in lower case), or None."""
    if not isinstance(value, str) or model.message_id_problem(value) is not None:
        return f"{value!r} is not an id (a UUID such as 9f1c2e34-5678-4abc-9def-0123456789ab)."
    if value != value.lower():
        # Refused, not lowered: lowering could make it another message's id, and the file would not be what the
        # mailbox holds. As it is, nothing could ever name it (ids given to commands are read in lower case).
        return (f"{value!r} is in upper case; agent-mail writes ids in lower case and finds them so (stored as "
                "given, no command could ever name it). Lower-case it if it is meant to be that message.")
    return None


def _check_message(record: dict, known_blobs, problems, line: int) -> None:
    if LEGACY_MESSAGE_KEY in record:  # an export written before lifetimes left the format
        ttl = record.pop(LEGACY_MESSAGE_KEY)
        if not isinstance(ttl, int) or isinstance(ttl, bool) or not 0 <= ttl <= LEGACY_TTL_MAX:
            problems.add(line, LEGACY_MESSAGE_KEY, f"{ttl!r} is not what an older export holds here (a whole number "
                                                   f"from 0 to {LEGACY_TTL_MAX}; it is dropped on import).")
    if set(record) != set(MESSAGE_KEYS):
        missing, extra = set(MESSAGE_KEYS) - set(record), set(record) - set(MESSAGE_KEYS)
        problems.add(line, None, f"a message record has exactly the keys {', '.join(MESSAGE_KEYS)}"
                     + (f"; missing {sorted(missing)}" if missing else "") + (f"; unknown {sorted(extra)}" if extra
                                                                                else "") + ".")
        return
    for field in ("id", "batch_id", "reply_to"):
        value = record[field]
        problem = _id_problem(value) if value is not None or field == "id" else None
        if problem:
            problems.add(line, field, problem)
    if record["reply_to"] is not None and record["reply_to"] == record["id"]:
        problems.add(line, "reply_to", "is the message's own id: a message cannot answer itself.")
    if record["kind"] not in ("direct", "broadcast"):
        problems.add(line, "kind", f"{record['kind']!r} is neither 'direct' nor 'broadcast'.")
    for field, broadcast in (("sender", False), ("recipient", True)):
        value = record[field]
        problem = model.identity_problem(value, allow_broadcast=broadcast) if isinstance(value, str) else \
            f"{value!r} is not an identity."
        if problem:
            problems.add(line, field, problem)
    if (record["recipient"] == model.BROADCAST) != (record["kind"] == "broadcast"):
        problems.add(line, "recipient", "is '*' exactly when kind is 'broadcast'.")
    for field, check in (("subject", model.subject_problem), ("body", model.body_problem)):
        value = record[field]
        problem = check(value) if isinstance(value, str) else f"{value!r} is not text."
        if problem:
            problems.add(line, field, problem)
    refs = record["refs"]
    if refs is not None and not (isinstance(refs, list) and refs and
                                 all(isinstance(r, str) and os.path.isabs(r) for r in refs)):
        problems.add(line, "refs", "is null or a non-empty list of absolute paths (as send stores them).")
    else:
        for ref in refs or ():  # what send refuses (a control character, a bidi control) is not brought in either
            problem = model.name_problem(ref)
            if problem:
                problems.add(line, "refs", f"{ref!r} {problem}")
    created = _stamp(record["created"], "created", problems, line, required=True)
    # a delayed message falls due at most the longest delay after it was sent
    due_by = created + datetime.timedelta(minutes=model.DELAY_MINUTES_MAX, seconds=1) if created else None
    _stamp(record["deliver_at"], "deliver_at", problems, line, after=created, latest=due_by)
    for field in ("cancelled_at", *_STATE):
        _stamp(record[field], field, problems, line, after=created)
    schedule = record["schedule"]
    if schedule is not None:
        if not isinstance(schedule, dict) or set(schedule) != {"deliver_at", "published_at"}:
            problems.add(line, "schedule", "is null or {deliver_at, published_at}.")
        else:
            _stamp(schedule["deliver_at"], "schedule.deliver_at", problems, line, required=True, after=created,
                   latest=due_by)
            _stamp(schedule["published_at"], "schedule.published_at", problems, line, after=created)
    states = record["broadcast_states"]
    if not isinstance(states, list) or (states and record["kind"] != "broadcast"):
        problems.add(line, "broadcast_states", "is a list, and empty unless kind is 'broadcast'.")
    else:
        seen: set[str] = set()
        for state in states:
            if not isinstance(state, dict) or set(state) != {"agent", *_STATE}:
                problems.add(line, "broadcast_states", "each is {agent, read_at, acked_at, archived_at, deleted_at}.")
                continue
            problem = model.identity_problem(state["agent"]) if isinstance(state["agent"], str) else "is not text"
            if problem:
                problems.add(line, "broadcast_states.agent", problem)
            elif state["agent"] in seen:
                problems.add(line, "broadcast_states.agent", f"{state['agent']} has two states; each recipient of a "
                                                             "broadcast has one.")
            else:
                seen.add(state["agent"])
            for field in _STATE:
                _stamp(state[field], f"broadcast_states.{field}", problems, line, after=created)
    files = record["attachments"]
    if not isinstance(files, list) or len(files) > model.ATTACHMENTS_MAX_COUNT:
        problems.add(line, "attachments", f"is a list of at most {model.ATTACHMENTS_MAX_COUNT}.")
        return
    for f in files:
        if not isinstance(f, dict) or set(f) != {"name", "size", "sha256"}:
            problems.add(line, "attachments", "each is {name, size, sha256}.")
            continue
        name = f["name"]
        if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", ".."):
            problems.add(line, "attachments.name", f"{name!r} is not a file name.")
        elif model.name_problem(name):
            problems.add(line, "attachments.name", f"{name!r} {model.name_problem(name)}")
        if f["sha256"] not in known_blobs:
            problems.add(line, "attachments.sha256", f"{f['sha256']!r}: no blob record before this line holds "
                                                     "that content, and the mailbox does not have it.")
        elif known_blobs[f["sha256"]] != f["size"]:
            problems.add(line, "attachments.size", f"{f['size']!r} is not the size of that content.")


def _check_blob(record: dict, problems, line: int) -> bytes | None:
    if set(record) != set(BLOB_KEYS):
        problems.add(line, None, f"a blob record has exactly the keys {', '.join(BLOB_KEYS)}.")
        return None
    try:
        content = base64.b64decode(record["content_base64"], validate=True)
    except (ValueError, TypeError):
        problems.add(line, "content_base64", "is not base64.")
        return None
    if len(content) > model.ATTACHMENT_MAX_BYTES:
        problems.add(line, "content_base64", f"holds {len(content)} bytes; an attachment is at most "
                                             f"{model.ATTACHMENT_MAX_BYTES}.")
    if hashlib.sha256(content).hexdigest() != record["sha256"]:
        problems.add(line, "sha256", "is not the SHA-256 of the content.")
    if record["size"] != len(content):
        problems.add(line, "size", f"{record['size']!r} is not the content's length ({len(content)}).")
    _stamp(record["created"], "created", problems, line, required=True)
    return content


def _check_profile(record: dict, problems, line: int) -> None:
    if set(record) != set(PROFILE_KEYS):
        problems.add(line, None, f"a profile record has exactly the keys {', '.join(PROFILE_KEYS)}.")
        return
    problem = model.identity_problem(record["agent"]) if isinstance(record["agent"], str) else "is not text"
    if problem:
        problems.add(line, "agent", problem)
    if not isinstance(record["human"], bool):
        problems.add(line, "human", "is true or false.")
    if record["mirror_dir"] is not None and not (isinstance(record["mirror_dir"], str) and
                                                 os.path.isabs(record["mirror_dir"])):
        problems.add(line, "mirror_dir", "is null or an absolute path.")
    entries = record["max_entries"]
    if entries is not None and (not isinstance(entries, int) or isinstance(entries, bool) or
                                not 1 <= entries <= model.MAX_ENTRIES_LIMIT):
        problems.add(line, "max_entries", f"is null or a whole number from 1 to {model.MAX_ENTRIES_LIMIT}.")
    _stamp(record["updated_at"], "updated_at", problems, line, required=True)


def _check_event(record: dict, problems, line: int) -> None:
    if set(record) != set(EVENT_KEYS):
        problems.add(line, None, f"an event record has exactly the keys {', '.join(EVENT_KEYS)}.")
        return
    problem = _id_problem(record["id"])
    if problem:
        problems.add(line, "id", problem)
    problem = model.identity_problem(record["agent"]) if isinstance(record["agent"], str) else "is not text"
    if problem:
        problems.add(line, "agent", problem)
    if not isinstance(record["source"], str) or not record["source"]:
        problems.add(line, "source", "is a non-empty text.")
    if not isinstance(record["payload"], dict):
        problems.add(line, "payload", "is a JSON object.")
    created = _stamp(record["created"], "created", problems, line, required=True)
    _stamp(record["dismissed_at"], "dismissed_at", problems, line, after=created)


def import_file(store, path: str, dry_run: bool) -> dict:
    """Import a JSON Lines export into `store`: all or nothing, existing records (by id) left as they are."""
    checks.guard("import", {"file": path, "dry_run": dry_run})
    if path == "-":
        source, shown = sys.stdin.buffer, "stdin"
    else:
        shown = os.path.abspath(os.path.expanduser(path))
        from agent_mail.files import same_file

        mailbox = getattr(store, "path", None)  # a SQLite mailbox's file: never opened outside SQLite here, where
        # this process holds a connection to it (closing the descriptor would drop the connection's locks)
        if mailbox and same_file(shown, [mailbox + suffix for suffix in ("", "-wal", "-shm", "-journal")]):
            raise errors.InvalidInput([("file", f"{shown} is the mailbox itself (or its journal), not an export; "
                                                "nothing was imported. Give a file agent-mail export wrote.")])
        try:
            source = open(shown, "rb")
        except OSError as exc:
            raise errors.InvalidInput([("file", f"cannot open {shown} ({exc.strerror}); nothing was imported.")]) \
                from None
    added = {"messages": 0, "blobs": 0, "profiles": 0, "events": 0}
    present = dict(added)
    problems = _Problems()
    progress = Progress("imported", None)
    try:
        with store.transaction(write=True):
            known: dict[str, int] = {}  # sha256 -> size, of blobs in the file so far or in the mailbox
            number = 0
            pending: list[tuple[int, dict]] = []  # checked messages and their lines, stored a batch at a time
            before = store.last_seq()  # messages stored after this one came from this file
            for number, raw in enumerate(source, start=1):
                if number == 1 and raw.startswith(b"From "):
                    raise errors.InvalidInput([("file", "import reads JSON Lines; this is an mbox file (export "
                                                        "--format mbox, for mail clients). Import an export made "
                                                        "with --format jsonl, the default; nothing was imported.")])
                try:
                    record = json.loads(raw)
                except (ValueError, UnicodeDecodeError) as exc:
                    problems.add(number, None, f"is not a JSON document ({str(exc)[:80]}).")
                    continue
                except RecursionError:
                    problems.add(number, None, "is nested too deeply to be a record of an export (a record is an "
                                               "object of values, lists and objects a few levels deep).")
                    continue
                if number == 1:
                    if not (isinstance(record, dict) and record.get("agent_mail_export") == VERSION):
                        problems.add(1, None, "is not an agent-mail export header {\"agent_mail_export\": 1}; "
                                              "export with agent-mail export --format jsonl.")
                        break
                    continue
                kind = record.get("type") if isinstance(record, dict) else None
                if kind == "blob":
                    content = _check_blob(record, problems, number)
                    if content is not None and not problems.total:
                        known[record["sha256"]] = len(content)
                        new = store.restore_blob(record["sha256"], content, record["created"])
                        (added if new else present)["blobs"] += 1
                elif kind == "message":
                    for f in record.get("attachments") or []:
                        sha = f.get("sha256") if isinstance(f, dict) else None
                        if isinstance(sha, str) and sha not in known:
                            size = store.blob_size(sha)
                            if size is not None:
                                known[sha] = size
                    so_far = problems.total
                    _check_message(record, known, problems, number)
                    if problems.total == so_far:  # compared with the others even when an earlier line was bad
                        pending.append((number, record))
                        if len(pending) >= BATCH:
                            _store_batch(store, pending, added, present, problems, before)
                            progress.step(len(pending))
                            pending.clear()
                elif kind == "profile":
                    _check_profile(record, problems, number)
                    if not problems.total:
                        new = store.restore_profile(record)
                        (added if new else present)["profiles"] += 1
                elif kind == "event":
                    _check_event(record, problems, number)
                    if not problems.total:
                        new = store.restore_event(record)
                        (added if new else present)["events"] += 1
                else:
                    problems.add(number, "type", f"{kind!r} is not a record type (blob, message, profile, event).")
            if number == 0:
                problems.add(1, None, "the file is empty; an export starts with {\"agent_mail_export\": 1}.")
            if pending:
                _store_batch(store, pending, added, present, problems, before)
            if problems.total:
                raise errors.InvalidInput(problems.listed + ([(None, f"... and {problems.total - len(problems.listed)}"
                                                                     " more problems")]
                                                             if problems.total > len(problems.listed) else [])
                                          + [(None, "nothing was imported")])
            if dry_run:
                raise _DryRun()
    except _DryRun:
        pass
    finally:
        progress.end()
        if source is not sys.stdin.buffer:
            source.close()
    return {"file": shown, "dry_run": dry_run, "format_version": VERSION, "added": added, "already_there": present,
            "next": [f"agent-mail import {shown}"] if dry_run and any(added.values()) else []}


class _DryRun(Exception):
    """Raised inside the import's transaction to roll it back after counting what would change."""


def _store_batch(store, records: list[tuple[int, dict]], added: dict, present: dict, problems, before: int) -> None:
    """Store checked message records, in file order (a statement per table: one round trip each on
    PostgreSQL); those whose id the mailbox has (or that came earlier in the file) are left out. An id that came
    earlier in the file with other content is a problem: which of the two is the message? Once there is a
    problem, nothing more is stored (the import will be refused), but records are still compared."""
    earlier: dict[str, tuple[int | None, dict]] = {}
    ids = list({record["id"] for _, record in records})
    for start in range(0, len(ids), BATCH):
        for row in store.stored_messages(agent=None, since=None, now=model.now_iso(), after=before, limit=BATCH,
                                         ids=ids[start:start + BATCH]):
            row.pop("seq")
            earlier[row["id"]] = (None, _record(row, row.pop("broadcast_states"), row.pop("attachments"),
                                                row.pop("schedule")))
    for number, record in records:
        if record["id"] not in earlier:
            earlier[record["id"]] = (number, record)
        elif _same(earlier[record["id"]][1], record) is False:
            first = earlier[record["id"]][0]
            problems.add(number, "id", f"{record['id']} came earlier in the file"
                         + (f" (line {first})" if first else "") + " with other content: one id is one message.")
    if problems.total:
        return
    new = store.restore_messages([{**record, "type": record["kind"]} for _, record in records])
    added["messages"] += new
    present["messages"] += len(records) - new


def _same(one: dict, other: dict) -> bool:
    """Whether two message records are the same (broadcast states in any order)."""
    def key(record):
        return {**record, "broadcast_states": sorted(record["broadcast_states"], key=lambda s: s["agent"])}
    return key(one) == key(other)
