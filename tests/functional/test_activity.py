"""What a supervisor of a fleet reads of each identity (issue 32, findings 15 and 16): `last_active`, when it last
did anything (a send, a read, an ack, a watch, a hook...), null for one that never did; and `hosts`, the machines it
is on, its own machine's name for a local command and the client's through `agent-mail serve` (two machines made
with a UTS namespace of their own: `unshare --uts`, then `hostname`). Real processes, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from agent_mail import model
from tests.lib.cli import am_process, json_of, process_env
from tests.lib.mailbox import raw_db
from tests.lib.tools import unavailable
from tests.lib.waiting import armed, until

pytestmark = [pytest.mark.backends, pytest.mark.timeout(180)]

HERE = model.machine_name()
OTHER = "other-host"


def _row(agent: str, env: dict | None = None) -> dict:
    return json_of(am_process("status", "--agent", agent, env=env or process_env()))["agents"][0]


def _everyone(env: dict | None = None) -> dict[str, dict]:
    return {r["agent"]: r for r in json_of(am_process("status", env=env or process_env()))["agents"]}


def _elsewhere_problem() -> str | None:
    if not shutil.which("unshare"):
        return "unshare (util-linux) is not installed"
    if os.geteuid() != 0:
        return "a UTS namespace of its own (another host name) needs root"
    return None


def elsewhere(*argv: str, env: dict, input: bytes | None = None, popen: bool = False):
    """`agent-mail ARGS` as run on another machine: in a UTS namespace of its own whose host name is OTHER."""
    command = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', OTHER, sys.executable, "-m",
               "agent_mail", *argv]
    if popen:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    return subprocess.run(command, env=env, input=input, capture_output=True, timeout=60)


@pytest.fixture
def other_machine():
    problem = _elsewhere_problem()
    if problem:
        unavailable(f"the other machine: {problem}")
    assert HERE != OTHER


# ---------------------------------------------------------------- last_active


def test_an_identity_that_only_sends_reads_and_acks_is_active_and_one_that_never_did_is_not():
    """The finding: an identity that reads, acks and sends but never watches looked exactly like one that never
    started (last_seen null, watch_state never). last_active tells them apart, at the time of what each did."""
    sent = json_of(am_process("send", "--from", "crew:writer", "--to", "crew:reader", "--to", "crew:sleeper",
                              "--subject", "the plan", "--body", "read me"))
    writer = _row("crew:writer")
    assert (writer["last_seen"], writer["watch_state"]) == (None, "never")  # as before: it never watched
    assert writer["last_active"] == sent["created"] and writer["hosts"] == [HERE]

    assert json_of(am_process("read", "crew:reader"))["count"] == 1
    acked = json_of(am_process("ack", "crew:reader", "--all"))
    assert acked["acked"] == [sent["deliveries"][0]["id"]]
    reader = _row("crew:reader")
    assert (reader["last_seen"], reader["watch_state"]) == (None, "never")
    assert reader["last_active"] == acked["acked_at"] and reader["hosts"] == [HERE]

    sleeper = _everyone()["crew:sleeper"]  # mail waits for it; it never ran a command
    assert (sleeper["unread"], sleeper["last_active"], sleeper["hosts"]) == (1, None, [])

    # Looks that change nothing leave no trace.
    json_of(am_process("read", "crew:reader", "--all", "--no-mark-read"))
    json_of(am_process("status", "--agent", "crew:reader"))
    json_of(am_process("search", "plan", "--agent", "crew:reader"))
    assert _row("crew:reader")["last_active"] == acked["acked_at"]
    assert json_of(am_process("status", "--fields", "agent,last_active,hosts"))["agents"][0] == \
        {"agent": "crew:reader", "last_active": acked["acked_at"], "hosts": [HERE]}


def test_every_command_an_identity_runs_moves_its_last_active(am, tmp_path, monkeypatch):
    """heartbeat, watch --once, dismiss, archive, delete, cancel, reserve, release, notifications --dismiss: each
    moves last_active of the identity it acts as, to the moment it ran."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    monkeypatch.chdir(repo)
    ids = [am("send", "--from", "crew:lead", "--to", "crew:hand", "--subject", f"job {n}").json["id"] for n in range(3)]
    scheduled = am("send", "--from", "crew:hand", "--to", "crew:lead", "--subject", "later", "--delay-minutes",
                   "30").json["id"]
    bounced = am("send", "--from", "crew:hand", "--to", "crew:nobody", "--subject", "anyone?", "--require-reachable")
    assert bounced.code == 3
    event = am("notifications", "crew:hand").json["system"]["events"][0]["id"]
    steps = [("heartbeat", "crew:hand"), ("watch", "crew:hand", "--once"), ("dismiss", "crew:hand", ids[0]),
             ("archive", "crew:hand", ids[1]), ("delete", "crew:hand", ids[2]), ("cancel", "crew:hand", scheduled),
             ("reserve", "crew:hand", "src/**"), ("release", "crew:hand", "src/**"),
             ("notifications", "crew:hand", "--dismiss", event)]
    last = am("status", "--agent", "crew:hand").json["agents"][0]["last_active"]
    for step in steps:
        before = model.now_iso()
        am(*step).assert_ok()
        active = am("status", "--agent", "crew:hand").json["agents"][0]["last_active"]
        assert active > last and active >= before, step
        last = active
    assert am("status", "--agent", "crew:lead").json["agents"][0]["last_active"] < last  # nobody else moved


