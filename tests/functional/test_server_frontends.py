"""The front ends that write on the client's machine or draw for a person, through `agent-mail serve` (issue 21),
as real processes on both backings: `profile --mirror-dir` and `notifications` write the mirror on the client's
machine, byte for byte what a mirror on the mailbox's machine holds; `notifications --follow` keeps it current
through the server and stops cleanly; the dashboard reads and acts through the server with the token's grant;
`describe` names the server, never the token."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.lib.cli import json_of, process_env
from tests.lib.serving import Server
from tests.lib.tools import require
from tests.lib.waiting import until

pytestmark = [pytest.mark.backends, pytest.mark.timeout(120)]


@pytest.fixture
def state(tmp_path):
    """The client's state directory (where it keeps its mirror settings), named for its processes."""
    return {"AGENT_MAIL_STATE_DIR": str(tmp_path / "client-state")}


def _files(directory) -> dict:
    folder = directory / ".notification"
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.exists() else {}


def test_profile_and_notifications_write_the_mirror_here_as_the_mailbox_writes_its_own(server, state, tmp_path):
    agent = server.token("--agent", "a:x")
    here, there = tmp_path / "client-mirror", tmp_path / "mailbox-mirror"
    here.mkdir()
    there.mkdir()
    json_of(server.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "one", "--body", "first"))
    json_of(server.direct("profile", "a:x", "--mirror-dir", str(there)))  # the mailbox's own, on its machine
    shown = json_of(server.client(agent, "profile", "a:x", "--mirror-dir", str(here), **state))
    assert shown["mirror_dir"] == str(here) and shown["mirror_problem"] is None
    assert [(m["path"], m["status"]) for m in shown["mirrors"]] == [
        (str(here / ".notification" / "email.json"), "rendered"),
        (str(here / ".notification" / "system.json"), "absent")]
    assert _files(here) == _files(there) and b'"one"' in _files(here)["email.json"]
    settings = tmp_path / "client-state" / "mirrors.json"
    assert settings.stat().st_mode & 0o777 == 0o600
    assert json.loads(settings.read_text()) == {server.url: {"a:x": str(here)}}
    # The mailbox's settings stay the mailbox's: max entries is kept there and shapes the client's mirror too.
    json_of(server.client(agent, "profile", "a:x", "--max-entries", "1", **state))
    json_of(server.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "two", "--body", "second"))
    result = json_of(server.client(agent, "notifications", "a:x", **state))  # rendered once, here
    assert result["email"]["data"]["count"] == 2 and len(result["email"]["data"]["emails"]) == 1
    assert _files(here) == _files(there)
    looked = json_of(server.client(agent, "profile", "a:x", **state))
    assert looked["mirror_dir"] == str(here) and looked["max_entries"] == 1 and looked["mirrors"] == []
    # --clear-email removes the file here without marking anything read; reading empties the mirror.
    cleared = json_of(server.client(agent, "notifications", "a:x", "--clear-email", **state))
    assert cleared["cleared"] is True and not (here / ".notification" / "email.json").exists()
    json_of(server.client(agent, "read", "a:x", **state))  # a command that changes mail renders the mirror here
    assert _files(here) == _files(there) == {}
    operator = server.token("--agent", "*")
    receipt = json_of(server.client(operator, "send", "--from", "b:y", "--to", "a:x", "--subject", "kept", **state))
    assert receipt["mirrors"] == [{"agent": "a:x", "path": str(here / ".notification" / "email.json"),
                                   "status": "rendered"}]  # the files written here, not the mailbox's machine's
    assert b'"kept"' in _files(here)["email.json"] and _files(here) == _files(there)
    json_of(server.client(agent, "dismiss", "a:x", json.loads(_files(here)["email.json"])["data"]["email_ids"][0],
                          **state))
    assert _files(here) == _files(there) == {}
    # Clearing the setting forgets it here and removes its files; the mailbox's own mirror is untouched.
    json_of(server.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "three"))
    json_of(server.client(agent, "notifications", "a:x", **state))
    gone = json_of(server.client(agent, "profile", "a:x", "--clear", "mirror-dir", **state))
    assert gone["mirror_dir"] is None and _files(here) == {} and _files(there)
    assert json.loads(settings.read_text()) == {}
    assert json_of(server.direct("profile", "a:x"))["mirror_dir"] == str(there)


