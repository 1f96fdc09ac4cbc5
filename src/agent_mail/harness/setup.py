"""`agent-mail setup HARNESS --agent P:N`: connect a harness to the mailbox in one command.

For a project directory DIR, the MCP server `agent-mail` (this interpreter running `agent_mail mcp --agent P:N`,
with the mailbox it resolved in its environment) and the hooks (this interpreter running the installed agent-mail
script, `hook ...`; `-m agent_mail hook ...` where no script is installed), and the file that names the mailbox.
Each harness's files, what goes in them and the notes shown are its record's (agent_mail.harnesses: claude_code,
codex, gemini, qwen, copilot, opencode, kilo, pi, vibe, one module each); this module writes them, the same way for
all: hooks merged into a harness's hooks object (hooks_merged: the record says the events and the shape of one
hook), the MCP server entry (servers), a JSON settings file edited in place (json_plan). Every harness gets the
context hooks, the stop guard, the end of a session and the pre-tool hook (`hook HARNESS pretool`, which denies an
edit of a file another live identity holds), and where it can be woken by itself its idle waiter.

Through a server (the mailbox an http(s):// URL): the MCP entry is the server's /mcp over streamable HTTP, its
bearer token read from AGENT_MAIL_TOKEN in the harness's environment, never written (.mcp.json's
`{"type": "http", "url": ".../mcp", "headers": {"Authorization": "Bearer ${AGENT_MAIL_TOKEN}"}}`, or each
harness's own form; none where the harness's project settings may not read the environment: the record's
remote_note says where it goes). The hooks are the same commands; agent-mail runs them as a client of the server.

Every harness: DIR/.agent-mail-db, the file by which any agent-mail command run in DIR or below finds the
mailbox (agent_mail.operations.location). Setup first checks that the mailbox can be opened (without creating it).

Files are merged, not replaced: other keys, hooks and servers stay as they were, in their order, and a JSON file
is edited as text (harness.json_text: its indentation, inline arrays, comments and trailing commas where the harness
reads JSONC, every byte setup does not change). Our entries are recognised by their command (`/path/to/agent-mail
hook`, or `-m agent_mail hook`, which older setups wrote; `agent_mail mcp`), so a second run changes no byte, a run
with another identity replaces ours, and --remove takes out only ours; what a file held before setup first changed
it is kept in the user's state directory and written back by --remove when it says the same (the exact bytes: a
file of {}, an empty object setup filled); a file setup has nothing to add to or take out of is not rewritten (a
file of {} stays). Writes are atomic (a temporary file renamed over the old one, its
permissions kept); --dry-run prints the diff instead.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import sys

from agent_mail import errors, harnesses, model, spec
from agent_mail.harness import json_text
from agent_mail.harnesses import record
from agent_mail.protocols import http_api

HARNESSES = spec.HARNESSES
KIT = sys.modules[__name__]  # what a harness's record is handed to write its files with (record.Harness.plans)
SERVER = record.SERVER
WAITER_TIMEOUT_SECONDS = 3600  # above the waiter's 55-minute wait
REWAKE_MESSAGE = record.WOKEN_FRAME
_MARK = " -m agent_mail "  # in the MCP servers' commands, and the hooks' of older setups and checkouts run in place
SCRIPT = "agent-mail"  # the script a hook runs (scripts/agent-mail, installed with the package)


def base_command() -> list[str]:
    return [sys.executable, "-m", "agent_mail"]


def hook_base() -> list[str]:
    """How a hook starts agent-mail: this interpreter running the agent-mail script installed with it. A hook runs on
    every tool call and prompt, and `-m agent_mail` costs a millisecond more a start (runpy finds and runs the
    package's __main__); where no script of ours is found (a checkout run in place), `-m agent_mail` all the same."""
    script = _script()
    return [sys.executable, script] if script is not None else base_command()


def _script() -> str | None:
    """The agent-mail script of this installation, by its absolute path: the one running (`agent-mail setup`), else
    the one beside this interpreter or in its scripts directory (a virtual environment's bin, the system's, the
    user's). Only a file that is our script counts: running it with this interpreter is `-m agent_mail`."""
    import sysconfig

    candidates = [sys.argv[0] if sys.argv else "", os.path.join(os.path.dirname(sys.executable), SCRIPT)]
    for scheme in (None, f"{os.name}_user"):
        try:
            candidates.append(os.path.join(sysconfig.get_path("scripts", scheme) or "", SCRIPT))
        except KeyError:  # no such scheme here
            pass
    for path in candidates:
        if os.path.basename(path) == SCRIPT and _is_our_script(path):
            return os.path.abspath(path)
    return None


def _is_our_script(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return b"from agent_mail.cli.main import run" in handle.read(4096)
    except OSError:
        return False


def _shell(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _ours(command: object) -> bool:
    """Whether a hook's command is one setup wrote: `PYTHON /path/to/agent-mail hook ...`, or `PYTHON -m agent_mail
    hook ...` (older setups, and a checkout run in place), after its AGENT_MAIL_DB=... A command naming agent-mail
    without its path (`agent-mail hook ...`) is the user's own."""
    if not isinstance(command, str) or " hook " not in command:
        return False
    if _MARK in f" {command} ":
        return True
    try:
        words = shlex.split(command)
    except ValueError:  # not a command a shell would take: not ours
        return False
    return any(word == "hook" and os.path.isabs(before) and os.path.basename(before) == SCRIPT
               for before, word in zip(words, words[1:], strict=False))


def _mailbox() -> str:
    """The mailbox the harness's commands should use: the resolved SQLite path, or the PostgreSQL URL with
    any password removed (settings files get committed and shared: the password belongs in ~/.pgpass or
    PGPASSFILE, which libpq reads). Refused if it could not be opened: every hook would fail."""
    from agent_mail.operations import location as located
    from agent_mail.urls import redact_url, scheme_of

    location, _ = located.resolve_location()
    if scheme_of(location) in ("http", "https"):
        return _server_url(location)
    problem = _mailbox_problem(location)
    if problem:
        raise errors.InvalidInput([(located.ENV_VAR, f"{problem} Every hook of the session would fail; fix it (or "
                                                     f"point {located.ENV_VAR} at another mailbox) and run setup "
                                                     "again. Nothing was written.")])
    return location if scheme_of(location) is None else redact_url(location)


def _server_url(url: str) -> str:
    """An agent-mail server's URL as the harness's entries name it (no trailing slash); refused when it could
    not be one: the URL a client uses, without credentials in it (those would land in the files setup writes)."""
    from urllib.parse import urlsplit

    from agent_mail.operations import location as located

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError as exc:
        parts, problem = None, f"is not a URL ({exc})"
    else:
        problem = None
    if parts is not None and not parts.hostname:
        problem = "names no host"
    elif parts is not None and (parts.username or parts.password):
        problem = "carries a user or password; the server takes a token (AGENT_MAIL_TOKEN), never a password"
    elif parts is not None and (parts.query or parts.fragment):
        problem = "has a query or fragment; give the server's base URL (https://HOST:PORT, or its path behind a proxy)"
    if problem:
        raise errors.InvalidInput([(located.ENV_VAR, f"{url!r} {problem}. Fix it and run setup again. Nothing was "
                                                     "written.")])
    return url.rstrip("/")


def is_server(mailbox: str) -> bool:
    return mailbox.startswith(("http://", "https://"))


TOKEN_VAR = "AGENT_MAIL_TOKEN"
TOKEN_FILE_VAR = "AGENT_MAIL_TOKEN_FILE"
# How each harness's remote MCP entry reads the token: from the environment of the harness's process (Claude Code
# and Gemini CLI expand ${VAR} in a server's headers; Codex names the variable), so no file holds it.
BEARER_FROM_ENV = "Bearer ${" + TOKEN_VAR + "}"


def _mailbox_problem(location: str) -> str | None:
    """Why the mailbox at `location` could not be opened, or None; found without creating it (no file, no
    directory, no PostgreSQL schema): describe's report of it, and for a file not made yet, whether the
    nearest directory that exists above it is a directory this user can create it in."""
    from agent_mail.store import backend_for, scheme_of

    report = backend_for(location).report(location, "", location)
    if report.get("problem"):
        return f"the mailbox {report.get('url') or location} cannot be opened: {report['problem']}"
    if scheme_of(location) is not None or report.get("exists"):
        return None
    above = os.path.dirname(location)
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        return f"the mailbox {location} cannot be created: {above} is a file, not a directory."
    if not os.access(above, os.W_OK | os.X_OK):
        return f"the mailbox {location} cannot be created: {above} is not writable by this user."
    return None


def _load(path: str, comments: bool = False) -> tuple[dict | None, str | None]:
    """(document, original text) of a JSON settings file (JSONC, with comments and trailing commas, where the
    harness reads that: `comments`); (None, None) when absent."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None, None
    except UnicodeDecodeError:
        raise errors.InvalidInput([(path, "is not UTF-8 text; fix or move it, then run setup again. Nothing was "
                                          "written.")]) from None
    except OSError as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc.strerror}. Nothing was written.") from None
    if not text.strip():
        return {}, text
    try:
        document = json_text.parse(text, comments).value
    except json_text.JSONTextError as exc:
        kind = "JSON (comments allowed)" if comments else "JSON"
        raise errors.InvalidInput([(path, f"is not valid {kind} ({exc}); fix it (or move it aside), then run setup "
                                          "again. Nothing was written.")]) from None
    if not isinstance(document, dict):
        raise errors.InvalidInput([(path, "must hold a JSON object; fix it, then run setup again. Nothing was "
                                          "written.")])
    return document, text


def _dump(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _hook_entries(harness: str, agent: str, mailbox: str) -> dict[str, list[dict]]:
    """Our hooks for `harness`, by its event names, in its settings' shape (its record's hook_entries and
    hook_entry)."""
    # The mailbox rides in the command (harnesses run it with a POSIX shell): a session started without
    # AGENT_MAIL_DB in its environment still reaches the mailbox set up here.
    base = f"AGENT_MAIL_DB={shlex.quote(mailbox)} " + _shell(hook_base())
    kind = harnesses.of(harness)

    def hook(event: str, **extra) -> dict:
        return kind.hook_entry(base + " " + _shell(["hook", harness, event, "--agent", agent]), event, extra)

    return kind.hook_entries(KIT, hook, agent)


def _without_ours(groups: object) -> object:
    """A hook event's matcher groups with our hooks taken out (and groups left empty by that); Copilot CLI's
    flat lists of hooks ({type, bash}) likewise."""
    if not isinstance(groups, list):
        return groups
    kept = []
    for group in groups:
        if isinstance(group, dict) and _ours(group.get("bash")):
            continue
        if isinstance(group, dict) and isinstance(group.get("hooks"), list):
            hooks = [h for h in group["hooks"] if not (isinstance(h, dict) and _ours(h.get("command")))]
            if not hooks and group["hooks"]:
                continue  # it held only ours
            if len(hooks) != len(group["hooks"]):
                group = {**group, "hooks": hooks}
        kept.append(group)
    return kept


def hooks_merged(document: dict, harness: str, agent: str, mailbox: str, remove: bool) -> dict:
    """`document` (a settings object with a "hooks" key) with our hooks replaced, or taken out."""
    document = dict(document)
    hooks = document.get("hooks", {})
    if not isinstance(hooks, dict):
        raise errors.InvalidInput([("hooks", "in the settings is not an object; fix it, then run setup again.")])
    hooks = {event: _without_ours(groups) for event, groups in hooks.items()}
    hooks = {event: groups for event, groups in hooks.items() if groups != []}
    if not remove:
        for event, groups in _hook_entries(harness, agent, mailbox).items():
            hooks[event] = (hooks.get(event) or []) + groups
    if hooks:
        document["hooks"] = hooks
    else:
        document.pop("hooks", None)
    return document


def server_entry(agent: str, mailbox: str) -> dict:
    base = base_command()
    return {"command": base[0], "args": base[1:] + ["mcp", "--agent", agent], "env": {"AGENT_MAIL_DB": mailbox}}


# Claude Code's .mcp.json is the file a team commits: nothing personal in it. The interpreter, identity and
# mailbox come from the session's environment, which .claude/settings.local.json's `env` sets and the server
# inherits. (Claude Code expands ${VAR} in .mcp.json before that env applies, so the shell reads $VAR instead.)
SHARED_SERVER = {"type": "stdio", "command": "sh", "args": [
    "-c", 'test -n "$AGENT_MAIL_PYTHON" || { echo "agent-mail: run agent-mail setup claude-code --agent P:N in this '
    'directory (it sets AGENT_MAIL_PYTHON in .claude/settings.local.json)" >&2; exit 1; }; '
    'exec "$AGENT_MAIL_PYTHON" -m agent_mail mcp']}


def remote_entry(url: str, typed: bool) -> dict:
    """The MCP entry of a harness reaching the server at `url` over streamable HTTP (its /mcp), the token read
    from the environment: `typed`, {"type": "http", "url": ...} (.mcp.json's form), else {"httpUrl": ...} (Gemini
    CLI's settings)."""
    where = {"type": "http", "url": mcp_url(url)} if typed else {"httpUrl": mcp_url(url)}
    return {**where, "headers": {"Authorization": BEARER_FROM_ENV}}


def mcp_url(url: str) -> str:
    """The /mcp of the agent-mail server at `url`."""
    return url + http_api.MCP_PATH


def servers(document: dict, agent: str, mailbox: str, remove: bool, **extra) -> dict:
    """`document` with our entry under mcpServers replaced, or taken out. With `type` in `extra`: .mcp.json's
    (SHARED_SERVER, or the server's /mcp as {"type": "http", ...}); otherwise the command with its environment, or
    {"httpUrl": ...}, `extra` added either way (trust=True, say)."""
    document = dict(document)
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise errors.InvalidInput([("mcpServers", "is not an object; fix it, then run setup again.")])
    servers = {name: spec for name, spec in servers.items() if name != SERVER}
    if not remove and is_server(mailbox):
        remote = remote_entry(mailbox, typed="type" in extra)
        servers[SERVER] = {**remote, **{k: v for k, v in extra.items() if k != "type"}}
    elif not remove:
        servers[SERVER] = dict(SHARED_SERVER) if "type" in extra else {**server_entry(agent, mailbox), **extra}
    if servers:
        document["mcpServers"] = servers
    else:
        document.pop("mcpServers", None)
    return document


def planned(path: str, action: str, before: str | None, after: str | None) -> dict:
    diff = "".join(difflib.unified_diff((before or "").splitlines(True), (after or "").splitlines(True),
                                        fromfile=path if before is not None else "/dev/null",
                                        tofile=path if after is not None else "/dev/null"))
    return {"path": path, "action": action, "diff": diff, "_text": after, "_before": before}


def json_plan(path: str, change, comments: bool = False) -> dict:
    """The plan for a JSON settings file: `change` (document -> document) applied, written as an edit of the text
    that was there (json_text: its formatting, order and comments kept; only what changed is rewritten)."""
    document, before = _load(path, comments)
    after_document = change(document or {})
    if document is not None and after_document == document:
        return planned(path, "unchanged", before, before)  # nothing of ours to add or take out: not a byte changed
    if not after_document:
        after = None
    elif before is None or not before.strip():
        after = _dump(after_document)
    else:
        after = json_text.edited(before, after_document, comments)
    if document is None and after is None:
        action = "unchanged"
    elif before is not None and after is not None and (after == before or after_document == document):
        action, after = "unchanged", before  # the same settings: not a byte rewritten
    elif after is None:
        action = "remove"
    else:
        action = "create" if document is None else "update"
    return planned(path, action, before, after)


# What a file held before setup first changed it, kept (privately, in the user's state directory:
# $XDG_STATE_HOME/agent-mail/setup, by default ~/.local/state/agent-mail/setup) so that
# --remove gives back those exact bytes: formatting the edit could not undo, a file of {} the person had, an empty
# object setup filled. Used only when it says the same as what --remove computes (other entries added since, by the
# person or another harness's setup, are never undone by it).
def originals_directory() -> str:
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    if not state or not os.path.isabs(state):  # the XDG rule: a relative path is ignored
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "agent-mail", "setup")


def _original_path(path: str) -> str:
    import hashlib

    name = hashlib.sha256(path.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"
    return os.path.join(originals_directory(), name)


def original(path: str) -> dict | None:
    """{"path", "before"} as setup found `path` before its first change, or None (none kept, or unreadable)."""
    try:
        with open(_original_path(path), encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("path") != path or not isinstance(record.get("before"),
                                                                                     (str, type(None))):
        return None
    return record


def _keep_original(path: str, before: str | None) -> None:
    """Remember what `path` held before setup first changed it (the first time only); best effort: without it
    --remove still takes out exactly setup's entries, in the file's own formatting."""
    from agent_mail import files

    target = _original_path(path)
    if os.path.exists(target):
        return
    try:
        files.make_private_dirs(os.path.dirname(target))
        fd = os.open(target + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"path": path, "before": before}, handle, ensure_ascii=False)
        os.replace(target + ".tmp", target)
    except (OSError, errors.AgentMailError):
        pass


def _forget_original(path: str) -> None:
    try:
        os.unlink(_original_path(path))
    except OSError:
        pass


def meaning(path: str, text: str | None) -> object:
    """What a settings file says, for comparing two versions of it: its document with empty objects and lists left
    out (setup takes out a container it emptied), {} for no file; the text itself for a file that is not JSON/TOML."""
    if text is None or not text.strip():
        return {}
    try:
        if path.endswith(".toml"):
            import tomllib

            document = tomllib.loads(text)
        elif path.endswith((".json", ".jsonc")):
            document = json_text.parse(text, comments=True).value
        else:
            return text
    except (ValueError, json_text.JSONTextError):
        return text

    def pruned(value):
        if isinstance(value, dict):
            value = {k: pruned(v) for k, v in value.items()}
            return {k: v for k, v in value.items() if v not in ({}, [])}
        if isinstance(value, list):
            return [pruned(v) for v in value]
        return value

    return pruned(document)


def _restoring(plan: dict) -> dict:
    """A --remove plan given the bytes the file held before setup, where those say what the plan's result says
    (or the plan would delete a plain file setup replaced)."""
    record = original(plan["path"])
    if record is None or plan["_text"] == record["before"]:
        return plan
    before = record["before"]
    same = meaning(plan["path"], plan["_text"]) == meaning(plan["path"], before)
    plain = not plan["path"].endswith((".json", ".jsonc", ".toml")) and plan["_text"] is None
    if not (same or plain):
        return plan
    current = plan["_before"]
    action = "unchanged" if before == current else ("remove" if before is None else
                                                    ("create" if current is None else "update"))
    return planned(plan["path"], action, current, before)


_PROJECT_NOTE = ("# The agent-mail mailbox of this directory tree (written by `agent-mail setup`; AGENT_MAIL_DB "
                 "overrides it).\n")
def set_up_here(root: str, harness: str) -> bool:
    """Whether `harness` is set up in the directory `root`: the file its record's marker names holds a mark (or,
    where setup writes no file there, its record's set_up_at says so)."""
    kind = harnesses.of(harness)
    if kind.set_up_at is not None:
        return kind.set_up_at(root)
    path, marks = kind.marker
    return mentions(os.path.join(root, path), marks)


def _project_file_plan(root: str, harness: str, mailbox: str, remove: bool) -> dict:
    """The plan for DIR/.agent-mail-db, the file by which a plain shell in the project finds the mailbox the
    harness uses: written with the mailbox; on --remove taken out once no other harness set up here uses it
    (and only if it still names what setup wrote)."""
    from agent_mail.operations import location

    path = os.path.join(root, location.PROJECT_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            before: str | None = handle.read(location.PROJECT_FILE_MAX_BYTES + 1)
    except FileNotFoundError:
        before = None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc}. Nothing was written.") from None
    text = _PROJECT_NOTE + mailbox + "\n"
    if remove:
        others = [h for h in harnesses.NAMES if h != harness and set_up_here(root, h)]
        after = None if before == text and not others else before
    else:
        after = text
    action = "unchanged" if after == before else ("remove" if after is None else
                                                  ("create" if before is None else "update"))
    return planned(path, action, before, after)


def mentions(path: str, marks: tuple[str, ...]) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
            return any(mark in text for mark in marks)
    except OSError:
        return False


def _remove_emptied_directories(root: str, plans: list[dict]) -> None:
    """A harness directory (.claude, .codex, .gemini, .qwen, .github/hooks and .github) left empty by --remove goes
    too: setup made it."""
    for plan in plans:
        directory = os.path.dirname(plan["path"])
        while plan["action"] == "remove" and directory != root and directory.startswith(root + os.sep):
            try:
                os.rmdir(directory)  # only when empty
            except OSError:
                break
            directory = os.path.dirname(directory)


def write(path: str, text: str | None) -> None:
    if text is None:
        os.unlink(path)
        return
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    temporary = os.path.join(directory, f".{os.path.basename(path)}.agent-mail-{os.getpid()}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def set_up_for(command: str, directory: str) -> str | None:
    """The harness that `command` starts (its file's name: gemini, copilot, ...), when agent-mail setup connected it
    in `directory` or a directory above (its hooks are in that harness's project file, so its prompt hook reads
    what agent-mail run types); None otherwise (another program, or a harness not set up here)."""
    name = os.path.basename(command)
    harness = next((h for h in harnesses.NAMES if harnesses.of(h).program == name), None)
    if harness is None:
        return None
    here = os.path.abspath(directory)
    while True:
        if set_up_here(here, harness):
            return harness
        above = os.path.dirname(here)
        if above == here:
            return None
        here = above


def _token_report(harness: str, mailbox: str, remove: bool) -> dict | None:
    """Through a server: where the harness's MCP entry and hooks read the token from (never the token)."""
    if not is_server(mailbox) or remove:
        return None
    return {"variable": TOKEN_VAR, "set": bool(os.environ.get(TOKEN_VAR, "").strip()),
            "file_variable": TOKEN_FILE_VAR, "file_set": bool(os.environ.get(TOKEN_FILE_VAR, "").strip())}


def _remote_notes(harness: str, mailbox: str) -> list[str]:
    if not is_server(mailbox):
        return []
    kind = harnesses.of(harness)
    start = kind.program
    if not kind.mcp:  # its hooks alone: they read either variable
        notes = [f"The hooks run agent-mail as a client of the agent-mail server {mailbox}. No file holds the token: "
                 f"they read {TOKEN_VAR} (or the file {TOKEN_FILE_VAR} names) from the environment `{start}` starts "
                 "with."]
        if not (os.environ.get(TOKEN_VAR, "").strip() or os.environ.get(TOKEN_FILE_VAR, "").strip()):
            notes.append(f"Neither {TOKEN_VAR} nor {TOKEN_FILE_VAR} is set here: export one before starting `{start}` "
                         "(the mailbox's operator makes a token with agent-mail token create --agent P:N).")
        return notes + _plain_http(mailbox)
    notes = [f"The MCP server is the agent-mail server's {mailbox}{http_api.MCP_PATH} (streamable HTTP), the identity "
             f"taken from the token; the hooks run agent-mail as a client of {mailbox}. No file holds the token: "
             f"{kind.token_reader} read it from {TOKEN_VAR} in the "
             f"environment `{start}` starts with."]
    if kind.remote_note is not None:  # no MCP entry written: the record says where it goes
        notes[0] = (f"The hooks run agent-mail as a client of {mailbox}, reading the token from {TOKEN_VAR} in the "
                    f"environment `{start}` starts with. " + kind.remote_note(KIT, mailbox))
    if not os.environ.get(TOKEN_VAR, "").strip():
        notes.append(f"{TOKEN_VAR} is not set here. Export it before starting `{start}` (the mailbox's operator "
                     "makes a token with agent-mail token create --agent P:N). With "
                     f"{TOKEN_FILE_VAR} instead: the hooks read the file themselves, but an MCP entry can only read "
                     f"a variable, so start `{start}` with {TOKEN_VAR}=\"$(cat \"${TOKEN_FILE_VAR}\")\" {start}.")
    return notes + _plain_http(mailbox)


def _plain_http(mailbox: str) -> list[str]:
    if mailbox.startswith("http://") and not _loopback(mailbox):
        return [f"{mailbox} is plain http to another machine: the token and the mail cross the network in clear. "
                "Prefer https:// (agent-mail serve --tls-cert, or a TLS proxy in front)."]
    return []


def _loopback(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setup(harness: str, agent: str, directory: str | None = None, dry_run: bool = False, remove: bool = False,
          emit=None) -> dict:
    if harness not in HARNESSES:
        raise errors.InvalidInput([("harness", f"{harness!r}: agent-mail sets up {', '.join(HARNESSES)}.")])
    problem = model.identity_problem(agent)
    if problem:
        raise errors.InvalidInput([("agent", problem)])
    root = os.path.realpath(os.path.expanduser(directory or os.getcwd()))
    if not os.path.isdir(root):
        raise errors.InvalidInput([("dir", f"{root} is not a directory; give the project directory the harness "
                                              "starts in.")])
    mailbox = _mailbox()
    project_file = _project_file_plan(root, harness, mailbox, remove)
    kind = harnesses.of(harness)
    plans = kind.plans(KIT, root, agent, mailbox, remove)
    plans.append(project_file)
    if remove:
        plans = [_restoring(plan) for plan in plans]
    files = [{k: v for k, v in plan.items() if not k.startswith("_")} for plan in plans]
    result = {
        "harness": harness, "agent": agent, "mailbox": mailbox, "dir": root, "removed": remove,
        "dry_run": dry_run, "files": files,
        "wakes_idle_session": kind.wakes_idle and not remove,
        "token": _token_report(harness, mailbox, remove),
        "notes": [] if remove else list(kind.notes) + _remote_notes(harness, mailbox) + [
            f"A plain shell in {root} or below now uses this mailbox too: {os.path.basename(project_file['path'])} "
            "names it (AGENT_MAIL_DB still wins). It is personal, like .claude/settings.local.json: keep it out of "
            "version control unless it names a shared mailbox."],
    }
    if emit is not None:
        emit(result)  # printed first, then written: a result that could not be printed changed nothing
    done: list[dict] = []
    if not dry_run:
        try:
            for plan in plans:
                if plan["action"] != "unchanged":
                    write(plan["path"], plan["_text"])
                    done.append(plan)
            _remove_emptied_directories(root, plans)
            for plan in done:
                if not remove:
                    _keep_original(plan["path"], plan["_before"])
                elif plan["_text"] is None or (original(plan["path"]) or {}).get("before", 0) == plan["_text"]:
                    _forget_original(plan["path"])
        except OSError as exc:
            for plan in reversed(done):  # all or nothing: put back what was already written
                try:
                    write(plan["path"], plan["_before"])
                except OSError:
                    pass
            raise errors.AgentMailError(f"could not write {exc.filename or plan['path']}: {exc.strerror}. Nothing "
                                        "was changed: check the directory's permissions and run setup again.") from None
    return result
