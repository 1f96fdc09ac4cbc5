"""agent-mail: a mailbox for AI coding agents. JSON on stdout, JSON errors on stderr.

Usage:
    agent-mail describe [COMMAND]                the whole manual, as JSON
    agent-mail send --from research:lead --to deploy:worker --subject "fix X" --body "..."
    agent-mail send --from research:lead --to '*' --subject "status check"
    agent-mail read deploy:worker                take delivery of unread mail
    agent-mail ack deploy:worker ID [ID ...]     "I acted on it"
    agent-mail status                            who has what waiting
    agent-mail cleanup --older-than 30 --dry-run deliberate deletion, no default age

The mailbox is ~/.agent-mail/mail.db (SQLite), or what $AGENT_MAIL_DB names: another file or a
postgresql:// URL.

This module is the command line's front end: it turns words into values by argument name, hands them
to the call layer (agent_mail.calls), which checks them and carries the operation out, and prints. It
is the one place where errors become {"error": ...} on stderr and exit codes, with arguments named as
flags.
"""

from __future__ import annotations

import os
import sys

from agent_mail.parts import checks
from agent_mail import errors, jsonout, spec


def parse(argv: list[str]) -> tuple[str, dict]:
    """argv (without the program name) -> (command, values). Raises InvalidInput with every problem, in
    the command line's words (`--reply-to`)."""
    if not argv:
        return "help", {"command": None}
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help", "help"):
        if name == "help" and len(rest) == 1 and rest[0] in spec.COMMANDS:
            return "help", {"command": rest[0]}
        return "help", {"command": None}
    if name == "--version":
        if rest:
            raise errors.InvalidInput([("--version", f"takes no arguments; drop {' '.join(rest)!r}.")])
        return "version", {}
    command = spec.COMMANDS.get(name)
    if command is None:
        raise errors.InvalidInput([(None, checks.unknown_command(name))])
    given, problems = words_to_values(command, rest)
    if given is HELP:
        return "help", {"command": name}
    try:
        return name, checks.check(name, given, also=problems)
    except errors.InvalidInput as exc:
        raise exc.renamed(namer(command)) from None


def namer(command: spec.Command):
    """How the command line names an argument (`--reply-to`): see checks.flag_namer."""
    return checks.flag_namer(command)


HELP = object()  # what words_to_values returns for values when -h / --help stands where a flag may


def words_to_values(command: spec.Command, tokens: list[str]) -> tuple[dict, list]:
    """The words of a command line -> (values by argument name, as given: text, a list of texts for a
    repeatable argument, True for a flag; the problems of the words themselves). Values are checked by
    `checks.check`, as every front end's are. A flag's value is never a flag of its own: `--subject
    --help` sends the subject "--help". Values is HELP when help was asked for."""
    flags = {a.name: a for a in command.args if not a.positional}
    positionals = [a for a in command.args if a.positional]
    # Every flag is --long: where a text is taken (search's query), -word is that text (search -fix).
    text_positional = any(a.kind == spec.TEXT for a in positionals)
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
                any(c.isspace() for c in token.partition("=")[0]) or \
                (text_positional and not token.startswith("--") and token not in ("-h",)):
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
                problems.append((checks.key(arg), "takes no value."))
            raw.setdefault(name, []).append("")
            continue
        if arg.kind == spec.REMOVED:
            if not has_value and i < len(tokens) and (not tokens[i].startswith("-") or _is_number(tokens[i])):
                i += 1  # its old value, if any
            raw.setdefault(name, []).append("")
            continue
        if not has_value:
            if i >= len(tokens) or tokens[i] in flags:
                problems.append((checks.key(arg), f"needs a value ({arg.kind}): {arg.help}"))
                continue
            value = tokens[i]
            i += 1
        raw.setdefault(name, []).append(value)

    for arg in positionals:
        if arg.repeat:
            taken, loose = loose, []
        else:
            taken, loose = loose[:1], loose[1:]
        if taken:
            raw[arg.name] = taken
    if loose:
        problems.append((None, f"unexpected argument(s) {loose!r} for '{command.name}'."))

    given: dict = {}
    for arg in command.args:
        words = raw.get(arg.name)
        if not words:
            continue
        if len(words) > 1 and not arg.repeat:
            problems.append((checks.key(arg), "was given more than once; give it once."))
            continue
        if arg.kind in (spec.FLAG, spec.REMOVED):
            given[checks.key(arg)] = True
        else:
            given[checks.key(arg)] = words if arg.repeat else words[0]
    return given, problems


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def _unknown_flag(command: spec.Command, name: str) -> str:
    names = [a.name for a in command.args if not a.positional]
    hint = checks.closest(name, names)
    text = f"is not a flag of '{command.name}'."
    if hint:
        text += f" Did you mean {hint}?"
    text += f" Flags: {', '.join(names) or 'none'}. See 'agent-mail describe {command.name}'."
    if any(a.positional and a.kind == spec.TEXT for a in command.args):
        text += f" A value that begins with '-' goes after --: agent-mail {command.name} -- {name}"
    return text


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
        failed = errors.OutputError(f"could not write the result to standard output ({exc}); nothing was changed.")
        failed.reader_gone = isinstance(exc, BrokenPipeError)
        raise failed from None


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
    name = None
    try:
        name, values = parse(args)
        if not brief(name, values):
            import gc

            gc.enable()  # off from the start (scripts/agent-mail): this command may live for hours
        try:
            return _dispatch(name, values, emit_once)
        except errors.AgentMailError as exc:  # named as the command line names its arguments
            raise exc.renamed(namer(spec.COMMANDS[name])) if name in spec.COMMANDS else exc from None
    except errors.AgentMailError as exc:
        if name in ("describe", "help") and getattr(exc, "reader_gone", False):
            return CLOSED_PIPE  # `agent-mail describe | head`: the reader had what it wanted
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


