"""`agent-mail setup HARNESS --agent P:N`: connect a harness to the mailbox in one command.

For a project directory DIR, the MCP server `agent-mail` (this interpreter running `agent_mail mcp
--agent P:N`, with the mailbox it resolved in its environment) and the hooks (this interpreter running the installed
agent-mail script, `hook ...`; `-m agent_mail hook ...` where no script is installed):
- Claude Code: DIR/.mcp.json (the server, nothing personal in it: teams commit it) and
  DIR/.claude/settings.local.json (personal, not committed: the interpreter, identity and mailbox in `env`;
  context on SessionStart, UserPromptSubmit and PostToolUse; the stop guard and the asyncRewake waiter
  on Stop; end on SessionEnd; `mcp__agent-mail` allowed and the server enabled, so no prompt asks).
- Codex: DIR/.codex/config.toml (the server, its tools approved, between two marker lines, and at the top
  thread_unload_delay_secs = 2, so that Codex's shared app-server ends a session 2 s after its terminal left) and
  DIR/.codex/hooks.json (context on SessionStart, UserPromptSubmit, PostToolUse; the stop guard on Stop;
  end on SessionEnd; the idle waker, harness.waker, started on SessionStart and Stop).
- Gemini CLI: DIR/.gemini/settings.json (the server, trusted; context on SessionStart, BeforeAgent,
  AfterTool; the stop guard on AfterAgent; end on SessionEnd).
- Qwen Code: DIR/.qwen/settings.json (the server, trusted, its main tools listed in tools.visible so the model
  sees them without Qwen's deferred-tool bridge; context on SessionStart, UserPromptSubmit, PostToolUse; the stop
  guard on Stop; end on SessionEnd; the idle waker, harness.waker, started on SessionStart and Stop, and
  dualOutput.inputFile, the file it wakes the session through). Claude Code's hook forms; timeouts in seconds.
- Copilot CLI: DIR/.github/hooks/agent-mail.json (a hooks file of its own: context on sessionStart,
  userPromptSubmitted, postToolUse; the stop guard on agentStop; end on sessionEnd) and the server in DIR/.mcp.json
  (`type: stdio`, all its tools).
- OpenCode: DIR/.opencode/plugin/agent-mail.js (a plugin running the same hook commands: context on each prompt and
  after each tool, the stop guard and the idle waiter when a session goes idle, the pre-tool guard, end on exit;
  agent_mail.harness.opencode) and the server in DIR/opencode.json (mcp.agent-mail, `type: local`).
- Kilo Code CLI (built on OpenCode): the same plugin in DIR/.kilo/plugin/agent-mail.js and the server in DIR/kilo.json
  (or the DIR/kilo.jsonc there).

All three also get the pre-tool hook (`hook HARNESS pretool`), which denies an edit of a file another live
identity holds: Claude Code PreToolUse on Edit|Write|MultiEdit|NotebookEdit, Codex PreToolUse on
apply_patch|Bash, Gemini CLI BeforeTool on write_file|replace, Qwen Code PreToolUse on write_file|edit, Copilot CLI
preToolUse (every tool; the hook passes all but create and edit at once).

Through a server (the mailbox an http(s):// URL): the MCP entry is the server's /mcp over streamable HTTP, its
bearer token read from AGENT_MAIL_TOKEN in the harness's environment, never written: Claude Code's .mcp.json
`{"type": "http", "url": ".../mcp", "headers": {"Authorization": "Bearer ${AGENT_MAIL_TOKEN}"}}`, Codex's
`url` + `bearer_token_env_var = "AGENT_MAIL_TOKEN"`, Gemini CLI's `httpUrl` + the same header. The hooks are the
same commands; agent-mail runs them as a client of the server.

All three: DIR/.agent-mail-db, the file by which any agent-mail command run in DIR or below finds the
mailbox (agent_mail.operations.location). Setup first checks that the mailbox can be opened (without creating it).

Files are merged, not replaced: other keys, hooks and servers stay as they were, in their order, and a JSON file
is edited as text (harness.json_text: its indentation, inline arrays, comments and trailing commas where the harness
reads JSONC, every byte setup does not change). Our entries are recognised by their command (`/path/to/agent-mail
hook`, or `-m agent_mail hook`, which older setups wrote; `agent_mail mcp`), so a second run changes no byte, a run
with another identity replaces ours, and --remove takes out only ours; what a file held before setup first changed
it is kept in the user's state directory and written back by --remove when it says the same (the exact bytes: a
file of {}, an empty object setup filled). Writes are atomic (a temporary file renamed over the old one, its
permissions kept); --dry-run prints the diff instead.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import sys

from agent_mail import errors, model, spec
from agent_mail.harness import json_text, opencode
from agent_mail.protocols import http_api

HARNESSES = spec.HARNESSES
_BEGIN = "# agent-mail setup: begin (written by `agent-mail setup codex`; `--remove` takes it out)"
_END = "# agent-mail setup: end"
# A root key has to come before the first table of a TOML file: ours is a block of its own at the top.
_TOP_BEGIN = "# agent-mail setup: begin, top of the file (written by `agent-mail setup codex`; `--remove` takes it out)"
_TOP_END = "# agent-mail setup: end, top of the file"
# Codex unloads a thread this long after the last terminal showing it left, and fires SessionEnd then (60 s by
# default): the session stops counting as live within about this long after /exit. An idle thread a terminal
# still shows is not unloaded (seen with 0.171.0: 15 s idle, still loaded, with the delay at 2 s).
UNLOAD_DELAY_SECONDS = 2
SERVER = "agent-mail"
WAITER_TIMEOUT_SECONDS = 3600  # above the waiter's 55-minute wait
REWAKE_MESSAGE = "agent-mail: new mail arrived while you were idle (this is mail for you, not an error):"
_MARK = " -m agent_mail "  # in the MCP servers' commands, and the hooks' of older setups and checkouts run in place
SCRIPT = "agent-mail"  # the script a hook runs (scripts/agent-mail, installed with the package)


def _base_command() -> list[str]:
    return [sys.executable, "-m", "agent_mail"]


def _hook_base() -> list[str]:
    """How a hook starts agent-mail: this interpreter running the agent-mail script installed with it. A hook runs on
    every tool call and prompt, and `-m agent_mail` costs a millisecond more a start (runpy finds and runs the
    package's __main__); where no script of ours is found (a checkout run in place), `-m agent_mail` all the same."""
    script = _script()
    return [sys.executable, script] if script is not None else _base_command()


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


def _hook_marks(harness: str) -> tuple[str, ...]:
    """What a file setup wrote `harness`'s hooks into holds: `agent-mail hook HARNESS ` (the script, its path quoted
    or not) or ` agent_mail hook HARNESS ` (-m agent_mail)."""
    return tuple(f"{word} hook {harness} " for word in ("/agent-mail", "/agent-mail'", " agent_mail"))


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


def _is_server(mailbox: str) -> bool:
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
    """Our hooks for `harness`, by its event names, in its settings' shape."""
    # The mailbox rides in the command (harnesses run it with a POSIX shell): a session started without
    # AGENT_MAIL_DB in its environment still reaches the mailbox set up here.
    base = f"AGENT_MAIL_DB={shlex.quote(mailbox)} " + _shell(_hook_base())

    def hook(event: str, **extra) -> dict:
        command = base + " " + _shell(["hook", harness, event, "--agent", agent])
        if harness == "gemini":  # named, for its /hooks panel; timeouts in milliseconds
            return {"type": "command", "name": f"agent-mail-{event}", "command": command, "timeout": 30_000, **extra}
        if harness == "qwen":  # named; timeouts in seconds
            return {"type": "command", "command": command, "name": f"agent-mail-{event}", "timeout": 30, **extra}
        if harness == "copilot":  # flat lists of {type, bash, timeoutSec} under camelCase events
            return {"type": "command", "bash": command, "timeoutSec": 30}
        return {"type": "command", "command": command, **extra}

    if harness == "copilot":
        return {
            "sessionStart": [hook("context")],
            "userPromptSubmitted": [hook("context")],
            "postToolUse": [hook("context")],
            "preToolUse": [hook("pretool")],
            "agentStop": [hook("stop")],
            "sessionEnd": [hook("end")],
        }
    if harness == "qwen":
        return {
            # wait: the session's waker (harness.waker), started detached at the start and after each turn
            "SessionStart": [{"hooks": [hook("context"), hook("wait")]}],
            "UserPromptSubmit": [{"hooks": [hook("context")]}],
            "PostToolUse": [{"matcher": "*", "hooks": [hook("context")]}],
            "PreToolUse": [{"matcher": "write_file|edit", "hooks": [hook("pretool")]}],
            "Stop": [{"hooks": [hook("stop"), hook("wait")]}],
            "SessionEnd": [{"hooks": [hook("end")]}],
        }

    if harness == "gemini":
        return {
            "SessionStart": [{"hooks": [hook("context")]}],
            "BeforeAgent": [{"hooks": [hook("context")]}],
            "AfterTool": [{"matcher": ".*", "hooks": [hook("context")]}],
            "BeforeTool": [{"matcher": "write_file|replace", "hooks": [hook("pretool")]}],
            "AfterAgent": [{"hooks": [hook("stop")]}],
            "SessionEnd": [{"hooks": [hook("end")]}],
        }
    entries = {
        "SessionStart": [{"hooks": [hook("context")]}],
        "UserPromptSubmit": [{"hooks": [hook("context")]}],
        "PostToolUse": [{"matcher": "*" if harness == "claude-code" else ".*", "hooks": [hook("context")]}],
        "Stop": [{"hooks": [hook("stop")]}],
        # Before an edit: refused when another live identity holds the file. Codex edits with apply_patch, which it
        # reports as "Bash" when run in its shell (the hook reads the patch; other commands pass at once); its
        # pre-tool-use.command.output schema takes the same permissionDecision as Claude Code's.
        "PreToolUse": [{"matcher": "Edit|Write|MultiEdit|NotebookEdit" if harness == "claude-code" else
                        "apply_patch|Bash", "hooks": [hook("pretool")]}],
    }
    if harness == "claude-code":
        # rewakeMessage and rewakeSummary (Claude Code's settings schema, marked internal there) replace what a
        # wake is framed as: "Stop hook blocking error from command ..." to the model and "Stop hook feedback" to
        # the user. Only a plugin's hook may set the summary per wake, so the user's line cannot name the sender.
        entries["Stop"][0]["hooks"].append(hook("wait", asyncRewake=True, timeout=WAITER_TIMEOUT_SECONDS,
                                                rewakeMessage=REWAKE_MESSAGE, rewakeSummary=f"agent-mail: new mail "
                                                f"for {agent}"))
    else:  # Codex: the session's waker (harness.waker), started detached at the start and after each turn
        entries["SessionStart"][0]["hooks"].append(hook("wait"))
        entries["Stop"][0]["hooks"].append(hook("wait"))
    # Codex 0.171 fires SessionEnd too (its session-end.command.input schema; seen under `codex exec`).
    entries["SessionEnd"] = [{"hooks": [hook("end")]}]
    return entries


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


def _hooks_merged(document: dict, harness: str, agent: str, mailbox: str, remove: bool) -> dict:
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


def _personal_env(agent: str, mailbox: str) -> dict[str, str]:
    """What Claude Code's settings.local.json `env` gives the session (and so its MCP server, which inherits
    it): the values that differ per person, kept out of the .mcp.json a team commits."""
    return {"AGENT_MAIL_PYTHON": sys.executable, "AGENT_MAIL_AGENT": agent, "AGENT_MAIL_DB": mailbox}


def _claude_settings(document: dict, agent: str, mailbox: str, remove: bool) -> dict:
    document = _hooks_merged(document, "claude-code", agent, mailbox, remove)
    env = document.get("env", {})
    if not isinstance(env, dict):
        raise errors.InvalidInput([("env", "in the settings is not an object; fix it, then run setup again.")])
    mine = _personal_env(agent, mailbox)
    env = {name: value for name, value in env.items() if name not in mine}
    if not remove:
        env.update(mine)
    if env:
        document["env"] = env
    else:
        document.pop("env", None)
    permissions = dict(document.get("permissions") or {})
    allow = [rule for rule in permissions.get("allow", []) if rule != f"mcp__{SERVER}"]
    if not remove:
        allow.append(f"mcp__{SERVER}")
    if allow:
        permissions["allow"] = allow
    else:
        permissions.pop("allow", None)
    if permissions:
        document["permissions"] = permissions
    else:
        document.pop("permissions", None)
    enabled = [name for name in document.get("enabledMcpjsonServers", []) if name != SERVER]
    if not remove:
        enabled.append(SERVER)
    if enabled:
        document["enabledMcpjsonServers"] = enabled
    else:
        document.pop("enabledMcpjsonServers", None)
    return document


def _server_entry(agent: str, mailbox: str) -> dict:
    base = _base_command()
    return {"command": base[0], "args": base[1:] + ["mcp", "--agent", agent], "env": {"AGENT_MAIL_DB": mailbox}}


# Claude Code's .mcp.json is the file a team commits: nothing personal in it. The interpreter, identity and
# mailbox come from the session's environment, which .claude/settings.local.json's `env` sets and the server
# inherits. (Claude Code expands ${VAR} in .mcp.json before that env applies, so the shell reads $VAR instead.)
SHARED_SERVER = {"type": "stdio", "command": "sh", "args": [
    "-c", 'test -n "$AGENT_MAIL_PYTHON" || { echo "agent-mail: run agent-mail setup claude-code --agent P:N in this '
    'directory (it sets AGENT_MAIL_PYTHON in .claude/settings.local.json)" >&2; exit 1; }; '
    'exec "$AGENT_MAIL_PYTHON" -m agent_mail mcp']}


def remote_entry(harness: str, url: str) -> dict:
    """The MCP entry of a harness reaching the server at `url` over streamable HTTP (its /mcp), the token read
    from the environment: Claude Code's .mcp.json (`type: http`) or Gemini CLI's settings (`httpUrl`)."""
    if harness == "gemini":
        return {"httpUrl": url + http_api.MCP_PATH, "headers": {"Authorization": BEARER_FROM_ENV}}
    return {"type": "http", "url": url + http_api.MCP_PATH, "headers": {"Authorization": BEARER_FROM_ENV}}


# Qwen Code defers MCP tools behind a bridge the model must call first; these it is shown directly (tools.visible).
QWEN_VISIBLE = tuple(f"mcp__{SERVER}__{name}" for name in ("read", "send", "ack", "watch", "status", "reserve",
                                                              "release", "reservations"))


def _qwen_input_file(root: str) -> str:
    """dualOutput.inputFile as setup writes it: one file per Qwen Code process (Qwen Code expands the variable),
    which the session's waker appends a prompt to (harness.waker)."""
    from agent_mail.harness import waker

    return os.path.join(root, waker.QWEN_WAKE_DIRECTORY, waker.QWEN_INPUT_FILE)


def _qwen_dual_output(document: dict, root: str, remove: bool) -> dict:
    """dualOutput.inputFile: ours set (or taken out); an input file of the person's own is kept (the waker then
    writes to it)."""
    dual = document.get("dualOutput", {})
    if not isinstance(dual, dict):
        raise errors.InvalidInput([("dualOutput", "in the settings is not an object; fix it, then run setup "
                                                  "again.")])
    dual = dict(dual)
    theirs = dual.get("inputFile")
    ours = isinstance(theirs, str) and theirs.endswith(os.path.basename(_qwen_input_file(root))) and \
        os.sep + os.path.join(".qwen", "agent-mail") + os.sep in theirs
    if theirs is None or ours:
        dual.pop("inputFile", None)
        if not remove:
            dual["inputFile"] = _qwen_input_file(root)
    document = dict(document)
    if dual:
        document["dualOutput"] = dual
    else:
        document.pop("dualOutput", None)
    return document


def _qwen_settings(document: dict, root: str, agent: str, mailbox: str, remove: bool) -> dict:
    document = _hooks_merged(_servers(document, agent, mailbox, remove, trust=True), "qwen", agent, mailbox, remove)
    document = _qwen_dual_output(document, root, remove)
    tools = document.get("tools", {})
    if not isinstance(tools, dict):
        raise errors.InvalidInput([("tools", "in the settings is not an object; fix it, then run setup again.")])
    tools = dict(tools)
    visible = tools.get("visible", [])
    if not isinstance(visible, list):
        raise errors.InvalidInput([("tools.visible", "in the settings is not a list; fix it, then run setup again.")])
    visible = [name for name in visible if not (isinstance(name, str) and name.startswith(f"mcp__{SERVER}__"))]
    if not remove:
        visible += list(QWEN_VISIBLE)
    if visible:
        tools["visible"] = visible
    else:
        tools.pop("visible", None)
    if tools:
        document["tools"] = tools
    else:
        document.pop("tools", None)
    return document


def _gemini_ui(document: dict, path: str, remove: bool) -> dict:
    """ui.errorVerbosity = "full" unless the person chose one: at "low" (Gemini CLI's default) a held stop (mail
    that arrived during a turn, given back as the next prompt) is followed by "This request failed", which mail is
    not. --remove takes it out unless it was there before setup."""
    ui = document.get("ui", {})
    if not isinstance(ui, dict):
        raise errors.InvalidInput([("ui", "in the settings is not an object; fix it, then run setup again.")])
    ui = dict(ui)
    if not remove:
        ui.setdefault("errorVerbosity", "full")
    else:
        before = _meaning(path, (_original(path) or {}).get("before"))
        theirs = isinstance(before, dict) and isinstance(before.get("ui"), dict) and "errorVerbosity" in before["ui"]
        if ui.get("errorVerbosity") == "full" and not theirs:
            ui.pop("errorVerbosity")
    document = dict(document)
    if ui:
        document["ui"] = ui
    else:
        document.pop("ui", None)
    return document


def _copilot_hooks(document: dict, agent: str, mailbox: str, remove: bool) -> dict:
    """DIR/.github/hooks/agent-mail.json: Copilot CLI's hooks file ({version: 1, hooks: ...}), ours merged in."""
    document = _hooks_merged(document, "copilot", agent, mailbox, remove)
    if "hooks" in document:
        document = {"version": document.get("version", 1), **document}
    elif set(document) <= {"version"}:
        return {}
    return document


def _copilot_entry(entry: object) -> bool:
    """Whether an .mcp.json agent-mail entry is the one `setup copilot` wrote (it lists `tools`)."""
    return isinstance(entry, dict) and "tools" in entry


def _claude_servers(document: dict, root: str, agent: str, mailbox: str, remove: bool) -> dict:
    """DIR/.mcp.json for Claude Code. Copilot CLI reads the same file and cannot start Claude's shared entry (it has
    no settings env for AGENT_MAIL_PYTHON): while Copilot CLI is set up here, its entry, which Claude Code starts as
    well, stays (on --remove too)."""
    servers = document.get("mcpServers")
    if isinstance(servers, dict) and _copilot_entry(servers.get(SERVER)) and _mentions(
            os.path.join(root, _HARNESS_FILES["copilot"][0]), _HARNESS_FILES["copilot"][1]):
        return document
    return _servers(document, agent, mailbox, remove, type="stdio")


def _copilot_servers(document: dict, root: str, agent: str, mailbox: str, remove: bool) -> dict:
    """DIR/.mcp.json for Copilot CLI: the stdio server with its tools enabled (`tools: ["*"]`), or the agent-mail
    server's /mcp (`type: http`). Copilot CLI has no settings `env` of its own, so the entry carries the mailbox.
    On --remove, where Claude Code is still set up here, its shared entry is put back."""
    if remove and _mentions(os.path.join(root, _HARNESS_FILES["claude-code"][0]),
                            _HARNESS_FILES["claude-code"][1]):
        return _servers(document, agent, mailbox, False, type="stdio")
    document = dict(document)
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise errors.InvalidInput([("mcpServers", "is not an object; fix it, then run setup again.")])
    servers = {name: spec for name, spec in servers.items() if name != SERVER}
    if not remove and _is_server(mailbox):
        servers[SERVER] = {**remote_entry("claude-code", mailbox), "tools": ["*"]}
    elif not remove:
        servers[SERVER] = {"type": "stdio", **_server_entry(agent, mailbox), "tools": ["*"]}
    if servers:
        document["mcpServers"] = servers
    else:
        document.pop("mcpServers", None)
    return document


def _servers(document: dict, agent: str, mailbox: str, remove: bool, **extra) -> dict:
    document = dict(document)
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise errors.InvalidInput([("mcpServers", "is not an object; fix it, then run setup again.")])
    servers = {name: spec for name, spec in servers.items() if name != SERVER}
    if not remove and _is_server(mailbox):
        remote = remote_entry("claude-code" if "type" in extra else "gemini", mailbox)
        servers[SERVER] = {**remote, **{k: v for k, v in extra.items() if k != "type"}}
    elif not remove:
        servers[SERVER] = dict(SHARED_SERVER) if "type" in extra else {**_server_entry(agent, mailbox), **extra}
    if servers:
        document["mcpServers"] = servers
    else:
        document.pop("mcpServers", None)
    return document


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


def _codex_config(path: str, agent: str, mailbox: str, remove: bool) -> dict:
    """The plan for .codex/config.toml: our [mcp_servers.agent-mail] table between two marker comments,
    replaced or taken out; the rest of the file kept byte for byte. Checked with tomllib before and after."""
    import tomllib

    try:
        with open(path, encoding="utf-8") as handle:
            before = handle.read()
    except FileNotFoundError:
        before = None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc}. Nothing was written.") from None
    text = before or ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.InvalidInput([(path, f"is not valid TOML ({exc}); fix it, then run setup again. Nothing was "
                                          "written.")]) from None
    lines = text.splitlines(keepends=True)
    for begin, end_mark in ((_BEGIN, _END), (_TOP_BEGIN, _TOP_END)):
        if begin in text and end_mark in text:
            start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == begin)
            end = next(i for i, line in enumerate(lines) if line.rstrip("\n") == end_mark and i > start)
            lines = lines[:start] + lines[end + 1:]
            while lines and lines[-1].strip() == "" and start >= len(lines):
                lines.pop()
            if begin == _TOP_BEGIN and start == 0 and lines and not lines[0].strip():
                lines.pop(0)  # the blank line setup put after its top block
    kept = "".join(lines)
    if not remove:
        if SERVER in tomllib.loads(kept).get("mcp_servers", {}):
            raise errors.InvalidInput([(path, f"already defines mcp_servers.{SERVER} (not written by setup); remove "
                                              "it, then run setup again. Nothing was written.")])
        if _is_server(mailbox):  # streamable HTTP; Codex reads the bearer token from the variable named
            block = [_BEGIN, f"[mcp_servers.{SERVER}]", f"url = {_toml_string(mailbox + http_api.MCP_PATH)}",
                     f"bearer_token_env_var = {_toml_string(TOKEN_VAR)}",
                     'default_tools_approval_mode = "approve"']
        else:
            entry = _server_entry(agent, mailbox)
            block = [_BEGIN, f"[mcp_servers.{SERVER}]", f"command = {_toml_string(entry['command'])}",
                     "args = [" + ", ".join(_toml_string(a) for a in entry["args"]) + "]",
                     'default_tools_approval_mode = "approve"',  # no approval prompt per call (as Claude's allow)
                     f"env = {{ AGENT_MAIL_DB = {_toml_string(mailbox)} }}"]
        block.append(_END)
        kept = kept + ("\n" if kept and not kept.endswith("\n") else "") + ("\n" if kept.strip() else "")
        kept += "\n".join(block) + "\n"
        if "thread_unload_delay_secs" not in tomllib.loads(kept):
            # Interactive `codex` runs its sessions' hooks and MCP servers in a shared app-server daemon, which
            # takes `codex queue` (the idle waker's, harness.waker) at once; without it a session's own process
            # looks at its queue about every 10 s. The daemon outlives /exit: it fires SessionEnd when it unloads
            # the thread, this long after the terminal left (60 s by default), so the session ends that soon.
            top = [_TOP_BEGIN, f"thread_unload_delay_secs = {UNLOAD_DELAY_SECONDS}", _TOP_END]
            kept = "\n".join(top) + "\n\n" + kept
        try:
            tomllib.loads(kept)
        except tomllib.TOMLDecodeError as exc:
            raise errors.InvalidInput([(path, f"cannot take the [mcp_servers.{SERVER}] table ({exc}); add it by "
                                              "hand. Nothing was written.")]) from None
    after = kept if kept.strip() else None  # a file left with nothing (setup made it, or it held only ours) goes
    if after == before or (after is None and before is None):
        action, after = "unchanged", before
    elif after is None:
        action = "remove"
    else:
        action = "create" if before is None else "update"
    return _planned(path, action, before, after)


