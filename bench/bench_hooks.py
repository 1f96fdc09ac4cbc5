"""What the harness hooks cost, and how fast an idle session is woken.

    python bench/bench_hooks.py [--rounds 31] [--wakes 10] [--only-wake] [--cli PATH]

- The PostToolUse hook runs on every tool call, so it is timed as Claude Code runs it: the command
  `agent-mail setup claude-code` writes, through `sh -c`, its hook input on stdin, as a whole process,
  with nothing new (the common case, quiet) and with one new message each time (a note is printed and
  the session marked told). Beside it, in the same run, the CLI's own `read AGENT` cold start (the
  issue's yardstick: within 5 ms of it), and `read` through the same `python -m agent_mail` form.
- The PreToolUse hook (issue 22) runs before every edit: timed the same way, in a git repository where
  another identity holds src/**, for an Edit of a held file (denied) and of a free one (silent).
- Idle wake, the hook's part: an asyncRewake waiter (`hook claude-code wait`) is blocked; a sender
  process commits a message; the time from the send process's exit to the waiter's exit 2.
- Idle wake, end to end, when Claude Code is installed (see tests/harnesses/test_claude_code.py): an interactive
  `claude` under tmux, idle after one turn; a send; the time until the scripted model receives the turn
  the wake started. The model is tests/lib/fake_model.py (local, instant), so this is Claude Code's own
  reaction plus ours.

No peer has these (MCP Agent Mail's hook prints to a log the model never sees; nothing else wakes an
idle session), so the comparison is with our own CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for tests.lib
from common import cli_env, implementations, table  # noqa: E402

AGENT = "bench:coder"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _time(argv: list[str], env: dict, stdin: bytes = b"", before=None) -> float:
    if before is not None:
        before()
    started = time.perf_counter()
    done = subprocess.run(argv, input=stdin, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed: {done.stderr.decode()}")
    return took


def hook_rows(cli: str, rounds: int) -> list[tuple]:
    python = os.path.join(os.path.dirname(cli), "python")
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "mail.db")
        env = cli_env(db)
        project = os.path.join(tmp, "project")
        os.makedirs(project)
        subprocess.run([python, "-m", "agent_mail", "setup", "claude-code", "--agent", AGENT, "--dir", project],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        settings = json.load(open(os.path.join(project, ".claude", "settings.local.json")))
        command = settings["hooks"]["PostToolUse"][0]["hooks"][0]["command"]
        start = json.dumps({"session_id": "bench", "hook_event_name": "SessionStart"}).encode()
        tool = json.dumps({"session_id": "bench", "hook_event_name": "PostToolUse", "tool_name": "Bash",
                           "tool_input": {"command": "ls"}, "tool_response": {"stdout": ""}}).encode()
        bare = {k: v for k, v in env.items() if k != "AGENT_MAIL_DB"}
        subprocess.run(["sh", "-c", command], input=start, env=bare, check=True, stdout=subprocess.DEVNULL)
        for i in range(4):  # some history: direct mail and broadcasts, told at the start
            subprocess.run([cli, "send", "--from", "bench:lead", "--to", AGENT if i % 2 else "*", "--subject",
                            f"m{i}"], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["sh", "-c", command], input=start, env=bare, check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["git", "init", "-q", project], check=True)
        subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project,
                       check=True)
        subprocess.run([cli, "reserve", "bench:holder", "src/**"], cwd=project, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        pretool = settings["hooks"]["PreToolUse"][0]["hooks"][0]["command"]

        def edit(path: str) -> bytes:
            return json.dumps({"session_id": "bench", "hook_event_name": "PreToolUse", "cwd": project,
                               "tool_name": "Edit", "tool_input": {"file_path": os.path.join(project, path),
                                                                   "old_string": "a", "new_string": "b"}}).encode()

        def alive():
            subprocess.run([cli, "heartbeat", "bench:holder"], env=env, check=True, stdout=subprocess.DEVNULL)

        samples = {"quiet": [], "new": [], "read": [], "read -m": [], "deny": [], "free": []}

        def send_one():
            subprocess.run([cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", "new"], env=env,
                           check=True, stdout=subprocess.DEVNULL)

        for _ in range(rounds):  # interleaved, so machine noise falls on all alike
            samples["quiet"].append(_time(["sh", "-c", command], bare, tool))
            samples["new"].append(_time(["sh", "-c", command], bare, tool, before=send_one))
            samples["read"].append(_time([cli, "read", AGENT, "--no-mark-read"], env))
            samples["read -m"].append(_time([python, "-m", "agent_mail", "read", AGENT, "--no-mark-read"], env))
            samples["deny"].append(_time(["sh", "-c", pretool], bare, edit("src/lib.rs"), before=alive))
            samples["free"].append(_time(["sh", "-c", pretool], bare, edit("README.md")))
    median = {key: statistics.median(values) for key, values in samples.items()}
    return [
        ("PostToolUse hook, nothing new (as set up: sh -c), ms", f"{median['quiet']:.1f}", f"{median['read']:.1f}",
         f"{median['quiet'] - median['read']:+.1f}"),
        ("PostToolUse hook, one new message, ms", f"{median['new']:.1f}", f"{median['read']:.1f}",
         f"{median['new'] - median['read']:+.1f}"),
        ("PreToolUse hook, Edit of a held file (denied), ms", f"{median['deny']:.1f}", f"{median['read']:.1f}",
         f"{median['deny'] - median['read']:+.1f}"),
        ("PreToolUse hook, Edit of a free file (silent), ms", f"{median['free']:.1f}", f"{median['read']:.1f}",
         f"{median['free'] - median['read']:+.1f}"),
        ("read AGENT as python -m agent_mail, ms", f"{median['read -m']:.1f}", f"{median['read']:.1f}",
         f"{median['read -m'] - median['read']:+.1f}"),
    ]


def waiter_rows(cli: str, rounds: int) -> list[tuple]:
    python = os.path.join(os.path.dirname(cli), "python")
    samples = []
    with tempfile.TemporaryDirectory() as tmp:
        env = cli_env(os.path.join(tmp, "mail.db"))
        env.update(CLAUDE_CODE_ENTRYPOINT="cli", CLAUDE_CODE_SESSION_ATTENDED="1", CLAUDE_PID=str(os.getpid()))
        document = json.dumps({"session_id": "bench", "hook_event_name": "Stop"}).encode()
        subprocess.run([python, "-m", "agent_mail", "hook", "claude-code", "context", "--agent", AGENT],
                       input=json.dumps({"session_id": "bench", "hook_event_name": "SessionStart"}).encode(),
                       env=env, check=True, stdout=subprocess.DEVNULL)
        for _ in range(rounds):
            waiter = subprocess.Popen([python, "-m", "agent_mail", "hook", "claude-code", "wait", "--agent", AGENT],
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      env=env)
            waiter.stdin.write(document)
            waiter.stdin.close()
            deadline = time.monotonic() + 30
            while True:  # armed: status shows it
                state = json.loads(subprocess.run([cli, "status", "--agent", AGENT], env=env, capture_output=True,
                                                  check=True).stdout)["agents"][0]["watch_state"]
                if state == "armed":
                    break
                if time.monotonic() > deadline:
                    waiter.kill()
                    raise RuntimeError("the waiter never armed")
                time.sleep(0.02)
            subprocess.run([cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", "wake"], env=env,
                           check=True, stdout=subprocess.DEVNULL)
            sent = time.perf_counter()
            code = waiter.wait(timeout=30)
            samples.append((time.perf_counter() - sent) * 1000)
            if code != 2:
                raise RuntimeError(f"the waiter exited {code}: {waiter.stderr.read().decode()}")
    return [("idle wake, hook part: send exits -> waiter exits 2, median ms", f"{statistics.median(samples):.1f}",
             "-", f"p90 {sorted(samples)[int(0.9 * (len(samples) - 1))]:.1f}")]


def claude_rows(cli: str, rounds: int) -> list[tuple]:
    """End to end through the real Claude Code, when it and tmux are installed."""
    claude = os.environ.get("AGENT_MAIL_CLAUDE") or os.path.join(ROOT, ".cache", "node", "node_modules", ".bin",
                                                                 "claude")
    if not os.path.exists(claude) or shutil.which("tmux") is None:
        return [("idle wake, Claude Code end to end", "not run: Claude Code or tmux not installed", "-", "-")]
    from tests.lib.fake_model import FakeModel

    python = os.path.join(os.path.dirname(cli), "python")
    samples = []
    with tempfile.TemporaryDirectory() as tmp, FakeModel() as model:
        project, home = os.path.join(tmp, "project"), os.path.join(tmp, "home")
        os.makedirs(project)
        os.makedirs(home)
        env = cli_env(os.path.join(tmp, "mail.db"))
        subprocess.run([python, "-m", "agent_mail", "setup", "claude-code", "--agent", AGENT, "--dir", project],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(home, ".claude.json"), "w") as handle:
            json.dump({"hasCompletedOnboarding": True, "customApiKeyResponses": {"approved": ["sk-ant-bench"]},
                       "projects": {project: {"hasTrustDialogAccepted": True}}}, handle)
        session = f"agent-mail-bench-{os.getpid()}"
        tmux = ["tmux", "-S", os.path.join(tmp, "tmux.sock")]  # a server of its own, its socket in tmp
        variables = {"HOME": home, "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-bench",
                     "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                     "ENABLE_TOOL_SEARCH": "false", "DISABLE_AUTOUPDATER": "1"}
        command = " ".join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={v}" for k, v in variables.items()] + [claude])
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "200", "-y", "50", "-c", project, command],
                       check=True)
        try:
            def turns() -> int:
                return len([r for r in model.requests if r.get("tools")])

            def armed() -> bool:
                return json.loads(subprocess.run([cli, "status", "--agent", AGENT], env=env, capture_output=True,
                                                 check=True).stdout)["agents"][0]["watch_state"] == "armed"

            def until(predicate, what: str, timeout: float = 60) -> None:
                deadline = time.monotonic() + timeout
                while not predicate():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Claude Code: {what}")
                    time.sleep(0.01)

            until(lambda: "❯" in subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                                text=True).stdout, "never reached its prompt")
            subprocess.run([*tmux, "send-keys", "-t", session, "hello"], check=True)
            time.sleep(0.3)
            subprocess.run([*tmux, "send-keys", "-t", session, "Enter"], check=True)
            load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())  # 1, 5, 15 min, as the wakes begin
            for i in range(rounds):
                until(armed, "the waiter never armed")
                before = turns()
                subprocess.run([cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", f"wake {i}"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                sent = time.perf_counter()
                until(lambda: turns() > before, "the idle session was not woken", timeout=30)  # noqa: B023
                samples.append((time.perf_counter() - sent) * 1000)
        finally:
            subprocess.run([*tmux, "kill-session", "-t", session], capture_output=True)
    ordered = sorted(samples)
    spread = (f"n {len(ordered)}, min {ordered[0]:.1f}, p90 {ordered[int(0.9 * (len(ordered) - 1))]:.1f}, max "
              f"{ordered[-1]:.1f}; load {load}")
    return [("idle wake, Claude Code end to end: send exits -> model asked, median ms",
             f"{statistics.median(samples):.1f}", "none: no peer wakes an idle session", spread)]


HEADERS = ("measure", "hook", "agent-mail read (same run)", "difference")


def rows(clis: dict, rounds: int = 31, wakes: int = 10, only_wake: bool = False) -> list[tuple]:
    cli = clis["agent-mail"]
    if only_wake:
        return waiter_rows(cli, wakes) + claude_rows(cli, wakes)
    return hook_rows(cli, rounds) + waiter_rows(cli, wakes) + claude_rows(cli, wakes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--wakes", type=int, default=10)
    parser.add_argument("--only-wake", action="store_true", help="only the idle-wake rows")
    parser.add_argument("--cli", help="the agent-mail CLI to time (default: reinstalled from this tree)")
    args = parser.parse_args()
    clis = {"agent-mail": args.cli} if args.cli else implementations()
    print(table(rows(clis, args.rounds, args.wakes, args.only_wake), HEADERS))


if __name__ == "__main__":
    main()
