"""`agent-mail mcp`: the mailbox as MCP tools over stdio, on the official MCP SDK (`MCPServer`).

Imported only by that command (the `mcp` extra). The tools are made from the spec: one per command a
model should call, the same names, arguments named without dashes, JSON Schema types, ranges and
descriptions from the spec. A call's JSON arguments go straight into the call layer (agent_mail.calls),
which checks them by the same rules as every front end's and carries out the same Mailbox operation;
the result is the JSON document the CLI prints, with its `next` steps rendered as tool calls. A refused
call is a tool error carrying the same `problems`, each argument named as the tool names it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, TextContent, Tool, ToolAnnotations

from agent_mail import __version__, calls, checks, errors, jsonout, schemas, spec

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
_READ_ONLY = {"status", "watch", "search", "reservations"}
_DESTRUCTIVE = {"delete", "cancel", "archive", "dismiss"}
_INSTRUCTIONS = (
    "agent-mail is the mailbox you share with other agents and the humans who supervise them. Take delivery "
    "with read, say you acted with ack, wait for mail with watch (it consumes nothing). Every result lists "
    "its `next` steps as tool calls: make them. Identities are project:name."
)

# Flags a tool call cannot use: watch waits in seconds (wait_seconds) and only blocked; a tool call must end,
# so notifications cannot follow forever.
_NOT_TOOL_ARGS = {"watch": ("--timeout-minutes", "--once"), "notifications": ("--follow",)}


_identity_arg = schemas.identity_arg


def _wait_property() -> dict:
    schema = schemas.property_schema(WAIT_ARG, spec.COMMANDS["watch"])
    schema["default"] = WAIT_DEFAULT_SECONDS
    return schema


def tool_definitions(agent: str | None) -> list[Tool]:
    tools = []
    for name in TOOLS:
        command = spec.COMMANDS[name]
        identity = _identity_arg(command)
        bound = (checks.key(identity),) if identity is not None and agent is not None else ()
        extra = {"wait_seconds": _wait_property()} if name == "watch" else None
        schema = schemas.arguments_schema(command, leave_out=_NOT_TOOL_ARGS.get(name, ()), optional=bound,
                                          extra=extra)
        for key in bound:
            schema["properties"][key]["description"] += f" Default: {agent}."
        tools.append(Tool(
            name=name, description=command.summary, input_schema=schema, output_schema=schemas.result_schema(command),
            # Only the hints that hold (absent means "no"): the whole list stays small.
            annotations=ToolAnnotations(read_only_hint=(name in _READ_ONLY) or None,
                                        destructive_hint=(name in _DESTRUCTIVE) or None),
        ))
    return tools


def render_steps(document: object, agent: str | None) -> object:
    """The result with each `next` step as the tool call to make ({"tool", "arguments"}), the identity left
    out where it is the session's default."""
    if isinstance(document, spec.Step):
        arguments = {}
        command = spec.COMMANDS[document.command]
        identity = _identity_arg(command)
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


