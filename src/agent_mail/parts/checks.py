"""Every value of a call checked against the spec: one set of rules for every front end and the library.

A front end hands in a command's values by argument name (`reply_to`, `from`, `ids`), as typed values
(an MCP call's JSON) or as the text a command line gave (`"30"`); `check` converts and checks each one,
applies the rules between arguments (one of, not together, only with), and returns the values by the
operation's keyword (`from_`) or raises InvalidInput with every problem of the call, keyed by argument
name. A problem's message names other arguments with `errors.arg(name)`, which each front end renders in
its own words (`--reply-to` on the command line, `reply_to` over MCP): no word is ever replaced inside a
message.

`guard` is the same check for the library itself: every public Mailbox operation calls it, so Python
code that skips the front ends still cannot store or return nonsense.
"""

from __future__ import annotations

from agent_mail import errors, model, spec

_DIGITS = frozenset("0123456789")


def key(arg: spec.Arg) -> str:
    """An argument's name as calls name it: the flag without dashes (`reply_to`), or the positional's name."""
    return arg.name.lstrip("-").replace("-", "_")


def flag_namer(command: spec.Command):
    """How the command line names an argument: its flag (`--reply-to`) or the positional's name; an argument of
    another command that a problem names (`profile`'s mirror_dir, from watch) as its flag."""
    names = {key(a): a.name for a in command.args}

    def name(arg_key: str) -> str:
        if arg_key in names:
            return names[arg_key]
        flags = {key(a): a.name for c in spec.COMMANDS.values() for a in c.args if not a.positional}
        return flags.get(arg_key, arg_key)
    return name


def by_key(command: spec.Command) -> dict[str, spec.Arg]:
    return {key(a): a for a in command.args}


def check(name: str, given: dict, *, skip: tuple[str, ...] = (), also: list | None = None,
          with_inputs: bool = True) -> dict:
    """`given` (argument name -> value; None or absent: not given) -> the operation's keyword values.
    Raises InvalidInput with every problem, keyed by argument name. `skip`: names this caller may not
    pass. `also`: problems the front end found before (its syntax), reported together. With problems,
    the checks that need no mailbox (a send's files, a profile's directory) run too, so one answer lists
    everything."""
    command = spec.COMMANDS[name]
    known = {k: a for k, a in by_key(command).items() if k not in skip}
    problems: list[tuple[str | None, str]] = list(also or ())
    values: dict = {}
    present: set[str] = set()
    for given_key in given:
        if given_key not in known:
            names = ", ".join(k for k, a in known.items() if a.kind != spec.REMOVED) or "none"
            problems.append((given_key, f"is not an argument of {name}; its arguments: {names}."))
    for arg_key, arg in known.items():
        value = given.get(arg_key)
        if arg.kind == spec.REMOVED:
            if value is not None and value is not False:
                present.add(arg.name)
                problems.append((arg_key, arg.removed_because))
            continue
        if value is None or (arg.kind == spec.FLAG and value is False) or (arg.repeat and value == []):
            values[arg.dest] = [] if arg.repeat else (False if arg.kind == spec.FLAG else arg.default)
            if arg.required:
                what = "argument" if arg.positional else "flag"
                problems.append((arg_key, f"is a required {what}: {arg.help}"))
            continue
        present.add(arg.name)
        converted, problem = convert(command, arg, value)
        if problem:
            problems.append((arg_key, problem))
        else:
            values[arg.dest] = converted
    problems += rule_problems(command, present)
    if problems and with_inputs:
        from agent_mail.parts import inputs  # only on the error path: find the other problems too

        seen = set(problems)
        problems += [p for p in inputs.input_problems(name, values) if p not in seen]
    if problems:
        raise errors.InvalidInput(problems)
    return values


def rule_problems(command: spec.Command, present: set[str]) -> list[tuple[str, str]]:
    """The rules between arguments, given which were present (by spec name: `--body`, `ids`)."""
    names = {a.name: key(a) for a in command.args}
    problems = []

    def listed(group) -> str:
        return ", ".join(errors.arg(names[g]) for g in group)

    for group in command.exclusive:
        used = [g for g in group if g in present]
        if len(used) > 1:
            problems.append((names[used[0]], f"cannot be combined with {listed(used[1:])}; use one."))
    for flag, needed in command.requires:
        if flag in present and needed not in present:
            problems.append((names[flag], f"only applies with {errors.arg(names[needed])}; drop it or add "
                                          f"{errors.arg(names[needed])}."))
    for group in command.one_of:
        used = [g for g in group if g in present]
        if not used:
            problems.append((names[group[0]], f"give one of: {listed(group)}."))
        elif len(used) > 1:
            problems.append((names[used[0]], f"cannot be combined with {listed(used[1:])}; use one."))
    return problems


def convert(command: spec.Command, arg: spec.Arg, value: object) -> tuple[object, str | None]:
    """One value -> (its typed value, None) or (None, why not). A repeatable argument takes a list (one
    value alone counts as a list of one)."""
    if arg.kind == spec.FLAG:
        if type(value) is not bool:
            return None, "must be true or false."
        return value, None
    if arg.kind == spec.FIELDS:
        return _fields(command, value)
    if isinstance(value, (list, tuple)):
        if not arg.repeat:
            return None, "takes one value, not a list."
        out = []
        for item in value:
            converted, problem = _one(command, arg, item)
            if problem:
                return None, problem
            out.append(converted)
        return out, None
    converted, problem = _one(command, arg, value)
    if problem:
        return None, problem
    return ([converted] if arg.repeat else converted), None


