"""SQLite's locks kept by a process that holds connections to a mailbox (issue 32, finding 5), with real processes.

On POSIX, closing any descriptor of a file drops every lock the process holds on it (SQLite's "How to corrupt an
SQLite database file", 2.2). A process whose connection lost its lock on the mailbox file lets another process's last
connection take the file exclusively as it closes, checkpoint and delete the WAL still in use: the first process then
reads a world nobody else writes to, and its own commits go to a deleted file. `doctor` reads the file's header and,
in a repair, its pages itself: that reading must never happen in a process holding a connection to the file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.lib.cli import json_of, process_env

pytestmark = [pytest.mark.timeout(120)]

# A process that holds a connection to the mailbox in WAL mode (as a server does), runs a function of agent-mail's
# on the same file when told to, and says what it reads, line by line on its standard streams.
_HOLDER = r"""
import json, sqlite3, sys
path = sys.argv[1]
db = sqlite3.connect(path, isolation_level=None)
db.execute("PRAGMA journal_mode = WAL")
db.execute("CREATE TABLE IF NOT EXISTS notes (n INTEGER PRIMARY KEY, text TEXT)")
db.execute("INSERT INTO notes (text) VALUES ('first')")
def newest():
    return db.execute("SELECT max(n), count(*) FROM notes").fetchone()
print(json.dumps({"ready": newest()}), flush=True)
for line in sys.stdin:
    asked = line.strip()
    if asked == "extent":
        from agent_mail.store import sqlite_pages
        sqlite_pages.extent(path)
    elif asked == "table_keys":
        from agent_mail.store import sqlite_pages
        root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'notes'").fetchone()[0]
        sqlite_pages.table_keys(path, root)
    elif asked == "doctor":
        from agent_mail.store import sqlite_checks
        sqlite_checks.doctor(path, False, lambda report: None)
    elif asked == "write":
        db.execute("INSERT INTO notes (text) VALUES ('from the holder')")
    print(json.dumps({"newest": newest()}), flush=True)
"""


def _write_and_close(path: str, text: str) -> None:
    """Another process: one commit, then its connection closed (the last one, if the holder lost its locks)."""
    subprocess.run([sys.executable, "-c", "import sqlite3, sys\n"
                    "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "db.execute('INSERT INTO notes (text) VALUES (?)', (sys.argv[2],))\n"
                    "db.close()\n", path, text], check=True, timeout=60)


def _newest_elsewhere(path: str) -> list:
    """(max n, count) as a fresh process reads the file."""
    done = subprocess.run([sys.executable, "-c", "import json, sqlite3, sys\n"
                           "db = sqlite3.connect(sys.argv[1])\n"
                           "print(json.dumps(db.execute('SELECT max(n), count(*) FROM notes').fetchone()))\n", path],
                          capture_output=True, check=True, timeout=60)
    return json.loads(done.stdout)


def _deleted_files(pid: int) -> list[str]:
    """The files process `pid` holds open or mapped that were deleted under it."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(" (deleted)"):
            found.append(target)
    with open(f"/proc/{pid}/maps") as maps:
        found += [line.split(None, 5)[-1].strip() for line in maps if line.rstrip().endswith(" (deleted)")]
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc to see the files a process holds")
@pytest.mark.parametrize("asked", ["extent", "table_keys", "doctor"])
def test_reading_the_file_beside_a_connection_keeps_its_locks(tmp_path, asked):
    """A process holding a connection reads the file's header or pages as doctor does; another process commits
    and closes; the holder still reads the newest commit, its WAL is not deleted under it, and what it commits
    next is read by a fresh process."""
    path = str(tmp_path / "mail.db")
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, path], env=process_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(holder.stdout.readline())["ready"] == [1, 1]

        def ask(what: str) -> list:
            holder.stdin.write(what + "\n")
            holder.stdin.flush()
            line = holder.stdout.readline()
            assert line, holder.stderr.read()
            return json.loads(line)["newest"]

        ask(asked)
        _write_and_close(path, "from another process")
        assert ask("read") == [2, 2], "the holder does not read the newest commit"
        assert ask("write") == [3, 3]
        assert _newest_elsewhere(path) == [3, 3], "the holder's commit went where nobody else reads"
        assert os.path.exists(path + "-wal"), "the WAL the holder uses was deleted under it"
        assert _deleted_files(holder.pid) == []
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
        holder.stdout.close()
        holder.stderr.close()


@pytest.mark.sqlite_only
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc to see the files a process holds")
def test_doctor_through_a_sqlite_server_leaves_the_servers_locks_alone(server):
    """A server holding a connection (a watch's) runs doctor for an operator; a process on the file itself then
    sends and closes. The server's WAL is not deleted under it, the watch gets that mail, the server reads it,
    and the server's own next send is read by a process on the file."""
    operator = server.token("--agent", "*")
    json_of(server.direct("send", "--from", "ops:one", "--to", "ops:two", "--subject", "before"))
    json_of(server.direct("read", "ops:two"))
    env = process_env(AGENT_MAIL_DB=server.url, AGENT_MAIL_TOKEN=operator)
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "ops:two", "--timeout-minutes", "5"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        from tests.lib.waiting import armed

        armed("ops:two", server.mailbox, procs=[watch])
        doctor = json_of(server.client(operator, "doctor"))
        assert doctor["ok"] is True, doctor
        json_of(server.direct("send", "--from", "ops:one", "--to", "ops:two", "--subject", "after the doctor"))
        out, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.communicate()
    assert watch.returncode == 0, err
    assert [m["subject"] for m in json.loads(out)["messages"]] == ["after the doctor"]
    seen = json_of(server.client(operator, "read", "ops:two", "--no-mark-read", "--all"))
    assert "after the doctor" in [m["subject"] for m in seen["messages"]], seen
    json_of(server.client(operator, "send", "--from", "ops:two", "--to", "ops:one", "--subject", "from the server"))
    mail = json_of(server.direct("read", "ops:one"))
    assert [m["subject"] for m in mail["messages"]] == ["from the server"], mail
    assert os.path.exists(server.mailbox + "-wal"), "the WAL the server uses was deleted under it"
    assert _deleted_files(server.proc.pid) == []
