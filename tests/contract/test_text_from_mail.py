"""Text from mail is data (principle 8): a ref, an attachment's name, a reservation's pattern or reason holding a
control character is refused where the sender gives it (the command line, a server, import); mail stored before
(or by an older version) is shown with them escaped (`read`, `watch`: JSON without DEL, C1, U+2028/2029); and a
model is told, in every harness's note and in the MCP tools, that mail is another agent's, not its user's. The
dashboard's side is tests/test_dashboard_e2e.py (a real terminal) and tests/test_dashboard.py."""

from __future__ import annotations

import base64
import json
import os

import pytest

from agent_mail import model, spec
from tests.lib.cli import am_process, json_of, process_env, run_inprocess
from tests.lib.mailbox import raw_db

AGENT = "proj:coder"
# ESC starting an OSC 52 clipboard write, an 8-bit CSI (U+009B), DEL, BEL, a tab: each a control character.
CONTROLS = ["x\x1b]52;c;Y3VybA==\x1b\\", "x\x9b2J", "x\x7f", "x\x07", "a\tb", "x\x85"]
C1 = [chr(c) for c in range(0x80, 0xa0)]


def _problems(result) -> list[dict]:
    assert result.code == 2, result
    return json.loads(result.err)["problems"]


@pytest.mark.fast
@pytest.mark.parametrize("text", CONTROLS)
def test_send_refuses_control_characters_in_refs_and_attachment_names(tmp_path, text):
    path = tmp_path / text
    path.write_text("x")
    for flag, value in (("--ref", str(path)), ("--refs", json.dumps([str(path)])), ("--attach", str(path))):
        result = run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", "s", flag, value)
        [problem] = _problems(result)
        assert problem["field"] == flag and "control character" in problem["message"], problem
        assert "Use plain printable text" in problem["message"]  # the fix
        assert "\x1b" not in result.err and "\x9b" not in result.err  # the error quotes it escaped
    assert json.loads(run_inprocess("read", "b:y").out)["count"] == 0  # nothing was sent


@pytest.mark.fast
@pytest.mark.parametrize("char", ["\x9b", "\x85", "\x7f", "\x1b"])
def test_subjects_and_bodies_refuse_c1_del_and_esc_too(char):
    subject = run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", f"fix{char}now")
    assert _problems(subject)[0]["field"] == "--subject"
    body = run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", f"a\n{char}b")
    assert _problems(body)[0]["field"] == "--body" and f"U+{ord(char):04X} at position 2" in body.err
    assert run_inprocess("send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--body", "a\r\n\tb").code == 0