def test_a_token_not_naming_the_identity_writes_nothing(server, state, tmp_path):
    other, watcher = server.token("--agent", "b:y"), server.token("--agent", "b:y", "--supervisor")
    here = tmp_path / "mirror"
    here.mkdir()
    json_of(server.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "private"))
    for token in (other, watcher):  # a supervisor looks, but keeps no one else's mirror
        for argv in (("profile", "a:x", "--mirror-dir", str(here)), ("notifications", "a:x", "--follow"),
                     ("notifications", "a:x", "--clear-email")):
            refused = server.client(token, *argv, **state)
            assert refused.returncode == 4, (argv, refused.stderr)
            error = json.loads(refused.stderr)
            assert "a:x" in error["error"] and error["problems"], error
    assert _files(here) == {} and not (tmp_path / "client-state" / "mirrors.json").exists()
    assert json.loads(server.client(watcher, "notifications", "a:x", **state).stdout)["email"]["data"]["count"] == 1
    missing = server.client(None, "profile", "a:x", "--mirror-dir", str(here), **state)
    assert missing.returncode == 4 and _files(here) == {}


def _follower(server: Server, token: str, agent: str, state: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "agent_mail", "notifications", agent, "--follow"],
                            env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token, **state),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_follow_keeps_the_mirror_here_current_and_stops_cleanly(server, state, tmp_path):
    agent = server.token("--agent", "a:x")
    here = tmp_path / "mirror"
    here.mkdir()
    not_set = server.client(agent, "notifications", "a:x", "--follow", **state)
    assert not_set.returncode == 2 and "profile a:x --mirror-dir" in json.loads(not_set.stderr)["error"]
    json_of(server.client(agent, "profile", "a:x", "--mirror-dir", str(here), **state))
    follower = _follower(server, agent, "a:x", state)
    try:
        first = json.loads(follower.stdout.readline())
        assert first["agent"] == "a:x" and first["unread"] == 0
        json_of(server.client(server.token("--agent", "b:y"), "send", "--from", "b:y", "--to", "a:x", "--subject",
                              "through the server"))
        update = json.loads(follower.stdout.readline())  # woken by the commit, not by a timer
        assert update["unread"] == 1 and update["mirrors"][0] == {
            "agent": "a:x", "path": str(here / ".notification" / "email.json"), "status": "rendered"}
        assert b"through the server" in _files(here)["email.json"]
        json_of(server.direct("send", "--from", "c:z", "--to", "a:x", "--subject", "straight into the mailbox"))
        assert json.loads(follower.stdout.readline())["unread"] == 2
        mirrored = json.loads(_files(here)["email.json"])
        assert [e["subject"] for e in mirrored["data"]["emails"]] == ["straight into the mailbox", "through the server"]
        follower.send_signal(signal.SIGTERM)
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"agent": "a:x", "updates": 3, "stopped_by": "SIGTERM"}
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert agent not in "".join(server.outputs)


def test_revoking_the_token_ends_a_follow_at_once(server, state, tmp_path):
    agent = server.token("--agent", "a:x")
    here = tmp_path / "mirror"
    here.mkdir()
    json_of(server.client(agent, "profile", "a:x", "--mirror-dir", str(here), **state))
    follower = _follower(server, agent, "a:x", state)
    try:
        assert json.loads(follower.stdout.readline())["unread"] == 0
        json_of(server.direct("token", "revoke", agent.split("_")[1]))
        started = time.monotonic()
        out, err = follower.communicate(timeout=20)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 4 and time.monotonic() - started < 5, err
    assert "revoked" in json.loads(err)["error"] and agent not in err + out


