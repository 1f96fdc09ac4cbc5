"""Mistral Vibe (the PyPI package mistral-vibe): its hooks file, and its hooks' input and output.

Vibe reads hooks from a project's `.vibe/hooks.toml` only in a folder the person trusted (it asks), and from the
user's `$VIBE_HOME/hooks.toml` (by default `~/.vibe/hooks.toml`) everywhere. `setup vibe` writes the user's file,
so nothing waits on a trust question, and scopes its entries to the project directory: each command first checks
that the session's directory (the hook runs in it) is DIR or below, and is a no-op elsewhere, without starting
Python. One block per set-up directory, between two marker lines naming it; the rest of the file (the person's own
hooks, comments, blank lines) keeps its bytes. Directories set up must not nest: two blocks would both answer.

Vibe has three hook types: `post_tool` (after each tool that ran: context, appended to the tool's result as
`hook_specific_output.additional_context`), `pre_tool` (before a tool call: the guard, `decision: deny` with the
reason the model is shown as the tool's error) and `post_agent` (a turn's end: the held stop, `decision: deny`,
whose reason Vibe sends back as the next user message). It has no session start, no per-prompt hook and no way to
start a turn from outside: an idle session is woken under `agent-mail run -- vibe`, which types its one-line notice
at the empty prompt; that turn's tool calls or its end tell the envelopes. The MCP server is not written: Vibe reads
MCP servers from the user's config.toml for every directory (or a trusted project's .vibe/config.toml), which cannot
bind one identity to one project; the notes name the agent-mail command line instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex

from agent_mail import errors
from agent_mail.harnesses.record import RUN, Harness

NAME = "vibe"
HOOKS_FILE = "hooks.toml"
HOME_VAR = "VIBE_HOME"
_BEGIN = "# agent-mail setup vibe: begin "
_END = "# agent-mail setup vibe: end "
_BY = " (written by `agent-mail setup vibe`; `--remove` takes it out)"
TIMEOUT_SECONDS = 30
# (Vibe's hook type, our hook event, its match): pre_tool before the two tools that edit a file (their model names
# write_file and edit; search_replace is edit's name in Vibe's catalogue).
HOOKS = (("post_tool", "context", None), ("pre_tool", "pretool", "re:write_file|edit|search_replace"),
         ("post_agent", "stop", None))
# How Vibe 3.0.2 names those tools in a hook's input (tool_name), the file in tool_input.file_path.
EDIT_TOOLS = ("file_system.write_file", "file_system.search_replace", "write_file", "edit", "search_replace")


def home() -> str:
    """Vibe's user directory: VIBE_HOME (absolute), else ~/.vibe."""
    given = os.environ.get(HOME_VAR, "").strip()
    return given if os.path.isabs(given) else os.path.join(os.path.expanduser("~"), ".vibe")


def hooks_path() -> str:
    return os.path.join(home(), HOOKS_FILE)


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


def roots(text: str) -> list[str]:
    """The directories a hooks file holds agent-mail blocks for."""
    found = []
    for line in text.splitlines():
        if line.startswith(_BEGIN) and line.endswith(_BY):
            found.append(line[len(_BEGIN):-len(_BY)])
    return found


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc}. Nothing was written.") from None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def set_up_at(directory: str, exactly: bool = True) -> bool:
    """Whether `setup vibe` connected `directory` (`exactly`), or it or a directory above it."""
    try:
        text = _read(hooks_path())
    except errors.AgentMailError:
        return False
    here = os.path.realpath(directory)
    return any(here == root if exactly else _within(here, root) for root in roots(text or ""))


def block(root: str, agent: str, mailbox: str, hook_base: list[str]) -> str:
    """Our [[hooks]] entries for `root`, between the marker lines; each command a no-op outside `root`."""
    tag = hashlib.sha256(root.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    base = f"AGENT_MAIL_DB={shlex.quote(mailbox)} exec " + " ".join(shlex.quote(w) for w in hook_base)
    lines = [_BEGIN + root + _BY]
    for kind, event, match in HOOKS:
        run = base + " " + " ".join(shlex.quote(w) for w in ["hook", "vibe", event, "--agent", agent])
        # The hook runs in the session's directory: ours only in DIR and below (pwd -P: links resolved, as DIR is).
        command = f'case "$(pwd -P)/" in {shlex.quote(root.rstrip(os.sep) + os.sep)}*) {run};; esac'
        lines += ["[[hooks]]", f"name = {_toml_string(f'agent-mail-{event}-{tag}')}", f"type = {_toml_string(kind)}"]
        if match:
            lines.append(f"match = {_toml_string(match)}")
        lines += [f"command = {_toml_string(command)}", f"timeout = {TIMEOUT_SECONDS}.0",
                  f"description = {_toml_string(f'agent-mail for {agent} in this directory and below')}"]
    lines.append(_END + root)
    return "\n".join(lines) + "\n"


def _without(text: str, root: str) -> str:
    """`text` without the block for `root` (and the blank line setup put before it)."""
    lines = text.splitlines(keepends=True)
    begin = _BEGIN + root + _BY
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip("\r\n") == begin)
        end = next(i for i, line in enumerate(lines) if i > start and line.rstrip("\r\n") == _END + root)
    except StopIteration:
        return text
    if start > 0 and not lines[start - 1].strip() and "".join(lines[:start - 1]).strip():
        start -= 1
    return "".join(lines[:start] + lines[end + 1:])


