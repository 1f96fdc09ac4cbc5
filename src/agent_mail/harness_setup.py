"""`agent-mail setup HARNESS --agent P:N`: connect a harness to the mailbox in one command.

Claude Code, for a project directory DIR:
- DIR/.mcp.json: the MCP server `agent-mail` (this interpreter running `agent_mail mcp --agent P:N`, with
  the mailbox it resolved in its environment);
- DIR/.claude/settings.local.json (personal, not committed): the hooks (context on SessionStart,
  UserPromptSubmit and PostToolUse; the stop guard and the asyncRewake waiter on Stop; end on
  SessionEnd), `mcp__agent-mail` allowed, and the server enabled so no prompt asks.

Files are merged, not replaced: other keys, hooks and servers stay as they were, in their order. Our
entries are recognised by their command (`agent_mail hook` / `agent_mail mcp`), so a second run changes
no byte, a run with another identity replaces ours, and --remove takes out only ours. Writes are atomic
(a temporary file renamed over the old one, its permissions kept); --dry-run prints the diff instead.
"""

from __future__ import annotations

import difflib
import json
import os
import shlex
import sys

from agent_mail import errors, model

HARNESSES = ("claude-code",)
SERVER = "agent-mail"
WAITER_TIMEOUT_SECONDS = 3600  # above the waiter's 55-minute wait
_MARK = " -m agent_mail "  # in every command we write: how our entries are told from the user's


def _base_command() -> list[str]:
    return [sys.executable, "-m", "agent_mail"]


