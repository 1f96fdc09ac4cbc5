"""The call layer: every front end answers the same bad input with the same problems, each in its own names.

Table-driven over every command of the spec: for each argument a value of its kind that must be refused is
given through the command line (words), through the call layer (values by argument name, as MCP, hooks, the
dashboard and a server hand them in) and, for the MCP tools, through the MCP server's own handler; the
problems must be the same, keyed by the argument as each front end names it.
"""

from __future__ import annotations

import json
import threading

import pytest

from agent_mail import calls, errors, spec
from agent_mail.parts import checks
from agent_mail.cli import main
from agent_mail.protocols import mcp_tools

pytestmark = pytest.mark.fast

VALID = {
    spec.IDENTITY: "proj:alice",
    spec.RECIPIENT: "proj:bob",
    spec.MESSAGE_ID: "0192f1d2-0000-7000-8000-000000000000",
    spec.TEXT: "x",
    spec.PATH: "somewhere",
    spec.JSON: "[]",
    spec.COMMAND: "send",
}

# A value of each kind that no call may take, as a command line spells it and as a named call gives it.
BAD_WORDS = {
    spec.IDENTITY: "NOT A VALID ID",
    spec.RECIPIENT: "Not:Valid",
    spec.MESSAGE_ID: "not-an-id",
    spec.COMMAND: "sned",
    spec.PATH: "",
    spec.TEXT: "nul\x00inside",
    spec.JSON: "nul\x00inside",
    spec.FIELDS: "id,nonsense",
}


def _bad_number(arg: spec.Arg):
    if arg.maximum is not None:
        return arg.maximum * 10 + 1
    if arg.minimum is not None:
        return arg.minimum - 1
    return None


def _baseline(command: spec.Command) -> dict:
    """Values by argument name that satisfy every required argument and one-of rule."""
    given = {}
    needed = {a.name for a in command.args if a.required} | {group[0] for group in command.one_of}
    for arg in command.args:
        if arg.name in needed:
            value = VALID.get(arg.kind, "x")
            if arg.kind == spec.FLAG:
                value = True
            given[checks.key(arg)] = [value] if arg.repeat else value
    return given


def _words(command: spec.Command, given: dict) -> list[str]:
    words, positionals = [], []
    for arg in command.args:
        value = given.get(checks.key(arg))
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        if arg.kind == spec.FIELDS and isinstance(value, list):
            values = [",".join(value)]
        if arg.positional:
            positionals += [str(v) for v in values]
        elif arg.kind == spec.FLAG:
            words.append(arg.name)
        else:
            words += [f"{arg.name}={_spelt(v)}" for v in values]
    return words + ["--"] + positionals if positionals else words


