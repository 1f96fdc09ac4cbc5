"""What `agent-mail serve` offers beside the calls, as real processes on both backings (issue 21): the OpenAPI
document (valid, every served command, held to by schemathesis against the live server), export and import
carried between the client's machine and the server, MCP over streamable HTTP at /mcp."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.lib.cli import json_of, process_env
from tests.lib.serving import Server

from agent_mail.protocols import http_api

pytestmark = [pytest.mark.backends, pytest.mark.timeout(180)]


def _openapi(server: Server) -> dict:
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", "/openapi.json")
        response = connection.getresponse()
        assert response.status == 200
        return json.loads(response.read())
    finally:
        connection.close()


def test_the_openapi_document_is_valid_and_covers_every_served_command(server):
    from openapi_spec_validator import validate

    from agent_mail.protocols import http_api, schemas
    from agent_mail.server import openapi
    from agent_mail import spec

    document = _openapi(server)
    validate(document)
    for name in openapi.SERVED:
        operation = document["paths"][f"/v1/call/{name}"]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        command = spec.COMMANDS[name]
        # The same arguments, types, forms and ranges as the MCP tools: both are made by agent_mail.protocols.schemas.
        assert body == openapi.call_schema(name), name
        plain = schemas.arguments_schema(command)["properties"]
        for key, value in body["properties"].items():
            listed = next((v for v in value.get("anyOf", ()) if v.get("type") == "array"), value)
            if key in plain:
                assert listed["type"] == plain[key]["type"], (name, key)
                for word in ("minimum", "maximum", "enum", "items"):
                    if word in plain[key] and word != "items":
                        assert listed[word] == plain[key][word], (name, key, word)
                    elif word == "items" and "items" in plain[key]:
                        assert listed["items"]["type"] == plain[key]["items"]["type"], (name, key)
        assert not set(openapi.LOCAL_TO_CLIENT.get(name, ())) & set(body["properties"]), name
        assert set(operation["responses"]) >= {"200", "400", "401", "403", "default"}
        assert "X-Agent-Mail-Exit" in operation["responses"]["200"]["headers"]
    # The version check (server/versions.py) on every operation: asked of the client, said on every answer.
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert {"name": "X-Agent-Mail-Version", "in": "header"}.items() <= next(
                p for p in operation["parameters"] if p["name"] == "X-Agent-Mail-Version").items(), (path, method)
            assert "400" in operation["responses"], (path, method)
            assert all("X-Agent-Mail-Version" in answer["headers"] for code, answer in operation["responses"].items()
                       if code not in ("408", "431")), (path, method)
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    # A watch's client stopped by a signal releases its wait's session with the key its request carried.
    stop = document["paths"][http_api.STOP_PATH]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(stop["required"]) == {"agent", "key"} and "stop_key" in openapi.EXTRAS["watch"]


# Checks that hold: no 5xx, status codes, content types, headers and bodies as documented, and what the schema
# calls invalid refused. Left out: positive_data_acceptance, since the rules between arguments (at most one of,
# requires) and the text rules of identities are the call layer's, not JSON Schema's.
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection")


# Now that the schema says what a valid identity is, schemathesis makes valid calls that wait: a watch (up to 55
# minutes), a hook's waiter, a look with wait_seconds. Each is made not to wait, without making an invalid case
# valid: a watch gets once (unless its once is off the schema already), a wait at most half a second.
NOT_WAITING = """
import re

import schemathesis
from schemathesis import GenerationMode

