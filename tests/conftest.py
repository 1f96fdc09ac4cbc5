"""The suite's fixtures and pytest hooks (helpers live in tests/lib): every test gets its own mailbox
(`mailbox_path`, on the `backend` it runs on, through a server under AGENT_MAIL_TEST_THROUGH=server); `am` runs
the CLI in-process; `server` is a running `agent-mail serve` of the test's mailbox; `private_postgres` a
PostgreSQL cluster of the test's own. The marks (pyproject.toml) take effect here: `backends`, `requires`,
`sqlite_only`, `local_only`."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading

import pytest
from hypothesis import settings

from tests.lib.cli import process_env, run_inprocess
from tests.lib.mailbox import THE_MAILBOX
from tests.lib.postgres import PrivatePostgres, drop_schema, new_schema_name, pg_url
from tests.lib.tools import require, unavailable

BACKENDS = ("sqlite", "postgresql")


def pytest_collection_modifyitems(config, items):
    """Under AGENT_MAIL_TEST_THROUGH=server, the tests marked local_only are skipped with their reason."""
    if not THROUGH_SERVER:
        return
    for item in items:
        marker = item.get_closest_marker("local_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "about the mailbox itself"
            item.add_marker(pytest.mark.skip(reason=f"local only: {why}"))


def pytest_runtest_setup(item):
    """A test marked requires(tool, ...) is skipped (failed under CI) before it starts when a tool is missing."""
    for marker in item.iter_markers("requires"):
        for tool in marker.args:
            require(tool)


def pytest_generate_tests(metafunc):
    """Modules marked `backends` run each test on both backends (test[sqlite], test[postgresql])."""
    if "backend" not in metafunc.fixturenames or metafunc.definition.get_closest_marker("sqlite_only"):
        return
    if metafunc.definition.get_closest_marker("backends"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


@pytest.fixture
def private_postgres():
    """A started PrivatePostgres, removed after the test. Needs PostgreSQL's server programs (found wherever they
    are installed), root and runuser (PostgreSQL refuses to run as root: the cluster runs as the postgres user)."""
    import pwd

    bindir = require("postgresql-server")
    if os.geteuid() != 0:
        unavailable("a private PostgreSQL cluster is run as the postgres user with runuser, which needs root")
    require("runuser")
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        unavailable("there is no postgres user to run a private PostgreSQL cluster as")
    cluster = PrivatePostgres(bindir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


_STARTED_IN = os.getcwd()
_TOOLS_OWN = {".pytest_cache", ".hypothesis", "__pycache__", ".ruff_cache"}  # what pytest, hypothesis, ruff keep there


@pytest.fixture(autouse=True)
def leaves_no_files_behind():
    """Fail a test that leaves anything in the directory the suite runs in, which is where the processes a
    test starts work unless told otherwise (a PostgreSQL URL taken for a file path once left
    ./postgresql:/postgres@.../test?schema=... there)."""
    before = set(os.listdir(_STARTED_IN))
    yield
    left = sorted(set(os.listdir(_STARTED_IN)) - before - _TOOLS_OWN)
    assert not left, f"this test left {left} in {_STARTED_IN}"


# AGENT_MAIL_TEST_THROUGH=server: every test's commands go through an `agent-mail serve` of its mailbox, as a
# client with an operator's token (AGENT_MAIL_DB=http://..., AGENT_MAIL_TOKEN), while the test's own looks at
# the mailbox (raw_db, the fixture's value) still see the file or schema itself. Tests of what only works on
# the mailbox itself (copy, token, doctor --repair, the file's own recovery) are marked `local_only`.
THROUGH_SERVER = os.environ.get("AGENT_MAIL_TEST_THROUGH") == "server"


@contextlib.contextmanager
def _through_server(location, monkeypatch):
    if not THROUGH_SERVER:
        yield
        return
    env = process_env(AGENT_MAIL_DB=str(location))
    env.pop("AGENT_MAIL_TOKEN", None)
    # The operator's token, made by a process of its own: in this one, opening a PostgreSQL mailbox would make
    # this process follow that server's clock (model.follow_clock) for the tests after it.
    made = subprocess.run([sys.executable, "-m", "agent_mail", "token", "create", "--agent", "*", "--note",
                           "the test suite, through a server"], env=env, capture_output=True, check=True)
    server = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        listening = json.loads(server.stderr.readline())["listening"]
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()  # its log, drained
        monkeypatch.setenv("AGENT_MAIL_DB", listening)
        monkeypatch.setenv("AGENT_MAIL_TOKEN", json.loads(made.stdout)["token"])
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def backend(request):
    """Which backend this test's mailbox is on."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(autouse=True)
def mailbox_path(tmp_path, monkeypatch, backend):
    """Point AGENT_MAIL_DB at a fresh mailbox (a file, or a PostgreSQL schema of its own), and HOME at a temp
    dir so the default is never touched. The value is the file's path on SQLite (where nothing is created
    yet), the URL on PostgreSQL."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VIBE_HOME", raising=False)  # Mistral Vibe's user files (setup vibe's hooks.toml): under HOME
    if backend == "sqlite":
        path = tmp_path / "box" / "mail.db"
        monkeypatch.setenv("AGENT_MAIL_DB", str(path))
        monkeypatch.setitem(THE_MAILBOX, "location", str(path))
        with _through_server(path, monkeypatch):
            yield path
        return
    require("postgresql")
    schema = new_schema_name()
    url = pg_url(schema)
    monkeypatch.setenv("AGENT_MAIL_DB", url)
    monkeypatch.setitem(THE_MAILBOX, "location", url)
    # A URL taken for a file path would be created relative to the working directory as "postgresql:/...".
    leaked_before = os.path.lexists("postgresql:")
    try:
        with _through_server(url, monkeypatch):
            yield url
    finally:
        drop_schema(schema)
    assert leaked_before or not os.path.lexists("postgresql:"), (
        "this test treated the PostgreSQL URL as a file path and created ./postgresql:")


@pytest.fixture
def am():
    """Run `agent-mail ARGS` in-process: am("send", "--from", ...) -> Result."""
    return run_inprocess


@pytest.fixture(autouse=True)
def stops_its_servers(mailbox_path):
    """Stop every serving.Server the test started and left running (a test that failed before its own stop),
    before its mailbox goes: no server outlives its test."""
    yield
    serving = sys.modules.get("tests.lib.serving")
    while serving is not None and serving.STARTED:
        serving.STARTED.pop().stop()


@pytest.fixture
def server_env() -> dict:
    """More variables for the `server` fixture's process (a module overrides this fixture to set them)."""
    return {}


@pytest.fixture
def server(mailbox_path, server_env):
    """A running `agent-mail serve` of the test's mailbox (serving.Server), stopped after the test."""
    from tests.lib.serving import Server

    running = Server(str(mailbox_path), **server_env)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def send(am):
    """send(frm, to, subject='s', *extra) -> receipt dict."""

    def _send(frm: str, to: str, subject: str = "hello", *extra: str) -> dict:
        return am("send", "--from", frm, "--to", to, "--subject", subject, *extra).json

    return _send


# CI runs the property tests with a fixed seed, so a run is reproducible; locally each run
# explores new examples. AGENT_MAIL_FUZZ_EXAMPLES raises the example counts for a long hunt.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")
