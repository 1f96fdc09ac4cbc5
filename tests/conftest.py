"""Shared fixtures: every test gets its own mailbox; helpers run the CLI in-process or as a process."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest

from agent_mail.cli import main

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


# The PostgreSQL server the tests use: AGENT_MAIL_TEST_PG, or the one CI starts (127.0.0.1:5432, trust auth).
# Each test gets a schema of its own, dropped after it. Without a server the PostgreSQL tests skip, saying
# why; under CI=1 they are required, and an unreachable server fails them.
TEST_PG_URL = os.environ.get("AGENT_MAIL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgresql")


def pytest_configure(config):
    config.addinivalue_line("markers", "backends: run every test of this module on SQLite and on PostgreSQL")
    config.addinivalue_line("markers", "sqlite_only: this test is about the SQLite file itself")
    config.addinivalue_line("markers", "local_only(why): this test is about the mailbox itself or this process (the "
                                       "library called in-process, a local command's imports, copy, token): "
                                       "skipped under AGENT_MAIL_TEST_THROUGH=server, saying why")


def pytest_collection_modifyitems(config, items):
    """Under AGENT_MAIL_TEST_THROUGH=server, the tests marked local_only are skipped with their reason."""
    if not THROUGH_SERVER:
        return
    for item in items:
        marker = item.get_closest_marker("local_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "about the mailbox itself"
            item.add_marker(pytest.mark.skip(reason=f"local only: {why}"))


def pytest_generate_tests(metafunc):
    """Modules marked `backends` run each test on both backends (test[sqlite], test[postgresql])."""
    if "backend" not in metafunc.fixturenames or metafunc.definition.get_closest_marker("sqlite_only"):
        return
    if metafunc.definition.get_closest_marker("backends"):
        metafunc.parametrize("backend", BACKENDS, indirect=True)


_pg_problem: list = []


def postgres_problem() -> str | None:
    """Why the test PostgreSQL server cannot be used (None when it can); asked once per run."""
    if not _pg_problem:
        try:
            import psycopg
        except ImportError:
            _pg_problem.append("psycopg is not installed (pip install -e '.[test]')")
        else:
            try:
                with psycopg.connect(TEST_PG_URL, connect_timeout=3, autocommit=True) as db:
                    _sweep_leftover_schemas(db)
                _pg_problem.append(None)
            except psycopg.Error as exc:
                _pg_problem.append(f"no PostgreSQL server at {TEST_PG_URL} ({str(exc).strip().splitlines()[0]}); "
                                   "set AGENT_MAIL_TEST_PG to a database URL where the tests may create schemas")
    return _pg_problem[0]


def _sweep_leftover_schemas(db) -> None:
    """Drop the schemas of test runs on this machine that were killed before their fixtures could drop them
    (t_HOST_PID_*, that process gone); other machines' runs are left alone."""
    pattern = f"^t_{_host_tag()}_[0-9]+_[0-9a-f]{{8}}$"
    for (name,) in db.execute("SELECT nspname FROM pg_namespace WHERE nspname ~ %s", (pattern,)).fetchall():
        pid = int(name.split("_")[2])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            db.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        except PermissionError:
            pass  # another user's live run


def require_postgres() -> None:
    """Skip (fail under CI=1) when the test server is missing."""
    problem = postgres_problem()
    if problem:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is required in CI: {problem}")
        pytest.skip(problem)


def pg_url(schema: str, base: str | None = None) -> str:
    base = base or TEST_PG_URL
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def drop_schema(schema: str) -> None:
    """Drop a test's schema. A connection the test left open in a transaction on it (a raw_db kept alive by a
    failed test's traceback) would hold the drop forever: after a while it is ended (only connections holding
    locks in this schema), and the drop goes on."""
    import psycopg

    with psycopg.connect(TEST_PG_URL, autocommit=True) as db:
        db.execute("SET lock_timeout = '10s'")
        try:
            db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            return
        except psycopg.errors.LockNotAvailable:
            pass
        db.execute("SELECT pg_terminate_backend(pid) FROM (SELECT DISTINCT l.pid FROM pg_locks l JOIN pg_class c "
                   "ON c.oid = l.relation JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s "
                   "AND l.pid <> pg_backend_pid()) AS holding", (schema,))
        db.execute("SET lock_timeout = 0")
        db.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _host_tag() -> str:
    import hashlib
    import socket

    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:6]


def new_schema_name() -> str:
    """t_HOST_PID_RANDOM: this machine's tag and process, so a later run here can sweep what a killed one left."""
    return f"t_{_host_tag()}_{os.getpid()}_{os.urandom(4).hex()}"


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
    if backend == "sqlite":
        path = tmp_path / "box" / "mail.db"
        monkeypatch.setenv("AGENT_MAIL_DB", str(path))
        with _through_server(path, monkeypatch):
            yield path
        return
    require_postgres()
    schema = new_schema_name()
    url = pg_url(schema)
    monkeypatch.setenv("AGENT_MAIL_DB", url)
    # A URL taken for a file path would be created relative to the working directory as "postgresql:/...".
    leaked_before = os.path.lexists("postgresql:")
    try:
        with _through_server(url, monkeypatch):
            yield url
    finally:
        drop_schema(schema)
    assert leaked_before or not os.path.lexists("postgresql:"), (
        "this test treated the PostgreSQL URL as a file path and created ./postgresql:")


