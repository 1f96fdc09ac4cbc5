"""Every command, argument, default, output field and example, declared once.

The argument parser (cli/main.py), the call layer's checks, `describe`, the MCP tool schemas and the usage
text are all built from these definitions, so the manual cannot disagree with what is accepted. The
pieces are in .base; the commands are declared in .mail, .reserving and .tools; the manual's whole-tool parts
(invariants, exit codes, describe's document) in .manual.

A command is loaded when it is first looked up: a hook or a read builds its own command's module, not the
thirty other commands' (most of a short command's start-up is importing; walking COMMANDS loads them all).
"""

from __future__ import annotations

from agent_mail.spec.base import (COMMAND, DECLARED, ENVELOPE_FIELDS, FIELDS, FIELDS_HELP, FLAG, HARNESSES, IDENTITY,
                                  INT, JSON, MAIL_IS_DATA, MESSAGE_FIELDS, MESSAGE_ID, MIRROR_ENTRY_FIELDS, NEXT_HELP,
                                  NUMBER, PATH, PROJECT, REACHABLE_HELP, RECIPIENT, REMOVED, STATUS_FIELDS, TEXT, Arg,
                                  Command)

__all__ = ["COMMAND", "COMMANDS", "DESCRIPTION", "ENVELOPE_FIELDS", "EXIT_CODES", "EXPORT_FORMAT", "FIELDS",
           "FIELDS_HELP", "FLAG", "HARNESSES", "IDENTITY", "INT", "INVARIANTS", "JSON", "MAIL_IS_DATA",
           "MESSAGE_FIELDS", "MESSAGE_ID", "MIRROR_ENTRY_FIELDS", "NEXT_HELP", "NUMBER", "PATH", "PROJECT",
           "REACHABLE_HELP", "RECIPIENT", "REMOVED", "SEARCH_FIELDS", "SEARCH_QUERY_HELP", "STATUS_FIELDS", "TEXT",
           "Arg", "Command", "Step", "describe_document"]

# Which module of this package declares each command, in the manual's order (describe, the usage text and the MCP
# tool list walk the commands in it). A test holds it to what the modules declare.
DECLARED_IN = {
    **dict.fromkeys(("describe", "send", "read", "ack", "watch", "heartbeat", "dismiss", "archive", "delete",
                     "cancel", "attachments", "profile", "notifications", "status"), "mail"),
    **dict.fromkeys(("reserve", "release", "reservations", "guard"), "reserving"),
    **dict.fromkeys(("search", "export", "import", "cleanup", "copy", "doctor", "mcp", "dashboard", "hook", "setup",
                     "token", "serve", "run"), "tools"),
}


def _declare(module: str) -> None:
    """Import the module that declares a command (it registers its commands into DECLARED as it loads)."""
    if module == "mail":
        from agent_mail.spec import mail  # noqa: F401
    elif module == "reserving":
        from agent_mail.spec import reserving  # noqa: F401
    elif module == "tools":
        from agent_mail.spec import tools  # noqa: F401


class Commands:
    """Every command by name, as a read-only mapping in the manual's order; a command's module is loaded the first
    time one of its commands is asked for."""

    def __getitem__(self, name: str) -> Command:
        command = DECLARED.get(name)
        if command is None:
            _declare(DECLARED_IN[name])  # KeyError for a name that is no command, as a dict's
            command = DECLARED[name]
        return command

    def __contains__(self, name: object) -> bool:
        return name in DECLARED_IN

    def get(self, name: str, default: Command | None = None) -> Command | None:
        return self[name] if name in DECLARED_IN else default

    def __iter__(self):
        return iter(DECLARED_IN)

    def __len__(self) -> int:
        return len(DECLARED_IN)

    def keys(self):
        return DECLARED_IN.keys()

    def values(self) -> list[Command]:
        return [self[name] for name in DECLARED_IN]

    def items(self) -> list[tuple[str, Command]]:
        return [(name, self[name]) for name in DECLARED_IN]


COMMANDS = Commands()


class Step(str):
    """One `next` step: a command to run, as data (`command`, `arguments` by argument name) that each
    front end renders its own way. As a string it is the CLI's rendering, `agent-mail read p:me`,
    which is what the CLI prints; the MCP server turns it into the tool call instead."""

    __slots__ = ("command", "arguments")

    def __new__(cls, command: str, **arguments: object) -> Step:
        words = ["agent-mail", command]
        for arg in COMMANDS[command].args:
            value = arguments.get(arg.dest)
            if value is None or value is False or value == []:
                continue
            if not arg.positional:
                words.append(arg.name)
                if value is True:
                    continue
            words.extend(_word(v) for v in value) if isinstance(value, (list, tuple)) else words.append(_word(value))
        step = super().__new__(cls, " ".join(words))
        step.command, step.arguments = command, arguments
        return step


_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/@%+=,")


def _word(value: object) -> str:
    """A value as one shell word: quoted when it holds anything a shell would read otherwise."""
    text = str(value)
    if text and _PLAIN.issuperset(text):
        return text
    return "'" + text.replace("'", "'\\''") + "'"


def describe_document(storage: dict, version: str, command: str | None = None) -> dict:
    """The manual: the whole of it, or one command's part (written by agent_mail.spec.manual)."""
    from agent_mail.spec import manual

    return manual.document(COMMANDS, storage, version, command)


def __getattr__(name: str):
    """The parts only some commands need, loaded when first used: the manual's (describe) and search's and
    export's formats."""
    if name in ("INVARIANTS", "EXIT_CODES", "DESCRIPTION"):
        from agent_mail.spec import manual

        return getattr(manual, name)
    if name in ("EXPORT_FORMAT", "SEARCH_FIELDS", "SEARCH_QUERY_HELP"):
        from agent_mail.spec import tools

        return getattr(tools, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
