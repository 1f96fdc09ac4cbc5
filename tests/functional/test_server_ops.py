"""What a team running `agent-mail serve` needs day to day (issue 27), as real processes on both backends: tokens
that expire, rotate with a grace and say when they were last used; refs through a server that stay the sender's
text, never a path on the server's disk (/v1 and /mcp); doctor through a server that never says where the mailbox
is; a client and server of versions that do not work together refused with both versions named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.lib.cli import json_of, process_env
from tests.lib.waiting import armed, until

pytestmark = [pytest.mark.backends, pytest.mark.timeout(120)]


@pytest.fixture
def server_env() -> dict:
    return {"AGENT_MAIL_SERVE_EXPIRY_SECONDS": "1"}  # the server looks for expired tokens every second


def _listed(server, token_id: str) -> dict:
    return next(t for t in json_of(server.direct("token", "list"))["tokens"] if t["id"] == token_id)


def test_a_token_expires_and_is_refused_after(server):
    made = json_of(server.direct("token", "create", "--agent", "a:x", "--expires-in", "3s"))
    token = made["token"]
    assert made["expires_at"] and not _listed(server, made["id"])["expired"]
    assert server.client(token, "heartbeat", "a:x").returncode == 0
    until(lambda: _listed(server, made["id"])["expired"], timeout=10, what="the token's expiry")
    refused = server.client(token, "heartbeat", "a:x")
    assert refused.returncode == 4, refused.stderr
    error = json.loads(refused.stderr)["error"]
    assert "expired at" in error and made["id"] in error and token not in refused.stderr.decode()
    bad = server.direct("token", "create", "--agent", "a:x", "--expires-in", "soon")
    assert bad.returncode == 2 and "--expires-in" in json.loads(bad.stderr)["error"]


def test_a_wait_made_with_a_token_ends_when_the_token_expires(server):
    made = json_of(server.direct("token", "create", "--agent", "a:x", "--expires-in", "4s"))
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE,
                             env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=made["token"]))
    try:
        armed("a:x", procs=[watch])
        out, err = watch.communicate(timeout=30)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 4 and out == b"", err
    assert "expired at" in json.loads(err)["error"] and made["token"] not in err.decode()


def test_rotation_shows_the_new_secret_once_and_ends_the_old_one_after_its_grace(server):
    old = json_of(server.direct("token", "create", "--agent", "a:x", "--note", "build box"))
    assert server.client(old["token"], "heartbeat", "a:x").returncode == 0
    rotated = json_of(server.direct("token", "rotate", old["id"], "--grace", "3s"))
    assert rotated["replaces"] == old["id"] and rotated["id"] != old["id"]
    assert rotated["agents"] == ["a:x"] and rotated["note"] == "build box"
    assert rotated["token"].startswith(f"am_{rotated['id']}_")
    # Both work during the grace; the list never shows a secret.
    assert server.client(old["token"], "heartbeat", "a:x").returncode == 0
    assert server.client(rotated["token"], "heartbeat", "a:x").returncode == 0
    listed = server.direct("token", "list").stdout.decode()
    assert old["token"].split("_", 2)[2] not in listed and rotated["token"].split("_", 2)[2] not in listed
    assert _listed(server, old["id"])["rotated_to"] == rotated["id"]
    until(lambda: _listed(server, old["id"])["expired"], timeout=10, what="the end of the grace")
    refused = server.client(old["token"], "heartbeat", "a:x")
    assert refused.returncode == 4 and f"rotated to {rotated['id']}" in json.loads(refused.stderr)["error"]
    assert server.client(rotated["token"], "heartbeat", "a:x").returncode == 0
    # A grace of 0 ends it at once; what ended cannot be rotated again.
    again = json_of(server.direct("token", "rotate", rotated["id"], "--grace", "0"))
    assert server.client(rotated["token"], "heartbeat", "a:x").returncode == 4
    assert server.client(again["token"], "heartbeat", "a:x").returncode == 0
    ended = server.direct("token", "rotate", rotated["id"])
    assert ended.returncode != 0 and "nothing to rotate" in json.loads(ended.stderr)["error"]


def test_list_says_when_a_token_was_last_used(server):
    made = json_of(server.direct("token", "create", "--agent", "a:x"))
    assert _listed(server, made["id"])["last_used"] is None
    before = time.time()
    assert server.client(made["token"], "status", "--agent", "a:x").returncode == 0
    used = _listed(server, made["id"])["last_used"]
    from datetime import datetime

    assert used and abs(datetime.fromisoformat(used).timestamp() - before) < 30


def _refused_or_stored_as_given(proc, given: list[str], secret_words=()) -> None:
    text = proc.stdout.decode() + proc.stderr.decode()
    for word in secret_words:
        assert word not in text, (word, text)
    if proc.returncode == 0:
        assert json.loads(proc.stdout)["refs"] == given


def test_refs_through_the_server_are_never_resolved_on_its_disk(server, tmp_path):
    import http.client

    token = server.token("--agent", "a:x")
    home, here = os.path.expanduser("~"), os.getcwd()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    for refs in (["/etc/shadow"], ["/no/such/file"], ["~/x"], ["relative/name"], ["/root/../etc/passwd"]):
        status, body = server.raw("/v1/call/send", json.dumps({"from": "a:x", "to": "b:y", "subject": "r",
                                                               "refs": json.dumps(refs)}).encode(), headers)
        text = body.decode()
        assert "resolved to" not in text and "does not exist" not in text, text
        assert (home not in text or refs == ["/root/../etc/passwd"]) and here not in text, text
        if status == 200:
            assert json.loads(body)["refs"] == refs and refs[0].startswith("/"), (refs, text)
        else:
            assert status == 400 and not refs[0].startswith("/"), (refs, text)
    # /mcp alike.
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    mcp = {**headers, "Accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    connection.request("POST", "/mcp", json.dumps(init), mcp)
    answer = connection.getresponse()
    session = answer.getheader("mcp-session-id")
    answer.read()
    if session:
        mcp["Mcp-Session-Id"] = session
    connection.request("POST", "/mcp", json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}), mcp)
    connection.getresponse().read()
    for number, refs in enumerate((["/etc/shadow"], ["~/x"], ["relative/name"], ["/no/such/file"]), 2):
        call = {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": {"name": "send", "arguments": {
            "to": "b:y", "subject": "r", "refs": json.dumps(refs)}}}
        connection.request("POST", "/mcp", json.dumps(call), mcp)
        text = connection.getresponse().read().decode()
        assert "resolved to" not in text and "does not exist" not in text and home not in text \
            and here not in text, text
        if refs[0].startswith("/"):
            assert json.dumps(refs)[1:-1].replace('"', '\\"') in text or refs[0] in text, text
    connection.close()
    stored = [m["refs"] for m in json_of(server.direct("read", "b:y", "--all", "--no-mark-read"))["messages"]]
    assert all(r and r[0].startswith("/") and not r[0].startswith(home + "/") for r in stored), stored
    # Through the client, a --ref is resolved on the sender's machine and stored as that text.
    note = tmp_path / "note.txt"
    note.write_text("x")
    sent = json_of(server.client(token, "send", "--from", "a:x", "--to", "b:y", "--subject", "s", "--ref",
                                 str(note), "--refs", json.dumps([str(note)])))
    assert sent["refs"] == [str(note)]


def _clone(where, origin: str):
    """A git work tree at `where` whose origin is `origin` (as a clone of it would be), holding logs/error.txt."""
    (where / "logs").mkdir(parents=True)
    (where / "logs" / "error.txt").write_text("boom")
    for argv in (["init", "-q"], ["remote", "add", "origin", origin]):
        subprocess.run(["git", *argv], cwd=where, check=True, capture_output=True)


def test_a_ref_through_a_server_names_the_file_in_its_repository_for_a_reader_elsewhere(server, tmp_path):
    """Issue 32: a --ref through a server was stored as the sender's absolute path, useless on another machine. It
    is stored as the repository's key and the path from its root, what any clone can open; outside a repository,
    the absolute path."""
    from tests.lib.cli import am_process

    token = server.token("--agent", "*")
    sender = tmp_path / "sender" / "widget"
    _clone(sender, "git@github.com:Acme/Widget.git")
    outside = tmp_path / "scratch.txt"
    outside.write_text("x")
    env = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token)
    sent = json_of(am_process("send", "--from", "a:x", "--to", "b:y", "--subject", "see", "--ref", "error.txt",
                              "--refs", json.dumps(["../logs/error.txt", str(outside)]), env=env, cwd=sender / "logs"))
    expected = ["github.com/Acme/Widget//logs/error.txt", str(outside)]
    assert sent["refs"] == expected
    # Read by a process elsewhere (another directory, not in the repository): the same text, and in its own clone
    # of the repository the path from the root opens the file the sender meant.
    reader = tmp_path / "reader"
    reader.mkdir()
    message = json_of(am_process("read", "b:y", env=env, cwd=reader))["messages"][0]
    assert message["refs"] == expected
    clone = tmp_path / "elsewhere" / "widget"
    _clone(clone, "https://github.com/Acme/Widget")
    key, _, path = message["refs"][0].rpartition("//")
    assert (clone / path).read_text() == "boom" and key == "github.com/Acme/Widget"
    # The API takes the same two forms from a client, and nothing else; a path climbing out of the root is refused.
    for refs, status in ((["github.com/Acme/Widget//src/lib.rs"], 200), (["github.com/Acme/Widget//../x"], 400),
                         (["src/lib.rs"], 400)):
        answer, body = server.raw("/v1/call/send", json.dumps({"from": "a:x", "to": "b:y", "subject": "r",
                                                               "refs": json.dumps(refs)}).encode(),
                                  {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert answer == status, (refs, body)
        if status == 400:
            assert json.loads(body)["problems"][0]["field"] == "refs", body


def test_doctor_through_the_server_never_says_where_the_mailbox_is(server):
    boss = server.token("--agent", "ops:lead", "--supervisor")
    proc = server.client(boss, "doctor")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    text = proc.stdout.decode()
    location = server.mailbox
    shown = [location, os.path.dirname(location)] if "://" not in location else \
        [location.split("?")[0].rsplit("@", 1)[-1], "schema="]
    assert report["path"] == "(the server's mailbox)" and report["ok"] is True
    assert not any(word and word in text for word in shown), text


def test_a_client_and_a_server_of_versions_that_do_not_work_together(server, tmp_path):
    token = server.token("--agent", "a:x")
    from agent_mail import __version__

    # A client naming another minor (before 1.0) is refused before anything is done, both versions named.
    major, minor = __version__.split(".")[:2]
    other = f"{major}.{int(minor) + 1}.0"
    status, body = server.raw("/v1/call/heartbeat", json.dumps({"agent": "a:x"}).encode(), {
        "Authorization": f"Bearer {token}", "Content-Type": "application/json", "X-Agent-Mail-Version": other})
    error = json.loads(body)
    assert status == 400 and other in error["error"] and __version__ in error["error"], error
    assert error["client_version"] == other and error["server_version"] == __version__
    # The same patch line, another patch: served, and every answer names the server's version.
    status, _ = server.raw("/v1/call/heartbeat", json.dumps({"agent": "a:x"}).encode(), {
        "Authorization": f"Bearer {token}", "Content-Type": "application/json",
        "X-Agent-Mail-Version": f"{major}.{minor}.99"})
    assert status == 200
    # The real client against a server of another version: exit 2 with both versions in its error.
    code = (f"import agent_mail; agent_mail.__version__ = {other!r}; import sys; "
            "from agent_mail.cli.main import main; sys.exit(main())")
    newer = subprocess.Popen([sys.executable, "-c", code, "serve", "--listen", "127.0.0.1:0"],
                             env=process_env(AGENT_MAIL_DB=server.mailbox), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        url = json.loads(newer.stderr.readline())["listening"]
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "a:x"], capture_output=True, timeout=60,
                              env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token))
    finally:
        newer.terminate()
        newer.communicate(timeout=30)
    assert proc.returncode == 2, proc.stderr
    said = json.loads(proc.stderr)["error"]
    assert f"client is version {__version__}" in said and f"server is version {other}" in said, said
