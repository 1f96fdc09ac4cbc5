"""`agent-mail mcp` through the MCP SDK's own client, the server a real subprocess over stdio."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from agent_mail import spec
from tests.lib.cli import am_process, process_env
from tests.lib.waiting import armed, disarmed, presences

mcp = pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[test]')")
import anyio  # noqa: E402
from mcp import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL

ME = "deploy:worker"
TOOLS = {"send", "read", "ack", "watch", "status", "heartbeat", "dismiss", "archive", "delete", "cancel",
         "notifications", "attachments", "search", "reserve", "release", "reservations"}


def session(body, *server_args: str, cwd=None):
    """Run `body(client)` against a fresh server process; return what it returns."""

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "agent_mail", "mcp", *server_args],
                                       env=process_env(), cwd=cwd)
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                return await body(client)

    return anyio.run(main)


async def call(client, name: str, **arguments):
    result = await client.call_tool(name, arguments)
    text = json.loads(result.content[0].text)
    if result.is_error:
        return "error", text
    assert result.structured_content == text  # the text and the structured result are one document
    return "ok", text


def test_tools_are_the_spec_commands_with_schemas_and_stay_small():
    async def body(client):
        return (await client.list_tools()).tools

    tools = session(body, "--agent", ME)
    assert {t.name for t in tools} == TOOLS
    listing = json.dumps([t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in tools])
    assert len(listing) < 19_000, len(listing)  # 16 tools (3 for reservations, ~4,500), each read into the context
    send = next(t for t in tools if t.name == "send")
    props = send.input_schema["properties"]
    assert props["to"] == {"type": "array", "items": {"type": "string"}, "description": props["to"]["description"]}
    delay = spec.COMMANDS["send"].arg("--delay-minutes")
    assert props["delay_minutes"]["type"] == "number" and props["delay_minutes"]["maximum"] == delay.maximum
    assert props["require_reachable"]["type"] == "boolean" and "reply_to" in props and "no_ack" in props
    assert "from" not in send.input_schema.get("required", []) and ME in props["from"]["description"]
    assert send.input_schema["additionalProperties"] is False
    read = next(t for t in tools if t.name == "read")
    assert read.input_schema["properties"]["limit"]["minimum"] == 1
    assert set(read.output_schema["properties"]) == set(spec.COMMANDS["read"].output)
    fields = read.input_schema["properties"]["fields"]
    assert fields["type"] == "array" and fields["items"]["enum"] == list(spec.COMMANDS["read"].item_fields)
    watch = next(t for t in tools if t.name == "watch")
    assert "timeout_minutes" not in watch.input_schema["properties"]
    assert watch.input_schema["properties"]["wait_seconds"]["maximum"] == 600

    # A supervisor's server without --agent: the identity is a required argument.
    tools = session(body, "--supervisor")
    assert "from" in next(t for t in tools if t.name == "send").input_schema["required"]
    assert "agent" in next(t for t in tools if t.name == "read").input_schema["required"]


def test_every_tool_answers_with_the_cli_document_and_next_steps_as_tool_calls(tmp_path):
    attachment = tmp_path / "notes.txt"
    attachment.write_text("the notes")

    async def body(client):
        seen = {}
        seen["send"] = await call(client, "send", **{"from": "boss:lead"}, to=[ME], subject="do it", body="now",
                                  attach=[str(attachment)])
        first = seen["send"][1]["id"]
        seen["heartbeat"] = await call(client, "heartbeat")
        seen["watch"] = await call(client, "watch", wait_seconds=0)
        seen["read"] = await call(client, "read")
        narrow = await call(client, "read", all=True, fields=["id", "subject"])
        seen["search"] = await call(client, "search", query="do it")  # what the session's identity may see
        private = await call(client, "search", query="do it", agent="boss:other")
        seen["ack"] = await call(client, "ack", ids=[first])
        seen["attachments"] = await call(client, "attachments", id=first, save_to="saved")
        second = (await call(client, "send", **{"from": "boss:lead"}, to=[ME], subject="two"))[1]["id"]
        seen["dismiss"] = await call(client, "dismiss", ids=[second])
        seen["archive"] = await call(client, "archive", ids=[first])
        seen["delete"] = await call(client, "delete", ids=[first])
        later = (await call(client, "send", to=["boss:lead"], subject="later", delay_minutes=5))[1]["id"]
        seen["cancel"] = await call(client, "cancel", ids=[later])
        seen["notifications"] = await call(client, "notifications")
        seen["status"] = await call(client, "status")
        seen["_narrow"] = narrow
        seen["_private"] = private
        return seen

    seen = session(body, "--agent", ME, "--supervisor", cwd=str(tmp_path))  # it sends as boss:lead too
    outcome, narrow = seen.pop("_narrow")
    assert seen.pop("_private") == ("ok", {"query": "do it", "results": [], "count": 0, "more": False, "next": []})
    assert outcome == "ok" and set(narrow["messages"][0]) == {"id", "subject"}
    assert set(seen) == TOOLS - {"reserve", "release", "reservations"}  # need a repository: see below
    for name, (outcome, document) in seen.items():
        assert outcome == "ok", (name, document)
        assert set(document) == set(spec.COMMANDS[name].output), name
    assert seen["send"][1]["deliveries"][0]["status"] == "delivered"
    assert seen["watch"][1]["count"] == 1 and seen["watch"][1]["next"] == [{"tool": "read", "arguments": {}}]
    read = seen["read"][1]
    assert read["messages"][0]["body"] == "now"
    # The step to take, as a tool call: the identity left out (it is the session's), the ids as a list.
    assert read["next"][0] == {"tool": "ack", "arguments": {"ids": [seen["send"][1]["id"]]}}
    assert seen["ack"][1]["count"] == 1
    found = seen["search"][1]
    assert [r["subject"] for r in found["results"]] == ["do it"] and found["results"][0]["attachments"] == ["notes.txt"]
    assert found["next"] == [{"tool": "read", "arguments": {"thread": seen["send"][1]["id"]}}]
    assert (tmp_path / "saved" / "notes.txt").read_text() == "the notes"
    assert seen["cancel"][1]["count"] == 1
    assert any(a["agent"] == ME for a in seen["status"][1]["agents"])
    # The same mailbox, seen from the command line.
    state = json.loads(am_process("read", ME, "--all", "--no-mark-read").stdout)
    assert [m["subject"] for m in state["messages"]] == ["two"]


def test_bad_arguments_are_tool_errors_naming_the_argument_and_change_nothing(tmp_path):
    async def body(client):
        results = [
            await call(client, "send", to=[ME], subject="", body="x"),
            await call(client, "send", to="not an identity", subject="s"),
            await call(client, "send", to=[ME], subject="s", no_ack=True),
            await call(client, "send", to=[ME], subject="s", delay_minutes="soon"),
            await call(client, "send", to=[ME], subject="s", bogus=1),
            await call(client, "read", limit=0),
            await call(client, "read", agent="Bad Name"),
            await call(client, "watch", wait_seconds=601),
            await call(client, "ack", ids=["not-a-uuid"]),
            await call(client, "attachments", id="9f1c2e34-5678-4abc-9def-0123456789ab", save_to="../outside"),
            await call(client, "describe"),
            await call(client, "read", fields=["id", "colour"]),
        ]
        return results

    results = session(body, "--agent", ME, cwd=str(tmp_path))
    fields = []
    for outcome, document in results:
        assert outcome == "error", document
        assert document["error"] and "Traceback" not in document["error"]
        fields.append({p["field"] for p in document.get("problems", [])})
    assert fields[0] == {"subject"} and "to" in fields[1] and fields[2] == {"no_ack"}
    assert fields[3] == {"delay_minutes"} and fields[4] == {"bogus"} and fields[5] == {"limit"}
    assert fields[6] == {"agent"} and fields[7] == {"wait_seconds"} and fields[8] == {"ids"}
    assert fields[9] == {"save_to"} and "describe" in results[10][1]["error"] and fields[11] == {"fields"}
    assert "only applies with reply_to" in results[2][1]["problems"][0]["message"]  # named as the tool names it
    assert not (tmp_path.parent / "outside").exists()
    assert json.loads(am_process("status").stdout)["count"] == 0  # nothing was stored


def test_a_blocked_watch_is_woken_by_a_send_from_another_process():
    sent = {}

    async def body(client):
        async def send_later():
            await anyio.to_thread.run_sync(lambda: armed(ME))  # the watch is blocked
            sent["at"] = time.monotonic()
            done = await anyio.to_thread.run_sync(lambda: am_process(
                "send", "--from", "boss:lead", "--to", ME, "--subject", "wake up"))
            assert done.returncode == 0, done.stderr

        async with anyio.create_task_group() as group:
            group.start_soon(send_later)
            started = time.monotonic()
            outcome = await call(client, "watch", wait_seconds=120)
            return outcome, time.monotonic() - started

    (outcome, document), waited = session(body, "--agent", ME)
    assert outcome == "ok" and [m["subject"] for m in document["messages"]] == ["wake up"]
    assert document["timeout"] is False and waited < 60  # woken, well before its 120 s wait


def test_the_server_says_what_to_install_when_the_sdk_is_missing():
    code = "import sys; sys.modules['mcp'] = None; from agent_mail.cli.main import main; sys.exit(main(['mcp']))"
    proc = subprocess.run([sys.executable, "-c", code], env=process_env(), capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 1 and proc.stdout == ""
    assert "pip install 'agent-mail[mcp]'" in json.loads(proc.stderr)["error"]


def test_the_server_ends_when_its_client_goes_away():
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "mcp", "--agent", ME], env=process_env(),
                            stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert os.environ.get("AGENT_MAIL_DB")  # the fixture's mailbox, never the user's


def test_a_cancelled_watch_call_releases_its_session():
    """A client that stops waiting (its own timeout, a cancel) does not leave the identity shown as armed
    for the rest of the wait: the watch gives up at its next refresh (every 5 s)."""

    async def body(client):
        with anyio.move_on_after(2):
            await client.call_tool("watch", {"wait_seconds": 600})
        # the server is still running: only the call was given up
        await anyio.to_thread.run_sync(lambda: disarmed(ME))
        return presences(ME)[ME]["watch_state"]

    assert session(body, "--agent", ME) == "released"


def test_numbers_are_judged_as_numbers_and_raw_infinity_or_nan_is_refused():
    async def body(client):
        tiny = await call(client, "send", to=["p:b"], subject="soon", delay_minutes=1e-300)
        huge = await call(client, "read", limit=10**30)
        return tiny, huge

    tiny, huge = session(body, "--agent", ME)
    assert tiny[0] == "ok"
    assert huge[0] == "error" and huge[1]["problems"][0]["field"] == "limit"
    assert "out of range" in huge[1]["problems"][0]["message"]
    # The SDK client sends Infinity/NaN as null (not given); a raw token, which Python's JSON reader takes, is
    # refused as a number that is not finite, naming the argument.
    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
             {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    raw = "\n".join(json.dumps(line) for line in lines) + "\n" + \
        '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "read", "arguments": ' \
        '{"limit": Infinity}}}\n'
    # stdin stays open until the answer came: at end of input the server may stop before it answers.
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "mcp", "--agent", ME], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=process_env())
    try:
        proc.stdin.write(raw)
        proc.stdin.flush()
        answers = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(a.get("id") == 2 for a in answers):
            line = proc.stdout.readline()
            if not line:
                break
            if line.strip():
                answers.append(json.loads(line))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    answer = [a for a in answers if a.get("id") == 2][0]
    assert answer["result"]["isError"] is True
    problems = json.loads(answer["result"]["content"][0]["text"])["problems"]
    assert problems == [{"field": "limit", "message": "must be a whole number, not inf."}]
    assert json.loads(am_process("read", ME).stdout)["count"] == 0


def test_a_session_acts_only_as_its_own_identity_unless_started_for_a_supervisor():
    other = "boss:lead"
    theirs = json.loads(am_process("send", "--from", "x:y", "--to", other, "--subject", "for boss only").stdout)["id"]

    async def body(client):
        return [
            await call(client, "send", **{"from": other}, to=[ME], subject="forged"),
            await call(client, "read", agent=other),
            await call(client, "ack", agent=other, ids=[theirs]),
            await call(client, "watch", agent=other, wait_seconds=0),
            await call(client, "dismiss", agent=other, ids=[theirs]),
            await call(client, "cancel", sender=other, ids=[theirs]),
            await call(client, "attachments", agent=other, id=theirs),
            await call(client, "search", query="boss", agent=other),
            await call(client, "heartbeat", agent=other),
            await call(client, "read", agent=None),  # null is "not given": the session's own
            await call(client, "send", **{"from": ME}, to=[other], subject="mine"),  # its own name, said aloud
        ]

    *refused, own_read, own_send = session(body, "--agent", ME)
    for (outcome, document), field in zip(refused, ["from", "agent", "agent", "agent", "agent", "sender", "agent",
                                                    "agent", "agent"], strict=True):
        assert outcome == "error", document
        assert [p["field"] for p in document["problems"]] == [field]
        assert "acts as deploy:worker only" in document["error"] and "--supervisor" in document["error"]
    assert own_read[0] == "ok" and own_read[1]["agent"] == ME and own_send[0] == "ok"
    state = json.loads(am_process("read", other, "--no-mark-read").stdout)
    assert [m["subject"] for m in state["messages"]] == ["for boss only", "mine"]  # untouched, still unread
    assert json.loads(am_process("read", ME, "--no-mark-read").stdout)["count"] == 0  # nothing forged

    # A supervisor's server may name any identity; setup never writes one.
    async def supervise(client):
        return await call(client, "read", agent=other, no_mark_read=True)

    outcome, document = session(supervise, "--agent", "ops:human", "--supervisor")
    assert outcome == "ok" and document["count"] == 2
    # Neither an identity nor --supervisor: the server refuses to start, naming the argument.
    env = {k: v for k, v in process_env().items() if k != "AGENT_MAIL_AGENT"}
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "mcp"], env=env, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == ""
    assert json.loads(proc.stderr)["problems"][0]["field"] == "--agent"


@pytest.mark.sqlite_only
def test_a_send_never_reads_the_mailbox_file_itself(tmp_path, mailbox_path):
    """The server runs calls side by side, so one call's connection may be open while another reads its files: the
    mailbox (by any name: a hard link here) is never opened outside SQLite (issue 32, finding 5)."""
    assert am_process("send", "--from", "p:a", "--to", "p:b", "--subject", "first").returncode == 0
    linked = tmp_path / "another-name.db"
    os.link(mailbox_path, linked)

    async def body(client):
        return [await call(client, "send", to=["p:b"], subject="a", attach=[str(mailbox_path)]),
                await call(client, "send", to=["p:b"], subject="b", body_file=str(linked))]

    results = session(body, "--agent", ME, "--root", str(tmp_path), cwd=str(tmp_path))
    for (outcome, document), field in zip(results, ["attach", "body_file"], strict=True):
        assert outcome == "error", document
        assert [p["field"] for p in document["problems"]] == [field], document
        assert "is the mailbox itself" in document["error"], document
    assert [m["subject"] for m in json.loads(am_process("read", "p:b").stdout)["messages"]] == ["first"]


def test_a_send_may_name_only_files_inside_the_working_tree_or_a_listed_root(tmp_path):
    project, shared, outside = tmp_path / "project", tmp_path / "shared", tmp_path / "outside"
    for directory in (project, shared, outside):
        directory.mkdir()
    (project / "notes.txt").write_text("inside")
    (shared / "spec.md").write_text("listed root")
    (outside / "secret.txt").write_text("not yours")
    (project / "link.txt").symlink_to(outside / "secret.txt")  # a link inside that leads outside
    (project / "sub").mkdir()

    async def body(client):
        return [
            await call(client, "send", to=["p:b"], subject="a", attach=["/etc/passwd"]),
            await call(client, "send", to=["p:b"], subject="b", attach=["link.txt"]),
            await call(client, "send", to=["p:b"], subject="c", ref=["../outside/secret.txt"]),
            await call(client, "send", to=["p:b"], subject="d", refs=json.dumps([str(outside / "secret.txt")])),
            await call(client, "send", to=["p:b"], subject="e", body_file=str(outside / "secret.txt")),
            await call(client, "send", to=["p:b"], subject="f", body_file="-"),
            await call(client, "send", to=["p:b"], subject="g", attach=[str(outside / "nothing-here")]),
            await call(client, "send", to=["p:b"], subject="ok", attach=["notes.txt", str(shared / "spec.md")],
                       ref=["sub"], body_file="notes.txt"),
        ]

    results = session(body, "--agent", ME, "--root", str(shared), cwd=str(project))
    *refused, accepted = results
    fields = ["attach", "attach", "ref", "refs", "body_file", "body_file", "attach"]
    for (outcome, document), field in zip(refused, fields, strict=True):
        assert outcome == "error", document
        assert [p["field"] for p in document["problems"]] == [field], document
    assert "outside the directories this session may read files from" in refused[0][1]["error"]
    assert "does not exist" not in refused[6][1]["error"]  # what lies outside is not even looked at
    assert "standard input" in refused[5][1]["error"]
    assert accepted[0] == "ok", accepted
    stored = json.loads(am_process("read", "p:b").stdout)["messages"]
    assert [m["subject"] for m in stored] == ["ok"] and stored[0]["body"] == "inside"
    assert sorted(stored[0]["attachments"][i]["name"] for i in range(2)) == ["notes.txt", "spec.md"]


def test_what_a_watch_or_read_result_showed_the_model_is_not_told_again_by_the_hooks():
    """Issue 20 #2: in a harness session (the hooks and this server children of one harness process) mail the
    model saw in a watch or read result counts as told: no PostToolUse context and no held stop repeat it;
    mail that came after the result is still told."""
    def hook(event: str, name: str, **extra) -> bytes:
        document = {"session_id": "s-mcp", "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp",
                    "hook_event_name": name, "permission_mode": "default", **extra}
        done = am_process("hook", "claude-code", event, "--agent", ME, input=json.dumps(document).encode())
        assert done.returncode == 0, done.stderr
        return done.stdout

    hook("context", "SessionStart", source="startup")
    am_process("send", "--from", "boss:lead", "--to", ME, "--subject", "seen in the watch")

    async def body(client):
        return await call(client, "watch", wait_seconds=0)

    status, result = session(body, "--agent", ME)
    assert status == "ok" and [m["subject"] for m in result["messages"]] == ["seen in the watch"]
    assert hook("context", "PostToolUse", tool_name="mcp__agent-mail__watch", tool_input={},
                tool_response={}) == b""
    assert hook("stop", "Stop", stop_hook_active=False) == b""
    am_process("send", "--from", "boss:lead", "--to", ME, "--subject", "arrived later")
    note = json.loads(hook("context", "PostToolUse", tool_name="Bash", tool_input={}, tool_response={}))
    text = note["hookSpecificOutput"]["additionalContext"]
    assert "arrived later" in text and "seen in the watch" not in text


def test_reservation_tools_act_as_the_session_and_refuse_another_identity(tmp_path):
    """Issue 22: reserve, release and reservations as tools; the session reserves as itself only, and a clash
    comes back with the holder and the send that asks them, as a tool call."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=tmp_path, check=True)
    held = am_process("reserve", "boss:lead", "docs/", "--reason", "rewriting", cwd=str(tmp_path))
    assert held.returncode == 0, held.stderr

    async def body(client):
        seen = {"reserve": await call(client, "reserve", patterns=["src/**"], reason="parser")}
        seen["clash"] = await call(client, "reserve", patterns=["docs/x.md"])
        seen["other"] = await call(client, "reserve", agent="boss:lead", patterns=["lib/**"])
        seen["check"] = await call(client, "reservations", check=True, paths=["docs/a.md", "src/lib.rs"])
        seen["reservations"] = await call(client, "reservations")
        seen["release"] = await call(client, "release", all=True)
        return seen

    seen = session(body, "--agent", ME, cwd=str(tmp_path))
    outcome, reserved = seen["reserve"]
    assert outcome == "ok" and reserved["agent"] == ME and reserved["granted"] == ["/src/**"]
    assert set(reserved) == set(spec.COMMANDS["reserve"].output)
    assert reserved["next"] == [{"tool": "release", "arguments": {"patterns": ["/src/**"]}}]
    outcome, clash = seen["clash"]
    assert outcome == "ok" and clash["granted"] == [] and clash["conflicts"][0]["holder"] == "boss:lead"
    assert clash["next"][0]["tool"] == "send" and clash["next"][0]["arguments"]["to"] == ["boss:lead"]
    outcome, other = seen["other"]
    assert outcome == "error" and "acts as deploy:worker only" in other["problems"][0]["message"]
    outcome, check = seen["check"]
    assert check["ok"] is False and [c["pattern"] for c in check["conflicts"]] == ["docs/a.md"]
    listed = seen["reservations"][1]
    assert sorted(r["agent"] for r in listed["reservations"]) == ["boss:lead", ME]
    assert set(seen["release"][1]) == set(spec.COMMANDS["release"].output)
    assert seen["release"][1]["count"] == 1


