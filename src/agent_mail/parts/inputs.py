"""What a call brings with it, read and checked before any mailbox is opened: bodies from files,
refs, attachments, profile settings. Problems are collected, so every one of a call is reported at once.
"""

from __future__ import annotations

import os

from agent_mail import errors, model

def _read_body_file(path: str) -> tuple[str | None, str | None]:
    limit = model.BODY_MAX_CHARS * 4 + 3  # UTF-8 needs at most 4 bytes a character, plus a BOM
    try:
        if path == "-":
            import sys

            stream = sys.stdin.buffer if sys.stdin is not None else None
            if stream is None:
                return None, f"standard input is closed; pass {errors.arg('body')} or a file."
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
            f"not content: pass the file with {errors.arg('ref')} instead."
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"{path!r} is not UTF-8 (invalid byte at offset {exc.start}). Convert it to UTF-8."
    return text.removeprefix("\ufeff"), None


def _resolve_ref(path: str, must_exist: bool = True, found: dict | None = None) -> tuple[str | None, str | None]:
    """A ref as stored (parts/repos.py's shared_ref: `KEY//PATH` inside a git repository, else the absolute path),
    or why not. `must_exist` False: text the sender's machine resolved (a client of agent-mail serve), checked, never
    looked for."""
    if not isinstance(path, str) or not path:
        return None, f"{path!r} is not a path; refs are non-empty strings."
    problem = _shown_path_problem(path)
    if problem:
        return None, problem
    from agent_mail.parts import repos

    if not must_exist:  # resolved and checked on the sender's machine (a client of agent-mail serve)
        problem = repos.stored_ref_problem(path)
        return (None, problem) if problem else (path, None)
    absolute = os.path.abspath(os.path.expanduser(path))
    problem = _shown_path_problem(absolute)  # what is stored and shown: the working directory's part too
    if problem:
        return None, problem
    if not os.path.exists(absolute):
        return None, f"{path!r} does not exist (resolved to {absolute}). Refs must exist when you send."
    return repos.shared_ref(absolute, found), None


def _shown_path_problem(path: str) -> str | None:
    """Why a path cannot be passed on as text for others to read and open, or None. (A problem quotes the path
    with repr(), which writes its control characters out as escapes.)"""
    if model.has_surrogates(path):
        return (f"{path!r} is not valid UTF-8, so it cannot be passed on as text (another agent could not open "
                "what it was shown). Rename the file to a UTF-8 name.")
    problem = model.name_problem(path)
    return f"{path!r} {problem}" if problem else None


def prepare_send(values: dict, uploaded: dict | None = None) -> tuple[dict, list[tuple[str, str]]]:
    """Check and normalise send's inputs without touching the mailbox: (fields, problems). `uploaded`: what a
    client of agent-mail serve read on its own machine ({refs: absolute paths, attachments: [{name, content}]}),
    checked by the same rules but not looked for here."""
    problems: list[tuple[str, str]] = []
    subject = values.get("subject")
    if subject is not None:
        problem = model.subject_problem(subject)
        if problem:
            problems.append(("subject", problem))
    body, body_flag = values.get("body"), "body"
    if values.get("body_file") is not None:
        body_flag = "body_file"
        body, problem = _read_body_file(values["body_file"])
        if problem:
            problems.append((body_flag, problem))
    if body is not None:
        problem = model.body_problem(body)
        if problem:
            problems.append((body_flag, problem))
    refs: list[str] = []
    for path in (uploaded or {}).get("refs") or []:
        absolute, problem = _resolve_ref(path, must_exist=False)
        if problem:
            problems.append(("ref", problem))
        else:
            refs.append(absolute)
    # Through a server (`uploaded` given), a ref is text the sender's machine read: never looked for, expanded
    # or resolved on the server's disk (an absolute path as given is stored; anything else is refused, unresolved).
    here, found = uploaded is None, {}
    for path in values.get("ref") or []:
        absolute, problem = _resolve_ref(path, must_exist=here, found=found)
        if problem:
            problems.append(("ref", problem))
        else:
            refs.append(absolute)
    if values.get("refs") is not None:
        import json  # decoding is needed only here: the output side uses jsonout

        try:
            listed = json.loads(values["refs"])
        except ValueError as exc:
            listed = None
            problems.append(("refs", f"is not valid JSON ({exc}). Prefer {errors.arg('ref')} PATH, once per path."))
        except RecursionError:
            listed = None
            problems.append(("refs", "is nested too deeply; give a flat JSON array of paths, e.g. "
                                       f"[\"docs/plan.md\"] (or {errors.arg('ref')} PATH, once per path)."))
        if listed is not None and not isinstance(listed, list):
            problems.append(("refs", "must be a JSON array of paths, e.g. [\"docs/plan.md\"]."))
            listed = None
        for path in listed or []:
            absolute, problem = _resolve_ref(path, must_exist=here, found=found)
            if problem:
                problems.append(("refs", problem))
            else:
                refs.append(absolute)
    if values.get("no_ack") and not values.get("reply_to"):
        problems.append(("no_ack", f"only applies with {errors.arg('reply_to')}; drop it."))
    recipients = list(dict.fromkeys(as_list(values.get("to"))))
    if model.BROADCAST in recipients and len(recipients) > 1:
        problems.append(("to", "'*' already means everyone; give it alone, or list the recipients instead."))
    if len(recipients) > model.RECIPIENTS_MAX:
        problems.append(("to", f"{len(recipients)} recipients; the limit is {model.RECIPIENTS_MAX} a send. Use '*' "
                                 "or split the send."))
    if uploaded is not None:
        attachments, attach_problems = _admit_uploaded(uploaded.get("attachments") or [])
    else:
        attachments, attach_problems = _read_attachments(as_list(values.get("attach")))
    problems += attach_problems
    prepared = {
        "subject": subject,
        "body": body or "",
        "refs": list(dict.fromkeys(refs)),
        "recipients": recipients,
        "attachments": attachments,
    }
    return prepared, problems


