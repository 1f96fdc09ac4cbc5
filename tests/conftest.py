"""Shared fixtures and the suite's plumbing: every test gets its own mailbox; helpers run the CLI in-process
(run_inprocess, `am`) or as a process (am_process); `server` is a running `agent-mail serve` of the test's
mailbox; json_of reads a command's answer; until() polls for a state and armed()/disarmed() for a watch's;
require() finds a tool a test drives for real (skipped, saying why, on a laptop; failed under CI)."""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
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
    config.addinivalue_line("markers", "requires(*tools): the tools (TOOLS) this test drives for real: skipped, "
                                       "saying why, where one is missing; failed under CI, which installs them")
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


# ---- Tools the tests drive for real. `.ci/run` installs every one, and CI (CI set) runs every test that needs
# one: there a missing tool fails the test; elsewhere (a laptop) the test is skipped, saying what to install.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_BIN = os.path.join(ROOT, ".cache", "node", "node_modules", ".bin")  # where .ci/run installs the harnesses

# tool: (AGENT_MAIL_... variable naming another copy, or None; commands to look for; how to install it)
TOOLS = {
    "tmux": (None, ("tmux",), "apt-get install tmux"),
    "mutt": (None, ("mutt",), "apt-get install mutt"),
    "vim": (None, ("vim", "vim.tiny"), "apt-get install vim-tiny"),
    "less": (None, ("less",), "apt-get install less"),
    "nginx": (None, ("nginx",), "apt-get install nginx-light"),
    "caddy": (None, ("caddy",), "apt-get install caddy"),
    "chromium": ("AGENT_MAIL_CHROMIUM", ("chromium-headless-shell", "chromium"),
                 "apt-get install chromium-headless-shell, or set AGENT_MAIL_CHROMIUM"),
    "claude": ("AGENT_MAIL_CLAUDE", ("claude",), "npm install @anthropic-ai/claude-code, or set AGENT_MAIL_CLAUDE"),
    "codex": ("AGENT_MAIL_CODEX", ("codex",), "npm install @openai/codex, or set AGENT_MAIL_CODEX"),
    "gemini": ("AGENT_MAIL_GEMINI", ("gemini",), "npm install @google/gemini-cli, or set AGENT_MAIL_GEMINI"),
    "qwen": ("AGENT_MAIL_QWEN", ("qwen",), "npm install @qwen-code/qwen-code, or set AGENT_MAIL_QWEN"),
    "copilot": ("AGENT_MAIL_COPILOT", ("copilot",), "npm install @github/copilot, or set AGENT_MAIL_COPILOT"),
    "opencode": ("AGENT_MAIL_OPENCODE", ("opencode",), "npm install opencode-ai, or set AGENT_MAIL_OPENCODE"),
    "runuser": (None, ("runuser",), "apt-get install util-linux"),
    "pg_ctlcluster": (None, ("pg_ctlcluster",), "apt-get install postgresql-common"),
    "sqlite3": (None, ("sqlite3",), "apt-get install sqlite3"),
    "pg_dump": (None, ("pg_dump",), "apt-get install postgresql-client"),
}


def unavailable(reason: str) -> None:
    """What a test does when something it needs is missing here: skip with the reason; under CI, which
    installs everything, fail with it."""
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def find(tool: str) -> str | None:
    """Where `tool` (a name in TOOLS) is: its AGENT_MAIL_... variable, the copy .ci/run installs under
    .cache/node (the harnesses), or PATH; None when it is nowhere."""
    variable, commands, _ = TOOLS[tool]
    for candidate in (os.environ.get(variable) if variable else None,
                      *(os.path.join(NODE_BIN, c) for c in commands), *(shutil.which(c) for c in commands)):
        if candidate and os.path.exists(candidate):
            return candidate
    return None


def require(tool: str) -> str:
    """The path of `tool`, or, where it is missing, the test skipped with the reason (failed under CI).
    "postgresql": the test PostgreSQL server (its URL); "postgresql-server": the directory of PostgreSQL's
    server programs (initdb, pg_ctl, postgres)."""
    if tool == "postgresql":
        problem = postgres_problem()
        if problem:
            unavailable(problem)
        return TEST_PG_URL
    if tool == "postgresql-server":
        found = postgres_bindir()
        if found is None:
            unavailable("PostgreSQL's server programs (initdb, pg_ctl, postgres) are not installed "
                        "(apt-get install postgresql)")
        return found
    path = find(tool)
    if path is None:
        unavailable(f"{tool} is not installed ({TOOLS[tool][2]})")
    return path


def postgres_bindir() -> str | None:
    """The directory of PostgreSQL's server programs (initdb, pg_ctl, postgres), wherever this machine has
    them: `pg_config --bindir`, else Debian's /usr/lib/postgresql/VERSION/bin (the newest first), else PATH."""
    candidates = []
    if shutil.which("pg_config"):
        try:
            candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                             timeout=30).stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass

    def version(path: str) -> tuple:
        return tuple(int(part) for part in path.split("/")[-2].split(".") if part.isdigit())

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(os.path.dirname(os.path.realpath(on_path)))
    for directory in candidates:
        if directory and all(os.path.exists(os.path.join(directory, p)) for p in ("initdb", "pg_ctl", "postgres")):
            return directory
    return None


