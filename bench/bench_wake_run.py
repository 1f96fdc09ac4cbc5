"""How fast `agent-mail run` wakes an idle harness that has no wake of its own: the real Gemini CLI.

    python bench/bench_wake_run.py [--wakes 10] [--cli 'python -m agent_mail']

`agent-mail setup gemini` in a throwaway project, then `agent-mail run --agent P:N -- gemini` in tmux against the
scripted model (tests/lib/fake_model.py: local, instant), idle at its prompt. Each round: a `send` process commits a
message for P:N; measured from that process's exit to the scripted model receiving the turn the wake started
(run saw the mail, found the prompt idle, typed the one-line trigger, saw it on the screen, pressed Enter; Gemini's
prompt hook added the envelope; Gemini asked the model). Between rounds the turn ends and run's wake interval
(WAKE_INTERVAL_SECONDS) passes, as it would between two separate pieces of mail. The first round starts once
Gemini CLI is done starting (its session-start hook recorded the session). The figure includes Gemini CLI's
own reaction to a typed prompt and its prompt hook (a Python process), so it is the whole of what a person waits.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # for tests.lib
sys.path.insert(0, os.path.join(ROOT, "src"))

AGENT = "bench:coder"


def _until(predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"Gemini CLI under run: {what}")
        time.sleep(0.005)


def measure(cli: list[str], wakes: int) -> dict:
    from tests.lib.fake_model import FakeModel

    from agent_mail.harness.run import WAKE_INTERVAL_SECONDS, trigger_text

    gemini = os.environ.get("AGENT_MAIL_GEMINI") or os.path.join(ROOT, ".cache", "node", "node_modules", ".bin",
                                                                 "gemini")
    if not os.path.exists(gemini) or shutil.which("tmux") is None:
        raise SystemExit("not run: Gemini CLI (.cache/node, or AGENT_MAIL_GEMINI) or tmux is not installed")

    def main_turn(request: dict) -> bool:
        return any(f["name"] == "mcp_agent-mail_read" for t in request.get("tools", [])
                   for f in t.get("functionDeclarations", []))

    samples: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, \
            FakeModel(lambda r: [{"type": "text", "text": "ok from the model"}] if main_turn(r) else None) as model:
        project, home = os.path.join(tmp, "project"), os.path.join(tmp, "home")
        os.makedirs(project)
        os.makedirs(os.path.join(home, ".gemini"))
        os.makedirs(os.path.join(home, "tmp"))
        with open(os.path.join(home, ".gemini", "settings.json"), "w") as handle:
            json.dump({"security": {"auth": {"selectedType": "gemini-api-key"}}}, handle)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["AGENT_MAIL_DB"] = os.path.join(tmp, "mail.db")
        env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
        subprocess.run([*cli, "setup", "gemini", "--agent", AGENT, "--dir", project], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        variables = {"HOME": home, "TMPDIR": os.path.join(home, "tmp"), "GEMINI_API_KEY": "bench",
                     "GOOGLE_GEMINI_BASE_URL": model.url, "GEMINI_CLI_TRUST_WORKSPACE": "true",
                     "PYTHONPATH": env["PYTHONPATH"], "PATH": env["PATH"]}
        if os.environ.get("AGENT_MAIL_RUN_LOG"):  # why a wake waited, step by step
            variables["AGENT_MAIL_RUN_LOG"] = os.environ["AGENT_MAIL_RUN_LOG"]
        command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={v}" for k, v in variables.items()), *cli,
                              "run", "--agent", AGENT, "--", gemini])
        session = f"agent-mail-bench-run-{os.getpid()}"
        tmux = ["tmux", "-S", os.path.join(tmp, "tmux.sock")]
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "45", "-c", project, command],
                       check=True)
        try:
            def screen() -> str:
                return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                      text=True).stdout

            def idle() -> bool:
                shown = screen()
                return "Type your message" in shown and "Executing Hook" not in shown and "esc to cancel" not in shown

            def turns() -> int:
                return len([r for r in model.requests if main_turn(r)])

            def live() -> bool:  # its session-start hook ran: Gemini CLI is done starting
                rows = json.loads(subprocess.run([*cli, "status"], env=env, capture_output=True, check=True).stdout)
                return any(r["agent"] == AGENT and r.get("sessions") for r in rows["agents"])

            _until(lambda: idle() and live(), "never reached its prompt", 120)
            load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
            woken = 0.0
            for i in range(wakes):
                _until(lambda: idle() and time.monotonic() > woken + WAKE_INTERVAL_SECONDS + 0.5,  # noqa: B023
                       "the last turn did not end", 60)
                before = turns()
                subprocess.run([*cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", f"wake {i}"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                sent = time.perf_counter()
                _until(lambda: turns() > before, f"round {i}: the idle session was not woken:\n{screen()}", 30)  # noqa: B023
                samples.append((time.perf_counter() - sent) * 1000)
                woken = time.monotonic()
                said = json.dumps([r for r in model.requests if main_turn(r)][before]["contents"])
                if trigger_text(AGENT) not in said or f"wake {i}" not in said:
                    raise RuntimeError(f"round {i}: the woken turn did not hold the trigger and the envelope")
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered), "min_ms": ordered[0],
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))], "max_ms": ordered[-1], "n": len(ordered),
            "load": load, "samples_ms": [round(s, 1) for s in samples]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=10, help="rounds (at least 10 for the figure)")
    parser.add_argument("--cli", default=f"{shlex.quote(sys.executable)} -m agent_mail",
                        help="the agent-mail command to run (default: this tree's, with this Python)")
    args = parser.parse_args()
    result = measure(shlex.split(args.cli), args.wakes)
    print(f"run wake, Gemini CLI end to end: send exits -> model asked: median {result['median_ms']:.1f} ms "
          f"(n {result['n']}, min {result['min_ms']:.1f}, p90 {result['p90_ms']:.1f}, max {result['max_ms']:.1f}; "
          f"load {result['load']}; target <= 1000 ms)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
