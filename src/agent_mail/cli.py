"""agent-mail: a mailbox for AI coding agents. JSON on stdout, JSON errors on stderr.

Usage:
    agent-mail describe [COMMAND]                the whole manual, as JSON
    agent-mail send --from research:lead --to deploy:worker --subject "fix X" --body "..."
    agent-mail send --from research:lead --to '*' --subject "status check"
    agent-mail read deploy:worker                take delivery of unread mail
    agent-mail ack deploy:worker ID [ID ...]     "I acted on it"
    agent-mail status                            who has what waiting
    agent-mail cleanup --older-than 30 --dry-run deliberate deletion, no default age

The mailbox is one SQLite file: ~/.agent-mail/mail.db, or $AGENT_MAIL_DB.

This module only parses, calls and prints. It is the one place where errors
become {"error": ...} and exit codes; the work happens in agent_mail.service.
"""

from __future__ import annotations

import os
import sys

from agent_mail import errors, jsonout, spec


def parse(argv: list[str]) -> tuple[str, dict]:
    """argv (without the program name) -> (command, values). Raises InvalidInput with every problem."""
    if not argv:
        return "describe", {"command": None}
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help", "help"):
        return "describe", {"command": None}
    if name == "--version":
        if rest:
            raise errors.InvalidInput([("--version", f"takes no arguments; drop {' '.join(rest)!r}.")])
        return "version", {}
    command = spec.COMMANDS.get(name)
    if command is None:
        raise errors.InvalidInput([(None, _unknown_command(name))])
    values, problems = _parse_args(command, rest)
    if values is HELP:
        return "describe", {"command": name}
    if problems:
        from agent_mail import service  # only on the error path: find the other problems too

        seen = {p for p in problems}
        problems += [p for p in service.input_problems(name, values) if p not in seen]
        raise errors.InvalidInput(problems)
    return name, values


def argument_name(arg: spec.Arg) -> str:
    """An argument's name where arguments are named (MCP tools): the flag without dashes, `reply_to`."""
    return arg.name.lstrip("-").replace("-", "_")


def parse_arguments(name: str, arguments: dict, skip: tuple[str, ...] = ()) -> dict:
    """Named arguments (a JSON object, as an MCP tool call gives them) -> the command's values, checked by
    exactly the rules the command line is: they are laid out as the words a shell would pass (`--flag=value`,
    positionals after `--`, so no value is ever taken for a flag) and parsed by `_parse_args`. Problems name
    the argument as given (`reply_to`, not `--reply-to`). `skip`: arguments this caller may not pass."""
    command = spec.COMMANDS[name]
    by_name = {argument_name(a): a for a in command.args if a.kind != spec.REMOVED and argument_name(a) not in skip}
    flags: list[str] = []
    positionals: dict[str, list[str]] = {}  # laid out in the command's order, whatever the order given
    problems: list[tuple[str | None, str]] = []
    for key, value in arguments.items():
        arg = by_name.get(key)
        if arg is None:
            problems.append((key, f"is not an argument of {name}; its arguments: {', '.join(by_name) or 'none'}."))
            continue
        if value is None:
            continue
        if arg.kind == spec.FLAG:
            if type(value) is not bool:
                problems.append((key, "must be true or false."))
            elif value:
                flags.append(arg.name)
            continue
        if arg.kind == spec.FIELDS and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # named calls give the fields as a list; the command line, comma-separated
        items = value if isinstance(value, list) else [value]
        if isinstance(value, list) and not arg.repeat:
            problems.append((key, "takes one value, not a list."))
            continue
        words = []
        for item in items:
            if type(item) is bool or not isinstance(item, (str, int, float)):
                problems.append((key, f"must be {'a number' if arg.kind in (spec.INT, spec.NUMBER) else 'a string'}"
                                      f"{' or a list of them' if arg.repeat else ''}."))
                break
            words.append(item if isinstance(item, str) else repr(item))
        else:
            if arg.positional:
                positionals[arg.name] = words
            else:
                flags.extend(f"{arg.name}={word}" for word in words)
    ordered = [word for arg in command.args if arg.positional for word in positionals.get(arg.name, [])]
    values, found = _parse_args(command, flags + ["--"] + ordered)
    problems += [problem for problem in named_problems(name, found) if problem[0] not in skip]
    if problems:
        raise errors.InvalidInput(problems)
    return values