def _one(command: spec.Command, arg: spec.Arg, value: object) -> tuple[object, str | None]:
    kind = arg.kind
    if kind in (spec.INT, spec.NUMBER):
        return _number(arg, value)
    if not isinstance(value, str):
        return None, f"must be a string{' or a list of them' if arg.repeat else ''}."
    if kind in (spec.IDENTITY, spec.RECIPIENT):
        return value, model.identity_problem(value, allow_broadcast=kind == spec.RECIPIENT)
    if kind == spec.MESSAGE_ID:
        return value.lower(), model.message_id_problem(value)
    if kind == spec.PROJECT:
        if model.is_name(value):
            return value, None
        return None, f"{value!r} is not a project name: lowercase letters, digits and hyphens."
    if kind == spec.COMMAND:
        if value not in spec.COMMANDS:
            return None, unknown_command(value)
        return value, None
    if arg.choices and value not in arg.choices:
        return None, f"{value!r} is not one of: {', '.join(arg.choices)}."
    if kind == spec.PATH and not value:
        return None, "is empty; give a path."
    if "\x00" in value:
        return None, "contains a NUL character."
    if kind != spec.PATH and model.has_surrogates(value):  # a path may name a local file as the system spells it
        return None, "is not valid UTF-8 text (it holds a byte, or an escaped lone surrogate, that is not UTF-8). " \
                     "Pass UTF-8."
    return value, None


def _number(arg: spec.Arg, value: object) -> tuple[object, str | None]:
    whole = arg.kind == spec.INT
    what = "a whole number" if whole else "a number"
    if isinstance(value, str):  # as a command line spells it: plain ASCII digits only
        if not _plain_number(value, whole=whole):
            example = "e.g. 30" if whole else "e.g. 30 or 2.5"
            return None, (f"{value!r} is not {what}: use plain ASCII digits ({example}), no spaces, "
                          "underscores or exponents.")
        number: float = int(value) if whole else float(value)
    elif type(value) is int:
        number = value
    elif type(value) is float:
        if value != value or value in (float("inf"), float("-inf")):
            return None, f"must be {what}, not {value!r}."
        if whole and not value.is_integer():
            return None, f"{value!r} is not {what}."
        number = int(value) if whole else value
    else:
        return None, f"must be {what}{' or a list of them' if arg.repeat else ''}."
    low, high = arg.minimum, arg.maximum
    if (low is not None and number < low) or (high is not None and number > high):
        shown = _num(number)  # the number, however it was spelt
        if len(shown) > 40:
            shown = shown[:20] + "..." + shown[-8:]
        return None, f"{shown} is out of range; use a value from {_num(low)} to {_num(high)}."
    if not whole:
        number = float(number)
    return number, None


def _fields(command: spec.Command, value: object) -> tuple[object, str | None]:
    valid = list(command.item_fields)
    if isinstance(value, str):
        wanted = [f.strip() for f in value.split(",") if f.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        wanted = [f.strip() for f in value if f.strip()]
    else:
        return None, f"must be a list of field names (or one comma-separated string); choose from: {','.join(valid)}."
    unknown = [f for f in wanted if f not in valid]
    if not wanted:
        return None, f"is empty. Choose from: {','.join(valid)}."
    if unknown:
        return None, f"unknown field(s) {unknown}. Choose from: {','.join(valid)}."
    return list(dict.fromkeys(wanted)), None


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
    if type(value) is int:
        return str(value)
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e16 else repr(value)


def unknown_command(name: str) -> str:
    known = ", ".join(spec.COMMANDS)
    hint = closest(name, list(spec.COMMANDS))
    text = f"unknown command {name!r}."
    if hint:
        text += f" Did you mean {hint!r}?"
    return text + f" Commands: {known}. Run 'agent-mail describe' for the manual."


def closest(word: str, choices: list[str]) -> str | None:
    import difflib  # only on the error path

    found = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return found[0] if found else None


def guard(name: str, values: dict) -> None:
    """The library's own check: `values` by the operation's keywords (`from_`), as Python passes them.
    Only the spec's arguments are looked at (an operation's own extras, like `emit`, are not), and only
    those given; raises InvalidInput keyed by argument name, as a front end would see it."""
    command = spec.COMMANDS[name]
    problems: list[tuple[str | None, str]] = []
    present = set()
    for arg in command.args:
        if arg.dest not in values or arg.kind == spec.REMOVED:
            continue
        value = values[arg.dest]
        if arg.default is not None and value == arg.default and not arg.required:
            continue  # the default, as a front end fills it in: not given
        if value is None or (arg.kind == spec.FLAG and value is False) or (arg.repeat and not value
                                                                           and isinstance(value, (list, tuple))):
            if arg.required:
                problems.append((key(arg), f"is required: {arg.help}"))
            continue
        present.add(arg.name)
        if arg.kind == spec.INT and type(value) is int or arg.kind == spec.NUMBER and type(value) in (int, float):
            pass  # checked below for range
        elif arg.kind in (spec.INT, spec.NUMBER):
            problems.append((key(arg), f"must be {'a whole number' if arg.kind == spec.INT else 'a number'}, "
                                       f"not {type(value).__name__}."))
            continue
        if arg.repeat and isinstance(value, str) and arg.kind != spec.FIELDS:
            value = [value]
        _, problem = convert(command, arg, value)
        if problem:
            problems.append((key(arg), problem))
    problems += rule_problems(command, present)
    if problems:
        raise errors.InvalidInput(problems)


def guarded(name: str):
    """A Mailbox operation that checks its own arguments (`guard`) before it does anything."""
    def wrap(operation):
        def checked(self, **values):
            guard(name, values)
            return operation(self, **values)
        checked.__name__, checked.__qualname__, checked.__doc__ = operation.__name__, operation.__qualname__, \
            operation.__doc__
        checked.__wrapped__ = operation
        return checked
    return wrap