def hooks_plan(root: str, agent: str, mailbox: str, remove: bool, hook_base: list[str], planned) -> dict:
    """The plan for the user's hooks.toml: our block for `root` replaced, or taken out; every other byte kept.
    Checked with tomllib before and after. `planned(path, action, before, after)` makes the plan."""
    import tomllib

    path = hooks_path()
    before = _read(path)
    text = before or ""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.InvalidInput([(path, f"is not valid TOML ({exc}); fix it, then run setup again. Nothing was "
                                          "written.")]) from None
    if any(ch < " " for ch in root):
        raise errors.InvalidInput([("dir", f"{root!r} has a control character in its name; Vibe's hooks are "
                                           "scoped by the directory's name. Nothing was written.")])
    kept = _without(text, root)
    if not remove:
        nested = [other for other in roots(kept) if _within(root, other) or _within(other, root)]
        if nested:
            raise errors.InvalidInput([("dir", f"{root} and {nested[0]} nest, and Vibe's hooks ({path}) are the "
                                               f"user's, scoped by directory: a session in the inner one would be "
                                               f"answered for both. Set up directories side by side (or take the "
                                               f"other out with agent-mail setup vibe --dir {nested[0]} --agent P:N "
                                               "--remove). Nothing was written.")])
        kept += ("\n" if kept and not kept.endswith("\n") else "") + ("\n" if kept.strip() else "")
        kept += block(root, agent, mailbox, hook_base)
        try:
            names = [h.get("name") for h in tomllib.loads(kept).get("hooks", []) if isinstance(h, dict)]
        except tomllib.TOMLDecodeError as exc:
            raise errors.InvalidInput([(path, f"cannot take agent-mail's [[hooks]] entries ({exc}); add them by "
                                              "hand. Nothing was written.")]) from None
        if len(names) != len(set(names)):
            raise errors.InvalidInput([(path, "names a hook the way agent-mail's are named (agent-mail-EVENT-...); "
                                              "rename yours, then run setup again. Nothing was written.")])
    after = kept if kept.strip() else None  # a file left with nothing (setup made it, or it held only ours) goes
    if after == before or (after is None and before is None):
        action, after = "unchanged", before
    elif after is None:
        action = "remove"
    else:
        action = "create" if before is None else "update"
    return planned(path, action, before, after)


def context_output(event: str, note: str) -> dict:
    """post_tool: the note appended to the tool's result."""
    return {"hook_specific_output": {"additional_context": note}}


def denial(note: str) -> dict:
    """pre_tool: decision deny, the reason the model is shown as the tool's error."""
    return {"decision": "deny", "reason": note}


def stop_output(decision: str, reason: str, line: str) -> dict:
    """post_agent: the reason sent back as the next user message; system_message the line the person is shown."""
    return {"decision": decision, "reason": reason, "system_message": line}


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    return [hooks_plan(root, agent, mailbox, remove, kit.hook_base(), kit.planned)]


HARNESS = Harness(
    name=NAME,
    title="Mistral Vibe",
    program="vibe",
    context_event="post_tool",
    context_output=context_output,
    stop_decision="deny",
    stop_output=stop_output,
    starts=False,  # no session start, no prompt hook: a first stop with unread mail is held with the inbox
    subagent_key="parent_session_id",  # a subagent's hooks: its parent session is told (its edits are guarded)
    edit_tools=EDIT_TOOLS,
    denial=denial,
    wake=RUN,
    # At work (under `run` too: run types nothing while a turn is under way), or idle where nothing wakes it.
    told="told at its next tool call or turn's end (a live Mistral Vibe session, at work or idle with nothing to "
         "wake it: `agent-mail run -- vibe` wakes it at its empty prompt)",
    # Its whole interface is on the alternate screen: its empty prompt is a line of ">" alone (typed text follows
    # it; an approval dialog takes its place).
    empty_prompt=("\n>\n",),
    told_at_prompt=False,
    plans=plans,
    set_up_at=set_up_at,
    mcp=False,
    notes=(
        "Vibe's hooks are in your user-wide hooks file (its hooks.toml above: ~/.vibe/, or $VIBE_HOME's; a project's "
        ".vibe/ is read only in a folder you trusted, so setup does not use it); each agent-mail entry acts only in "
        "this directory and below, elsewhere it exits at once. Your own hooks in that file stay as they were.",
        "Start `vibe` in this directory: after each tool call the model is told of mail that is new to the session "
        "(appended to the tool's result), and a turn that ends with mail it was not told of is sent back once with "
        "the envelopes (post_agent). Vibe has no hook at a prompt or at a session's start: mail waiting when a "
        "session starts is told at its first tool call or the end of its first turn.",
        "Vibe cannot wake an idle session by itself: start it as `agent-mail run -- vibe` and an idle session is "
        "woken when mail arrives (run types a one-line notice at the empty prompt, never while you type; that turn's "
        "hooks then tell the model). Started plainly, an idle Vibe hears of mail after its next tool call or at its "
        "next turn's end.",
        "No MCP entry is written: Vibe reads MCP servers from your user-wide config.toml (or a trusted project's), "
        "which cannot hold one identity per project. The model uses the agent-mail command line the notes name "
        "(agent-mail read, ack, send), through Vibe's bash tool.",
    ),
)