def _planned(path: str, action: str, before: str | None, after: str | None) -> dict:
    diff = "".join(difflib.unified_diff((before or "").splitlines(True), (after or "").splitlines(True),
                                        fromfile=path if before is not None else "/dev/null",
                                        tofile=path if after is not None else "/dev/null"))
    return {"path": path, "action": action, "diff": diff, "_text": after, "_before": before}


def _plan(path: str, change, comments: bool = False) -> dict:
    """The plan for a JSON settings file: `change` (document -> document) applied, written as an edit of the text
    that was there (json_text: its formatting, order and comments kept; only what changed is rewritten)."""
    document, before = _load(path, comments)
    after_document = change(document or {})
    if document is not None and after_document == document:
        return _planned(path, "unchanged", before, before)  # nothing of ours to add or take out: not a byte changed
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
    return _planned(path, action, before, after)


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


def _original(path: str) -> dict | None:
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


def _meaning(path: str, text: str | None) -> object:
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
    record = _original(plan["path"])
    if record is None or plan["_text"] == record["before"]:
        return plan
    before = record["before"]
    same = _meaning(plan["path"], plan["_text"]) == _meaning(plan["path"], before)
    plain = not plan["path"].endswith((".json", ".jsonc", ".toml")) and plan["_text"] is None
    if not (same or plain):
        return plan
    current = plan["_before"]
    action = "unchanged" if before == current else ("remove" if before is None else
                                                    ("create" if current is None else "update"))
    return _planned(plan["path"], action, current, before)