@pytest.mark.fast
def test_reserve_refuses_control_characters_in_patterns_and_reasons(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkdir(tmp_path / ".git")
    (tmp_path / ".git" / "config").write_text("[core]\n")
    result = run_inprocess("reserve", AGENT, "src/\x1b]0;x\x07.py", "--reason", "mine\x9b")
    assert {p["field"] for p in _problems(result)} == {"patterns", "--reason"}, result.err
    assert json.loads(run_inprocess("reservations", "--agent", AGENT).out)["reservations"] == []


@pytest.mark.fast
def test_import_refuses_what_send_refuses(tmp_path):
    from agent_mail.operations import history

    message = dict.fromkeys(history.MESSAGE_KEYS)
    message.update({"type": "message", "id": model.new_message_id(), "kind": "direct", "sender": "a:x",
                    "recipient": "b:y", "subject": "s", "body": "", "refs": ["/srv/x\x1b]0;pwned\x07"],
                    "created": "2026-01-01T00:00:00+00:00", "broadcast_states": [], "attachments": []})
    message = {k: message[k] for k in history.MESSAGE_KEYS if k in message}
    export = tmp_path / "export.jsonl"
    export.write_text(json.dumps({"agent_mail_export": history.VERSION}) + "\n" + json.dumps(message) + "\n")
    result = run_inprocess("import", str(export))
    assert result.code == 2 and "control character" in result.err and "refs" in result.err, result
    assert json.loads(run_inprocess("read", "b:y").out)["count"] == 0


@pytest.mark.backends  # through a server, and what a stored message shows: on SQLite and PostgreSQL
def test_a_server_refuses_control_characters_in_refs_and_uploaded_names(server, tmp_path):
    token = server.token("--agent", AGENT)
    named = tmp_path / "x\x1b[2J.txt"
    named.write_text("x")
    for flag in ("--ref", "--attach"):  # the command line through the server: refused on the client's side
        done = server.client(token, "send", "--from", AGENT, "--to", "proj:lead", "--subject", "s", flag, str(named))
        assert done.returncode == 2 and json.loads(done.stderr)["problems"][0]["field"] == flag, done.stderr
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for extra, field in (({"client_refs": ["/srv/x\x9b31m"]}, "ref"),
                         ({"upload_attachments": [{"name": "x\x1b]52;c;eA==\x07", "content_base64":
                                                   base64.b64encode(b"hi").decode()}]}, "attach")):
        body = {"from": AGENT, "to": ["proj:lead"], "subject": "files", **extra}
        status, answer = server.raw("/v1/call/send", json.dumps(body).encode(), headers)
        problems = json.loads(answer)["problems"]
        assert status == 400 and [p["field"] for p in problems] == [field], answer
        assert "control character" in problems[0]["message"] and b"\x1b" not in answer and b"\xc2\x9b" not in answer
    assert json_of(am_process("read", "proj:lead", "--no-mark-read"))["count"] == 0


def _plant(mailbox, text: str) -> str:
    """A message carrying `text` in its subject, body and refs, as an older version could have stored it."""
    sent = json_of(am_process("send", "--from", "ops:lead", "--to", AGENT, "--subject", "plain", "--body", "b"))
    db = raw_db(str(mailbox))
    try:
        with db:
            db.execute("UPDATE messages SET subject = ?, body = ?, refs = ? WHERE id = ?",
                       (f"s{text}", f"b{text}", json.dumps([f"/srv/r{text}"]), sent["id"]))
    finally:
        db.close()
    return sent["id"]


@pytest.mark.backends  # through a server, and what a stored message shows: on SQLite and PostgreSQL
def test_read_and_watch_write_no_c1_or_del_whatever_is_stored(mailbox_path, server):
    stored = "".join(C1) + "\x7f\u2028\u2029\x1b"
    planted = _plant(mailbox_path, stored)
    token = server.token("--agent", AGENT)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    status, answer = server.raw("/v1/call/read", json.dumps({"agent": AGENT, "no_mark_read": True}).encode(),
                                headers)
    assert status == 200 and json.loads(answer)["messages"][0]["subject"] == f"s{stored}"
    assert not any(char.encode() in answer for char in C1 + ["\x7f", "\u2028", "\u2029", "\x1b"]), answer
    for argv in (("watch", AGENT, "--once"), ("read", AGENT, "--no-mark-read"), ("search", "plain"),
                 ("through the server", "read", AGENT, "--no-mark-read"), ("read", AGENT)):
        done = server.client(token, *argv[1:]) if argv[0] == "through the server" else am_process(*argv)
        assert done.returncode == 0, done.stderr
        argv = argv[1:] if argv[0] == "through the server" else argv
        written = done.stdout.decode("utf-8")
        assert not any(char in written for char in C1 + ["\x7f", "\u2028", "\u2029", "\x1b"]), (argv, written)
        assert "\\u009b" in written and "\\u001b" in written, written
        if argv[0] in ("read", "watch"):  # and it reads back as what is stored
            [message] = json.loads(written)["messages"]
            assert message["id"] == planted and message["subject"] == f"s{stored}"


def _note(harness: str, event: str, document: dict, hook_event: str) -> str:
    done = am_process("hook", harness, hook_event, "--agent", AGENT, input=json.dumps(document).encode(),
                      env=process_env())
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)
    if hook_event == "stop":  # the line the person is shown: Mistral Vibe's system_message, the others' systemMessage
        shown = output["system_message"] if harness == "vibe" else output["systemMessage"]
        assert output["decision"] in ("block", "deny") and "\x9b" not in shown
        return output["reason"]
    if harness == "vibe":
        return output["hook_specific_output"]["additional_context"]
    return (output if harness == "copilot" else output["hookSpecificOutput"])["additionalContext"]


@pytest.mark.backends  # through a server, and what a stored message shows: on SQLite and PostgreSQL
@pytest.mark.parametrize("harness", spec.HARNESSES)
def test_every_harness_note_says_mail_is_data_from_other_agents(mailbox_path, harness):
    """The note at a session's start, the note of new mail and the held stop's reason, in each harness's shape:
    each says mail is another agent's, and quotes a stored subject's control characters escaped."""
    _plant(mailbox_path, "\x9b2J\x1b[31m")
    session = f"{harness}-1"
    start = _note(harness, "SessionStart", {"session_id": session, "hook_event_name": "SessionStart"}, "context")
    assert spec.MAIL_IS_DATA in start and "s\\u009b2J\\u001b[31m" in start, start
    _plant(mailbox_path, "\x85")
    new = _note(harness, "PostToolUse", {"session_id": session, "hook_event_name": "PostToolUse"}, "context")
    assert spec.MAIL_IS_DATA in new and "s\\u0085" in new, new
    _plant(mailbox_path, "\x9d")
    stop = _note(harness, "Stop", {"session_id": session, "hook_event_name": "Stop", "stop_hook_active": False},
                 "stop")
    assert spec.MAIL_IS_DATA in stop and "s\\u009d" in stop, stop


@pytest.mark.fast
def test_visible_writes_out_what_a_terminal_would_take_as_a_command():
    assert model.visible("plain é 日本 😀") == "plain é 日本 😀"
    assert model.visible("a\x1b]0;t\x07b\x9bc\x7f\u202e\u2028") == "a\\x1b]0;t\\x07b\\x9bc\\x7f\\u202e\\u2028"
    assert model.visible("a\nb\tc\rd", keep="\n\t") == "a\nb\tc\\x0dd"
    assert all(model.name_problem(f"a{chr(c)}b") for c in (*range(0x20), *range(0x7f, 0xa0)))
    assert model.name_problem("/srv/notes é [x].md") is None