# The commands that end within moments, which an agent or a harness's hook runs all day. The program starts with the
# garbage collector off (scripts/agent-mail, agent_mail/__main__.py): what these make dies with the process, and the
# collections their imports would set off are about a millisecond of each start. Every other command (a watch, the
# MCP server, serve, run, the dashboard, a hook's waiter; and those that may work through a whole mailbox) turns it
# back on before it starts.
BRIEF = frozenset({"describe", "help", "version", "send", "read", "ack", "heartbeat", "dismiss", "archive", "delete",
                   "cancel", "attachments", "profile", "status", "reserve", "release", "reservations", "guard",
                   "search", "hook", "setup", "token", "webhook"})


def brief(name: str, values: dict) -> bool:
    """Whether the command `name` ends within moments (see BRIEF): a hook does, but for the waiter it arms."""
    return name in BRIEF and not (name == "hook" and values.get("event") == "wait")


CLOSED_PIPE = 141  # 128 + SIGPIPE: how a Unix tool ends when its reader closed the pipe


def _at_a_terminal() -> bool:
    try:
        return sys.stdout is not None and sys.stdout.isatty()
    except (ValueError, OSError):
        return False


def _write_text(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        raise errors.OutputError(f"could not write the usage text to standard output ({exc}).") from None


def _dispatch(name: str, values: dict, emit_once) -> int:
    """Carry out a parsed command; return the exit code."""
    if name == "version":
        from agent_mail import __version__

        emit({"name": "agent-mail", "version": __version__})
        return errors.EXIT_OK
    if name == "help" and _at_a_terminal():
        from agent_mail.cli import usage

        _write_text(usage.text(values.get("command")))
        return errors.EXIT_OK
    if name in ("describe", "help"):  # help for a pipe (an agent) is the manual, as JSON
        from agent_mail import __version__
        from agent_mail.operations import location

        emit(spec.describe_document(location.storage_report(), __version__, values.get("command")))
        return errors.EXIT_OK
    if name == "setup":
        from agent_mail.harness import setup

        setup.setup(values["harness"], values["agent"], values["dir"], values["dry_run"], values["remove"],
                            emit=emit_once)
        return errors.EXIT_OK
    from agent_mail.operations import location

    url = location.server_url()  # AGENT_MAIL_DB names an agent-mail server: the client carries the call
    served = None
    if url is not None:
        from agent_mail.client import commands as client

        if name not in client.STARTED_HERE:
            return client.main(name, values, emit_once)
        served = client.backing(name, url)  # a front end run here, its mailbox steps carried by the server
    front_end = _front_end(name)
    if front_end is not None:
        return front_end.main(values, emit_once, served=served) if served is not None else \
            front_end.main(values, emit_once)
    from agent_mail import calls

    result = calls.run(name, values, emit=emit_once)
    if name == "send" and result["refused"]:
        return errors.EXIT_PARTIAL  # the receipt is on stdout and says who was refused
    if name in ("reserve", "reservations") and result.get("conflicts"):
        return errors.EXIT_PARTIAL  # the result is on stdout and lists the conflicts
    return errors.EXIT_OK


def _front_end(name: str):
    """The front end that carries out `name` when it is not a call of the call layer (MCP over stdio, a harness's
    hook, the git guard, the dashboard, the server), imported only when that command runs: each brings its own
    dependencies, and an extra that is not installed is named with the command that needs it."""
    command = spec.COMMANDS[name]
    try:
        if name == "mcp":
            from agent_mail.harness import mcp_stdio as module
        elif name == "hook":
            from agent_mail.harness import hooks as module
        elif name == "guard":
            from agent_mail.harness import git_guard as module
        elif name == "run":
            from agent_mail.harness import run as module
        elif name == "dashboard":
            import agent_mail.dashboard as module
        elif name == "serve":
            from agent_mail.server import app as module
        else:
            return None
    except ImportError as exc:
        if not command.extra:
            raise
        raise errors.AgentMailError(
            f"agent-mail {name} needs the {command.extra!r} extra, which is not installed ({exc}). Install it: "
            f"pip install 'agent-mail[{command.extra}]'.") from None
    return module


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