def as_list(value) -> list:
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
        problems.append(("attach", f"{len(paths)} files; the limit is {model.ATTACHMENTS_MAX_COUNT} a send."))
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
            problems.append(("attach", f"{path!r} does not exist (resolved to {absolute})."))
            continue
        except OSError as exc:
            problems.append(("attach", f"cannot read {path!r}: {exc.strerror or exc}."))
            continue
        if not stat.S_ISREG(info.st_mode):
            problems.append(("attach", f"{path!r} is not a regular file; attach files, not directories or devices."))
            continue
        if info.st_size > model.ATTACHMENT_MAX_BYTES:
            problems.append(("attach", f"{path!r} is {info.st_size} bytes; the limit is {model.ATTACHMENT_MAX_BYTES} "
                                         f"a file. Put it somewhere shared and {errors.arg('ref')} it instead."))
            continue
        try:
            with open(absolute, "rb") as handle:
                content = handle.read(model.ATTACHMENT_MAX_BYTES + 1)
        except OSError as exc:
            problems.append(("attach", f"cannot read {path!r}: {exc.strerror or exc}."))
            continue
        if len(content) > model.ATTACHMENT_MAX_BYTES:  # it grew while we looked
            problems.append(("attach", f"{path!r} is over the {model.ATTACHMENT_MAX_BYTES}-byte limit."))
            continue
        total += len(content)
        # A name that is not UTF-8 keeps what it can, so the file still travels; the content is exact.
        name = os.fsencode(os.path.basename(absolute)).decode("utf-8", "replace") or "attachment"
        problem = model.name_problem(name)
        if problem:
            problems.append(("attach", f"the file name {name!r} {problem}"))
            continue
        attachments.append({"name": name, "content": content, "size": len(content),
                            "sha256": hashlib.sha256(content).hexdigest()})
    if total > model.ATTACHMENTS_MAX_BYTES_PER_SEND:
        problems.append(("attach", f"{total} bytes in all; the limit is {model.ATTACHMENTS_MAX_BYTES_PER_SEND} a "
                                     f"send. Split it, or {errors.arg('ref')} large files."))
    return attachments, problems