def _spelt(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _cases():
    for command in spec.COMMANDS.values():
        for arg in command.args:
            if arg.kind in (spec.INT, spec.NUMBER):
                bad = _bad_number(arg)
            else:
                bad = BAD_WORDS.get(arg.kind)
            if bad is None:
                continue
            if arg.kind == spec.FIELDS:
                bad = bad.split(",")
            yield pytest.param(command.name, checks.key(arg), bad, id=f"{command.name}-{checks.key(arg)}")


@pytest.mark.parametrize("name,key,bad", list(_cases()))
def test_the_command_line_and_a_named_call_refuse_the_same_value_with_the_same_problems(name, key, bad):
    command = spec.COMMANDS[name]
    given = _baseline(command)
    arg = checks.by_key(command)[key]
    given[key] = [bad] if arg.repeat and not isinstance(bad, list) else bad
    with pytest.raises(errors.InvalidInput) as named:
        calls.check(name, given)
    with pytest.raises(errors.InvalidInput) as words:
        main.parse([name] + _words(command, given))
    # The same problems; the command line names arguments as flags, a named call by their names.
    assert sorted(map(json.dumps, named.value.renamed(main.namer(command)).problems())) == \
        sorted(map(json.dumps, words.value.problems()))
    assert key in {p["field"] for p in named.value.problems()}
    assert arg.name in {p["field"] for p in words.value.problems()}


def _mcp_problems(name: str, arguments: dict) -> list[dict]:
    import anyio

    from agent_mail.harness import mcp_stdio

    server = mcp_stdio.AgentMailServer(None, ".")
    result = anyio.run(server.call_tool, name, arguments)
    assert result.is_error, result
    return json.loads(result.content[0].text)["problems"]


@pytest.mark.parametrize("name,key,bad", [c for c in _cases() if c.values[0] in
                                          mcp_tools.TOOLS])
def test_mcp_refuses_the_same_value_with_the_same_problems_in_its_own_names(name, key, bad):
    command = spec.COMMANDS[name]
    given = _baseline(command)
    given[key] = bad
    if key in {checks.key(command.arg(f)) for f in mcp_tools.NOT_TOOL_ARGS.get(name, ())}:
        pytest.skip("not a tool argument")
    with pytest.raises(errors.InvalidInput) as named:
        calls.check(name, given)
    assert sorted(map(json.dumps, _mcp_problems(name, given))) == sorted(map(json.dumps, named.value.problems()))


def test_mcp_numbers_are_judged_as_numbers_not_by_their_spelling():
    tiny = calls.check("send", {"from": "p:a", "to": ["p:b"], "subject": "s", "delay_minutes": 1e-300})
    assert tiny["delay_minutes"] == 1e-300
    with pytest.raises(errors.InvalidInput) as huge:
        calls.check("read", {"agent": "p:a", "limit": 10**30})
    assert "out of range" in huge.value.problems()[0]["message"]
    for bad in (float("nan"), float("inf"), True, "5x", 2.5, [5]):
        with pytest.raises(errors.InvalidInput) as refused:
            calls.check("read", {"agent": "p:a", "limit": bad})
        assert refused.value.problems()[0]["field"] == "limit"


def test_a_rule_between_arguments_names_them_in_each_front_ends_words():
    with pytest.raises(errors.InvalidInput) as named:
        calls.check("send", {"from": "p:a", "to": ["p:b"], "subject": "s", "no_ack": True})
    problem = named.value.problems()[0]
    assert problem == {"field": "no_ack", "message": "only applies with reply_to; drop it or add reply_to."}
    with pytest.raises(errors.InvalidInput) as words:
        main.parse(["send", "--from", "p:a", "--to", "p:b", "--subject", "s", "--no-ack"])
    assert words.value.problems()[0] == {"field": "--no-ack",
                                         "message": "only applies with --reply-to; drop it or add --reply-to."}
    assert _mcp_problems("send", {"from": "p:a", "to": ["p:b"], "subject": "s", "no_ack": True})[0] == problem


def test_the_hook_and_the_dashboard_check_their_identity_through_the_call_layer(monkeypatch):
    from agent_mail import dashboard
    from agent_mail.harness import hooks

    expected = checks.convert(spec.COMMANDS["hook"], spec.COMMANDS["hook"].arg("--agent"), "Bad Agent")[1]
    monkeypatch.setenv("AGENT_MAIL_AGENT", "Bad Agent")
    with pytest.raises(errors.InvalidInput) as hook:
        hooks.run("claude-code", "context", None, lambda document: None)
    assert hook.value.problems() == [{"field": "agent", "message": expected}]
    with pytest.raises(errors.InvalidInput) as board:
        dashboard.run(human="Bad Agent")
    assert board.value.problems() == [{"field": "as", "message": expected}]


def test_an_unknown_argument_of_a_named_call_is_refused_with_the_known_ones():
    with pytest.raises(errors.InvalidInput) as refused:
        calls.check("status", {"bogus": 1})
    assert refused.value.problems()[0]["field"] == "bogus"
    assert "its arguments:" in refused.value.problems()[0]["message"]


def test_a_named_call_is_carried_out_and_returns_data():
    sent = calls.call("send", {"from": "p:a", "to": ["p:b"], "subject": "hello"})
    assert sent["refused"] == 0 and sent["id"]
    read = calls.call("read", {"agent": "p:b"})
    assert [m["subject"] for m in read["messages"]] == ["hello"]
    assert isinstance(read["next"][0], spec.Step)


def test_mcp_watch_wait_is_checked_by_the_same_rules():
    problems = _mcp_problems("watch", {"agent": "p:a", "wait_seconds": 601})
    assert problems == [{"field": "wait_seconds", "message": "601 is out of range; use a value from 0 to 600."}]
    assert threading.active_count() >= 1


# ---- The library guards itself: each public operation, called from Python, refuses what the spec refuses.

MAILBOX_OPERATIONS = ("send", "read", "ack", "watch", "heartbeat", "dismiss", "archive", "delete", "cancel",
                      "attachments", "profile", "notifications", "status", "search", "cleanup")


def _library_call(name: str, values: dict):
    """Call operation `name` as Python code would (keywords, typed values), on this test's mailbox."""
    from agent_mail.operations import history, location, mail

    if name in MAILBOX_OPERATIONS:
        with mail.open_mailbox() as mailbox:
            return getattr(mailbox, name)(**values)
    if name == "export":
        with mail.open_mailbox() as mailbox:
            return history.export(mailbox.store, **{k: values.get(k) for k in ("format", "output", "agent",
                                                                                 "since_days")})
    if name == "import":
        with mail.open_mailbox() as mailbox:
            return history.import_file(mailbox.store, values.get("file"), values.get("dry_run", False))
    if name == "doctor":
        return location.doctor(**values)
    if name == "copy":
        return location.copy_mailbox(**values)
    raise AssertionError(name)


LIBRARY = MAILBOX_OPERATIONS + ("export", "import", "doctor", "copy")


@pytest.mark.parametrize("name,key,bad", [c for c in _cases() if c.values[0] in LIBRARY])
def test_each_public_operation_refuses_a_bad_value_from_python_naming_the_argument(name, key, bad):
    command = spec.COMMANDS[name]
    arg = checks.by_key(command)[key]
    values = {}
    for given_key, value in {**_baseline(command), key: bad}.items():
        spec_arg = checks.by_key(command)[given_key]
        if spec_arg.kind == spec.MESSAGE_ID and spec_arg.repeat and not isinstance(value, list):
            value = [value]
        values[spec_arg.dest] = value
    if arg.repeat and not isinstance(values[arg.dest], list):
        values[arg.dest] = [values[arg.dest]]
    with pytest.raises(errors.InvalidInput) as refused:
        _library_call(name, values)
    assert key in {p["field"] for p in refused.value.problems()}, refused.value.problems()


def test_the_library_refuses_what_the_issue_found_it_accepting():
    from agent_mail.operations import mail

    with mail.open_mailbox() as mailbox:
        with pytest.raises(errors.InvalidInput) as read:
            mailbox.read(agent="NOT A VALID ID", limit=-5)
        assert {p["field"] for p in read.value.problems()} == {"agent", "limit"}
        with pytest.raises(errors.InvalidInput) as status:
            mailbox.status(agent="also bad")
        assert status.value.problems()[0]["field"] == "agent"
        with pytest.raises(errors.InvalidInput):
            mailbox.ack(agent="p:a")  # neither ids nor all
        with pytest.raises(errors.InvalidInput):
            mailbox.send(from_="p:a", to=[], subject="s")


def _text_args():
    for command in spec.COMMANDS.values():
        for arg in command.args:
            if arg.kind not in (spec.INT, spec.NUMBER, spec.FLAG, spec.FIELDS, spec.PATH, spec.REMOVED):
                yield pytest.param(command.name, checks.key(arg), id=f"{command.name}-{checks.key(arg)}")


@pytest.mark.parametrize("name,key", list(_text_args()))
def test_a_lone_surrogate_in_any_text_is_refused_by_name_before_anything_is_done(name, key):
    """A JSON client can send an escaped lone surrogate ("\\udbff") where a command line cannot: every text argument
    refuses it by name (a server once stored some of them, or failed with a 500, for reserve, release,
    reservations and a hook's session)."""
    command = spec.COMMANDS[name]
    given = _baseline(command)
    arg = checks.by_key(command)[key]
    given[key] = ["x\udbff"] if arg.repeat else "x\udbff"
    with pytest.raises(errors.InvalidInput) as refused:
        calls.check(name, given)
    assert key in {p["field"] for p in refused.value.problems()}, refused.value.problems()