def test_follow_outlives_a_server_restart(mailbox_path, state, tmp_path):
    first = Server(str(mailbox_path))
    port = first.port
    agent = first.token("--agent", "a:x")
    here = tmp_path / "mirror"
    here.mkdir()
    json_of(first.client(agent, "profile", "a:x", "--mirror-dir", str(here), **state))
    follower = _follower(first, agent, "a:x", state)
    second = None
    try:
        assert json.loads(follower.stdout.readline())["unread"] == 0
        first.stop()
        json_of(first.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "while it was down"))
        second = Server(str(mailbox_path), port=port)
        update = json.loads(follower.stdout.readline())  # it looked again once the server was back
        assert update["unread"] == 1 and b"while it was down" in _files(here)["email.json"]
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=30)
        assert follower.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1])["stopped_by"] == "SIGINT"
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
        if second is not None:
            second.stop()


@pytest.mark.sqlite_only
def test_the_mirror_commands_import_the_standard_library_only(server, state, tmp_path):
    token = server.token("--agent", "a:x")
    here = tmp_path / "mirror"
    here.mkdir()
    json_of(server.direct("send", "--from", "b:y", "--to", "a:x", "--subject", "for the mirror"))
    for argv in (["profile", "a:x", "--mirror-dir", str(here)], ["notifications", "a:x"]):
        code = ("import sys; before = set(sys.modules); from agent_mail.cli.main import main; "
                f"code = main({argv!r}); new = {{m.split('.')[0] for m in set(sys.modules) - before}}; "
                "print(code, sorted(m for m in new if m not in sys.stdlib_module_names and m != 'agent_mail'), "
                "file=sys.stderr)")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token, **state))
        assert proc.stderr.strip().splitlines()[-1] == "0 []", proc.stderr
    assert (here / ".notification").is_dir()


def test_describe_names_the_server_and_never_the_token(server):
    token = server.token("--agent", "a:x")
    storage = json_of(server.client(token, "describe"))["storage"]
    assert storage["backend"] == "server" and storage["url"] == server.url
    assert storage["token_from"] == "AGENT_MAIL_TOKEN"
    secret_file = server.client(None, "describe", AGENT_MAIL_TOKEN_FILE="/nonexistent/token")
    assert json.loads(secret_file.stdout)["storage"]["url"] == server.url
    assert token not in "".join(server.outputs) and token.split("_", 2)[2] not in "".join(server.outputs)


# ---------------------------------------------------------------- the dashboard, through Textual's pilot

textual = pytest.importorskip("textual", reason="the dashboard needs the tui extra: pip install 'agent-mail[tui]'")


def _run_dashboard(server: Server, token: str, test, human: str | None = None, notes: list | None = None) -> None:
    from agent_mail import dashboard
    from agent_mail.dashboard import app as dashboard_app

    served = (server.url, token)

    async def main():
        first = dashboard.first_look(human, 30, served)
        app = dashboard_app.Dashboard(first=first, human=human, served=served)
        if notes is not None:  # what the app tells the user, kept
            app.notify = lambda message, **kw: notes.append((message, kw.get("severity")))
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            await test(app, pilot)
    asyncio.run(main())


def _rows(app, table_id: str) -> list[str]:
    from textual.widgets import DataTable

    table = app.query_one(f"#{table_id}", DataTable)
    return [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]