def _admit_uploaded(files: list[dict]) -> tuple[list[dict], list[tuple[str, str]]]:
    """Attachments a client uploaded ([{name, content}]), held to --attach's limits."""
    import hashlib

    problems: list[tuple[str, str]] = []
    if len(files) > model.ATTACHMENTS_MAX_COUNT:
        return [], [("attach", f"{len(files)} files; the limit is {model.ATTACHMENTS_MAX_COUNT} a send.")]
    attachments, total = [], 0
    for upload in files:
        name, content = upload["name"], upload["content"]
        problem = ("is not valid UTF-8 text" if model.has_surrogates(name) else model.name_problem(name)) if name \
            else "is empty"
        if problem or "/" in name:
            problems.append(("attach", f"the file name {name!r} {problem or 'is not a plain file name'}"))
            continue
        if len(content) > model.ATTACHMENT_MAX_BYTES:
            problems.append(("attach", f"{name!r} is {len(content)} bytes; the limit is {model.ATTACHMENT_MAX_BYTES} "
                                         f"a file. Put it somewhere shared and {errors.arg('ref')} it instead."))
            continue
        total += len(content)
        attachments.append({"name": name, "content": content, "size": len(content),
                            "sha256": hashlib.sha256(content).hexdigest()})
    if total > model.ATTACHMENTS_MAX_BYTES_PER_SEND:
        problems.append(("attach", f"{total} bytes in all; the limit is {model.ATTACHMENTS_MAX_BYTES_PER_SEND} a "
                                     f"send. Split it, or {errors.arg('ref')} large files."))
    return attachments, problems


def confine_paths(given: dict, roots: tuple[str, ...]) -> list[tuple[str, str]]:
    """A send's paths (attach, ref, refs, body_file; given by argument name, as a front end has them) that
    lie outside every directory in `roots` (real paths), as problems; those paths are taken out of `given`,
    so nothing outside is ever opened or said to exist. Each path is resolved as the send will resolve it,
    links included, before it is compared."""
    problems: list[tuple[str, str]] = []

    def inside(path: object) -> bool:
        if not isinstance(path, str) or not path or "\x00" in path:
            return True  # not a path: the send's own checks say what is wrong with it
        real = os.path.realpath(os.path.abspath(os.path.expanduser(path)))
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep) for root in roots)

    where = " or ".join(roots)

    def refused(field: str, path: str) -> tuple[str, str]:
        return (field, f"{path!r} is outside the directories this session may read files from ({where}); "
                       "copy it inside, or start the server with --root for its directory.")

    for field in ("attach", "ref"):
        paths = given.get(field)
        listed = [paths] if isinstance(paths, str) else paths
        if isinstance(listed, list):
            problems += [refused(field, p) for p in listed if not inside(p)]
            given[field] = [p for p in listed if inside(p)]
    if isinstance(given.get("refs"), str):
        import json

        try:
            listed = json.loads(given["refs"])
        except (ValueError, RecursionError):
            listed = None  # the send's own checks say why
        if isinstance(listed, list):
            problems += [refused("refs", p) for p in listed if not inside(p)]
            given["refs"] = json.dumps([p for p in listed if inside(p)])
    body_file = given.get("body_file")
    if body_file == "-":
        problems.append(("body_file", f"'-' (standard input) is this server's connection, not a body; give the "
                                      f"body as {errors.arg('body')}, or a file."))
        del given["body_file"]
    elif isinstance(body_file, str) and not inside(body_file):
        problems.append(refused("body_file", body_file))
        del given["body_file"]
    return problems


def naming_the_mailbox(given: dict, mailbox: str) -> list[tuple[str, str]]:
    """A send's files (attach, body_file; by argument name) that are the SQLite mailbox `mailbox` or its journal
    files, as problems; those paths are taken out of `given`. A process that may hold connections to the mailbox
    (an MCP server runs calls side by side) never opens it outside SQLite: closing that descriptor would drop every
    lock its connections hold on the file (SQLite's "How to corrupt an SQLite database file", 2.2)."""
    from agent_mail import files

    if not mailbox:
        return []
    guarded = [mailbox + suffix for suffix in ("", "-wal", "-shm", "-journal")]
    problems: list[tuple[str, str]] = []

    def the_mailbox(path: object) -> bool:
        return isinstance(path, str) and path != "-" and "\x00" not in path and \
            files.same_file(os.path.expanduser(path), guarded)

    def refused(field: str, path: str) -> tuple[str, str]:
        return (field, f"{path!r} is the mailbox itself (or its journal), which is read through SQLite only; "
                       "send an export of it instead (agent-mail export).")

    attached = given.get("attach")
    listed = [attached] if isinstance(attached, str) else attached
    if isinstance(listed, list):
        problems += [refused("attach", p) for p in listed if the_mailbox(p)]
        given["attach"] = [p for p in listed if not the_mailbox(p)]
    if the_mailbox(given.get("body_file")):
        problems.append(refused("body_file", given.pop("body_file")))
    return problems


