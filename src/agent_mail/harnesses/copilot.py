"""Copilot CLI (the `copilot` program): a hooks file of its own, camelCase input and top-level output; no wake of its
own: `agent-mail run -- copilot` wakes it.

Setup writes DIR/.github/hooks/agent-mail.json (context on sessionStart, userPromptSubmitted, postToolUse; the stop
guard on agentStop; the pre-tool guard on preToolUse, every tool: the hook passes all but create and edit at once;
end on sessionEnd) and the server in DIR/.mcp.json (`type: stdio`, all its tools), the file Claude Code reads too.
It reads a TOP-LEVEL additionalContext from its context events (it ignores the nested hookSpecificOutput form) and
holds its agentStop with {"decision": "block"} (both seen with 1.0.102).
"""

from __future__ import annotations

import os

from agent_mail import errors, jsonout
from agent_mail.harnesses.record import RUN, SERVER, Harness, hook_marks

NAME = "copilot"
HOOKS = os.path.join(".github", "hooks", "agent-mail.json")
EDIT_TOOLS = ("create", "edit")


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    return [kit.json_plan(os.path.join(root, ".mcp.json"), lambda d: _servers(kit, d, root, agent, mailbox, remove)),
            kit.json_plan(os.path.join(root, HOOKS), lambda d: _hooks(kit, d, agent, mailbox, remove))]


def hook_entry(command: str, event: str, extra: dict) -> dict:
    """Flat lists of {type, bash, timeoutSec} under camelCase events."""
    return {"type": "command", "bash": command, "timeoutSec": 30}


def hook_entries(kit, hook, agent: str) -> dict[str, list[dict]]:
    return {
        "sessionStart": [hook("context")],
        "userPromptSubmitted": [hook("context")],
        "postToolUse": [hook("context")],
        "preToolUse": [hook("pretool")],
        "agentStop": [hook("stop")],
        "sessionEnd": [hook("end")],
    }


def _hooks(kit, document: dict, agent: str, mailbox: str, remove: bool) -> dict:
    """DIR/.github/hooks/agent-mail.json: Copilot CLI's hooks file ({version: 1, hooks: ...}), ours merged in."""
    document = kit.hooks_merged(document, NAME, agent, mailbox, remove)
    if "hooks" in document:
        document = {"version": document.get("version", 1), **document}
    elif set(document) <= {"version"}:
        return {}
    return document


def _servers(kit, document: dict, root: str, agent: str, mailbox: str, remove: bool) -> dict:
    """DIR/.mcp.json for Copilot CLI: the stdio server with its tools enabled (`tools: ["*"]`), or the agent-mail
    server's /mcp (`type: http`). Copilot CLI has no settings `env` of its own, so the entry carries the mailbox.
    On --remove, where Claude Code is still set up here, its shared entry is put back."""
    if remove and kit.set_up_here(root, "claude-code"):
        return kit.servers(document, agent, mailbox, False, type="stdio")
    document = dict(document)
    servers = document.get("mcpServers", {})
    if not isinstance(servers, dict):
        raise errors.InvalidInput([("mcpServers", "is not an object; fix it, then run setup again.")])
    servers = {name: spec for name, spec in servers.items() if name != SERVER}
    if not remove and kit.is_server(mailbox):
        servers[SERVER] = {**kit.remote_entry(mailbox, typed=True), "tools": ["*"]}
    elif not remove:
        servers[SERVER] = {"type": "stdio", **kit.server_entry(agent, mailbox), "tools": ["*"]}
    if servers:
        document["mcpServers"] = servers
    else:
        document.pop("mcpServers", None)
    return document


# Copilot CLI 1.0.102 passes camelCase input and no event name: {sessionId, timestamp, cwd, ...}; sessionStart adds
# source and initialPrompt, userPromptSubmitted prompt, preToolUse toolName and toolArgs, postToolUse toolResult,
# agentStop stopReason and stop_hook_active. Which event it is shows in the keys it carries.
_EVENTS = (("toolResult", "postToolUse"), ("toolName", "preToolUse"), ("stopReason", "agentStop"),
           ("source", "SessionStart"), ("initialPrompt", "SessionStart"), ("prompt", "userPromptSubmitted"))


def read_input(document: dict) -> dict:
    """Copilot CLI's hook input in the words of the others' (session_id, hook_event_name, tool_name, tool_input,
    stop_hook_active); the session start named SessionStart, as the telling side knows it."""
    found = dict(document)
    if "session_id" not in found and "sessionId" in found:
        found["session_id"] = found["sessionId"]
    if "hook_event_name" not in found:
        event = next((name for key, name in _EVENTS if key in document), None)
        if event is not None:
            found["hook_event_name"] = event
    if "toolName" in found:
        found.setdefault("tool_name", found["toolName"])
        arguments = found.get("toolArgs")
        if isinstance(arguments, str):  # a JSON text in some versions
            try:
                arguments = jsonout.loads(arguments)
            except ValueError:
                arguments = None
        found.setdefault("tool_input", arguments if isinstance(arguments, dict) else {})
    if "stopHookActive" in found:
        found.setdefault("stop_hook_active", found["stopHookActive"])
    return found


def context_output(event: str, note: str) -> dict:
    return {"additionalContext": note}


def denial(note: str) -> dict:
    """preToolUse: top-level (seen with 1.0.102)."""
    return {"permissionDecision": "deny", "permissionDecisionReason": note}


HARNESS = Harness(
    name=NAME,
    title="Copilot CLI",
    program="copilot",
    read_input=read_input,
    context_event="postToolUse",
    context_output=context_output,
    edit_tools=EDIT_TOOLS,
    denial=denial,
    wake=RUN,
    # At work (under `run` too: run types nothing while a turn is under way), or idle where nothing wakes it.
    told="told at its next prompt or tool call (a live Copilot CLI session, at work or idle with nothing to wake it: "
         "`agent-mail run -- copilot` wakes it at its empty prompt)",
    empty_prompt=("/ commands",),
    plans=plans,
    hook_entry=hook_entry,
    hook_entries=hook_entries,
    marker=(HOOKS, hook_marks(NAME)),
    notes=(
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
    ),
)