def test_the_tools_say_mail_is_data_and_results_write_no_control_characters(mailbox_path):
    """The server's instructions and every tool that returns mail tell the model it is another agent's words, not
    its user's; a stored subject's C1 and ESC reach the model escaped in the text (the same string, decoded)."""
    from tests.lib.mailbox import raw_db

    sent = json.loads(am_process("send", "--from", "boss:lead", "--to", ME, "--subject", "plain").stdout)["id"]
    db = raw_db(str(mailbox_path))  # as an older version could have stored it: send refuses it now
    try:
        with db:
            db.execute("UPDATE messages SET subject = ? WHERE id = ?", ("fix\x9b2J\x1b]0;t\x07", sent))
    finally:
        db.close()

    async def main():
        params = StdioServerParameters(command=sys.executable, args=["-m", "agent_mail", "mcp", "--agent", ME],
                                       env=process_env())
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as client:
                started = await client.initialize()
                tools = (await client.list_tools()).tools
                result = await client.call_tool("read", {"no_mark_read": True})
                return started.instructions, tools, result

    instructions, tools, result = anyio.run(main)
    assert spec.MAIL_IS_DATA in instructions
    described = {t.name: t.description for t in tools}
    for name in ("read", "watch", "search"):
        assert spec.MAIL_IS_DATA in described[name], name
    text = result.content[0].text
    assert not result.is_error and "\x9b" not in text and "\x1b" not in text and "\x07" not in text, text
    assert '"fix\\u009b2J\\u001b]0;t\\u0007"' in text
    assert json.loads(text)["messages"][0]["subject"] == "fix\x9b2J\x1b]0;t\x07" == \
        result.structured_content["messages"][0]["subject"]
