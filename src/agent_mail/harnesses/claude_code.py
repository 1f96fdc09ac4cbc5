"""Claude Code (the `claude` program): command hooks in the project's settings, its idle session woken by an
asyncRewake hook.

Setup writes DIR/.mcp.json (the server, nothing personal in it: teams commit it) and DIR/.claude/settings.local.json
(personal, not committed: the interpreter, identity and mailbox in `env`; context on SessionStart,
UserPromptSubmit and PostToolUse; the stop guard on Stop; the asyncRewake waiter on SessionStart and Stop, so a
session idle before its first prompt is woken too; the pre-tool guard on PreToolUse; end on SessionEnd;
`mcp__agent-mail` allowed and the server enabled, so no prompt asks). Its hooks read
hookSpecificOutput.additionalContext on the context events and {"decision": "block"} on Stop.
"""

from __future__ import annotations

import os
import sys

from agent_mail import errors
from agent_mail.harnesses.record import HOOK, Harness, hook_marks

NAME = "claude-code"
SETTINGS = os.path.join(".claude", "settings.local.json")
EDIT_TOOLS = ("Edit", "Write", "MultiEdit", "NotebookEdit")


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    return [kit.json_plan(os.path.join(root, ".mcp.json"), lambda d: _servers(kit, d, root, agent, mailbox, remove)),
            kit.json_plan(os.path.join(root, SETTINGS), lambda d: _settings(kit, d, agent, mailbox, remove))]


def hook_entries(kit, hook, agent: str) -> dict[str, list[dict]]:
    # rewakeMessage and rewakeSummary (Claude Code's settings schema, marked internal there) replace what a wake is
    # framed as: "Stop hook blocking error from command ..." to the model and "Stop hook feedback" to the user. Only
    # a plugin's hook may set the summary per wake, so the user's line cannot name the sender.
    waiter = hook("wait", asyncRewake=True, timeout=kit.WAITER_TIMEOUT_SECONDS, rewakeMessage=kit.REWAKE_MESSAGE,
                  rewakeSummary=f"agent-mail: new mail for {agent}")
    return {
        # The waiter on SessionStart too: a session idle at its prompt before its first turn is woken as well.
        "SessionStart": [{"hooks": [hook("context"), waiter]}],
        "UserPromptSubmit": [{"hooks": [hook("context")]}],
        "PostToolUse": [{"matcher": "*", "hooks": [hook("context")]}],
        "Stop": [{"hooks": [hook("stop"), waiter]}],
        # Before an edit: refused when another live identity holds the file.
        "PreToolUse": [{"matcher": "|".join(EDIT_TOOLS), "hooks": [hook("pretool")]}],
        "SessionEnd": [{"hooks": [hook("end")]}],
    }


def _personal_env(agent: str, mailbox: str) -> dict[str, str]:
    """What Claude Code's settings.local.json `env` gives the session (and so its MCP server, which inherits
    it): the values that differ per person, kept out of the .mcp.json a team commits."""
    return {"AGENT_MAIL_PYTHON": sys.executable, "AGENT_MAIL_AGENT": agent, "AGENT_MAIL_DB": mailbox}


def _listed(holder: dict, key: str, value: str, remove: bool) -> None:
    """`value` appended to the list `key` of `holder`, or taken out; the key dropped when the list is empty."""
    kept = [item for item in holder.get(key, []) if item != value]
    if not remove:
        kept.append(value)
    if kept:
        holder[key] = kept
    else:
        holder.pop(key, None)


def _settings(kit, document: dict, agent: str, mailbox: str, remove: bool) -> dict:
    document = kit.hooks_merged(document, NAME, agent, mailbox, remove)
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
    _listed(permissions, "allow", f"mcp__{kit.SERVER}", remove)
    if permissions:
        document["permissions"] = permissions
    else:
        document.pop("permissions", None)
    _listed(document, "enabledMcpjsonServers", kit.SERVER, remove)
    return document


def _servers(kit, document: dict, root: str, agent: str, mailbox: str, remove: bool) -> dict:
    """DIR/.mcp.json for Claude Code. Copilot CLI reads the same file and cannot start Claude's shared entry (it has
    no settings env for AGENT_MAIL_PYTHON): while Copilot CLI is set up here, its entry, which Claude Code starts as
    well, stays (on --remove too)."""
    servers = document.get("mcpServers")
    entry = servers.get(kit.SERVER) if isinstance(servers, dict) else None
    if isinstance(entry, dict) and "tools" in entry and kit.set_up_here(root, "copilot"):  # `setup copilot` lists tools
        return document
    return kit.servers(document, agent, mailbox, remove, type="stdio")


HARNESS = Harness(
    name=NAME,
    title="Claude Code",
    program="claude",
    tool="mcp__agent-mail__{}",
    edit_tools=EDIT_TOOLS,
    wake=HOOK,
    woken="woken now (a live Claude Code session, idle: its asyncRewake waiter starts a turn)",
    told="told at its next tool call or stop (a live Claude Code session, at work; woken when idle)",
    plans=plans,
    hook_entries=hook_entries,
    # Its hooks mark it set up, not .mcp.json: Copilot CLI's server shares that file.
    marker=(SETTINGS, hook_marks(NAME)),
    token_reader=".mcp.json",
    notes=(
        "Start `claude` in this directory: the agent-mail MCP tools (mcp__agent-mail__*) are allowed, mail reaches "
        "the model's context on session start, each prompt and after tool calls, a stop is held once for mail that "
        "arrived during the turn, and an idle session is woken when mail arrives, from its start on (an asyncRewake "
        "hook armed at the session's start and at the end of each turn).",
        "claude -p and SDK runs are not kept waiting: the waiter only arms in interactive sessions.",
    ),
)
