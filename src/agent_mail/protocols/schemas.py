"""JSON Schema for a command's arguments and result, made from the spec: what the MCP tools (harness/mcp_stdio.py)
and the HTTP API's OpenAPI document (the server's /openapi.json) both declare, so the two cannot drift from each
other or from `describe`. Arguments are named as calls name them (the flag without dashes, `reply_to`).

Both say each value's JSON type, range and choices. The OpenAPI document's (`exact`) says all the call layer takes,
so the server holds every request to it: an identity's and a message id's form, lengths, the most items, a
repeatable value given alone or as a list, `fields` as a list or one comma-separated string, and the rules between
arguments (not together, only with, exactly one of) as `not`, `if`/`then` and `oneOf`. The MCP tools' leave the
forms to each argument's description (every tool's schema is read into a model's context, so the listing stays
small) and the rules out (Claude's tool schemas take no combinators at their top level); the call layer checks
them all, with the same messages, whichever front end a call comes through."""

from __future__ import annotations

from typing import Any

from agent_mail.parts import checks
from agent_mail.parts.inputs import PROFILE_SETTINGS, URL_MAX_CHARS
from agent_mail import model, spec

_KINDS = {spec.INT: "integer", spec.NUMBER: "number", spec.FLAG: "boolean"}
_NAME = f"[a-z0-9][a-z0-9-]{{0,{model.NAME_MAX_CHARS - 1}}}"
IDENTITY = f"{_NAME}:{_NAME}"
MESSAGE_ID = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_NO_NUL = "^[^\\u0000]*$"
_BIDI = "\\u202a-\\u202e\\u2066-\\u2069"
_LINE = f"[^\\u0000-\\u001f\\u007f-\\u009f{_BIDI}]"  # what a subject may hold (model.LINE_CONTROL, model.BIDI)
_BODY = f"[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f{_BIDI}]"  # model.BODY_CONTROL, model.BIDI
_FORMS = {
    spec.IDENTITY: {"pattern": f"^{IDENTITY}$", "maxLength": 2 * model.NAME_MAX_CHARS + 1},
    spec.RECIPIENT: {"pattern": f"^(\\*|{IDENTITY})$", "maxLength": 2 * model.NAME_MAX_CHARS + 1},
    spec.MESSAGE_ID: {"pattern": f"^{MESSAGE_ID}$"},
    spec.PROJECT: {"pattern": f"^{_NAME}$"},
    spec.PATH: {"minLength": 1, "pattern": _NO_NUL},
    spec.TEXT: {"pattern": _NO_NUL},
    spec.JSON: {"pattern": _NO_NUL},
}
# What one command's argument takes beyond its kind: the send's text rules (model.subject_problem, body_problem),
# a query that is not blank, the most recipients a send has.
_ARGUMENT_FORMS = {
    ("send", "subject"): {"maxLength": model.SUBJECT_MAX_CHARS, "pattern": f"^{_LINE}*[^\\s{_LINE[2:-1]}]{_LINE}*$"},
    ("send", "body"): {"maxLength": model.BODY_MAX_CHARS, "pattern": f"^{_BODY}*$"},
    ("search", "query"): {"pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"},
    # never a negation, a comment, or a control character (wildmatch.pattern_problem; others are shown it)
    **{(name, key): {"minLength": 1, "pattern": f"^[^!#{_LINE[2:-1]}]{_LINE}*$"} for name, key in (
        ("reserve", "patterns"), ("release", "patterns"))},
    ("reserve", "reason"): {"pattern": f"^{_LINE}*$"},  # model.name_problem: others are shown it
    ("profile", "clear"): {"enum": list(PROFILE_SETTINGS)},
    # an http(s) URL with a host (inputs.url_problem says the rest: its port, control characters)
    ("webhook", "url"): {"maxLength": URL_MAX_CHARS, "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]+(?:[/?#]\\S*)?$"},
    **{("reservations", key): {"minLength": 1, "pattern": _NO_NUL} for key in ("paths", "path")},
}
_MOST_ITEMS = {("send", "to"): model.RECIPIENTS_MAX}
# A name shown to others as it is (an uploaded attachment's: model.name_problem, and no "/"), and standard base64.
ATTACHMENT_NAME = {"type": "string", "minLength": 1, "pattern": f"^[^/{_LINE[2:-1]}]+$"}
BASE64 = {"type": "string", "contentEncoding": "base64",
          "pattern": "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"}


def identity_arg(command: spec.Command) -> spec.Arg | None:
    """The argument that names the caller: the positional identity (`agent`, cancel's `sender`), send's
    `--from`, or search's `--agent` (what the caller may see: a session searches its own mail unless it
    names another). (status's `--agent` is a filter, not the caller.)"""
    for arg in command.args:
        if arg.kind == spec.IDENTITY and (arg.positional or arg.name == "--from"
                                          or (command.name == "search" and arg.name == "--agent")):
            return arg
    return None


