"""Codex (the `codex` program): command hooks in the project's .codex/hooks.json, its idle session woken by our
waker through `codex queue` (agent_mail.harness.waker).

Setup writes DIR/.codex/config.toml (the server, its tools approved, between two marker lines, and at the top
thread_unload_delay_secs = 2, so that Codex's shared app-server ends a session 2 s after its terminal left) and
DIR/.codex/hooks.json (context on SessionStart, UserPromptSubmit, PostToolUse; the stop guard on Stop; the pre-tool
guard on PreToolUse; end on SessionEnd; the idle waker started on SessionStart and Stop). Its hooks take Claude
Code's forms.
"""

from __future__ import annotations

import json
import os

from agent_mail import errors
from agent_mail.harnesses.record import SERVER, WAKER, Harness

NAME = "codex"
CONFIG = os.path.join(".codex", "config.toml")
BEGIN = "# agent-mail setup: begin (written by `agent-mail setup codex`; `--remove` takes it out)"
END = "# agent-mail setup: end"
# A root key has to come before the first table of a TOML file: ours is a block of its own at the top.
TOP_BEGIN = "# agent-mail setup: begin, top of the file (written by `agent-mail setup codex`; `--remove` takes it out)"
TOP_END = "# agent-mail setup: end, top of the file"
# Codex unloads a thread this long after the last terminal showing it left, and fires SessionEnd then (60 s by
# default): the session stops counting as live within about this long after /exit. An idle thread a terminal
# still shows is not unloaded (seen with 0.171.0: 15 s idle, still loaded, with the delay at 2 s).
UNLOAD_DELAY_SECONDS = 2
# Codex 0.171 reports an edit made with `apply_patch <<EOF` in its shell as tool_name "Bash" (tool_input.command:
# the patch; seen under `codex exec`), and a model given the apply_patch tool calls it "apply_patch". Either way the
# files are named in the patch's headers (other commands pass at once); its pre-tool-use.command.output schema takes
# the same permissionDecision as Claude Code's.
EDIT_TOOLS = ("apply_patch", "Bash")


def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
    return [_config(kit, os.path.join(root, CONFIG), agent, mailbox, remove),
            kit.json_plan(os.path.join(root, ".codex", "hooks.json"),
                          lambda d: kit.hooks_merged(d, NAME, agent, mailbox, remove))]


def hook_entries(kit, hook, agent: str) -> dict[str, list[dict]]:
    return {
        # wait: the session's waker (harness.waker), started detached at the start and after each turn
        "SessionStart": [{"hooks": [hook("context"), hook("wait")]}],
        "UserPromptSubmit": [{"hooks": [hook("context")]}],
        "PostToolUse": [{"matcher": ".*", "hooks": [hook("context")]}],
        "Stop": [{"hooks": [hook("stop"), hook("wait")]}],
        "PreToolUse": [{"matcher": "|".join(EDIT_TOOLS), "hooks": [hook("pretool")]}],
        # Codex 0.171 fires SessionEnd too (its session-end.command.input schema; seen under `codex exec`).
        "SessionEnd": [{"hooks": [hook("end")]}],
    }


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a JSON string is a TOML basic string


def _config(kit, path: str, agent: str, mailbox: str, remove: bool) -> dict:
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
    for begin, end_mark in ((BEGIN, END), (TOP_BEGIN, TOP_END)):
        if begin in text and end_mark in text:
            start = next(i for i, line in enumerate(lines) if line.rstrip("\n") == begin)
            end = next(i for i, line in enumerate(lines) if line.rstrip("\n") == end_mark and i > start)
            lines = lines[:start] + lines[end + 1:]
            while lines and lines[-1].strip() == "" and start >= len(lines):
                lines.pop()
            if begin == TOP_BEGIN and start == 0 and lines and not lines[0].strip():
                lines.pop(0)  # the blank line setup put after its top block
    kept = "".join(lines)
    if not remove:
        if SERVER in tomllib.loads(kept).get("mcp_servers", {}):
            raise errors.InvalidInput([(path, f"already defines mcp_servers.{SERVER} (not written by setup); remove "
                                              "it, then run setup again. Nothing was written.")])
        if kit.is_server(mailbox):  # streamable HTTP; Codex reads the bearer token from the variable named
            block = [BEGIN, f"[mcp_servers.{SERVER}]", f"url = {_toml_string(kit.mcp_url(mailbox))}",
                     f"bearer_token_env_var = {_toml_string(kit.TOKEN_VAR)}",
                     'default_tools_approval_mode = "approve"']
        else:
            entry = kit.server_entry(agent, mailbox)
            block = [BEGIN, f"[mcp_servers.{SERVER}]", f"command = {_toml_string(entry['command'])}",
                     "args = [" + ", ".join(_toml_string(a) for a in entry["args"]) + "]",
                     'default_tools_approval_mode = "approve"',  # no approval prompt per call (as Claude's allow)
                     f"env = {{ AGENT_MAIL_DB = {_toml_string(mailbox)} }}"]
        block.append(END)
        kept = kept + ("\n" if kept and not kept.endswith("\n") else "") + ("\n" if kept.strip() else "")
        kept += "\n".join(block) + "\n"
        if "thread_unload_delay_secs" not in tomllib.loads(kept):
            # Interactive `codex` runs its sessions' hooks and MCP servers in a shared app-server daemon, which
            # takes `codex queue` (the idle waker's, harness.waker) at once; without it a session's own process
            # looks at its queue about every 10 s. The daemon outlives /exit: it fires SessionEnd when it unloads
            # the thread, this long after the terminal left (60 s by default), so the session ends that soon.
            top = [TOP_BEGIN, f"thread_unload_delay_secs = {UNLOAD_DELAY_SECONDS}", TOP_END]
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
    return kit.planned(path, action, before, after)


HARNESS = Harness(
    name=NAME,
    title="Codex",
    program="codex",
    edit_tools=EDIT_TOOLS,
    patch_tools=EDIT_TOOLS,
    wake=WAKER,
    woken="woken within a second (a live Codex session, idle: its waker queues the envelopes, `codex queue`)",
    told="told at its next prompt or tool call (a live Codex session, at work; woken when idle)",
    plans=plans,
    hook_entries=hook_entries,
    marker=(CONFIG, (BEGIN,)),
    notes=(
        "Start `codex` in this directory: the agent-mail MCP server and hooks load from .codex/ (Codex reads a "
        "project's .codex/ once the project is trusted, and asks you to review new hooks before they run).",
        "Mail reaches the model's context on session start, each prompt and after tool calls; a stop is held once "
        "for mail that arrived during the turn.",
        "An idle session is woken when mail arrives: its waker (started by the SessionStart and Stop hooks, ended "
        "with the session) queues the envelopes as a prompt with `codex queue`, which Codex's shared app-server "
        "starts at once. That app-server outlives /exit and ends the session 2 s after its terminal left "
        "(thread_unload_delay_secs, set at the top of .codex/config.toml). With its automatic start turned off "
        "(features.daemon_auto_start = false) a session still wakes, within about 10 s.",
    ),
)
