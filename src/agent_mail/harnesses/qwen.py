"""Qwen Code (the `qwen` program): Claude Code's hook forms in the project's .qwen/settings.json, its idle session
woken by our waker through its dual-output input file (agent_mail.harness.waker).

Setup writes DIR/.qwen/settings.json: the server, trusted, its main tools listed in tools.visible so the model sees
them without Qwen's deferred-tool bridge; context on SessionStart, UserPromptSubmit, PostToolUse; the stop guard on
Stop; the pre-tool guard on PreToolUse; end on SessionEnd; the idle waker started on SessionStart and Stop; and
dualOutput.inputFile, the file it wakes the session through. Timeouts in seconds.
"""

from __future__ import annotations

import os

from agent_mail import errors
from agent_mail.harnesses.record import SERVER, WAKER, Harness

NAME = "qwen"
SETTINGS = os.path.join(".qwen", "settings.json")
EDIT_TOOLS = ("write_file", "edit")
WAKE_DIRECTORY = os.path.join(".qwen", "agent-mail")  # setup's inputFile lives here, one file per process
INPUT_FILE = "wake-${QWEN_CODE_LAUNCHER_PID}.jsonl"  # Qwen Code expands ${VAR} in its settings
# Qwen Code defers MCP tools behind a bridge the model must call first; these it is shown directly (tools.visible).
VISIBLE = tuple(f"mcp__{SERVER}__{name}" for name in ("read", "send", "ack", "watch", "status", "reserve", "release",
                                                       "reservations"))


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    return [kit.json_plan(os.path.join(root, SETTINGS), lambda d: _settings(kit, d, root, agent, mailbox, remove))]


def hook_entry(command: str, event: str, extra: dict) -> dict:
    """Named; timeouts in seconds."""
    return {"type": "command", "command": command, "name": f"agent-mail-{event}", "timeout": 30, **extra}


def hook_entries(kit, hook, agent: str) -> dict[str, list[dict]]:
    return {
        # wait: the session's waker (harness.waker), started detached at the start and after each turn
        "SessionStart": [{"hooks": [hook("context"), hook("wait")]}],
        "UserPromptSubmit": [{"hooks": [hook("context")]}],
        "PostToolUse": [{"matcher": "*", "hooks": [hook("context")]}],
        "PreToolUse": [{"matcher": "|".join(EDIT_TOOLS), "hooks": [hook("pretool")]}],
        "Stop": [{"hooks": [hook("stop"), hook("wait")]}],
        "SessionEnd": [{"hooks": [hook("end")]}],
    }


def input_file(root: str) -> str:
    """dualOutput.inputFile as setup writes it: one file per Qwen Code process (Qwen Code expands the variable),
    which the session's waker appends a prompt to (harness.waker)."""
    return os.path.join(root, WAKE_DIRECTORY, INPUT_FILE)


def _dual_output(document: dict, root: str, remove: bool) -> dict:
    """dualOutput.inputFile: ours set (or taken out); an input file of the person's own is kept (the waker then
    writes to it)."""
    dual = document.get("dualOutput", {})
    if not isinstance(dual, dict):
        raise errors.InvalidInput([("dualOutput", "in the settings is not an object; fix it, then run setup "
                                                  "again.")])
    dual = dict(dual)
    theirs = dual.get("inputFile")
    ours = isinstance(theirs, str) and theirs.endswith(os.path.basename(input_file(root))) and \
        os.sep + WAKE_DIRECTORY + os.sep in theirs
    if theirs is None or ours:
        dual.pop("inputFile", None)
        if not remove:
            dual["inputFile"] = input_file(root)
    document = dict(document)
    if dual:
        document["dualOutput"] = dual
    else:
        document.pop("dualOutput", None)
    return document


def _settings(kit, document: dict, root: str, agent: str, mailbox: str, remove: bool) -> dict:
    document = kit.hooks_merged(kit.servers(document, agent, mailbox, remove, trust=True), NAME, agent, mailbox,
                                remove)
    document = _dual_output(document, root, remove)
    tools = document.get("tools", {})
    if not isinstance(tools, dict):
        raise errors.InvalidInput([("tools", "in the settings is not an object; fix it, then run setup again.")])
    tools = dict(tools)
    visible = tools.get("visible", [])
    if not isinstance(visible, list):
        raise errors.InvalidInput([("tools.visible", "in the settings is not a list; fix it, then run setup again.")])
    visible = [name for name in visible if not (isinstance(name, str) and name.startswith(f"mcp__{SERVER}__"))]
    if not remove:
        visible += list(VISIBLE)
    if visible:
        tools["visible"] = visible
    else:
        tools.pop("visible", None)
    if tools:
        document["tools"] = tools
    else:
        document.pop("tools", None)
    return document


HARNESS = Harness(
    name=NAME,
    title="Qwen Code",
    program="qwen",
    tool="mcp__agent-mail__{}",
    edit_tools=EDIT_TOOLS,
    wake=WAKER,
    woken="woken within about a second (a live Qwen Code session, idle: its waker hands the envelopes to Qwen "
          "Code's input file, which it reads every 0.5 s)",
    told="told at its next prompt or tool call (a live Qwen Code session, at work; woken when idle)",
    plans=plans,
    hook_entry=hook_entry,
    hook_entries=hook_entries,
    marker=(SETTINGS, (SERVER,)),
    notes=(
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
    ),
)
