"""A PostgreSQL server of the benchmark's own: a fresh cluster in a temporary directory, on a free port.

Idle costs are measured here rather than on a shared server: there, every other user's DDL and NOTIFY wakes
idle backends (PostgreSQL signals the listening backends of a database on every NOTIFY, whatever the channel,
and asks the backends that fall behind the shared invalidation queue to catch up), which is their work, not
the watches'; and `max_connections` is ours to set to the herd's size.

Needs the server's binaries (Debian's postgresql package: /usr/lib/postgresql/VERSION/bin) and, when run as
root, the `postgres` user to own the cluster (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time


def binaries() -> str | None:
    """The directory of initdb and pg_ctl, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),  # Debian's, all tools together
                        key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0)
    if candidates:
        return os.path.dirname(candidates[-1])
    found = shutil.which("initdb")
    return os.path.dirname(found) if found and shutil.which("pg_isready", path=os.path.dirname(found)) else None


def problem() -> str | None:
    """Why a private cluster cannot be made here, or None."""
    if binaries() is None:
        return "no initdb (install PostgreSQL's server package)"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser to start the cluster as the postgres user"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Cluster:
    """`with Cluster(max_connections=N) as url:` a PostgreSQL URL (database postgres, trust auth) for the block."""

    def __init__(self, max_connections: int = 100, shared_buffers: str = "128MB"):
        self.max_connections, self.shared_buffers = max_connections, shared_buffers
        self.directory = self.port = None

    def _run(self, *argv: str) -> None:
        as_owner = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*as_owner, *argv], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def __enter__(self) -> str:
        reason = problem()
        if reason:
            raise RuntimeError(f"cannot start a private PostgreSQL: {reason}")
        self.directory = tempfile.mkdtemp(prefix="agent-mail-bench-pg-")
        os.chmod(self.directory, 0o755)
        data = os.path.join(self.directory, "data")
        if os.geteuid() == 0:
            shutil.chown(self.directory, "postgres", "postgres")
        bin_dir = binaries()
        self._run(os.path.join(bin_dir, "initdb"), "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        self.port = _free_port()
        options = (f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 "
                   f"-c max_connections={self.max_connections} -c shared_buffers={self.shared_buffers} "
                   "-c fsync=off -c synchronous_commit=off")
        self._run(os.path.join(bin_dir, "pg_ctl"), "-D", data, "-o", options, "-w", "-l",
                  os.path.join(self.directory, "log"), "start")
        self._bin = bin_dir
        deadline = time.monotonic() + 30
        while subprocess.run([os.path.join(bin_dir, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
                             ).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the private PostgreSQL did not start")
            time.sleep(0.2)
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __exit__(self, *exc) -> None:
        try:
            self._run(os.path.join(self._bin, "pg_ctl"), "-D", os.path.join(self.directory, "data"), "-m", "immediate",
                      "-w", "stop")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