async def _until(pilot, condition, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if condition():
            return True
    return False


def test_the_dashboard_reads_and_acts_through_the_server(server, monkeypatch):
    from agent_mail.dashboard import feeder

    monkeypatch.setattr(feeder, "REFRESH_SECONDS", 120.0)  # what brings new mail in is the server's wake-up
    json_of(server.direct("send", "--from", "api:worker", "--to", "ops:human", "--subject", "may I deploy?"))
    json_of(server.direct("send", "--from", "api:worker", "--to", "web:worker", "--subject", "not for the human"))
    # A supervisor's token that acts as ops:human only: it sees every identity, and sends as ops:human.
    token = server.token("--agent", "ops:human", "--supervisor")

    async def test(app, pilot):
        names = [row.split()[0] for row in _rows(app, "fleet-table")]
        assert {"ops:human", "web:worker", "api:worker"} <= set(names)
        app.open_inbox("web:worker")  # another identity's inbox: looking marks nothing read
        assert await _until(pilot, lambda: any("not for the human" in r for r in _rows(app, "inbox-table")))
        await pilot.press("2")
        assert await _until(pilot, lambda: app.feeder is not None and app.feeder.is_alive())
        await pilot.pause(0.5)
        json_of(server.direct("send", "--from", "api:worker", "--to", "web:worker", "--subject", "landed later"))
        assert await _until(pilot, lambda: any("landed later" in r for r in _rows(app, "feed-table")))
        await pilot.press("c")  # send as the human, through the server
        await pilot.pause()
        for text in ("api:worker",):
            await pilot.press(*text)
        await pilot.press("tab")
        await pilot.press(*"go ahead")
        await pilot.press("ctrl+s")
        assert await _until(pilot, lambda: any("go ahead" in r for r in _rows(app, "feed-table")))
        app.open_inbox("ops:human")  # the human's own inbox: ack through the server
        assert await _until(pilot, lambda: any("may I deploy?" in r for r in _rows(app, "inbox-table")))
        row = next(i for i, r in enumerate(_rows(app, "inbox-table")) if "may I deploy?" in r)
        app.query_one("#inbox-table").move_cursor(row=row)
        await pilot.pause()
        await pilot.press("a")
        assert await _until(pilot, lambda: any("ack: done" in text for text, _ in notes))
        # What the server refuses is shown as its problems, and changes nothing.
        await pilot.press("c", *"not an identity", "ctrl+s")
        assert await _until(pilot, lambda: any(severity == "error" for _, severity in notes))
        assert not any("Traceback" in text for text, _ in notes)

    notes: list = []
    _run_dashboard(server, token, test, human="ops:human", notes=notes)
    acked = [m for m in json_of(server.direct("read", "ops:human", "--all", "--no-mark-read"))["messages"]
             if m["subject"] == "may I deploy?"]
    assert acked[0]["acked_at"]
    read = json_of(server.direct("read", "api:worker", "--no-mark-read"))
    assert [(m["sender"], m["subject"]) for m in read["messages"]] == [("ops:human", "go ahead")]
    assert json_of(server.direct("read", "web:worker", "--no-mark-read"))["count"] == 2  # looked at, still unread
    assert json_of(server.direct("profile", "ops:human"))["human"] is True


def test_the_dashboard_refuses_what_the_token_does_not_allow_before_drawing(server):
    from agent_mail import dashboard
    from agent_mail.protocols.http_client import Refused

    agent, watcher = server.token("--agent", "ops:human"), server.token("--agent", "ops:human", "--supervisor")
    with pytest.raises(Refused) as looked:  # an agent's token: the fleet is everyone's
        dashboard.first_look(None, 30, (server.url, agent))
    assert looked.value.exit_code == 4 and "supervisor" in looked.value.message
    with pytest.raises(Refused) as stepped:  # a supervisor steps in only as an identity it names
        dashboard.first_look("api:worker", 30, (server.url, watcher))
    assert stepped.value.exit_code == 4 and "api:worker" in stepped.value.message
    # As a command: the same refusal, as JSON with exit 4; with a good token and no terminal, the CLI's error.
    proc = server.client(agent, "dashboard")
    assert proc.returncode == 4 and "supervisor" in json.loads(proc.stderr)["error"]
    proc = server.client(watcher, "dashboard", "--as", "api:worker")
    said = json.loads(proc.stderr)["error"]
    assert proc.returncode == 4 and "change the profile of api:worker" in said and "may not profile" not in said, said
    proc = server.client(watcher, "dashboard")
    assert proc.returncode == 1 and "terminal" in json.loads(proc.stderr)["error"]


def test_the_dashboard_shows_a_server_that_went_away_and_comes_back(mailbox_path, monkeypatch):
    from agent_mail.dashboard import feeder

    monkeypatch.setattr(feeder, "REFRESH_SECONDS", 1.0)
    first = Server(str(mailbox_path))
    port = first.port
    token = first.token("--agent", "*")
    json_of(first.direct("send", "--from", "a:x", "--to", "b:y", "--subject", "before"))
    second = []

    async def test(app, pilot):
        from textual.widgets import Static

        banner = app.query_one("#problem", Static)
        first.stop()
        assert await _until(pilot, lambda: "cannot reach the agent-mail server" in str(banner.content))
        assert "Traceback" not in str(banner.content)
        json_of(first.direct("send", "--from", "a:x", "--to", "c:z", "--subject", "after"))
        second.append(Server(str(mailbox_path), port=port))
        assert await _until(pilot, lambda: str(banner.content) == "", seconds=30)
        assert await _until(pilot, lambda: "c:z" in [r.split()[0] for r in _rows(app, "fleet-table")])

    try:
        _run_dashboard(first, token, test)
    finally:
        first.stop()
        for running in second:
            running.stop()
    assert os.environ.get("AGENT_MAIL_TOKEN") != token


def test_the_dashboard_command_in_a_real_terminal_through_the_server(server, tmp_path):
    require("tmux")
    json_of(server.direct("send", "--from", "ops:lead", "--to", "web:worker", "--subject", "first task"))
    token_file = tmp_path / "token"
    token_file.write_text(server.token("--agent", "ops:human", "--supervisor") + "\n")
    token_file.chmod(0o600)
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]  # a tmux server of its own, ended with the test
    env = process_env(TERM="xterm-256color")
    command = " ".join(["env", f"AGENT_MAIL_DB={server.url}", f"AGENT_MAIL_TOKEN_FILE={token_file}",
                        f"PYTHONPATH={env['PYTHONPATH']}", f"HOME={os.environ['HOME']}", "TERM=xterm-256color",
                        sys.executable, "-m", "agent_mail", "dashboard", "--as", "ops:human", ";", "echo",
                        "dashboard-exited-$?", ";", "sleep", "60"])
    subprocess.run([*tmux, "new-session", "-d", "-s", "dash", "-x", "100", "-y", "24", command], check=True, env=env)

    def pane() -> str:
        return subprocess.run([*tmux, "capture-pane", "-p", "-t", "dash"], capture_output=True, text=True).stdout

    def wait(condition) -> None:
        until(condition, 20, pane)

    try:
        wait(lambda: "web:worker" in pane() and "through " + server.url in pane())
        subprocess.run([*tmux, "send-keys", "-t", "dash", "2"], check=True)
        wait(lambda: "first task" in pane())
        json_of(server.direct("send", "--from", "api:worker", "--to", "web:worker", "--subject", "live via serve"))
        wait(lambda: "live via serve" in pane())  # woken through the server, not by a timer
        subprocess.run([*tmux, "send-keys", "-t", "dash", "4"], check=True)
        wait(lambda: "Sends per hour" in pane())
        subprocess.run([*tmux, "send-keys", "-t", "dash", "q"], check=True)
        wait(lambda: "dashboard-exited-0" in pane())
        assert "Traceback" not in pane()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    # Looking marks nothing read.
    assert json_of(server.direct("status", "--agent", "web:worker"))["agents"][0]["unread"] == 2


def test_the_dashboard_saves_attachments_on_its_own_machine(server, tmp_path):
    from agent_mail import errors
    from agent_mail.dashboard.served import ServedSupervisor

    note = tmp_path / "note.bin"
    note.write_bytes(b"\x00 the attached bytes")
    sent = json_of(server.direct("send", "--from", "api:worker", "--to", "ops:human", "--subject", "with a file",
                                 "--attach", str(note)))
    served = ServedSupervisor(server.url, server.token("--agent", "ops:human", "--supervisor"))
    saved = served.call("attachments", {"agent": "ops:human", "id": sent["id"], "save_to": str(tmp_path / "out")})
    assert (tmp_path / "out" / "note.bin").read_bytes() == b"\x00 the attached bytes"
    assert saved["directory"] == str(tmp_path / "out") and [s["name"] for s in saved["saved"]] == ["note.bin"]
    with pytest.raises(errors.InvalidInput) as again:  # nothing is overwritten, as on the command line
        served.call("attachments", {"agent": "ops:human", "id": sent["id"], "save_to": str(tmp_path / "out")})
    assert again.value.exit_code == 2 and "already exists" in again.value.message