_PROJECT_NOTE = ("# The agent-mail mailbox of this directory tree (written by `agent-mail setup`; AGENT_MAIL_DB "
                 "overrides it).\n")
# The file (and the mark in it) by which a harness is known to be set up in a directory: for Claude Code its
# hooks, since Copilot CLI's server shares .mcp.json.
_HARNESS_FILES = {"claude-code": (os.path.join(".claude", "settings.local.json"), _hook_marks("claude-code")),
                  "codex": (os.path.join(".codex", "config.toml"), (_BEGIN,)),
                  "gemini": (os.path.join(".gemini", "settings.json"), (SERVER,)),
                  "qwen": (os.path.join(".qwen", "settings.json"), (SERVER,)),
                  "copilot": (os.path.join(".github", "hooks", "agent-mail.json"), _hook_marks("copilot")),
                  **{h: (fork.plugin, (fork.mark,)) for h, fork in opencode.FORKS.items()}}


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
        others = [h for h, (name, mark) in _HARNESS_FILES.items() if h != harness and _mentions(
            os.path.join(root, name), mark)]
        after = None if before == text and not others else before
    else:
        after = text
    action = "unchanged" if after == before else ("remove" if after is None else
                                                  ("create" if before is None else "update"))
    return _planned(path, action, before, after)