class PrivatePostgres:
    """A PostgreSQL cluster of the test's own (a temporary directory, a free loopback port, trust
    authentication), run as the postgres user: a test may stop and restart it, never the shared server."""

    def __init__(self, bindir: str):
        import socket
        import tempfile

        self.bin = bindir
        self.directory = tempfile.mkdtemp(prefix="am-test-pg-")
        shutil.chown(self.directory, "postgres")
        os.chmod(self.directory, 0o700)
        self.data = os.path.join(self.directory, "data")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")

    def _as_postgres(self, program: str, *args: str) -> None:
        proc = subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(self.bin, program), *args],
                              capture_output=True, text=True, timeout=120, cwd=self.directory)
        assert proc.returncode == 0, (program, proc.stdout, proc.stderr)

    def _pg_ctl(self, action: str, *args: str) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._as_postgres("pg_ctl", "-D", self.data, "-o", options, "-l", os.path.join(self.directory, "log"),
                          "-w", "-t", "60", *args, action)

    def start(self) -> None:
        self._pg_ctl("start")

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        self._pg_ctl("restart", "-m", "fast")

    def remove(self) -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(self.bin, "pg_ctl"), "-D", self.data,
                            "-m", "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.directory, ignore_errors=True)


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


_THE_MAILBOX: dict = {}  # the running test's mailbox itself (its file or URL), for armed() and disarmed()


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
        monkeypatch.setitem(_THE_MAILBOX, "location", str(path))
        with _through_server(path, monkeypatch):
            yield path
        return
    require("postgresql")
    schema = new_schema_name()
    url = pg_url(schema)
    monkeypatch.setenv("AGENT_MAIL_DB", url)
    monkeypatch.setitem(_THE_MAILBOX, "location", url)
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
    """Run `agent-mail ARGS` in this process (what the `am` fixture gives): its exit code, stdout and stderr."""
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


def json_of(proc: subprocess.CompletedProcess):
    """The JSON document a command that succeeded printed (a process run by am_process, Server.direct,
    Server.client...); a failure is shown with its stderr."""
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def until(predicate, timeout: float = 30.0, what=None, interval: float = 0.05):
    """Poll `predicate` until it returns something true, and return that. After `timeout` seconds the test
    fails, saying `what` (a string, or a function giving one at that moment: the state it found)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g} s: {said or getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)


def presences(agents, mailbox=None) -> dict[str, dict]:
    """{identity: its presence as `status` shows it (watching, watch_state, reachable...)} for `agents` (one
    identity or several), read in this process from `mailbox` (a file path or a PostgreSQL URL; by default the
    running test's own mailbox, the file or schema itself, also under AGENT_MAIL_TEST_THROUGH=server)."""
    from agent_mail.parts.liveness import presence
    from agent_mail.store import open_store

    agents = [agents] if isinstance(agents, str) else list(agents)
    location = str(mailbox if mailbox is not None else _THE_MAILBOX["location"])
    if "://" not in location and not os.path.exists(location):  # not made yet: looking must not make it
        return {agent: {"watching": False, "watch_state": "never"} for agent in agents}
    store = open_store(location)
    try:
        with store.transaction():
            return {agent: presence(store, agent) for agent in agents}
    finally:
        store.close()


def _watches_reach(agents, mailbox, timeout: float, procs, armed: bool) -> float:
    started = time.monotonic()
    seen: dict = {}

    def reached() -> bool:
        for proc in procs:
            if proc.poll() is not None:
                if proc.stdin is not None and proc.stdin.closed:
                    proc.stdin = None  # written and closed already: communicate() would flush it
                out, err = proc.communicate()
                raise AssertionError(f"a watch ended (exit {proc.returncode}) before the state: {out!r} {err!r}")
        seen.update({a: p["watch_state"] for a, p in presences(agents, mailbox).items()})
        return all((state == "armed") == armed for state in seen.values())

    until(reached, timeout, lambda: f"watch states {seen}, waiting for them {'' if armed else 'not '}to be armed")
    return time.monotonic() - started


def armed(agents, mailbox=None, *, timeout: float = 30.0, procs=()) -> float:
    """Until every one of `agents` (one identity or several) reads as armed in `status` (a watch blocked on it:
    mail committed from now on wakes it), on `mailbox` (the test's own by default); how long that took. Fails
    at once, with its output, if one of `procs` (the watch processes) ends first."""
    return _watches_reach(agents, mailbox, timeout, procs, armed=True)


def disarmed(agents, mailbox=None, *, timeout: float = 30.0) -> float:
    """Until none of `agents` reads as armed any more (its watch released, or gone stale); how long that took."""
    return _watches_reach(agents, mailbox, timeout, (), armed=False)


def without_dac_override() -> None:
    """A preexec_fn for root: drop the capabilities that let root read and write any file (CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH) from the program about to run, so file modes bind it as they bind any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP: gone from what exec grants
            raise OSError(ctypes.get_errno(), "prctl")


def as_a_user() -> dict:
    """subprocess arguments that make a child bound by file modes as an ordinary user is, whoever runs the
    suite (CI runs it as root): for root, a preexec_fn dropping the capabilities that override them."""
    return {"preexec_fn": without_dac_override} if os.geteuid() == 0 else {}


@pytest.fixture(autouse=True)
def stops_its_servers(mailbox_path):
    """Stop every serving.Server the test started and left running (a test that failed before its own stop),
    before its mailbox goes: no server outlives its test."""
    yield
    serving = sys.modules.get("serving")
    while serving is not None and serving.STARTED:
        serving.STARTED.pop().stop()


@pytest.fixture
def server_env() -> dict:
    """More variables for the `server` fixture's process (a module overrides this fixture to set them)."""
    return {}


@pytest.fixture
def server(mailbox_path, server_env):
    """A running `agent-mail serve` of the test's mailbox (serving.Server), stopped after the test."""
    from serving import Server

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
