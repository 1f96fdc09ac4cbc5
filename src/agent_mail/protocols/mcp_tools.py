"""The mailbox as MCP tools, declared once for both MCP front ends: `agent-mail mcp` (stdio, harness/mcp_stdio.py) and
the streamable HTTP endpoint of `agent-mail serve` (/mcp, server/mcp_http.py). Made from the spec like the OpenAPI
document (through agent_mail.protocols.schemas): one tool per command a model should call, the same names, arguments
named without dashes, JSON Schema types, ranges and descriptions from the spec; a result's `next` steps
rendered as the tool calls to make; a refusal as a tool error carrying the same `problems`, each argument named
as the tool names it.

Neither front end's rules live here (which identity a call acts as, which files it may touch): only the shape of
the tools and the running of one prepared call off the event loop. Needs the `mcp` extra.
"""

from __future__ import annotations

import threading

import anyio
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from agent_mail.parts import checks
from agent_mail import errors, jsonout, spec
from agent_mail.protocols import schemas

# The commands a model may call, in the order listed. Left out: describe (the tool list is the manual),
# profile and cleanup (a human's settings and deliberate deletion), doctor (repair), version, export and
# import (whole mailboxes, files: a human's job), copy, dashboard, setup.
TOOLS = ("send", "read", "ack", "watch", "status", "heartbeat", "dismiss", "archive", "delete", "cancel",
         "notifications", "attachments", "search", "reserve", "release", "reservations")
WAIT_DEFAULT_SECONDS = 120
WAIT_MAX_SECONDS = 600
# watch's wait as a tool call gives it (the command line's --timeout-minutes and --once are not tool
# arguments: a tool call must end), checked by the same rules as every declared argument.
WAIT_ARG = spec.Arg("wait_seconds", spec.INT, "Seconds to wait for mail before returning an empty result; 0 checks "
                    "once. The wait costs nothing and returns the moment mail arrives.", default=WAIT_DEFAULT_SECONDS,
                    minimum=0, maximum=WAIT_MAX_SECONDS)
READ_ONLY = {"status", "watch", "search", "reservations"}
DESTRUCTIVE = {"delete", "cancel", "archive", "dismiss"}
INSTRUCTIONS = (
    "agent-mail is the mailbox you share with other agents and the humans who supervise them. Take delivery "
    "with read, say you acted with ack, wait for mail with watch (it consumes nothing). Every result lists "
    "its `next` steps as tool calls: make them. Identities are project:name. " + spec.MAIL_IS_DATA
)

# Flags a tool call cannot use: watch waits in seconds (wait_seconds) and only blocked; a tool call must end,
# so notifications cannot follow forever.
NOT_TOOL_ARGS = {"watch": ("--timeout-minutes", "--once"), "notifications": ("--follow",)}

identity_arg = schemas.identity_arg


def _wait_property() -> dict:
    schema = schemas.property_schema(WAIT_ARG, spec.COMMANDS["watch"])
    schema["default"] = WAIT_DEFAULT_SECONDS
    return schema


def tool_definitions(agent: str | None, *, names: tuple[str, ...] = TOOLS,
                     leave_out: dict[str, tuple[str, ...]] | None = None,
                     default_note: str | None = None) -> list[Tool]:
    """The tools `names`, each without the flags `leave_out` names for it (beside NOT_TOOL_ARGS). The identity
    argument is optional where the caller fills it in: with `agent` (the session's identity, "Default: P:N"),
    or where `default_note` says how it is chosen."""
    tools = []
    for name in names:
        command = spec.COMMANDS[name]
        identity = identity_arg(command)
        bound = (checks.key(identity),) if identity is not None and (agent or default_note) else ()
        extra = {"wait_seconds": _wait_property()} if name == "watch" else None
        dropped = NOT_TOOL_ARGS.get(name, ()) + (leave_out or {}).get(name, ())
        schema = schemas.arguments_schema(command, leave_out=dropped, optional=bound, extra=extra)
        for key in bound:
            schema["properties"][key]["description"] += f" Default: {agent}." if agent else f" {default_note}"
        tools.append(Tool(
            name=name, description=command.summary, input_schema=schema, output_schema=schemas.result_schema(command),
            # Only the hints that hold (absent means "no"): the whole list stays small.
            annotations=ToolAnnotations(read_only_hint=(name in READ_ONLY) or None,
                                        destructive_hint=(name in DESTRUCTIVE) or None),
        ))
    return tools


