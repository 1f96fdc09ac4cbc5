"""What a JSON client can send a server that no command line can: a lone surrogate (JSON's escaped \\udbff) in a
hook's session or an uploaded attachment's name. Each is a 400 naming what is wrong, never a 500, and nothing is
stored. Real server processes, on both backings (the reservation commands' fields:
tests/functional/test_server_hooks.py)."""

from __future__ import annotations

import base64
import json

import pytest

from tests.lib.cli import am_process, json_of

pytestmark = pytest.mark.backends

AGENT = "proj:coder"


def _auth(token: str) -> dict:
    return {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}


def test_a_lone_surrogate_in_a_hooks_session_is_refused_by_name(server):
    token = server.token("--agent", AGENT)
    for session in ({"session_id": "s\udbff"}, {"session_id": "s", "hook_event_name": "\udbff"},
                    {"session_id": "s", "host": "h\udbff"}):
        body = {"harness": "claude-code", "event": "context", "agent": AGENT, "session": session}
        status, answer = server.raw("/v1/call/hook", json.dumps(body).encode(), _auth(token))
        assert status == 400 and "session" in {p["field"] for p in json.loads(answer)["problems"]}, answer
    assert json_of(am_process("status"))["agents"] == []  # no session was kept for it


def test_a_lone_surrogate_in_an_uploaded_attachments_name_is_refused_and_nothing_is_sent(server):
    token = server.token("--agent", AGENT)
    upload = [{"name": "notes\udbff.txt", "content_base64": base64.b64encode(b"hi").decode()}]
    body = {"from": AGENT, "to": ["proj:lead"], "subject": "files", "upload_attachments": upload}
    status, answer = server.raw("/v1/call/send", json.dumps(body).encode(), _auth(token))
    problems = json.loads(answer)["problems"]
    assert status == 400 and "attach" in {p["field"] for p in problems} and "UTF-8" in json.dumps(problems), answer
    assert json_of(am_process("read", "proj:lead", "--no-mark-read"))["count"] == 0
