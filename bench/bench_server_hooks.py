"""What the harness hooks cost through `agent-mail serve` (AGENT_MAIL_DB=http://), beside the same hooks on the
mailbox itself, in the same run.

    python bench/bench_server_hooks.py [--rounds 31] [--wakes 10] [--db URL]

Each row is a whole process, as a harness runs it, interleaved so machine noise falls on all alike:
`read AGENT --no-mark-read` (the yardstick), the PostToolUse hook with nothing new (quiet) and with one new
message, and the PreToolUse hook for an Edit of a file another identity holds (denied) and of a free one
(silent); locally (the mailbox opened by the hook) and through a server on loopback (the hook's own steps on
this machine, its mailbox steps one request each). Then the idle wake through the server: a Claude Code
waiter (`hook claude-code wait`) blocked there, a sender's process exits, the waiter exits 2 (median, p90).

The mailbox is a temporary SQLite file, or the PostgreSQL URL given with --db (a schema of its own is not made:
give a database the benchmark may write to). The code timed is this tree's (src/ first on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, percentile, table  # noqa: E402

AGENT, HOLDER = "bench:coder", "bench:holder"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADERS = ("what (median of whole processes)", "local, ms", "through the server, ms", "difference")


def _env(db: str, **extra: str) -> dict:
    env = cli_env(db)
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def _am(env: dict, *argv: str, stdin: bytes = b"", cwd: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "agent_mail", *argv], input=stdin, env=env, cwd=cwd,
                          capture_output=True)
    if done.returncode not in (0, 3):
        raise RuntimeError(f"{argv} failed: {done.stderr.decode()}")
    return done


def _timed(env: dict, *argv: str, stdin: bytes = b"", cwd: str | None = None) -> float:
    started = time.perf_counter()
    _am(env, *argv, stdin=stdin, cwd=cwd)
    return (time.perf_counter() - started) * 1000


class Serving:
    def __init__(self, db: str, log: str):
        self.log = open(log, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"],
                                     env=_env(db), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.url = json.loads(self.proc.stderr.readline())["listening"]
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=self.log)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self._drain.wait(timeout=10)
        self.log.close()


def run(rounds: int, wakes: int, db: str | None) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        db = db or os.path.join(tmp, "mail.db")
        local = _env(db)
        token = json.loads(_am(local, "token", "create", "--agent", "bench:*").stdout)["token"]
        server = Serving(db, os.path.join(tmp, "serve.log"))
        try:
            remote = _env(server.url, AGENT_MAIL_TOKEN=token)
            project = os.path.join(tmp, "project")
            os.makedirs(os.path.join(project, "src"))
            subprocess.run(["git", "init", "-q", project], check=True)
            subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/bench.git"], cwd=project,
                           check=True)
            _am(local, "reserve", HOLDER, "src/**", cwd=project)
            for side, env in (("local", local), ("served", remote)):
                _am(env, "hook", "claude-code", "context", "--agent", AGENT, stdin=json.dumps(
                    {"session_id": side, "hook_event_name": "SessionStart"}).encode())
            samples: dict[tuple[str, str], list[float]] = {}

            def tool(side: str) -> bytes:
                return json.dumps({"session_id": side, "hook_event_name": "PostToolUse", "tool_name": "Bash"}).encode()

            def edit(path: str) -> bytes:
                return json.dumps({"session_id": "e", "hook_event_name": "PreToolUse", "cwd": project,
                                   "tool_name": "Edit", "tool_input": {"file_path": os.path.join(project, path)}}
                                  ).encode()
            for _ in range(rounds):
                _am(local, "heartbeat", HOLDER)  # the holder stays live
                for side, env in (("local", local), ("served", remote)):
                    hook = ("hook", "claude-code")
                    samples.setdefault(("read", side), []).append(
                        _timed(env, "read", AGENT, "--no-mark-read"))
                    samples.setdefault(("quiet", side), []).append(
                        _timed(env, *hook, "context", "--agent", AGENT, stdin=tool(side)))
                    _am(local, "send", "--from", "bench:lead", "--to", AGENT, "--subject", "new")
                    samples.setdefault(("new", side), []).append(
                        _timed(env, *hook, "context", "--agent", AGENT, stdin=tool(side)))
                    samples.setdefault(("deny", side), []).append(
                        _timed(env, *hook, "pretool", "--agent", AGENT, stdin=edit("src/lib.rs"), cwd=project))
                    samples.setdefault(("free", side), []).append(
                        _timed(env, *hook, "pretool", "--agent", AGENT, stdin=edit("README.md"), cwd=project))
            median = {key: statistics.median(values) for key, values in samples.items()}
            names = {"read": "read AGENT --no-mark-read", "quiet": "PostToolUse hook, nothing new",
                     "new": "PostToolUse hook, one new message", "deny": "PreToolUse hook, Edit of a held file",
                     "free": "PreToolUse hook, Edit of a free file"}
            rows = [(names[k], f"{median[(k, 'local')]:.1f}", f"{median[(k, 'served')]:.1f}",
                     f"{median[(k, 'served')] - median[(k, 'local')]:+.1f}") for k in names]
            rows.append(_wake_row(remote, local, wakes))
            return rows
        finally:
            server.stop()


def _wake_row(remote: dict, local: dict, wakes: int) -> tuple:
    """send's process exits -> the waiter blocked through the server exits 2."""
    env = {**remote, "CLAUDE_CODE_ENTRYPOINT": "cli", "CLAUDE_CODE_SESSION_ATTENDED": "1",
           "CLAUDE_PID": str(os.getpid())}
    document = json.dumps({"session_id": "waiter", "hook_event_name": "Stop"}).encode()
    _am(env, "hook", "claude-code", "context", "--agent", AGENT, stdin=json.dumps(
        {"session_id": "waiter", "hook_event_name": "SessionStart"}).encode())
    samples = []
    for _ in range(wakes):
        waiter = subprocess.Popen([sys.executable, "-m", "agent_mail", "hook", "claude-code", "wait", "--agent",
                                   AGENT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=env)
        waiter.stdin.write(document)
        waiter.stdin.close()
        deadline = time.monotonic() + 30
        while json.loads(_am(local, "status", "--agent", AGENT).stdout)["agents"][0]["watch_state"] != "armed":
            if time.monotonic() > deadline:
                waiter.kill()
                raise RuntimeError("the waiter never armed")
            time.sleep(0.02)
        _am(local, "send", "--from", "bench:lead", "--to", AGENT, "--subject", "wake")
        sent = time.perf_counter()
        code = waiter.wait(timeout=30)
        samples.append((time.perf_counter() - sent) * 1000)
        waiter.stderr.close()
        if code != 2:
            raise RuntimeError(f"the waiter exited {code}")
    return ("idle wake through the server: send exits -> waiter exits 2", "-",
            f"{statistics.median(samples):.1f}", f"p90 {percentile(samples, 0.9):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--wakes", type=int, default=10)
    parser.add_argument("--db", help="a postgresql:// URL to run on (default: a temporary SQLite file)")
    args = parser.parse_args()
    print(table(run(args.rounds, args.wakes, args.db), HEADERS))


if __name__ == "__main__":
    main()