def render_steps(document: object, agent: str | None) -> object:
    """The result with each `next` step as the tool call to make ({"tool", "arguments"}), the identity left
    out where it is the session's default."""
    if isinstance(document, spec.Step):
        arguments = {}
        command = spec.COMMANDS[document.command]
        identity = identity_arg(command)
        for arg in command.args:
            value = document.arguments.get(arg.dest)
            if value is None or value is False or value == []:
                continue
            if arg is identity and value == agent:
                continue
            arguments[checks.key(arg)] = value
        return {"tool": document.command, "arguments": arguments}
    if isinstance(document, dict):
        return {key: render_steps(value, agent) for key, value in document.items()}
    if isinstance(document, (list, tuple, jsonout.Rendered)):
        return [render_steps(value, agent) for value in document]
    return document


def take_wait(arguments: dict, problems: list) -> int | None:
    """watch's wait_seconds taken out of a tool call's arguments and checked (a problem added when it is bad)."""
    wait = arguments.pop("wait_seconds", None)
    if wait is not None:
        wait, problem = checks.convert(spec.COMMANDS["watch"], WAIT_ARG, wait)
        if problem:
            problems.append(("wait_seconds", problem))
    return wait


def set_wait(values: dict, wait: int | None, wanted) -> None:
    """A checked watch's values made a tool call's: once for 0, else blocked for `wait` seconds (default 120),
    asking wanted() at each refresh whether anyone still waits for the answer."""
    wait = WAIT_DEFAULT_SECONDS if wait is None else wait
    values.pop("timeout_minutes", None)
    if wait == 0:
        values["once"] = True
    else:
        values["timeout_seconds"] = float(wait)
        values["wanted"] = wanted


def not_tool_args(name: str) -> tuple[str, ...]:
    """The keys of the flags a tool call of `name` cannot pass (the call layer skips them)."""
    command = spec.COMMANDS[name]
    return tuple(checks.key(command.arg(flag)) for flag in NOT_TOOL_ARGS.get(name, ()))


class OnTheLoop:
    """What a tool call's work gives back when the rest of it is awaited on the event loop: `await awaited()` is the
    result (a watch a server carries on its waits' hub, holding no thread while it waits)."""

    def __init__(self, awaited):
        self.awaited = awaited


async def answer(name: str, prepare, agent: str | None, after=None, limiter=None) -> CallToolResult:
    """One tool call: prepare(cancelled) checks it and returns the work to do (raising errors.AgentMailError to
    refuse), which runs in a worker thread (within `limiter`, anyio's default without one); after(result), if
    given, runs there too once it is done. The result
    rendered for the model (steps as tool calls, the identity `agent` left out), or the tool error."""
    try:
        if name not in TOOLS:
            raise errors.InvalidInput([(None, f"unknown tool {name!r}; tools: {', '.join(TOOLS)}.")])
        cancelled = threading.Event()
        work = prepare(cancelled)
        try:
            result = await anyio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
            if isinstance(result, OnTheLoop):  # cancelled while awaited: it ends at once, its session released
                result = await result.awaited()
        except anyio.get_cancelled_exc_class():
            cancelled.set()  # a blocked watch gives up at its next refresh and releases its session
            raise
    except errors.AgentMailError as exc:
        return error(exc.renamed(namer(name)).payload())
    except Exception as exc:  # a bug: still a tool error a model can read, never a traceback
        return error({"error": f"internal error ({type(exc).__name__}: {exc}). Nothing was changed. "
                               "Please report this."})
    if after is not None:
        await anyio.to_thread.run_sync(after, result)
    document = render_steps(result, agent)
    return CallToolResult(content=[TextContent(type="text", text=jsonout.dumps(document))],
                          structured_content=document)


def namer(name: str):
    """How a tool call names an argument: without dashes (`reply_to`); a command-line flag in a problem
    found below the call layer is written the same way."""
    command = spec.COMMANDS.get(name)
    flags = {a.name: checks.key(a) for a in command.args} if command else {}
    return lambda key: flags.get(key, key)


def error(payload: dict) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=jsonout.dumps(payload))], is_error=True)