def named_problems(name: str, problems: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
    """Problems as found by the command-line checks (fields and texts naming `--reply-to`), spelt with the
    argument names of named calls (`reply_to`)."""
    names = {a.name: argument_name(a) for a in spec.COMMANDS[name].args}
    flags = sorted((flag for flag in names if flag.startswith("-")), key=len, reverse=True)
    renamed = []
    for field, message in problems:
        for flag in flags:
            message = message.replace(flag, names[flag])
        renamed.append((names.get(field, field) if field is not None else None, message))
    return renamed


def _unknown_command(name: str) -> str:
    known = ", ".join(spec.COMMANDS)
    hint = _closest(name, list(spec.COMMANDS))
    text = f"unknown command {name!r}."
    if hint:
        text += f" Did you mean {hint!r}?"
    return text + f" Commands: {known}. Run 'agent-mail describe' for the manual."


def _closest(word: str, choices: list[str]) -> str | None:
    import difflib  # only on the error path

    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return found[0] if found else None


HELP = object()  # what _parse_args returns for values when -h / --help stands where a flag may


def _parse_args(command: spec.Command, tokens: list[str]) -> tuple[dict, list]:
    """(values, problems); values is HELP when help was asked for. A flag's value is never a flag
    of its own: `--subject --help` sends the subject "--help"."""
    flags = {a.name: a for a in command.args if not a.positional}
    positionals = [a for a in command.args if a.positional]
    problems: list[tuple[str | None, str]] = []
    raw: dict[str, list[str]] = {}
    loose: list[str] = []
    only_positional = False
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        # A flag's name has no spaces: '-staging deploy' (a search query) is a value, not a flag.
        if only_positional or token == "-" or not token.startswith("-") or _is_number(token) or \
                any(c.isspace() for c in token.partition("=")[0]):
            loose.append(token)
            continue
        if token == "--":
            only_positional = True
            continue
        if token in ("-h", "--help"):
            return HELP, []
        name, has_value, value = token.partition("=")
        arg = flags.get(name)
        if arg is None:
            problems.append((name, _unknown_flag(command, name)))
            if not has_value and i < len(tokens) and not tokens[i].startswith("-"):
                i += 1  # most likely its value: one problem, not two
            continue
        if arg.kind == spec.FLAG:
            if has_value:
                problems.append((name, "takes no value."))
            raw.setdefault(name, []).append("")
            continue
        if arg.kind == spec.REMOVED:
            if not has_value and i < len(tokens) and (not tokens[i].startswith("-") or _is_number(tokens[i])):
                i += 1  # its old value, if any
            raw.setdefault(name, []).append("")
            continue
        if not has_value:
            if i >= len(tokens) or tokens[i] in flags:
                problems.append((name, f"needs a value ({arg.kind}): {arg.help}"))
                continue
            value = tokens[i]
            i += 1
        raw.setdefault(name, []).append(value)

    values: dict = {}
    for arg in positionals:
        if arg.repeat:
            taken, loose = loose, []
        else:
            taken, loose = loose[:1], loose[1:]
        raw[arg.name] = taken
    if loose:
        problems.append((None, f"unexpected argument(s) {loose!r} for '{command.name}'."))

    for arg in command.args:
        given = raw.get(arg.name) or []
        if arg.kind == spec.REMOVED:
            if given:
                problems.append((arg.name, arg.removed_because))
            continue
        if not given:
            values[arg.dest] = [] if arg.repeat else (False if arg.kind == spec.FLAG else arg.default)
            if arg.required:
                what = "argument" if arg.positional else "flag"
                problems.append((arg.name, f"is a required {what}: {arg.help}"))
            continue
        if len(given) > 1 and not arg.repeat:
            problems.append((arg.name, "was given more than once; give it once."))
            continue
        if arg.kind == spec.FLAG:
            values[arg.dest] = True
            continue
        converted = []
        for text in given:
            result, problem = _convert(command, arg, text)
            if problem:
                problems.append((arg.name, problem))
            else:
                converted.append(result)
        values[arg.dest] = converted if arg.repeat else (converted[0] if converted else None)

    present = {a.name for a in command.args if raw.get(a.name)}
    for group in command.exclusive:
        used = [g for g in group if g in present]
        if len(used) > 1:
            problems.append((used[0], f"cannot be combined with {', '.join(used[1:])}; use one."))
    for flag, needed in command.requires:
        if flag in present and needed not in present:
            problems.append((flag, f"only applies with {needed}; drop it or add {needed}."))
    for group in command.one_of:
        used = [g for g in group if g in present]
        if not used:
            problems.append((group[0], f"give one of: {', '.join(group)}."))
        elif len(used) > 1:
            problems.append((used[0], f"cannot be combined with {', '.join(used[1:])}; use one."))
    return values, problems


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _unknown_flag(command: spec.Command, name: str) -> str:
    names = [a.name for a in command.args if not a.positional]
    hint = _closest(name, names)
    text = f"is not a flag of '{command.name}'."
    if hint:
        text += f" Did you mean {hint}?"
    text += f" Flags: {', '.join(names) or 'none'}. See 'agent-mail describe {command.name}'."
    if any(a.positional and a.kind == spec.TEXT for a in command.args):
        text += f" A value that begins with '-' goes after --: agent-mail {command.name} -- {name}"
    return text


def _convert(command: spec.Command, arg: spec.Arg, text: str) -> tuple[object, str | None]:
    """Turn one raw value into its typed value, or explain why it cannot be."""
    from agent_mail import model

    kind = arg.kind
    if kind in (spec.IDENTITY, spec.RECIPIENT):
        problem = model.identity_problem(text, allow_broadcast=kind == spec.RECIPIENT)
        return text, problem
    if kind == spec.MESSAGE_ID:
        return text.lower(), model.message_id_problem(text)
    if kind in (spec.INT, spec.NUMBER):
        if not _plain_number(text, whole=kind == spec.INT):
            example = "e.g. 30" if kind == spec.INT else "e.g. 30 or 2.5"
            return None, (f"{text!r} is not {'a whole number' if kind == spec.INT else 'a number'}: use plain ASCII "
                          f"digits ({example}), no spaces, underscores or exponents.")
        number = int(text) if kind == spec.INT else float(text)
        low, high = arg.minimum, arg.maximum
        if (low is not None and number < low) or (high is not None and number > high):
            return None, f"{text} is out of range; use a value from {_num(low)} to {_num(high)}."
        return number, None
    if kind == spec.FIELDS:
        wanted = [f.strip() for f in text.split(",") if f.strip()]
        valid = list(command.item_fields)
        unknown = [f for f in wanted if f not in valid]
        if not wanted:
            return None, f"is empty. Choose from: {','.join(valid)}."
        if unknown:
            return None, f"unknown field(s) {unknown}. Choose from: {','.join(valid)}."
        return list(dict.fromkeys(wanted)), None
    if kind == spec.COMMAND:
        if text not in spec.COMMANDS:
            return None, _unknown_command(text)
        return text, None
    if kind == spec.PATH and not text:
        return None, "is empty; give a path."
    if "\x00" in text:
        return None, "contains a NUL character."
    return text, None


_DIGITS = frozenset("0123456789")


def _plain_number(text: str, *, whole: bool) -> bool:
    """Only the plain forms -?D+ and (for numbers) -?D+.D+ with ASCII digits D. int() and float()
    would also take ' 5', '1_0', '1e3', '5.' and other scripts' digits."""
    body = text[1:] if text.startswith("-") else text
    whole_part, point, fraction = body.partition(".")
    if point and (whole or not fraction):
        return False
    digits = whole_part + fraction
    return bool(whole_part) and len(digits) <= 30 and all(c in _DIGITS for c in digits)


def _num(value: float | None) -> str:
    if value is None:
        return "any"
    return str(int(value)) if float(value).is_integer() else str(value)


# ---------------------------------------------------------------- output


def _dumps(document: object) -> bytes:
    text = jsonout.dumps(document, end="\n")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _without_surrogates(text).encode("utf-8")


def _without_surrogates(text: str) -> str:
    """Replace lone surrogates, which strict JSON parsers reject even as \\u escapes.

    They come from bytes that were not UTF-8 (argv, file names, environment), decoded by Python
    with surrogateescape; they can only sit inside JSON strings. Such a byte is shown as the text
    \\xNN (escaped for JSON), anything else as U+FFFD.
    """
    out = []
    for ch in text:
        code = ord(ch)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\\\x{code - 0xDC00:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out)


def emit(document: object) -> None:
    """Write the result to stdout and make sure it arrived; raise OutputError if not."""
    stream = sys.stdout
    try:
        if stream is None:
            raise OSError("standard output is closed")
        buffer = getattr(stream, "buffer", None)
        if buffer is None:  # replaced by a text-only stream (tests): keep its encoding out of it
            stream.write(_dumps(document).decode("utf-8"))
        else:
            stream.flush()
            _write_all(buffer, _dumps(document))
        stream.flush()
    except (OSError, ValueError) as exc:
        _silence_stdout()
        raise errors.OutputError(
            f"could not write the result to standard output ({exc}); nothing was changed."
        ) from None


def _write_all(buffer, data: bytes) -> None:
    """Write every byte or raise: a large write can come back short (a file-size limit, a
    signal), and a result cut short must count as not delivered."""
    view = memoryview(data)
    while view:
        written = buffer.write(view)
        if not written:
            raise OSError("the output accepted no more bytes")
        view = view[written:]


def _silence_stdout() -> None:
    """After a failed write, stop Python from failing again on exit while flushing stdout."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass


def _emit_error(error: errors.AgentMailError, printed: bool = False) -> None:
    payload = error.payload()
    if printed:
        # The payload reached stdout, then the commit failed: the exit status decides.
        payload["error"] += (" The result already printed on standard output was not committed: disregard it "
                             "(a non-zero exit always means nothing changed).")
        payload["output_discarded"] = True
    data = _dumps(payload)
    try:
        stream = sys.stderr
        buffer = getattr(stream, "buffer", None)
        if buffer is None:
            stream.write(data.decode("utf-8"))
        else:
            _write_all(buffer, data)
        stream.flush()
    except (OSError, ValueError, AttributeError):
        pass


# ---------------------------------------------------------------- dispatch


def main(argv: list[str] | None = None) -> int:
    """Run one command; return the exit code. Never raises for user-facing failures."""
    args = sys.argv[1:] if argv is None else list(argv)
    printed = []

    def emit_once(document: object) -> None:
        emit(document)
        printed.append(True)

    previous = _stop_on_signals()
    try:
        name, values = parse(args)
        if name == "version":
            from agent_mail import __version__

            emit({"name": "agent-mail", "version": __version__})
            return errors.EXIT_OK
        if name == "describe":
            from agent_mail import __version__, service

            emit(spec.describe_document(service.storage_report(), __version__, values.get("command")))
            return errors.EXIT_OK
        from agent_mail import service

        if name == "setup":
            from agent_mail import harness_setup

            harness_setup.setup(values["harness"], values["agent"], values["dir"], values["dry_run"], values["remove"],
                                emit=emit_once)
            return errors.EXIT_OK
        if name == "hook":
            from agent_mail import hooks

            return hooks.run(values["harness"], values["event"], values["agent"], emit_once)
        if name == "mcp":
            try:
                from agent_mail import mcp_server
            except ImportError as exc:
                raise errors.AgentMailError(
                    f"agent-mail mcp needs the MCP SDK, which is not installed ({exc}). Install the extra: "
                    "pip install 'agent-mail[mcp]'.") from None
            mcp_server.serve(**values)
            return errors.EXIT_OK
        if name == "dashboard":
            from agent_mail import dashboard

            dashboard.run(human=values["as"], project=values["project"], overdue_minutes=values["overdue_minutes"],
                          web=values["web"], port=values["port"])
            return errors.EXIT_OK
        if name == "doctor":
            service.doctor(**values, emit=emit_once)
            return errors.EXIT_OK
        if name == "copy":
            service.copy_mailbox(**values, emit=emit_once)
            return errors.EXIT_OK
        if name in ("export", "import"):
            from agent_mail import history

            problems = service.input_problems(name, values)
            if problems:  # before the mailbox is opened: a refused export creates nothing
                raise errors.InvalidInput(problems)
            with service.open_mailbox() as mailbox:
                if name == "import":
                    emit_once(history.import_file(mailbox.store, values["file"], values["dry_run"]))
                    return errors.EXIT_OK
                summary = history.export(mailbox.store, format=values["format"], output=values["output"],
                                         agent=values["agent"], since_days=values["since_days"])
            if summary is not None:  # to stdout, the export itself is the output
                emit_once(summary)
            return errors.EXIT_OK
        with service.open_mailbox() as mailbox:
            result = getattr(mailbox, name)(**values, emit=emit_once)
        if name == "send" and result["refused"]:
            return errors.EXIT_PARTIAL  # the receipt is on stdout and says who was refused
        return errors.EXIT_OK
    except errors.AgentMailError as exc:
        _emit_error(exc, printed=bool(printed))
        return exc.exit_code
    except KeyboardInterrupt:
        _emit_error(errors.Interrupted("interrupted by SIGINT; nothing was changed.", 130), printed=bool(printed))
        return 130
    except Exception as exc:
        # a bug: still JSON, still no traceback, with enough to report it
        _emit_error(errors.AgentMailError(
            f"internal error ({type(exc).__name__}: {exc}). Nothing was changed. Please report this."
        ), printed=bool(printed))
        return errors.EXIT_FAILED
    finally:
        _restore_signals(previous)


_SIGNAL_NAMES = {1: "SIGHUP", 15: "SIGTERM"}


def _stop_on_signals() -> dict:
    """SIGTERM and SIGHUP end any command the way SIGINT does: the transaction under way rolls back,
    a JSON error says so, and the exit status is 128 + the signal number. (`_signal`, not `signal`,
    which imports enum: a cost every command would pay.)"""
    import _signal

    def stop(signum, frame):
        name = _SIGNAL_NAMES.get(signum, f"signal {signum}")
        raise errors.Interrupted(f"stopped by {name}; nothing was changed.", 128 + signum)

    previous = {}
    for number in _SIGNAL_NAMES:
        try:
            previous[number] = _signal.signal(number, stop)
        except (ValueError, OSError):  # not the main thread
            pass
    return previous


def _restore_signals(previous: dict) -> None:
    import _signal

    for number, handler in previous.items():
        _signal.signal(number, handler)


def run() -> None:
    """Console-script entry point.

    Everything is written, flushed and committed by the time main() returns, so the process
    ends right there: tearing the interpreter down module by module would add about a fifth
    to the run time of a short command.
    """
    code = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