# schemathesis's coverage phase sends a placeholder such as "0" as a positive value of a header whose pattern it
# cannot cover; a positive case carries a value on the pattern instead (a negative one keeps what it was given).
HEADERS = {"X-Agent-Mail-Version": (VERSION_PATTERN, VERSION), "X-Agent-Mail-Host": (HOST_PATTERN, "test-host")}


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    if case.headers and case.meta is not None and case.meta.generation.mode == GenerationMode.POSITIVE:
        for name, (pattern, value) in HEADERS.items():
            if name in case.headers and not re.search(pattern, case.headers[name]):
                case.headers[name] = value
    body = case.body
    if not isinstance(body, dict):
        return
    if case.path.endswith("/watch") and isinstance(body.get("once", False), bool):
        body["once"] = True
    if case.path.endswith("/hook") and "wait_seconds" not in body:
        body["wait_seconds"] = 0.05
    wait = body.get("wait_seconds")
    if isinstance(wait, (int, float)) and not isinstance(wait, bool) and 0.5 < wait <= 14400:
        body["wait_seconds"] = 0.5
"""


def openapi_host_pattern() -> str:
    from agent_mail.server import openapi

    operation = openapi.document("0.1.0")["paths"]["/v1/call/status"]["post"]
    return next(p for p in operation["parameters"] if p["name"] == "X-Agent-Mail-Host")["schema"]["pattern"]


def _schemathesis(server, tmp_path, examples: int, seconds: int, phases: str = "examples,coverage,fuzzing") \
        -> subprocess.CompletedProcess:
    token = server.token("--agent", "*")
    hooks = tmp_path / "not_waiting.py"
    from agent_mail import __version__

    hooks.write_text(NOT_WAITING.replace("VERSION_PATTERN", repr(http_api.served_pattern(__version__)))
                     .replace("HOST_PATTERN", repr(openapi_host_pattern())).replace("VERSION", repr(__version__)))
    return subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "schemathesis"), "run", f"{server.url}/openapi.json",
         "--header", f"Authorization: Bearer {token}", "--checks", CHECKS, "--max-examples", str(examples),
         "--seed", "21", "--request-timeout", "20", "--max-time", str(seconds), "--workers", "2",
         "--phases", phases],
        capture_output=True, text=True, timeout=seconds + 70, cwd=tmp_path, stdin=subprocess.DEVNULL,
        env=process_env(NO_COLOR="1", SCHEMATHESIS_HOOKS=str(hooks)))


# Where schemathesis may still find "mostly rejected generated data", and why that is no mismatch of the schema:
# the data is of the right form, refused for the mailbox's state (an empty mailbox: ids of messages, events,
# waits and webhooks that do not exist), for a rule between values (the call layer's, not JSON Schema's), or the
# operation's only generated value is a header (its coverage phase sends placeholders off the pattern, such as
# "0", as positive; every value on the pattern is served: tests/unit/test_wire.py).
MAY_REFUSE_VALID_FORMS = {
    **{f"POST /v1/call/{name}": "ids of messages that do not exist" for name in (
        "ack", "archive", "attachments", "cancel", "delete", "dismiss")},
    "POST /v1/call/notifications": "dismiss: an event that is not open",
    "POST /v1/call/search": "thread: a message that does not exist",
    "POST /v1/call/send": "reply_to: a message that does not exist; refs as JSON",
    "POST /v1/call/watch": "once with timeout_minutes (a rule between values)",
    "POST /v1/call/webhook": "which values go with which action (a rule between values)",
    "POST /v1/call/release": "patterns or all (a rule between values)",
    "POST /v1/import": "its body is an export (JSON Lines), which the schema cannot state",
    "POST /v1/watch/stop": "key: no wait was made with it",
    "POST /v1/delivered": "delivery: no read answered with it",
    **{f"GET {path}": "only a header is generated" for path in ("/v1/health", "/v1/health/live",
                                                                 "/v1/health/ready", "/metrics")},
}


def test_schemathesis_finds_no_server_error_and_no_answer_off_the_schema(server, tmp_path):
    # The examples and the coverage phase run whole (their cases are set, ~10 s); the fuzzing phase runs until its
    # time is up, which cuts an operation's cases short wherever that falls: its warnings are left out.
    proc = _schemathesis(server, tmp_path, 8, 120, "examples,coverage")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    # The schema says what the server takes (issue 32: 23 of 30 operations "mostly rejected generated data" with
    # these settings before; docs/testing.md has the figures): what is left is in MAY_REFUSE_VALID_FORMS.
    warned = proc.stdout.split("Schema validation mismatch:", 1)[1].split("\n\n", 2)[1] \
        if "Schema validation mismatch:" in proc.stdout else ""
    listed = set(re.findall(r"^\s+- ((?:GET|POST) \S+)$", warned, re.MULTILINE))
    assert listed <= set(MAY_REFUSE_VALID_FORMS), (sorted(listed - set(MAY_REFUSE_VALID_FORMS)),
                                                   proc.stdout[-4000:])
    fuzzed = _schemathesis(server, tmp_path, 8, 20, "fuzzing")
    assert fuzzed.returncode == 0, fuzzed.stdout[-6000:] + fuzzed.stderr[-2000:]


@pytest.fixture
def second_mailbox(backend, tmp_path):
    """Another empty mailbox on the same backing."""
    if backend == "sqlite":
        yield str(tmp_path / "second" / "mail.db")
        return
    from tests.lib.postgres import drop_schema, new_schema_name, pg_url

    schema = new_schema_name()
    yield pg_url(schema)
    drop_schema(schema)


def test_export_and_import_go_between_the_client_and_the_server(server, second_mailbox, tmp_path):
    operator, agent = server.token("--agent", "*"), server.token("--agent", "a:x")
    note = tmp_path / "note.bin"
    note.write_bytes(b"\x00\x01 attached")
    json_of(server.client(operator, "send", "--from", "b:y", "--to", "a:x", "--subject", "one", "--attach", str(note)))
    json_of(server.client(operator, "send", "--from", "a:x", "--to", "b:y", "--subject", "two"))
    direct = tmp_path / "direct.jsonl"
    json_of(server.direct("export", "--output", str(direct)))
    out = tmp_path / "remote.jsonl"
    summary = json_of(server.client(operator, "export", "--output", str(out)))
    assert out.read_bytes() == direct.read_bytes()  # the same bytes, written on the client's machine
    assert summary["file"] == str(out) and summary["messages"] == 2 and summary["blobs"] == 1
    assert summary["bytes"] == out.stat().st_size and summary["next"] == [f"agent-mail import {out} --dry-run"]
    again = server.client(operator, "export", "--output", str(out))
    assert again.returncode == 2 and "exists" in json.loads(again.stderr)["error"]
    streamed = server.client(operator, "export")
    assert streamed.returncode == 0 and streamed.stdout == direct.read_bytes()
    mbox = server.client(operator, "export", "--format", "mbox")
    assert mbox.returncode == 0 and mbox.stdout.count(b"\nFrom ") + mbox.stdout.startswith(b"From ") == 2
    # An agent's token exports its own mail only; import needs an operator's.
    assert json_of(server.client(agent, "export", "--agent", "a:x", "--output", str(tmp_path / "mine.jsonl")))
    assert server.client(agent, "export").returncode == 4
    refused = server.client(agent, "import", str(out))
    assert refused.returncode == 4 and "operator" in json.loads(refused.stderr)["error"]
    # Into an empty mailbox through a second server: a dry run, the import, and again (nothing new).
    fresh = Server(second_mailbox)
    try:
        token = fresh.token("--agent", "*")
        dry = json_of(fresh.client(token, "import", str(out), "--dry-run"))
        assert dry["file"] == str(out) and dry["added"]["messages"] == 2 and dry["next"] == [f"agent-mail import {out}"]
        assert json_of(fresh.client(token, "import", str(out)))["added"]["messages"] == 2
        assert json_of(fresh.client(token, "import", "-", input=out.read_bytes()))["already_there"]["messages"] == 2
        bad = tmp_path / "bad.jsonl"
        bad.write_bytes(out.read_bytes() + b'{"type": "nonsense"}\n')
        failed = fresh.client(token, "import", str(bad))
        assert failed.returncode == 2 and "nothing was imported" in failed.stderr.decode()
        assert fresh.client(token, "export").stdout == direct.read_bytes()
    finally:
        fresh.stop()
    assert operator not in "".join(server.outputs)


def test_an_import_by_a_token_that_may_not_is_refused_before_its_upload(server):
    """The operator check comes first: an agent's token is answered 403 while its upload has barely begun (the
    server waits for none of it, and spools none of it)."""
    import socket

    agent = server.token("--agent", "a:x")
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
        sock.sendall((f"POST /v1/import HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {agent}\r\n"
                      "Content-Type: application/x-ndjson\r\nContent-Length: 100000000\r\n\r\n").encode()
                     + b'{"format": "agent-mail"}\n')
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert agent.encode() not in answer


def test_the_apis_names_are_one_module_that_imports_nothing():
    """Server, client and dashboard share the API's names (agent_mail.protocols.http_api); the client loads it on every
    command it carries to a server, so it loads nothing else."""
    code = ("import sys\nbefore = set(sys.modules)\nimport agent_mail.protocols.http_api\n"
            "print(sorted(set(sys.modules) - before))")
    done = subprocess.run([sys.executable, "-S", "-c", code], env=process_env(), capture_output=True, text=True)
    assert done.stdout.strip() == str(["agent_mail", "agent_mail.protocols", "agent_mail.protocols.http_api"]), \
        done.stdout + done.stderr


def test_the_server_refuses_what_its_schema_refuses_naming_the_value(server):
    """Issue 32: schemathesis found 200s for bodies /openapi.json calls invalid (views: null on /v1/dashboard, a
    path that is not a string in reservations, format: null on /v1/export). Each is now a 400 naming the value."""
    token = server.token("--agent", "*", "--supervisor")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    cases = [("/v1/dashboard", {"views": None}, "views"),
             ("/v1/dashboard", {"views": {"feed": {}}, "after": None}, "after"),
             ("/v1/call/reservations", {"repo": "r", "path": None}, "path"),
             ("/v1/call/reservations", {"repo": "r", "path": 5}, "path"),
             ("/v1/call/reservations", {"repo": "r", "paths": [["x"]]}, "paths"),
             ("/v1/export", {"format": None}, "format"),
             ("/v1/call/read", {"agent": "a:x", "limit": "30"}, "limit"),
             ("/v1/call/status", {"agent": None}, "agent"),
             ("/v1/follow", {"agent": "a:x", "after": None}, "after")]
    for path, body, field in cases:
        status, answer = server.raw(path, json.dumps(body).encode(), headers)
        assert status == 400, (path, body, answer)
        problems = json.loads(answer)["problems"]
        assert field in [p["field"] for p in problems], (path, body, problems)
        assert "Traceback" not in answer.decode()
    assert json.loads(server.raw("/v1/dashboard", json.dumps({"views": None}).encode(), headers)[1])["problems"][0][
        "message"].startswith("is null; leave a value out")
    # What the document allows is taken: the same values left out, or given as it says.
    for path, body in (("/v1/dashboard", {"views": {"feed": {}}}), ("/v1/call/reservations", {"repo": "r"}),
                       ("/v1/call/reservations", {"repo": "r", "path": "src/x.py"}),
                       ("/v1/call/read", {"agent": "a:x", "limit": 30, "fields": "id, subject"}),
                       ("/v1/call/read", {"agent": "a:x", "fields": ["id"]}),
                       ("/v1/call/status", {"agent": "a:x"}), ("/v1/follow", {"agent": "a:x"})):
        status, answer = server.raw(path, json.dumps(body).encode(), headers)
        assert status == 200, (path, body, answer)
    status, _ = server.raw("/v1/export", json.dumps({"format": "mbox"}).encode(), headers)
    assert status == 200
