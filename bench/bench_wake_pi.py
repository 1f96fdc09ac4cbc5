"""Idle wake of the real Pi coding agent, end to end: `send` exits -> Pi's new request reaches the model.

    python bench/bench_wake_pi.py [--wakes 10] [--pi PATH]

An interactive `pi` (the TUI, in a tmux of its own) set up by `agent-mail setup pi`, against tests/lib/fake_model.py
(local, instant: the figure is Pi's and agent-mail's own, not a model's), named in Pi's models.json; PI_OFFLINE=1. After
a first turn the session is idle; each round waits until the extension's waiter (`hook pi wait`) is armed, sends one
message with `agent-mail send`, and times from the moment send exits to the moment the fake model receives the woken
session's request (the extension's pi.sendUserMessage with the waiter's note). Target: median <= 1 s (issue 33). Needs
Pi (.cache/node, as .ci/run installs it) and tmux; prints the median, the spread and the load average.
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
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # for tests.lib
AGENT = "bench:pi"
TARGET_SECONDS = 1.0
NODE = os.path.join(ROOT, ".cache", "node", "node_modules")


def run(pi: str, wakes: int) -> list[float]:
    from tests.lib.fake_model import FakeModel

    arrived: list[float] = []
    lock = threading.Lock()

    def script(request):
        if any(t.get("function", {}).get("name") == "write" for t in request.get("tools") or []):
            with lock:
                arrived.append(time.perf_counter())
        return [{"type": "text", "text": "ok"}]

    samples = []
    with tempfile.TemporaryDirectory() as tmp, FakeModel(script) as model:
        project, home = os.path.join(tmp, "project"), os.path.join(tmp, "home")
        settings = os.path.join(home, ".pi", "agent")
        os.makedirs(project)
        os.makedirs(settings)
        with open(os.path.join(settings, "models.json"), "w") as handle:
            json.dump({"providers": {"scripted": {"baseUrl": f"{model.url}/v1", "api": "openai-completions",
                                                  "apiKey": "x", "models": [{"id": "scripted"}]}}}, handle)
        with open(os.path.join(settings, "settings.json"), "w") as handle:
            json.dump({"defaultProvider": "scripted", "defaultModel": "scripted"}, handle)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["AGENT_MAIL_DB"] = os.path.join(tmp, "mail.db")
        env["PYTHONPATH"] = os.path.join(ROOT, "src")
        cli = [sys.executable, "-m", "agent_mail"]
        subprocess.run([*cli, "setup", "pi", "--agent", AGENT, "--dir", project], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        variables = {"HOME": home, "PYTHONPATH": env["PYTHONPATH"], "PI_OFFLINE": "1", "PI_SKIP_VERSION_CHECK": "1",
                     "PI_TELEMETRY": "0"}
        command = " ".join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={v}" for k, v in variables.items()] + [pi])
        session = f"agent-mail-bench-pi-{os.getpid()}"
        tmux = ["tmux", "-S", os.path.join(tmp, "tmux.sock")]

        def until(predicate, what: str, timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Pi: {what}")
                time.sleep(0.01)

        def armed() -> bool:
            return json.loads(subprocess.run([*cli, "status", "--agent", AGENT], env=env, capture_output=True,
                                             check=True).stdout)["agents"][0]["watch_state"] == "armed"

        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "45", "-c", project, command],
                       check=True)
        try:
            until(lambda: "agent-mail.ts" in subprocess.run([*tmux, "capture-pane", "-p", "-t", session],
                                                            capture_output=True, text=True).stdout,
                  "never started with the extension")
            subprocess.run([*tmux, "send-keys", "-t", session, "hello"], check=True)
            time.sleep(0.3)
            subprocess.run([*tmux, "send-keys", "-t", session, "Enter"], check=True)
            until(lambda: len(arrived) >= 1, "the first turn never reached the model")
            for i in range(wakes):
                until(armed, "the waiter never armed")
                before = len(arrived)
                subprocess.run([*cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", f"wake {i}"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                sent = time.perf_counter()
                until(lambda: len(arrived) > before, "the idle session was not woken", timeout=30)  # noqa: B023
                samples.append(arrived[before] - sent)
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=10)
    parser.add_argument("--pi", default=os.environ.get("AGENT_MAIL_PI") or os.path.join(NODE, ".bin", "pi"))
    args = parser.parse_args()
    if not os.path.exists(args.pi) or shutil.which("tmux") is None:
        sys.exit("not run: Pi (.ci/run installs it under .cache/node) or tmux is not installed")
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    samples = sorted(run(args.pi, args.wakes))
    median, p90 = statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]
    print(f"idle wake, Pi end to end (send exits -> model asked): median {median * 1000:.0f} ms over "
          f"{len(samples)} wakes (min {samples[0] * 1000:.0f}, p90 {p90 * 1000:.0f}, max {samples[-1] * 1000:.0f}); "
          f"target <= {TARGET_SECONDS * 1000:.0f} ms: "
          f"{'met' if median <= TARGET_SECONDS else 'NOT met'}; load {load}")


if __name__ == "__main__":
    main()
