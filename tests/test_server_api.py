"""What `agent-mail serve` offers beside the calls, as real processes on both backings (issue 21): the OpenAPI
document (valid, every served command, held to by schemathesis against the live server), export and import
carried between the client's machine and the server, MCP over streamable HTTP at /mcp."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import process_env
from serving import Server

pytestmark = [pytest.mark.backends, pytest.mark.timeout(180)]


@pytest.fixture
def server(mailbox_path):
    running = Server(str(mailbox_path))
    yield running
    running.stop()


def _json(proc: subprocess.CompletedProcess):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


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

    from agent_mail import api, schemas, spec

    document = _openapi(server)
    validate(document)
    for name in api.SERVED:
        operation = document["paths"][f"/v1/call/{name}"]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        command = spec.COMMANDS[name]
        # The same arguments, types and ranges as the MCP tools: both are made by agent_mail.schemas.
        expected = schemas.arguments_schema(command, extra=api.EXTRAS.get(name), nullable=True)
        for key in api.LOCAL_TO_CLIENT.get(name, ()):
            expected["properties"].pop(key, None)
        assert body == expected, name
        assert set(operation["responses"]) >= {"200", "400", "401", "403", "default"}
        assert "X-Agent-Mail-Exit" in operation["responses"]["200"]["headers"]
    assert document["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


# Checks that hold: no 5xx, status codes, content types, headers and bodies as documented, and what the schema
# calls invalid refused. Left out: positive_data_acceptance, since the rules between arguments (at most one of,
# requires) and the text rules of identities are the call layer's, not JSON Schema's.
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,"
          "response_schema_conformance,negative_data_rejection")


def test_schemathesis_finds_no_server_error_and_no_answer_off_the_schema(server, tmp_path):
    token = server.token("--agent", "*")
    proc = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "schemathesis"), "run", f"{server.url}/openapi.json",
         "--header", f"Authorization: Bearer {token}", "--checks", CHECKS, "--max-examples", "8", "--seed", "21",
         "--request-timeout", "20", "--max-time", "40", "--workers", "2"],
        capture_output=True, text=True, timeout=90, cwd=tmp_path, stdin=subprocess.DEVNULL,
        env=process_env(NO_COLOR="1"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