@dataclass
class Result:
    code: int
    out: str
    err: str

    def assert_ok(self) -> None:
        """Assert the command succeeded: exit 0, nothing on stderr, a JSON document on stdout.
        For calls made only for their effect; `.json` asserts the same and returns the document."""
        assert self.code == 0, f"exit {self.code}: {self.err}"
        assert self.err == "", self.err
        try:
            json.loads(self.out)
        except ValueError as exc:
            raise AssertionError(f"stdout is not JSON ({exc}): {self.out!r}") from None

    @property
    def json(self):
        self.assert_ok()
        return json.loads(self.out)

    @property
    def error(self):
        assert self.code != 0, f"expected failure, got: {self.out}"
        assert self.out == "", f"stdout must be empty on failure: {self.out}"
        assert "Traceback" not in self.err
        return json.loads(self.err)


def run_inprocess(*argv: str, stdin: bytes | None = None) -> Result:
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.stdout, sys.stderr, sys.stdin
    sys.stdout, sys.stderr = out, err
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        code = main.main(list(argv))
    finally:
        sys.stdout, sys.stderr, sys.stdin = saved
    out.flush()
    err.flush()
    return Result(code, out.buffer.getvalue().decode("utf-8"), err.buffer.getvalue().decode("utf-8"))


@pytest.fixture
def am():
    """Run `agent-mail ARGS` in-process: am("send", "--from", ...) -> Result."""
    return run_inprocess


def process_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def am_process(*argv: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m agent_mail ARGS` as a real process."""
    env = kwargs.pop("env", None) or process_env()
    return subprocess.run([sys.executable, "-m", "agent_mail", *argv], capture_output=True, env=env,
                          timeout=timeout, **kwargs)


@pytest.fixture
def send(am):
    """send(frm, to, subject='s', *extra) -> receipt dict."""

    def _send(frm: str, to: str, subject: str = "hello", *extra: str) -> dict:
        return am("send", "--from", frm, "--to", to, "--subject", subject, *extra).json

    return _send


# CI runs the property tests with a fixed seed, so a run is reproducible; locally each run
# explores new examples. AGENT_MAIL_FUZZ_EXAMPLES raises the example counts for a long hunt.
from hypothesis import settings as _settings  # noqa: E402

_settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    _settings.load_profile("ci")
FUZZ_EXAMPLES = int(os.environ.get("AGENT_MAIL_FUZZ_EXAMPLES", "0"))


def examples(default: int) -> int:
    """How many examples a property test runs: its default, or more when asked."""
    return max(default, FUZZ_EXAMPLES)


class _RawPostgres:
    """A psycopg connection to a test mailbox's schema, spoken to like sqlite3 (? placeholders, commit)."""

    def __init__(self, url: str):
        import psycopg

        from agent_mail.store.postgres import split_url

        conninfo, schema = split_url(url)
        self.db = psycopg.connect(conninfo)
        self.db.execute(f'SET search_path TO "{schema}"')

    def execute(self, sql: str, params=()):
        return self.db.execute(sql.replace("%", "%%").replace("?", "%s"), params)

    def commit(self):
        self.db.commit()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.db.commit()
        else:
            self.db.rollback()

    def close(self):
        self.db.close()


def raw_db(mailbox):
    """A connection straight to the test mailbox's tables (SQLite file or PostgreSQL schema), for tests that
    plant or inspect rows the commands would not write."""
    if isinstance(mailbox, str) and mailbox.startswith("postgresql://"):
        return _RawPostgres(mailbox)
    import sqlite3

    return sqlite3.connect(mailbox)


def mailbox_exists(mailbox) -> bool:
    """Whether the test mailbox has been created (the file, or the schema's tables)."""
    if isinstance(mailbox, str) and mailbox.startswith("postgresql://"):
        import psycopg

        from agent_mail.store.postgres import split_url

        conninfo, schema = split_url(mailbox)
        with psycopg.connect(conninfo) as db:
            return db.execute("SELECT to_regclass(%s)", (f'"{schema}".messages',)).fetchone()[0] is not None
    return mailbox.exists()


@contextlib.contextmanager
def mailbox_itself(mailbox):
    """The test mailbox opened in this process (the library's Mailbox on the file or schema itself, whatever
    AGENT_MAIL_DB names: also under AGENT_MAIL_TEST_THROUGH=server), for tests that set up with the library
    what the commands would not (a watch that ran out, a row to move)."""
    from agent_mail.operations.mail import Mailbox
    from agent_mail.store import open_store

    store = open_store(str(mailbox))
    try:
        mailbox_ = Mailbox(store)
        mailbox_.publish_due()
        yield mailbox_
    finally:
        store.close()