def _mentions(path: str, marks: tuple[str, ...]) -> bool:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
            return any(mark in text for mark in marks)
    except OSError:
        return False


def _remove_emptied_directories(root: str, plans: list[dict]) -> None:
    """A harness directory (.claude, .codex, .gemini, .qwen, .github/hooks and .github, .opencode/plugin, ...) left
    empty by --remove goes too: setup made it."""
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


NOTES = {
    "claude-code": [
        "Start `claude` in this directory: the agent-mail MCP tools (mcp__agent-mail__*) are allowed, mail reaches "
        "the model's context on session start, each prompt and after tool calls, a stop is held once for mail that "
        "arrived during the turn, and an idle session is woken when mail arrives (an asyncRewake hook).",
        "claude -p and SDK runs are not kept waiting: the waiter only arms in interactive sessions.",
    ],
    "codex": [
        "Start `codex` in this directory: the agent-mail MCP server and hooks load from .codex/ (Codex reads a "
        "project's .codex/ once the project is trusted, and asks you to review new hooks before they run).",
        "Mail reaches the model's context on session start, each prompt and after tool calls; a stop is held once "
        "for mail that arrived during the turn.",
        "An idle session is woken when mail arrives: its waker (started by the SessionStart and Stop hooks, ended "
        "with the session) queues the envelopes as a prompt with `codex queue`, which Codex's shared app-server "
        "starts at once. That app-server outlives /exit and ends the session 2 s after its terminal left "
        "(thread_unload_delay_secs, set at the top of .codex/config.toml). With its automatic start turned off "
        "(features.daemon_auto_start = false) a session still wakes, within about 10 s.",
    ],
    "gemini": [
        "Start `gemini` in this directory: the agent-mail MCP server (trusted: no confirmation per call) and hooks "
        "load from .gemini/settings.json once you trust the folder (Gemini CLI asks, and asks you to review new "
        "project hooks).",
        "Mail reaches the model's context on session start, each prompt (BeforeAgent) and after tool calls "
        "(AfterTool); a finished turn (AfterAgent) is sent back once for mail that arrived during it.",
        "Gemini CLI cannot wake an idle session by itself (its hooks have no asyncRewake): start it as "
        "`agent-mail run -- gemini` and an idle session is woken when mail arrives (run types a one-line notice at "
        "the empty prompt, never while you type; the hooks then tell the model). Started plainly, an idle Gemini "
        "hears of mail at its next prompt.",
        "ui.errorVerbosity is set to full in .gemini/settings.json (unless you chose one): at low, Gemini CLI follows "
        "a held stop with \"This request failed\", and mail is not a failure. The held stop shows as \"Agent "
        "execution blocked: agent-mail: new mail ...\" (Gemini's words for a hook that continues the turn).",
    ],
    "qwen": [
        "Start `qwen` in this directory: the agent-mail MCP server (trusted: no confirmation per call; its main tools "
        "listed in tools.visible) and hooks load from .qwen/settings.json. An interactive Qwen Code asks you once to "
        "approve the workspace's MCP server (and again when its entry changes): approve agent-mail.",
        "If you turned on Qwen Code's folder trust (security.folderTrust.enabled), it runs a project's hooks only in "
        "a folder you trusted: trust this one once when Qwen Code asks (~/.qwen/trustedFolders.json); agent-mail "
        "does not answer that for you.",
        "Mail reaches the model's context on session start, each prompt and after tool calls; a stop is held once "
        "for mail that arrived during the turn.",
        "An idle session is woken when mail arrives: its waker (started by the SessionStart and Stop hooks, ended "
        "with the session) submits the envelopes as a prompt through Qwen Code's dual-output input file "
        "(dualOutput.inputFile, one file per process under .qwen/agent-mail/; Qwen Code reads it every 500 ms). "
        "Qwen Code takes that setting at start: restart a session that was running.",
        ".qwen/settings.json now holds this interpreter, identity and mailbox (Qwen Code has no personal project "
        "settings file): keep it out of version control, or commit it only for a shared mailbox.",
    ],
    "copilot": [
        "Start `copilot` in this directory: the agent-mail MCP server (all its tools) loads from .mcp.json, the hooks "
        "from .github/hooks/agent-mail.json. An interactive session counts as live from its first prompt (Copilot "
        "CLI fires sessionStart then).",
        "Copilot CLI runs a repository's hooks only in a folder you trusted, and silently skips them otherwise (also "
        "under -p): trust this folder once when Copilot CLI asks (or start it once with --trust-folder); agent-mail "
        "does not do that for you.",
        "Mail reaches the model's context on session start, each prompt and after tool calls; a stop (agentStop) is "
        "held once for mail that arrived during the turn.",
        "Copilot CLI cannot wake an idle session by itself: start it as `agent-mail run -- copilot` and an idle "
        "session is woken when mail arrives (run types a one-line notice at the empty prompt, never while you type; "
        "the hooks then tell the model). Started plainly, an idle Copilot hears of mail at its next prompt.",
        ".github/hooks/agent-mail.json and the agent-mail entry of .mcp.json hold this interpreter, identity and "
        "mailbox (Copilot CLI reads no personal project settings): keep them out of version control, or commit them "
        "only for a shared mailbox.",
    ],
    "opencode": [
        "Start `opencode` in this directory (OpenCode reads opencode.json from the directory it starts in): the "
        "agent-mail MCP server (tools agent-mail_*) loads from opencode.json, the plugin from "
        ".opencode/plugin/agent-mail.js.",
        "Mail reaches the model's context at each prompt (the first one of a session gets the inbox) and after tool "
        "calls; a session that goes idle with mail that arrived during its turn is sent it as one more prompt, once; "
        "an idle session is woken when mail arrives (the plugin's waiter starts a turn with the envelopes). Under "
        "`opencode run` nothing waits: it exits when its session is idle.",
        "At its first start in a directory OpenCode installs @opencode-ai/plugin into .opencode/node_modules with npm "
        "(a few seconds; without a network it retries for about 75 s before the session starts; "
        "npm_config_fetch_retries=0 makes that fail at once). The agent-mail plugin does not use it.",
        "The agent-mail entry of opencode.json and .opencode/plugin/agent-mail.js hold this interpreter, identity and "
        "mailbox (OpenCode reads no personal project settings): keep them out of version control, or commit them only "
        "for a shared mailbox.",
    ],
    "kilo": [
        "Start `kilo` in this directory: the plugin loads from .kilo/plugin/agent-mail.js, the agent-mail MCP server "
        "(tools agent-mail_*) from the project's kilo.json (or the kilo.jsonc it merged into; through an agent-mail "
        "server, see below).",
        "Mail reaches the model's context at each prompt (the first one of a session gets the inbox) and after tool "
        "calls; a session that goes idle with mail that arrived during its turn is sent it as one more prompt, once; "
        "an idle session is woken when mail arrives (the plugin's waiter starts a turn with the envelopes). Under "
        "`kilo run` nothing waits: it exits when its session is idle.",
        "Kilo's TUI runs plugins in a worker that sees no exit: the session stops counting as live when Kilo's "
        "process ends, and its waiter ends with that process.",
        "The agent-mail entry of kilo.json and .kilo/plugin/agent-mail.js hold this interpreter, identity and "
        "mailbox (Kilo Code reads no personal project settings): keep them out of version control, or commit them "
        "only for a shared mailbox.",
    ],
}