def test_a_harness_sessions_hooks_count_as_activity():
    hook = ["hook", "claude-code", "context", "--agent", "crew:coder"]
    start = {"session_id": "s-1", "hook_event_name": "SessionStart", "source": "startup", "cwd": "/tmp"}
    assert am_process(*hook, input=json.dumps(start).encode()).returncode == 0
    coder = _row("crew:coder")
    assert coder["last_active"] is not None and coder["sessions"] == 1 and coder["hosts"] == [HERE]
    stop = {"session_id": "s-1", "hook_event_name": "Stop", "stop_hook_active": False}
    assert am_process("hook", "claude-code", "stop", "--agent", "crew:coder",
                      input=json.dumps(stop).encode()).returncode == 0
    assert _row("crew:coder")["last_active"] > coder["last_active"]


def test_a_blocked_watch_is_not_woken_by_what_its_identity_does_elsewhere(mailbox_path):
    """Recording activity is a write that cannot change what a watch waits for: the watch of an identity that
    sends, heartbeats and reads (finding nothing) elsewhere sleeps on (CONTRACT, Scale)."""
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "crew:busy"], env=process_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        armed("crew:busy", procs=[watch])
        armed_at = _row("crew:busy")["last_active"]

        def switches() -> int:
            with open(f"/proc/{watch.pid}/status") as handle:
                return next(int(line.split()[1]) for line in handle if line.startswith("voluntary_ctxt_switches"))
        before = switches()
        for step in (("send", "--from", "crew:busy", "--to", "crew:peer", "--subject", "done"),
                     ("heartbeat", "crew:busy"), ("read", "crew:busy"), ("ack", "crew:busy", "--all")):
            json_of(am_process(*step))
        assert switches() == before and watch.poll() is None  # asleep all along
        assert _row("crew:busy")["last_active"] > armed_at
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.communicate(timeout=30)


# ---------------------------------------------------------------- hosts


def test_two_machines_on_one_mailbox_are_both_named_the_latest_first(other_machine, mailbox_path):
    json_of(am_process("heartbeat", "crew:roamer"))
    json_of(elsewhere("heartbeat", "crew:roamer", env=process_env()))
    assert _row("crew:roamer")["hosts"] == [OTHER, HERE]
    json_of(am_process("read", "crew:roamer"))
    assert _row("crew:roamer")["hosts"] == [HERE, OTHER]
    assert _row("crew:roamer", env=process_env())["hosts"] == _everyone()["crew:roamer"]["hosts"]


def test_through_a_server_each_client_names_its_machine_and_a_stale_watch_keeps_its_own(other_machine, server):
    """A watch through a server records the machine its client named; killed there (stale), its machine is still
    among the identity's hosts, and its session names it."""
    token = server.token("--agent", "crew:*")
    json_of(server.client(token, "send", "--from", "crew:roamer", "--to", "crew:peer", "--subject", "hello"))
    assert _row("crew:roamer")["hosts"] == [HERE]
    env = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token)
    watch = elsewhere("watch", "crew:roamer", env=env, popen=True)
    try:
        armed("crew:roamer", procs=[watch])
        seen = _row("crew:roamer")
        assert (seen["watch_state"], seen["hosts"]) == ("armed", [OTHER, HERE])
        db = raw_db(server.mailbox)
        try:
            hosts = [r[0] for r in db.execute("SELECT host FROM watch_sessions WHERE agent = 'crew:roamer'")]
        finally:
            db.close()
        assert hosts == [OTHER]
        json_of(server.client(token, "heartbeat", "crew:roamer"))  # later, here: first in the list now
        assert _row("crew:roamer")["hosts"] == [HERE, OTHER]
    finally:
        watch.kill()  # no clean stop: the watch is killed
        watch.communicate(timeout=30)
    stale = until(lambda: (r := _row("crew:roamer"))["watch_state"] == "stale" and r, 30, "the killed watch")
    assert OTHER in stale["hosts"] and stale["hosts"][0] == HERE


def test_a_hook_through_a_server_names_the_clients_machine(other_machine, server):
    token = server.token("--agent", "crew:*")
    env = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=token)
    start = {"session_id": "s-far", "hook_event_name": "SessionStart", "source": "startup", "cwd": "/tmp"}
    done = elsewhere("hook", "claude-code", "context", "--agent", "crew:far", env=env,
                     input=json.dumps(start).encode())
    assert done.returncode == 0, done.stderr
    far = _row("crew:far")
    assert far["sessions"] == 1 and far["hosts"] == [OTHER] and far["last_active"] is not None


def test_a_machine_name_a_server_cannot_show_is_refused_and_changes_nothing(server):
    token = server.token("--agent", "crew:*")
    for bad in ("two words", "-dash-first", "x" * 254, "naïve"):
        status, body = server.raw("/v1/call/heartbeat", json.dumps({"agent": "crew:liar"}).encode("utf-8"),
                                  {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                                   "X-Agent-Mail-Host": bad.encode("utf-8").decode("latin-1")})
        answer = json.loads(body)
        assert status == 400 and answer["problems"][0]["field"] == "X-Agent-Mail-Host", answer
        assert "letters, digits" in answer["error"] and "Traceback" not in body.decode()
    assert "crew:liar" not in _everyone()
    status, body = server.raw("/v1/call/heartbeat", json.dumps({"agent": "crew:plain"}).encode(),
                              {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert status == 200  # no header: served, on no named machine
    plain = _row("crew:plain")
    assert plain["last_active"] is not None and plain["hosts"] == []