def _shell(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _ours(command: object) -> bool:
    return isinstance(command, str) and _MARK in f" {command} " and " hook " in command


def _mailbox() -> str:
    from agent_mail import service

    path, _ = service.resolve_path()
    return path


def _load(path: str) -> tuple[dict | None, str | None]:
    """(document, original text) of a JSON settings file; (None, None) when absent."""
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
        document = json.loads(text)
    except ValueError as exc:
        raise errors.InvalidInput([(path, f"is not valid JSON ({exc}); fix it (or move it aside), then run setup "
                                          "again. Nothing was written.")]) from None
    if not isinstance(document, dict):
        raise errors.InvalidInput([(path, "must hold a JSON object; fix it, then run setup again. Nothing was "
                                          "written.")])
    return document, text


def _dump(document: dict) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _hook_entries(agent: str, mailbox: str) -> dict[str, list[dict]]:
    # The mailbox rides in the command (the harness runs it with a POSIX shell): a session started without
    # AGENT_MAIL_DB in its environment still reaches the mailbox set up here.
    base = f"AGENT_MAIL_DB={shlex.quote(mailbox)} " + _shell(_base_command())

    def hook(event: str, **extra) -> dict:
        return {"type": "command", "command": base + " " + _shell(["hook", "claude-code", event, "--agent", agent]),
                **extra}

    return {
        "SessionStart": [{"hooks": [hook("context")]}],
        "UserPromptSubmit": [{"hooks": [hook("context")]}],
        "PostToolUse": [{"matcher": "*", "hooks": [hook("context")]}],
        "Stop": [{"hooks": [hook("stop"), hook("wait", asyncRewake=True, timeout=WAITER_TIMEOUT_SECONDS)]}],
        "SessionEnd": [{"hooks": [hook("end")]}],
    }


def _without_ours(groups: object) -> object:
    """A hook event's matcher groups with our hooks taken out (and groups left empty by that)."""
    if not isinstance(groups, list):
        return groups
    kept = []
    for group in groups:
        if isinstance(group, dict) and isinstance(group.get("hooks"), list):
            hooks = [h for h in group["hooks"] if not (isinstance(h, dict) and _ours(h.get("command")))]
            if not hooks and group["hooks"]:
                continue  # it held only ours
            if len(hooks) != len(group["hooks"]):
                group = {**group, "hooks": hooks}
        kept.append(group)
    return kept


def _settings(document: dict, agent: str, mailbox: str, remove: bool) -> dict:
    document = dict(document)
    hooks = document.get("hooks", {})
    if not isinstance(hooks, dict):
        raise errors.InvalidInput([("hooks", "in the settings is not an object; fix it, then run setup again.")])
    hooks = {event: _without_ours(groups) for event, groups in hooks.items()}
    hooks = {event: groups for event, groups in hooks.items() if groups != []}
    if not remove:
        for event, groups in _hook_entries(agent, mailbox).items():
            hooks[event] = (hooks.get(event) or []) + groups
    if hooks:
        document["hooks"] = hooks
    else:
        document.pop("hooks", None)
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


def _servers(document: dict, agent: str, mailbox: str, remove: bool) -> dict:
    document = dict(document)
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise errors.InvalidInput([("mcpServers", "in .mcp.json is not an object; fix it, then run setup again.")])
    servers = {name: spec for name, spec in servers.items() if name != SERVER}
    if not remove:
        base = _base_command()
        servers[SERVER] = {"type": "stdio", "command": base[0], "args": base[1:] + ["mcp", "--agent", agent],
                           "env": {"AGENT_MAIL_DB": mailbox}}
    if servers:
        document["mcpServers"] = servers
    else:
        document.pop("mcpServers", None)
    return document


def _plan(path: str, change) -> dict:
    document, before = _load(path)
    after_document = change(document or {})
    after = _dump(after_document) if after_document else None
    if document is None and after is None:
        action = "unchanged"
    elif before is not None and after is not None and (after == before or after_document == document):
        action, after = "unchanged", before  # the same settings: not a byte rewritten
    elif after is None:
        action = "remove"
    else:
        action = "create" if document is None else "update"
    diff = "".join(difflib.unified_diff((before or "").splitlines(True), (after or "").splitlines(True),
                                        fromfile=path if before is not None else "/dev/null",
                                        tofile=path if after is not None else "/dev/null"))
    return {"path": path, "action": action, "diff": diff, "_text": after, "_before": before}


def _write(path: str, text: str | None) -> None:
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


def setup(harness: str, agent: str, directory: str | None = None, dry_run: bool = False, remove: bool = False,
          emit=None) -> dict:
    if harness not in HARNESSES:
        raise errors.InvalidInput([("harness", f"{harness!r}: agent-mail sets up {', '.join(HARNESSES)}.")])
    problem = model.identity_problem(agent)
    if problem:
        raise errors.InvalidInput([("--agent", problem)])
    root = os.path.realpath(os.path.expanduser(directory or os.getcwd()))
    if not os.path.isdir(root):
        raise errors.InvalidInput([("--dir", f"{root} is not a directory; give the project directory the harness "
                                              "starts in.")])
    mailbox = _mailbox()
    plans = [
        _plan(os.path.join(root, ".mcp.json"), lambda d: _servers(d, agent, mailbox, remove)),
        _plan(os.path.join(root, ".claude", "settings.local.json"), lambda d: _settings(d, agent, mailbox, remove)),
    ]
    files = [{k: v for k, v in plan.items() if not k.startswith("_")} for plan in plans]
    result = {
        "harness": harness, "agent": agent, "mailbox": mailbox, "dir": root, "removed": remove,
        "dry_run": dry_run, "files": files,
        "wakes_idle_session": not remove,
        "notes": [] if remove else [
            "Start `claude` in this directory: the agent-mail MCP tools (mcp__agent-mail__*) are allowed, mail "
            "reaches the model's context on session start, each prompt and after tool calls, a stop is held once "
            "for mail that arrived during the turn, and an idle session is woken when mail arrives.",
            "claude -p and SDK runs are not kept waiting: the waiter only arms in interactive sessions.",
        ],
    }
    if emit is not None:
        emit(result)  # printed first, then written: a result that could not be printed changed nothing
    done: list[dict] = []
    if not dry_run:
        try:
            for plan in plans:
                if plan["action"] != "unchanged":
                    _write(plan["path"], plan["_text"])
                    done.append(plan)
        except OSError as exc:
            for plan in reversed(done):  # all or nothing: put back what was already written
                try:
                    _write(plan["path"], plan["_before"])
                except OSError:
                    pass
            raise errors.AgentMailError(f"could not write {exc.filename or plan['path']}: {exc.strerror}. Nothing "
                                        "was changed: check the directory's permissions and run setup again.") from None
    return result
