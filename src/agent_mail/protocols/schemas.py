"""JSON Schema for a command's arguments and result, made from the spec: what the MCP tools (harness/mcp_stdio.py)
and the HTTP API's OpenAPI document (the server's /openapi.json) both declare, so the two cannot drift from each
other or from `describe`. Arguments are named as calls name them (the flag without dashes, `reply_to`)."""

from __future__ import annotations

from typing import Any

from agent_mail.parts import checks
from agent_mail import spec

_KINDS = {spec.INT: "integer", spec.NUMBER: "number", spec.FLAG: "boolean"}


def identity_arg(command: spec.Command) -> spec.Arg | None:
    """The argument that names the caller: the positional identity (`agent`, cancel's `sender`), send's
    `--from`, or search's `--agent` (what the caller may see: a session searches its own mail unless it
    names another). (status's `--agent` is a filter, not the caller.)"""
    for arg in command.args:
        if arg.kind == spec.IDENTITY and (arg.positional or arg.name == "--from"
                                          or (command.name == "search" and arg.name == "--agent")):
            return arg
    return None


def property_schema(arg: spec.Arg, command: spec.Command) -> dict:
    """One argument's JSON Schema: its type, range, choices and help."""
    if arg.kind == spec.FIELDS:  # a list of the item fields, by name (the CLI's comma-separated list)
        return {"type": "array", "items": {"type": "string", "enum": list(command.item_fields)},
                "description": "Which fields of each item to return (saves context)."}
    kind = _KINDS.get(arg.kind, "string")
    schema: dict[str, Any] = {"type": kind}
    if arg.minimum is not None:
        schema["minimum"] = arg.minimum if kind == "number" else int(arg.minimum)
    if arg.maximum is not None:
        schema["maximum"] = arg.maximum if kind == "number" else int(arg.maximum)
    if arg.choices:
        schema["enum"] = list(arg.choices)
    if arg.repeat:
        schema = {"type": "array", "items": schema}
    schema["description"] = arg.help
    return schema


def arguments_schema(command: spec.Command, *, leave_out: tuple[str, ...] = (), optional: tuple[str, ...] = (),
                     extra: dict[str, dict] | None = None, nullable: bool = False) -> dict:
    """The object of a call's values by argument name. `leave_out`: flags (as declared, `--once`) this caller
    cannot pass; `optional`: names that are required on the command line but filled in by this caller;
    `extra`: properties only this caller takes; `nullable`: an optional value may be null, meaning not given
    (as the call layer takes it)."""
    properties: dict[str, dict] = {}
    required = []
    for arg in command.args:
        if arg.kind in (spec.REMOVED, spec.COMMAND) or arg.name in leave_out:
            continue
        key = checks.key(arg)
        properties[key] = property_schema(arg, command)
        if arg.required and key not in optional:
            required.append(key)
        elif nullable:
            properties[key]["type"] = [properties[key]["type"], "null"]
    properties.update(extra or {})
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def result_schema(command: spec.Command) -> dict:
    """The result document: an object with the command's output fields (each of any type)."""
    return {"type": "object", "properties": {field: {} for field in command.output}}