def _value_schema(arg: spec.Arg, command: spec.Command, exact: bool) -> dict:
    """One value of an argument (one item of a repeatable one): its type, range and choices; `exact`: its form."""
    kind = _KINDS.get(arg.kind, "string")
    schema: dict[str, Any] = {"type": kind}
    if kind == "string" and exact:
        schema.update(_FORMS.get(arg.kind, {}))
        schema.update(_ARGUMENT_FORMS.get((command.name, checks.key(arg)), {}))
        if arg.kind == spec.COMMAND:
            schema["enum"] = list(spec.COMMANDS)
    if arg.minimum is not None:
        schema["minimum"] = arg.minimum if kind == "number" else int(arg.minimum)
    if arg.maximum is not None:
        schema["maximum"] = arg.maximum if kind == "number" else int(arg.maximum)
    if arg.choices:
        schema = {"type": "string", "enum": list(arg.choices)}
    return schema


def property_schema(arg: spec.Arg, command: spec.Command, *, exact: bool = False) -> dict:
    """One argument's JSON Schema: its type, form, range, choices and help. `exact`: also the other spellings the
    call layer takes (a repeatable value alone, fields as one comma-separated string)."""
    if arg.kind == spec.FIELDS:  # a list of the item fields, by name (the CLI's comma-separated list)
        names = list(command.item_fields)
        schema: dict[str, Any] = {"type": "array", "items": {"type": "string", "enum": names}}
        if exact:
            schema["minItems"] = 1
            one = "(?:" + "|".join(names) + ")"
            listed = f"^[\\s,]*{one}\\s*(?:,[\\s,]*(?:{one}\\s*)?)*$"
            schema = {"anyOf": [schema, {"type": "string", "pattern": listed}]}
        schema["description"] = "Which fields of each item to return (saves context)."
        return schema
    schema = _value_schema(arg, command, exact)
    if arg.repeat:
        listed = {"type": "array", "items": schema}
        if exact and arg.required:
            listed["minItems"] = 1
        if exact and (command.name, checks.key(arg)) in _MOST_ITEMS:
            listed["maxItems"] = _MOST_ITEMS[(command.name, checks.key(arg))]
        schema = {"anyOf": [schema, listed]} if exact else listed
    schema["description"] = arg.help
    return schema


def _given(arg: spec.Arg) -> dict:
    """What it is, in JSON Schema, for `arg` to be given (as the call layer counts it: a flag true, a list not
    empty)."""
    present: dict[str, Any] = {"required": [checks.key(arg)]}
    if arg.kind == spec.FLAG or arg.repeat:
        present["properties"] = {checks.key(arg): {"not": {"enum": [False, []]}}}
    return present


def rules_schema(command: spec.Command, keys: set[str]) -> list[dict]:
    """The rules between `command`'s arguments (those among `keys`) as JSON Schema: at most one of each exclusive
    group, an argument only with the one it needs, exactly one of each one_of group."""
    args = {a.name: a for a in command.args if checks.key(a) in keys}
    rules: list[dict] = []
    for group in command.exclusive:
        named = [args[g] for g in group if g in args]
        rules += [{"not": {"allOf": [_given(a), _given(b)]}} for i, a in enumerate(named) for b in named[i + 1:]]
    for flag, needed in command.requires:
        if flag in args and needed in args:
            rules.append({"if": _given(args[flag]), "then": _given(args[needed])})
    for group in command.one_of:
        rules.append({"oneOf": [_given(args[g]) for g in group if g in args]})
    return rules


def arguments_schema(command: spec.Command, *, leave_out: tuple[str, ...] = (), optional: tuple[str, ...] = (),
                     extra: dict[str, dict] | None = None, exact: bool = False) -> dict:
    """The object of a call's values by argument name. `leave_out`: flags (as declared, `--once`) this caller
    cannot pass; `optional`: names that are required on the command line but filled in by this caller;
    `extra`: properties only this caller takes; `exact`: every spelling the call layer takes and the rules
    between arguments (the OpenAPI document's), else the plain forms a model is shown (the MCP tools'). A value
    left out is not given; null is no value."""
    properties: dict[str, dict] = {}
    required = []
    for arg in command.args:
        if arg.kind in (spec.REMOVED, spec.COMMAND) or arg.name in leave_out:
            continue
        key = checks.key(arg)
        properties[key] = property_schema(arg, command, exact=exact)
        if arg.required and key not in optional:
            required.append(key)
    properties.update(extra or {})
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    if exact:
        rules = rules_schema(command, set(properties))
        if rules:
            schema["allOf"] = rules
    return schema


def result_schema(command: spec.Command) -> dict:
    """The result document: an object with the command's output fields (each of any type)."""
    return {"type": "object", "properties": {field: {} for field in command.output}}