_STARTS = {"claude-code": "claude", "codex": "codex", "gemini": "gemini", "qwen": "qwen", "copilot": "copilot",
           "opencode": "opencode", "kilo": "kilo"}


def set_up_for(command: str, directory: str) -> str | None:
    """The harness that `command` starts (its file's name: gemini, copilot, ...), when agent-mail setup connected it
    in `directory` or a directory above (its hooks are in that harness's project file, so its prompt hook reads
    what agent-mail run types); None otherwise (another program, or a harness not set up here)."""
    name = os.path.basename(command)
    harness = next((h for h, start in _STARTS.items() if start == name), None)
    if harness is None:
        return None
    path, mark = _HARNESS_FILES[harness]
    here = os.path.abspath(directory)
    while True:
        if _mentions(os.path.join(here, path), mark):
            return harness
        above = os.path.dirname(here)
        if above == here:
            return None
        here = above


def _opencode_plans(harness: str, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    """DIR/opencode.json (the MCP server, merged) and DIR/.opencode/plugin/agent-mail.js (the hooks); for Kilo Code,
    DIR/kilo.json (or kilo.jsonc) and DIR/.kilo/plugin/agent-mail.js."""
    fork = opencode.FORKS[harness]
    remote = mailbox + http_api.MCP_PATH if _is_server(mailbox) else None
    entry = None if remove else opencode.server_entry(_base_command(), agent, mailbox, remote,
                                                      BEARER_FROM_OPENCODE_ENV)
    if remote is not None and not fork.env_in_project:
        entry = None  # the token cannot be read there, and is never written: _remote_notes says where it goes
    text = None if remove else opencode.plugin_text(fork, agent, _hook_base(), mailbox, REWAKE_MESSAGE)
    config = opencode.config_path(fork, root)
    return [_plan(config, lambda d: opencode.config_merged(d, entry, os.path.basename(config)), comments=True),
            opencode.plugin_plan(fork, root, text, _planned)]


BEARER_FROM_OPENCODE_ENV = "Bearer {env:" + TOKEN_VAR + "}"  # OpenCode's substitution of a variable in its config


def _token_report(harness: str, mailbox: str, remove: bool) -> dict | None:
    """Through a server: where the harness's MCP entry and hooks read the token from (never the token)."""
    if not _is_server(mailbox) or remove:
        return None
    return {"variable": TOKEN_VAR, "set": bool(os.environ.get(TOKEN_VAR, "").strip()),
            "file_variable": TOKEN_FILE_VAR, "file_set": bool(os.environ.get(TOKEN_FILE_VAR, "").strip())}


def _remote_notes(harness: str, mailbox: str) -> list[str]:
    if not _is_server(mailbox):
        return []
    start = _STARTS[harness]
    notes = [f"The MCP server is the agent-mail server's {mailbox}{http_api.MCP_PATH} (streamable HTTP), the identity "
             f"taken from the token; the hooks run agent-mail as a client of {mailbox}. No file holds the token: "
             f"{'.mcp.json' if harness == 'claude-code' else 'the settings'} read it from {TOKEN_VAR} in the "
             f"environment `{start}` starts with."]
    if harness in opencode.FORKS and not opencode.FORKS[harness].env_in_project:
        entry = {"type": "remote", "url": mailbox + http_api.MCP_PATH, "headers": {"Authorization":
                                                                                 BEARER_FROM_OPENCODE_ENV}}
        notes[0] = (f"The hooks run agent-mail as a client of {mailbox}, reading the token from {TOKEN_VAR} in the "
                    f"environment `{start}` starts with. {opencode.FORKS[harness].name} refuses to read the "
                    "environment in a project's config, so no MCP entry was written here (one naming the token "
                    "itself would put it in a file): for the MCP tools, add "
                    f'"mcp": {{"{SERVER}": {json.dumps(entry)}}} to your own {opencode.FORKS[harness].user_config}, '
                    f"which it trusts to read {TOKEN_VAR}.")
    if not os.environ.get(TOKEN_VAR, "").strip():
        notes.append(f"{TOKEN_VAR} is not set here. Export it before starting `{start}` (the mailbox's operator "
                     "makes a token with agent-mail token create --agent P:N). With "
                     f"{TOKEN_FILE_VAR} instead: the hooks read the file themselves, but an MCP entry can only read "
                     f"a variable, so start `{start}` with {TOKEN_VAR}=\"$(cat \"${TOKEN_FILE_VAR}\")\" {start}.")
    if mailbox.startswith("http://") and not _loopback(mailbox):
        notes.append(f"{mailbox} is plain http to another machine: the token and the mail cross the network in "
                     "clear. Prefer https:// (agent-mail serve --tls-cert, or a TLS proxy in front).")
    return notes


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
    if harness == "claude-code":
        plans = [
            _plan(os.path.join(root, ".mcp.json"), lambda d: _claude_servers(d, root, agent, mailbox, remove)),
            _plan(os.path.join(root, ".claude", "settings.local.json"),
                  lambda d: _claude_settings(d, agent, mailbox, remove)),
        ]
    elif harness == "codex":
        plans = [
            _codex_config(os.path.join(root, ".codex", "config.toml"), agent, mailbox, remove),
            _plan(os.path.join(root, ".codex", "hooks.json"),
                  lambda d: _hooks_merged(d, "codex", agent, mailbox, remove)),
        ]
    elif harness == "qwen":
        plans = [_plan(os.path.join(root, ".qwen", "settings.json"),
                       lambda d: _qwen_settings(d, root, agent, mailbox, remove))]
    elif harness == "copilot":
        plans = [
            _plan(os.path.join(root, ".mcp.json"), lambda d: _copilot_servers(d, root, agent, mailbox, remove)),
            _plan(os.path.join(root, ".github", "hooks", "agent-mail.json"),
                  lambda d: _copilot_hooks(d, agent, mailbox, remove)),
        ]
    elif harness in opencode.FORKS:
        plans = _opencode_plans(harness, root, agent, mailbox, remove)
    else:
        path = os.path.join(root, ".gemini", "settings.json")
        plans = [_plan(path, lambda d: _gemini_ui(_hooks_merged(_servers(d, agent, mailbox, remove, trust=True),
                                                                "gemini", agent, mailbox, remove), path, remove))]
    plans.append(project_file)
    if remove:
        plans = [_restoring(plan) for plan in plans]
    files = [{k: v for k, v in plan.items() if not k.startswith("_")} for plan in plans]
    result = {
        "harness": harness, "agent": agent, "mailbox": mailbox, "dir": root, "removed": remove,
        "dry_run": dry_run, "files": files,
        "wakes_idle_session": harness in ("claude-code", "opencode", "kilo", "codex", "qwen") and not remove,
        "token": _token_report(harness, mailbox, remove),
        "notes": [] if remove else NOTES[harness] + _remote_notes(harness, mailbox) + [
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
                elif plan["_text"] is None or (_original(plan["path"]) or {}).get("before", 0) == plan["_text"]:
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