class AgentMailServer(MCPServer):
    """MCPServer whose tools are declared by the spec rather than by Python signatures."""

    def __init__(self, agent: str | None, save_root: str, *, supervisor: bool = False, roots: tuple[str, ...] = ()):
        super().__init__(name="agent-mail", version=__version__, instructions=_INSTRUCTIONS)
        self.agent = agent
        self.supervisor = supervisor
        self.save_root = save_root
        # The trees whose files a call may attach, reference or read a body from: the working directory and
        # those listed (--root), links resolved, so a link inside cannot lead a path outside.
        self.roots = tuple(dict.fromkeys(os.path.realpath(os.path.expanduser(r)) for r in (os.getcwd(), *roots)))
        self._tools = tool_definitions(agent)

    async def list_tools(self) -> list[Tool]:
        return self._tools

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> CallToolResult:
        try:
            if name not in TOOLS:
                raise errors.InvalidInput([(None, f"unknown tool {name!r}; tools: {', '.join(TOOLS)}.")])
            cancelled = threading.Event()
            call = self._prepare(name, dict(arguments or {}), cancelled)
            try:
                result = await anyio.to_thread.run_sync(call, abandon_on_cancel=True)
            except anyio.get_cancelled_exc_class():
                cancelled.set()  # a blocked watch gives up at its next refresh and releases its session
                raise
        except errors.AgentMailError as exc:
            return _error(exc.renamed(_namer(name)).payload())
        except Exception as exc:  # a bug: still a tool error a model can read, never a traceback
            return _error({"error": f"internal error ({type(exc).__name__}: {exc}). Nothing was changed. "
                                    "Please report this."})
        if name in ("watch", "read") and isinstance(result, dict) and result.get("messages"):
            await anyio.to_thread.run_sync(_told, result)
        document = render_steps(result, self.agent)
        return CallToolResult(content=[TextContent(type="text", text=jsonout.dumps(document))],
                              structured_content=document)

    def _prepare(self, name: str, arguments: dict, cancelled: threading.Event):
        command = spec.COMMANDS[name]
        problems: list[tuple[str | None, str]] = self._bound(command, arguments)
        if name == "send":
            from agent_mail import inputs

            problems += inputs.confine_paths(arguments, self.roots)
        wait = arguments.pop("wait_seconds", None) if name == "watch" else None
        if wait is not None:
            wait, problem = checks.convert(command, WAIT_ARG, wait)
            if problem:
                problems.append(("wait_seconds", problem))
        skip = tuple(checks.key(command.arg(flag)) for flag in _NOT_TOOL_ARGS.get(name, ()))
        values = calls.check(name, arguments, skip=skip, also=problems)
        if name == "attachments" and values.get("save_to") is not None:
            values["save_to"] = self._inside_save_root(values["save_to"])
        if name == "watch":
            wait = WAIT_DEFAULT_SECONDS if wait is None else wait
            values.pop("timeout_minutes", None)
            if wait == 0:
                values["once"] = True
            else:
                values["timeout_seconds"] = float(wait)
                values["wanted"] = lambda: not cancelled.is_set()
        return lambda: calls.run(name, values)

    def _bound(self, command: spec.Command, arguments: dict) -> list[tuple[str, str]]:
        """The session's identity filled in where the call names the caller; another identity refused unless
        this server was started for a supervisor."""
        identity = _identity_arg(command)
        if command.name == "reservations" and arguments.get("check") and arguments.get("agent") is None \
                and self.agent is not None:
            arguments["agent"] = self.agent  # may I change these? asked as this session (any --agent only looks)
        if identity is None or self.agent is None:
            return []
        key = checks.key(identity)
        given = arguments.get(key)
        if given is None:
            arguments[key] = self.agent
        elif given != self.agent and not self.supervisor:
            return [(key, f"{given!r}: this session acts as {self.agent} only (its server was started with "
                          f"--agent {self.agent}); leave {key} out. Acting as another identity needs a "
                          "supervisor's server: agent-mail mcp --agent P:N --supervisor.")]
        return []

    def _inside_save_root(self, path: str) -> str:
        root = os.path.realpath(self.save_root)
        target = os.path.realpath(os.path.join(root, path))
        if os.path.commonpath([root, target]) != root:
            raise errors.InvalidInput([("save_to", f"must be a directory under {root}, where this server may save "
                                                   "files (agent-mail mcp --save-root); give a relative path.")])
        return target


def _told(result: dict) -> None:
    """The mail this result shows the model counts as told to its harness session (best effort: a failure
    only means a hook may tell it again)."""
    from agent_mail import liveness, service

    try:
        with service.open_mailbox() as mailbox:
            liveness.told_by_tool(mailbox.store, result["agent"], [m["id"] for m in result["messages"]])
    except errors.AgentMailError:
        pass


def _namer(name: str):
    """How a tool call names an argument: without dashes (`reply_to`); a command-line flag in a problem
    found below the call layer is written the same way."""
    command = spec.COMMANDS.get(name)
    flags = {a.name: checks.key(a) for a in command.args} if command else {}
    return lambda key: flags.get(key, key)


def _error(payload: dict) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=jsonout.dumps(payload))], is_error=True)


def serve(agent: str | None = None, save_root: str | None = None, supervisor: bool = False,
          root: list[str] | tuple[str, ...] = ()) -> None:
    """Run the server on stdin/stdout until the client closes it. A session is bound to `agent` (default
    AGENT_MAIL_AGENT): it acts as no other identity unless `supervisor`; a supervisor may also run without one."""
    agent = agent or os.environ.get("AGENT_MAIL_AGENT") or None
    if agent is not None:
        calls.check("mcp", {"agent": agent}, with_inputs=False)
    elif not supervisor:
        raise errors.InvalidInput([("agent", "is required: the identity this session acts as (project:name; or "
                                             "AGENT_MAIL_AGENT). A server that may act as any identity is a "
                                             "supervisor's: add --supervisor.")])
    problems = [("root", f"{r!r} is not a directory.") for r in root if not os.path.isdir(os.path.expanduser(r))]
    if problems:
        raise errors.InvalidInput(problems)
    AgentMailServer(agent, save_root or os.getcwd(), supervisor=supervisor, roots=tuple(root)).run("stdio")


def main(values: dict, emit) -> int:
    """`agent-mail mcp [--agent P:N] [--supervisor] [--root DIR]... [--save-root DIR]`, as the command line
    starts it."""
    serve(**values)
    return errors.EXIT_OK
