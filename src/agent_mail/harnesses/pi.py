"""Pi, and `agent-mail setup pi`: what the Pi coding agent (the npm package @mariozechner/pi-coding-agent, or its
newer name @earendil-works/pi-coding-agent; the command `pi`) is given.

Pi has no command hooks and no MCP client: it loads a project's TypeScript extensions (DIR/.pi/extensions/*.ts) into
its own process at start, with no prompt. Setup writes one, DIR/.pi/extensions/agent-mail.ts (the extension shipped
with this package, pi_extension.ts, with this person's settings filled in), which runs `agent-mail hook pi EVENT
--agent P:N` (the JSON input on stdin, as every harness's hooks) at the points Pi offers:

- session_start: `hook pi context` as SessionStart (the session counts as live from its start); the start note (the
  inbox) is given to the model at the session's first prompt;
- before_agent_start (each prompt): the context note, a message of the prompt (in the history from then on, as a
  hook's additionalContext is);
- tool_result: the context note appended to the tool's result;
- tool_call on write and edit: `hook pi pretool`; a deny blocks the call ({block: true, reason}), the reason shown to
  the model as the tool's error, and the file is not written;
- agent_end (the session goes idle): `hook pi stop`; a held stop is sent back as the next prompt
  (pi.sendUserMessage), once; otherwise, and from the session's start, the waiter `hook pi wait` runs (the one
  OpenCode's plugin runs), which exits 2 with the note when mail the session was not told of arrives: the extension
  starts a turn with it (pi.sendUserMessage). A prompt ends the waiter (the hooks tell what comes during a turn); the
  waiter ends when Pi does (it watches its parent). Not under `pi -p` or `--mode json`, which exit when the prompt is
  done (no UI: nobody is there to be woken or held).
- session_shutdown (quit, /new, /resume, /fork): `hook pi end` (the session stops counting as live).

The model reaches the mailbox through its shell tool (`agent-mail read`, `ack`, `send`): the notes name those
commands. Everything in the extension is this person's (interpreter, identity, mailbox).
"""

from __future__ import annotations

import json
import os

from agent_mail import errors
from agent_mail.harnesses.record import HOOK, Harness

NAME = "pi"
EXTENSION = os.path.join(".pi", "extensions", "agent-mail.ts")
MARK = "written by `agent-mail setup pi"  # in the extension's first line: how ours is told from another's
EDIT_TOOLS = ("write", "edit")  # Pi's tools that change a file, its path in input.path
_SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pi_extension.ts")
_AGENT, _SETTINGS = "__AGENT__", "__SETTINGS__"  # what setup fills in in the shipped extension

NOTES = (
    "Start `pi` in this directory: Pi loads the agent-mail extension from .pi/extensions/agent-mail.ts at start "
    "(no prompt; /reload reloads it). Pi has no MCP client: the model reads, acks and sends with the agent-mail "
    "command in its bash tool, as the notes it is given say.",
    "The session counts as live from its start. Mail reaches the model's context at each prompt (the first one of a "
    "session gets the inbox) and after tool calls; a session that goes idle with mail that arrived during its turn is "
    "sent it as one more prompt, once; an idle session is woken when mail arrives (the extension's waiter starts a "
    "turn with the envelopes). Under `pi -p` nothing waits: it exits when its prompt is done.",
    "A write or edit of a file another live identity holds is blocked, the model told who holds it and how to ask.",
    ".pi/extensions/agent-mail.ts holds this interpreter, identity and mailbox: keep it out of version control, or "
    "commit it only for a shared mailbox.",
)


def extension_text(agent: str, command: list[str], mailbox: str, wake: str) -> str:
    """The extension for `agent` (`command`: the hook command's words up to `hook`; the mailbox its hooks use)."""
    with open(_SHIPPED, encoding="utf-8") as handle:
        shipped = handle.read()
    settings = {"agent": agent, "command": command + ["hook", "pi"], "env": {"AGENT_MAIL_DB": mailbox}, "wake": wake,
                "edits": list(EDIT_TOOLS)}
    text = json.dumps(settings, ensure_ascii=False, indent=2)
    return shipped.replace(_AGENT, agent, 1).replace(_SETTINGS, text, 1)


def is_ours(text: str | None) -> bool:
    return text is not None and MARK in text.split("\n", 1)[0]


def extension_plan(root: str, text: str | None, planned) -> dict:
    """The plan for DIR/.pi/extensions/agent-mail.ts (`text`: what it should hold, None to take it out); refused
    when a file of that name is not ours. `planned(path, action, before, after)` makes the plan."""
    path = os.path.join(root, EXTENSION)
    try:
        with open(path, encoding="utf-8") as handle:
            before: str | None = handle.read()
    except FileNotFoundError:
        before = None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc}. Nothing was written.") from None
    if before is not None and not is_ours(before):
        raise errors.InvalidInput([(path, "exists and was not written by agent-mail setup; move it aside (or rename "
                                          "it), then run setup again. Nothing was written.")])
    if text == before:
        return planned(path, "unchanged", before, before)
    if text is None:
        return planned(path, "remove", before, None)
    return planned(path, "create" if before is None else "update", before, text)


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    """DIR/.pi/extensions/agent-mail.ts (the hooks): the only file, since Pi has no MCP client."""
    text = None if remove else extension_text(agent, kit.hook_base(), mailbox, kit.REWAKE_MESSAGE)
    return [extension_plan(root, text, kit.planned)]


HARNESS = Harness(
    name=NAME,
    title="Pi",
    program="pi",
    mcp=False,
    tool="agent-mail {}",  # the command (no MCP client: the notes name the commands themselves)
    edit_tools=EDIT_TOOLS,
    wake=HOOK,
    woken="woken now (a live Pi session, idle: its agent-mail extension's waiter starts a turn)",
    told="told at its next prompt or tool call (a live Pi session, at work; woken when idle)",
    plans=plans,
    marker=(EXTENSION, (MARK,)),
    token_reader="the extension's hooks",
    notes=NOTES,
)
