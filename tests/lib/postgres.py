"""The PostgreSQL the tests use: the shared test server (a schema of its own for each test, dropped after it;
what a killed run left is swept) and a private cluster a test may stop and restart (PrivatePostgres)."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

# The PostgreSQL server the tests use: AGENT_MAIL_TEST_PG, or the one CI starts (127.0.0.1:5432, trust auth).
# Each test gets a schema of its own, dropped after it. Without a server the PostgreSQL tests skip, saying
# why; under CI=1 they are required, and an unreachable server fails them.
TEST_PG_URL = os.environ.get("AGENT_MAIL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


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
