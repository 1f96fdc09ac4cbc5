"""`agent-mail mcp`: the mailbox as MCP tools over stdio, on the official MCP SDK (`MCPServer`).

Imported only by that command (the `mcp` extra). The tools are made from the spec (protocols.mcp_tools, shared
with the streamable HTTP endpoint of `agent-mail serve`): one per command a model should call, the same names,
arguments named without dashes, JSON Schema types, ranges and descriptions from the spec. A call's JSON
arguments go straight into the call layer (agent_mail.calls), which checks them by the same rules as every front
end's and carries out the same Mailbox operation; the result is the JSON document the CLI prints, with its
`next` steps rendered as tool calls. A refused call is a tool error carrying the same `problems`, each argument
named as the tool names it.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, Tool

from agent_mail import __version__, calls, errors, spec
from agent_mail.parts import checks
from agent_mail.protocols import mcp_tools

_identity_arg = mcp_tools.identity_arg
tool_definitions = mcp_tools.tool_definitions
render_steps = mcp_tools.render_steps


class AgentMailServer(MCPServer):
    """MCPServer whose tools are declared by the spec rather than by Python signatures."""

    def __init__(self, agent: str | None, save_root: str, *, supervisor: bool = False, roots: tuple[str, ...] = ()):
        super().__init__(name="agent-mail", version=__version__, instructions=mcp_tools.INSTRUCTIONS)
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
        told = _told if name in ("watch", "read") else None
        return await mcp_tools.answer(name, lambda cancelled: self._prepare(name, dict(arguments or {}), cancelled),
                                      self.agent, after=told)

    def _prepare(self, name: str, arguments: dict, cancelled: threading.Event):
        command = spec.COMMANDS[name]
        problems: list[tuple[str | None, str]] = self._bound(command, arguments)
        if name == "send":
            from agent_mail.parts import inputs

            problems += inputs.confine_paths(arguments, self.roots)
            problems += inputs.naming_the_mailbox(arguments, _mailbox_file())
        wait = mcp_tools.take_wait(arguments, problems) if name == "watch" else None
        values = calls.check(name, arguments, skip=mcp_tools.not_tool_args(name), also=problems)
        if name == "attachments" and values.get("save_to") is not None:
            values["save_to"] = self._inside_save_root(values["save_to"])
        if name == "watch":
            mcp_tools.set_wait(values, wait, lambda: not cancelled.is_set())
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


def _mailbox_file() -> str:
    """The SQLite file this server's calls open ("" for a database server's mailbox, or one not resolved)."""
    from agent_mail.operations import location
    from agent_mail.urls import scheme_of

    try:
        found = location.resolve_location()[0]
    except errors.AgentMailError:
        return ""
    return "" if scheme_of(found) is not None else found


def _told(result: object) -> None:
    """The mail this result shows the model counts as told to its harness session (best effort: a failure
    only means a hook may tell it again)."""
    from agent_mail.parts import liveness
    from agent_mail.operations import mail

    if not isinstance(result, dict) or not result.get("messages"):
        return
    try:
        with mail.open_mailbox() as mailbox:
            liveness.told_by_tool(mailbox.store, result["agent"], [m["id"] for m in result["messages"]])
    except errors.AgentMailError:
        pass


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
