"""The short usage text a person at a terminal gets from `agent-mail`, `--help`, `-h`, `help` and
`COMMAND --help`. A pipe (an agent) gets the JSON manual instead (`describe`), which says everything."""

from __future__ import annotations

from agent_mail import spec

WIDTH = 100


def _first_sentence(text: str) -> str:
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _wrap(text: str, indent: str = "", first: str = "") -> str:
    import textwrap

    return textwrap.fill(text, WIDTH, initial_indent=first or indent, subsequent_indent=indent,
                         break_on_hyphens=False)


def text(command: str | None = None) -> str:
    """The whole tool in one screen, or one command's usage."""
    if command is not None:
        return _command_text(spec.COMMANDS[command])
    from agent_mail import __version__

    width = max(len(name) for name in spec.COMMANDS)
    lines = [f"agent-mail {__version__}: a mailbox for AI coding agents and the people who supervise them.",
             "JSON on stdout, JSON errors on stderr, the exit status says how it went.", "",
             "Usage: agent-mail COMMAND [ARGUMENTS]", "", "Commands:"]
    for name, cmd in spec.COMMANDS.items():
        summary = _first_sentence(cmd.summary)
        if len(summary) > WIDTH - width - 4:
            summary = summary[: WIDTH - width - 7].rstrip() + "..."
        lines.append(f"  {name:<{width}}  {summary}")
    lines += ["", "agent-mail COMMAND --help   one command's arguments and examples",
              "agent-mail describe         the whole manual as JSON (what an agent reads)",
              "Mailbox: ~/.agent-mail/mail.db, or $AGENT_MAIL_DB (a file or a postgresql:// URL).", ""]
    return "\n".join(lines)


def _command_text(command: spec.Command) -> str:
    lines = [_wrap(f"agent-mail {command.name}: {command.summary}"), "", "Arguments:"]
    if not command.args:
        lines.append("  none")
    for arg in command.args:
        if arg.kind == spec.REMOVED:
            continue
        shown = arg.name if arg.kind == spec.FLAG else f"{arg.name} {arg.kind.upper()}"
        if arg.positional:
            shown = arg.name.upper() + ("..." if arg.repeat else "")
        notes = []
        if arg.required:
            notes.append("required")
        if arg.repeat and not arg.positional:
            notes.append("repeatable")
        if arg.choices:
            notes.append("one of " + ", ".join(arg.choices))
        if arg.minimum is not None or arg.maximum is not None:
            notes.append(f"from {_num(arg.minimum)} to {_num(arg.maximum)}")
        help_text = arg.help + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(f"  {shown}")
        lines.append(_wrap(help_text, indent=" " * 8))
    if command.examples:
        lines += ["", "Examples:"]
        lines += [f"  agent-mail {example}" for example in command.examples]
    lines += ["", f"Output and every field: agent-mail describe {command.name}", ""]
    return "\n".join(lines)


def _num(value) -> str:
    if value is None:
        return "any"
    return str(int(value)) if float(value).is_integer() else str(value)