def input_problems(command: str, values: dict) -> list[tuple[str, str]]:
    """Problems found without the mailbox, for reporting alongside parse errors."""
    if command == "send":
        return prepare_send(values)[1]
    if command == "profile":
        return profile_problems(values)
    if command == "webhook" and values.get("action") == "add":
        problems = []
        if values.get("url") is not None and url_problem(values["url"]):
            problems.append(("url", url_problem(values["url"])))
        if values.get("secret_file") is not None:
            problem = read_secret(values["secret_file"])[1]
            if problem:
                problems.append(("secret_file", problem))
        return problems
    return []


# -- a webhook's URL and secret file (agent-mail webhook add) ---------------------------------------------
SECRET_MIN_CHARS, SECRET_MAX_CHARS = 16, 1000
URL_MAX_CHARS = 2000


def shown_url(url: str) -> str:
    """`url` as it may be shown: scheme, host, port and the first part of its path; no user, password, query or
    the rest of the path (a Slack incoming webhook's path is its secret)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not a URL)"
    first, _, rest = parts.path.lstrip("/").partition("/")
    path = f"/{first}" + ("/…" if rest or parts.query else "") if first else ("/…" if parts.query else "")
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{port}{path}"


def url_problem(url: str) -> str | None:
    from urllib.parse import urlsplit

    if len(url) > URL_MAX_CHARS or any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        return f"is not a URL a webhook can POST to (spaces, control characters, or over {URL_MAX_CHARS} " \
               "characters); give http://HOST[:PORT]/PATH or https://..."
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is no number raises here)
    except ValueError:
        return "is not a URL (its host or port cannot be read); give http://HOST[:PORT]/PATH or https://..."
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{shown_url(url)!r} is not an http:// or https:// URL with a host; give one, such as " \
               "https://hooks.example.com/agent-mail."
    return None


def read_secret(path: str) -> tuple[str | None, str | None]:
    """The secret in the first line of the file at `path` (which only its owner may read): (secret, None) or
    (None, why not). Never says what the file holds."""
    path = os.path.expanduser(path)
    try:
        with open(path, "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            import stat

            if not stat.S_ISREG(mode):
                return None, f"{path} is not a regular file; give a file whose first line is the secret."
            if mode & 0o077:
                return None, f"{path} can be read by others (mode {mode & 0o777:o}): anyone who reads it can forge " \
                             f"this webhook's POSTs. chmod 600 {path}"
            raw = handle.read(SECRET_MAX_CHARS * 4 + 2)
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc}); give a file whose first line is the secret " \
                     "(e.g. openssl rand -hex 32 > FILE; chmod 600 FILE)."
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text; put the secret in its first line."
    lines = text.strip().splitlines()
    return secret_checked(lines[0].strip() if lines else "", path)


def secret_checked(secret: object, where: str = "the secret") -> tuple[str | None, str | None]:
    if not isinstance(secret, str) or not secret:
        return None, f"{where} holds no secret; put one in its first line (e.g. openssl rand -hex 32)."
    if not SECRET_MIN_CHARS <= len(secret) <= SECRET_MAX_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in secret):
        return None, f"the secret in {where} must be {SECRET_MIN_CHARS} to {SECRET_MAX_CHARS} printable " \
                     "characters (e.g. openssl rand -hex 32)."
    return secret, None


PROFILE_SETTINGS = ("human", "mirror-dir", "max-entries")


def profile_problems(values: dict) -> list[tuple[str, str]]:
    problems = []
    for name in values.get("clear") or []:
        if name not in PROFILE_SETTINGS:
            problems.append(("clear", f"{name!r} is not a setting; use one of: {', '.join(PROFILE_SETTINGS)}."))
        elif values.get(name.replace("-", "_")):
            problems.append(("clear", f"cannot both set and clear {name}."))
    directory = values.get("mirror_dir")
    if directory is not None:
        from agent_mail.parts import notifications

        expanded = os.path.expanduser(directory)
        if not os.path.isdir(expanded):
            problems.append(("mirror_dir", f"{directory!r} is not an existing directory; create it first."))
        elif model.has_surrogates(expanded):
            problems.append(("mirror_dir", f"{directory!r} is not a UTF-8 path; choose a directory with a UTF-8 "
                                             "name."))
        else:
            problem = notifications.mirror_problem(os.path.realpath(expanded))
            if problem:
                problems.append(("mirror_dir", problem))
    return problems


def identity_problems(identities: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Identity checks for callers that bypass the CLI parser (library use)."""
    problems = []
    for flag, value in identities:
        problem = model.identity_problem(value, allow_broadcast=flag == "to")
        if problem:
            problems.append((flag, problem))
    return problems
