"""Agents on two machines sharing one PostgreSQL mailbox: two network namespaces joined to the server's by
veth links, each agent with its own HOME and working directory, the server reachable over TCP only."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import pytest

from tests.lib.cli import json_of
from tests.lib.postgres import TEST_PG_URL, drop_schema, new_schema_name, pg_url
from tests.lib.tools import require, unavailable
from tests.lib.twohosts import TwoHosts, namespaces_problem
from tests.lib.waiting import armed


@pytest.fixture
def hosts(tmp_path):
    require("postgresql")
    problem = namespaces_problem()
    if problem:
        unavailable(f"the two-host tests: {problem}")
    schema = new_schema_name()
    try:
        with TwoHosts(str(tmp_path), TEST_PG_URL, schema) as made:
            made.mailbox = pg_url(schema)  # the mailbox both hosts share, as this process reaches it
            yield made
    finally:
        drop_schema(schema)


@contextmanager
def _watching(hosts, host, agent):
    """A `watch AGENT` on `host`, armed; killed on the way out if still running."""
    json_of(host.run("status"))  # the mailbox exists, reached over this host's link
    watch = host.popen("watch", agent)
    try:
        armed(agent, hosts.mailbox, procs=[watch])
        yield watch
    finally:
        if watch.poll() is None:
            watch.kill()
        watch.communicate()


def test_a_watch_on_one_host_is_woken_by_a_send_from_the_other(hosts):
    a, b = hosts["a"], hosts["b"]
    assert a.url != b.url and a.env()["HOME"] != b.env()["HOME"]
    with _watching(hosts, a, "team:alice") as watch:
        seen_from_a = json_of(a.run("status", "--agent", "team:alice"))["agents"][0]
        seen_from_b = json_of(b.run("status", "--agent", "team:alice"))["agents"][0]
        assert seen_from_a["watch_state"] == seen_from_b["watch_state"] == "armed"  # liveness seen from both
        sent_at = time.monotonic()
        receipt = json_of(b.run("send", "--from", "team:bob", "--to", "team:alice", "--subject", "from host b"))
        assert receipt["deliveries"][0]["reachable"] is True  # b sees a's armed watch
        out, err = watch.communicate(timeout=30)
        assert watch.returncode == 0, err
        assert time.monotonic() - sent_at < 10  # woken by the commit, not its 55-minute timeout
        assert [m["subject"] for m in json.loads(out)["messages"]] == ["from host b"]
        assert json_of(b.run("status", "--agent", "team:alice"))["agents"][0]["watch_state"] == "released"


def test_a_partition_gives_clear_errors_and_the_watch_recovers_having_missed_nothing(hosts):
    a, b = hosts["a"], hosts["b"]
    with _watching(hosts, a, "team:alice") as watch:
        a.partition()
        try:
            cut_off = a.run("send", "--from", "team:alice", "--to", "team:bob", "--subject", "lost?", timeout=60)
            assert cut_off.returncode == 1 and cut_off.stdout == "" and "Traceback" not in cut_off.stderr
            assert "cannot reach" in json.loads(cut_off.stderr)["error"]
            # while a is cut off, b writes to it
            json_of(b.run("send", "--from", "team:bob", "--to", "team:alice", "--subject", "during the partition"))
            time.sleep(1.0)
            assert watch.poll() is None  # still waiting, not failed
        finally:
            a.partition(down=False)
        out, err = watch.communicate(timeout=60)
        assert watch.returncode == 0, err
        assert [m["subject"] for m in json.loads(out)["messages"]] == ["during the partition"]
        # the send that failed on a's side did not happen
        assert json_of(b.run("read", "team:bob", "--no-mark-read"))["count"] == 0


def test_a_partition_longer_than_the_reconnect_window_ends_the_watch_with_a_clear_error(hosts):
    a = hosts["a"]
    with _watching(hosts, a, "team:alice") as watch:  # the keepalives notice the dead link within about 11 s
        a.partition()
        try:
            out, err = watch.communicate(timeout=120)
        finally:
            a.partition(down=False)
        assert watch.returncode == 1 and out == "" and "Traceback" not in err
        error = json.loads(err)["error"]
        assert "PostgreSQL" in error and ("unreachable" in error or "cannot reach" in error)


def test_a_ref_sent_on_one_host_names_the_file_in_the_other_hosts_clone(hosts):
    """Issue 32: a ref is stored from the repository's root with the repository named, so the reader on the other
    machine, in its own clone (another path, another spelling of the origin URL), opens the file the sender meant."""
    import os
    import subprocess

    a, b = hosts["a"], hosts["b"]
    for host, origin in ((a, "git@github.com:acme/widget.git"), (b, "https://github.com/acme/widget")):
        work = os.path.join(host.root, "work")
        os.makedirs(os.path.join(work, "logs"), exist_ok=True)
        with open(os.path.join(work, "logs", "error.txt"), "w") as handle:
            handle.write(f"the log on {host.name}")
        for argv in (["init", "-q"], ["remote", "add", "origin", origin]):
            subprocess.run(["git", *argv], cwd=work, check=True, capture_output=True)
    json_of(a.run("send", "--from", "team:alice", "--to", "team:bob", "--subject", "look", "--ref",
                  "logs/error.txt"))
    refs = json_of(b.run("read", "team:bob"))["messages"][0]["refs"]
    assert refs == ["github.com/acme/widget//logs/error.txt"]
    key, _, path = refs[0].rpartition("//")
    with open(os.path.join(b.root, "work", path)) as handle:
        assert handle.read() == "the log on b"
