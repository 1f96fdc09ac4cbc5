"""MCP over streamable HTTP at /mcp on a real `agent-mail serve` process, through the MCP SDK's own client, on
both backings (issue 21): the tools are those of `agent-mail mcp` the server carries out, the identity comes from
the bearer token, a token acts only as the identities it names, a missing or bad token is refused before
anything is read, a blocked watch is woken by a send from the command line and ended by SIGTERM, and no token
ever appears in any output or log line."""

from __future__ import annotations

import json
import time

import pytest

from serving import Server

mcp = pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[test]')")
import anyio  # noqa: E402
import httpx2  # noqa: E402  (the MCP SDK's HTTP client)
from mcp import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

pytestmark = [pytest.mark.backends, pytest.mark.timeout(180)]

HTTP_TOOLS = {"send", "read", "ack", "watch", "status", "heartbeat", "dismiss", "archive", "delete", "cancel",
              "notifications", "attachments", "search"}


@pytest.fixture
def server(mailbox_path):
    running = Server(str(mailbox_path))
    yield running
    running.stop()


def _json(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def connect(server: Server, token: str | None, body, seen: list | None = None):
    """Run `body(client)` in one MCP client session with the server; what it returns. Every tool result's text
    goes to `seen` (to look for the token in later)."""

    async def main():
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
            async with streamable_http_client(f"{server.url}/mcp", http_client=http) as streams:
                async with ClientSession(streams[0], streams[1]) as client:
                    await client.initialize()
                    return await body(client)

    outcome = anyio.run(main)
    if seen is not None:
        seen.append(json.dumps(outcome, default=str))
    return outcome


async def call(client, name: str, **arguments):
    result = await client.call_tool(name, arguments)
    document = json.loads(result.content[0].text)
    if result.is_error:
        return "error", document
    assert result.structured_content == document
    return "ok", document


def test_tools_send_read_and_ack_as_the_token_names(server):
    worker, lead = server.token("--agent", "deploy:worker"), server.token("--agent", "ops:lead")
    seen: list = []

    async def tools(client):
        return (await client.list_tools()).tools

    listed = connect(server, worker, tools)
    assert {t.name for t in listed} == HTTP_TOOLS
    send = next(t for t in listed if t.name == "send")
    properties = send.input_schema["properties"]
    # Nothing that names a file on the server's machine; the identity is the token's by default.
    assert not {"attach", "ref", "body_file"} & set(properties)
    assert "from" not in send.input_schema.get("required", []) and "token" in properties["from"]["description"]
    assert "save_to" not in next(t for t in listed if t.name == "attachments").input_schema["properties"]

    async def lead_sends(client):
        return await call(client, "send", to=["deploy:worker"], subject="fix X", body="please")

    state, sent = connect(server, lead, lead_sends, seen)
    assert state == "ok" and sent["sender"] == "ops:lead" and sent["delivered"] == 1, sent

    async def worker_reads(client):
        read = await call(client, "read")
        acked = await call(client, "ack", ids=[sent["id"]])
        return read, acked

    (state, read), (acked_state, acked) = connect(server, worker, worker_reads, seen)
    assert state == "ok" and read["agent"] == "deploy:worker" and [m["subject"] for m in read["messages"]] == ["fix X"]
    assert read["messages"][0]["body"] == "please"
    # Next steps are tool calls, the token's own identity left out.
    assert {"tool": "ack", "arguments": {"ids": [sent["id"]]}} in read["next"], read["next"]
    assert acked_state == "ok" and acked["acked"] == [sent["id"]]
    direct = _json(server.direct("read", "deploy:worker", "--all", "--no-mark-read"))
    assert [(m["read_at"] is not None, m["acked_at"] is not None) for m in direct["messages"]] == [(True, True)]
    for secret in (worker, lead):
        assert not any(secret in text for text in seen)


ACTING_AS_BOB = [
    ("read", {"agent": "team:bob"}), ("ack", {"agent": "team:bob", "all": True}),
    ("watch", {"agent": "team:bob", "wait_seconds": 0}), ("send", {"from": "team:bob", "to": ["team:carol"],
                                                                    "subject": "as bob"}),
    ("heartbeat", {"agent": "team:bob"}), ("dismiss", {"agent": "team:bob", "ids": ["MID"]}),
    ("archive", {"agent": "team:bob", "ids": ["MID"]}), ("delete", {"agent": "team:bob", "ids": ["MID"]}),
    ("search", {"query": "private", "agent": "team:bob"}), ("attachments", {"agent": "team:bob", "id": "MID"}),
    ("notifications", {"agent": "team:bob", "clear_email": True}),
]


def test_a_token_not_naming_the_identity_is_refused_and_nothing_changes(server):
    alice = server.token("--agent", "team:alice")
    mid = _json(server.direct("send", "--from", "team:carol", "--to", "team:bob", "--subject", "private"))["id"]
    before = (server.direct("read", "team:bob", "--all", "--no-mark-read").stdout,
              _json(server.direct("status"))["agents"])

    async def body(client):
        answers = []
        for name, arguments in ACTING_AS_BOB:
            arguments = {k: ([mid] if v == ["MID"] else mid if v == "MID" else v) for k, v in arguments.items()}
            answers.append((name, await call(client, name, **arguments)))
        return answers

    for name, (state, answer) in connect(server, alice, body):
        assert state == "error", (name, answer)
        assert "team:bob" in answer["error"] and "team:alice" in answer["error"], (name, answer)
        assert answer["problems"], answer
    after = (server.direct("read", "team:bob", "--all", "--no-mark-read").stdout,
             _json(server.direct("status"))["agents"])
    assert after == before  # nothing read, marked, sent or seen

    # A token naming several identities has no default: the call must say which, and it is told so.
    several = server.token("--agent", "team:alice", "--agent", "ops:*")

    async def unnamed(client):
        return await call(client, "read"), await call(client, "read", agent="ops:anyone")

    (state, refused), (named_state, named) = connect(server, several, unnamed)
    assert state == "error" and refused["problems"][0]["field"] == "agent", refused
    assert "team:alice, ops:*" in refused["problems"][0]["message"]
    assert named_state == "ok" and named["agent"] == "ops:anyone"


def test_arguments_naming_files_on_the_server_are_refused(server, tmp_path):
    token = server.token("--agent", "a:x")
    secret = tmp_path / "server-side.txt"
    secret.write_text("the server's own file")

    async def body(client):
        return (await call(client, "send", to=["b:y"], subject="s", attach=[str(secret)]),
                await call(client, "send", to=["b:y"], subject="s", body_file=str(secret)))

    for state, answer in connect(server, token, body):
        assert state == "error" and "server's machine" in json.dumps(answer), answer
    assert _json(server.direct("read", "b:y", "--all", "--no-mark-read"))["count"] == 0


def test_no_token_or_a_bad_one_is_refused_before_anything_is_read(server):
    token = server.token("--agent", "a:x")
    initialize = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    guessed = "am_000000000000_guessedsecretvalue"
    for extra in ({}, {"Authorization": f"Bearer {guessed}"}, {"Authorization": "Basic abc"},
                  {"Authorization": f"Bearer {token[:-2]}xx"}):
        status, answer = server.raw("/mcp", initialize, {**headers, **extra})
        assert status == 401, (extra, answer)
        error = json.loads(answer)
        assert error["error"] and "problems" in error and guessed not in answer.decode()
    server.direct("token", "revoke", token.split("_")[1])
    status, answer = server.raw("/mcp", initialize, {**headers, "Authorization": f"Bearer {token}"})
    assert status == 401 and "revoked" in json.loads(answer)["error"] and token not in answer.decode()
    # The SDK's client sees the refusal as an error, not a session.
    with pytest.raises(BaseException):
        connect(server, guessed, lambda client: client.list_tools())
    fresh = server.token("--agent", "a:x")
    status, answer = server.raw("/mcp", b"{" * 100, {**headers, "Authorization": f"Bearer {fresh}"})
    assert 400 <= status < 500, answer  # malformed JSON-RPC: a clear 4xx, the server stays up
    assert server.client(fresh, "read", "a:x").returncode == 0


def test_a_blocked_watch_is_woken_by_a_send_from_the_command_line(server):
    token = server.token("--agent", "deploy:worker")
    seen: list = []

    async def body(client):
        outcome = []

        async def send_when_armed():
            deadline = time.monotonic() + 30
            while True:
                status = await anyio.to_thread.run_sync(lambda: _json(server.direct("status", "--agent",
                                                                                    "deploy:worker")))
                if status["agents"] and status["agents"][0]["watch_state"] == "armed":
                    break
                assert time.monotonic() < deadline, "the watch never armed"
                await anyio.sleep(0.2)
            outcome.append(time.monotonic())
            await anyio.to_thread.run_sync(lambda: _json(server.direct(
                "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "wake up")))

        async with anyio.create_task_group() as group:
            group.start_soon(send_when_armed)
            answer = await call(client, "watch", wait_seconds=120)
        return answer, time.monotonic() - outcome[0]

    (state, woke), waited = connect(server, token, body, seen)
    assert state == "ok" and [m["subject"] for m in woke["messages"]] == ["wake up"], woke
    assert waited < 30  # woken by the send, not by the end of its 120 s
    assert woke["next"] and woke["next"][0]["tool"] == "read"
    code, log = server.stop()
    assert code == 0
    lines = [json.loads(line) for line in log.splitlines()]  # every line is JSON: the SDK's own logs too
    watch = [line for line in lines if line.get("command") == "watch"]
    assert watch and watch[0]["path"] == "/mcp" and watch[0]["as"] == "deploy:worker" and watch[0]["status"] == 200
    assert token not in log and not any(token in text for text in seen + server.outputs)


def test_sigterm_ends_a_blocked_watch_and_the_server_promptly(server):
    token = server.token("--agent", "a:x")
    stopped = {}

    async def body(client):
        async def stop_when_armed():
            while _json(server.direct("status", "--agent", "a:x"))["agents"][:1] == [] or \
                    _json(server.direct("status", "--agent", "a:x"))["agents"][0]["watch_state"] != "armed":
                await anyio.sleep(0.2)
            started = time.monotonic()
            stopped["code"], stopped["log"] = await anyio.to_thread.run_sync(server.stop)
            stopped["seconds"] = time.monotonic() - started

        async with anyio.create_task_group() as group:
            group.start_soon(stop_when_armed)
            return await call(client, "watch", wait_seconds=300)

    state, answer = connect(server, token, body)
    assert state == "error" and "stopping" in answer["error"], answer
    assert stopped["code"] == 0 and stopped["seconds"] < 10, stopped
    assert _json(server.direct("status", "--agent", "a:x"))["agents"][0]["watch_state"] == "released"
