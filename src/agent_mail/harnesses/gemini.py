"""Gemini CLI (the `gemini` program): command hooks in the project's .gemini/settings.json; no wake of its own (its
hooks have no asyncRewake): `agent-mail run -- gemini` wakes it.

Setup writes DIR/.gemini/settings.json: the server, trusted; context on SessionStart, BeforeAgent and AfterTool
(hookSpecificOutput.additionalContext); the stop guard on AfterAgent ({"decision": "deny"}); the pre-tool guard on
BeforeTool; end on SessionEnd. Its hooks' stdout is parsed as JSON: a hook with nothing to say prints {}.
"""

from __future__ import annotations

import os

from agent_mail import errors
from agent_mail.harnesses.record import RUN, SERVER, Harness

NAME = "gemini"
SETTINGS = os.path.join(".gemini", "settings.json")
EDIT_TOOLS = ("write_file", "replace")


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    path = os.path.join(root, SETTINGS)
    return [kit.json_plan(path, lambda d: _ui(kit, kit.hooks_merged(kit.servers(d, agent, mailbox, remove, trust=True),
                                                                     NAME, agent, mailbox, remove), path, remove))]


def hook_entry(command: str, event: str, extra: dict) -> dict:
    """Named, for its /hooks panel; timeouts in milliseconds."""
    return {"type": "command", "name": f"agent-mail-{event}", "command": command, "timeout": 30_000, **extra}


def hook_entries(kit, hook, agent: str) -> dict[str, list[dict]]:
    return {
        "SessionStart": [{"hooks": [hook("context")]}],
        "BeforeAgent": [{"hooks": [hook("context")]}],
        "AfterTool": [{"matcher": ".*", "hooks": [hook("context")]}],
        "BeforeTool": [{"matcher": "|".join(EDIT_TOOLS), "hooks": [hook("pretool")]}],
        "AfterAgent": [{"hooks": [hook("stop")]}],
        "SessionEnd": [{"hooks": [hook("end")]}],
    }


def _ui(kit, document: dict, path: str, remove: bool) -> dict:
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
        before = kit.meaning(path, (kit.original(path) or {}).get("before"))
        theirs = isinstance(before, dict) and isinstance(before.get("ui"), dict) and "errorVerbosity" in before["ui"]
        if ui.get("errorVerbosity") == "full" and not theirs:
            ui.pop("errorVerbosity")
    document = dict(document)
    if ui:
        document["ui"] = ui
    else:
        document.pop("ui", None)
    return document


def denial(note: str) -> dict:
    """BeforeTool: decision deny, the reason sent to the agent as the tool's error."""
    return {"decision": "deny", "reason": note}


HARNESS = Harness(
    name=NAME,
    title="Gemini CLI",
    program="gemini",
    context_event="AfterTool",
    stop_decision="deny",
    quiet={},  # its hooks' stdout is parsed as JSON: an empty object, not nothing
    tool="mcp_agent-mail_{}",
    edit_tools=EDIT_TOOLS,
    denial=denial,
    wake=RUN,
    # At work (under `run` too: run types nothing while a turn is under way), or idle where nothing wakes it.
    told="told at its next prompt or tool call (a live Gemini CLI session, at work or idle with nothing to wake it: "
         "`agent-mail run -- gemini` wakes it at its empty prompt)",
    empty_prompt=("Type your message",),
    plans=plans,
    hook_entry=hook_entry,
    hook_entries=hook_entries,
    marker=(SETTINGS, (SERVER,)),
    notes=(
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
    ),
)
