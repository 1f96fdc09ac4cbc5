"""Idle wake of the real OpenCode (or Kilo Code CLI), end to end: `send` exits -> its new request reaches the model.

    python bench/bench_wake_opencode.py [--wakes 10] [--opencode PATH]
    python bench/bench_wake_opencode.py --harness kilo [--wakes 10] [--kilo PATH]

An interactive `opencode` (the TUI, in a tmux of its own) set up by `agent-mail setup opencode`, against
tests/lib/fake_model.py (local, instant: the figure is OpenCode's and agent-mail's own, not a model's). After a first
turn the session is idle; each round waits until the plugin's waiter (`hook opencode wait`) is armed, sends one message
with `agent-mail send`, and times from the moment send exits to the moment the fake model receives the woken
session's request (the plugin's client.session.promptAsync with the waiter's note). Target: median <= 1 s (issue 28).
Needs OpenCode (.cache/node, as .ci/run installs it, with @opencode-ai/plugin, linked in so OpenCode fetches nothing)
and tmux; prints the median, the spread and the load average. --harness kilo: the same with `kilo` (@kilocode/cli,
built on OpenCode: the same plugin, in .kilo/plugin, set up by `agent-mail setup kilo`; its config kilo.json).
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
AGENT = "bench:opencode"
NAMES = {"opencode": "OpenCode", "kilo": "Kilo Code"}
TARGET_SECONDS = 1.0
NODE = os.path.join(ROOT, ".cache", "node", "node_modules")


def _link_plugin_package(config: str) -> None:
    """@opencode-ai/plugin, which OpenCode would npm-install into a config directory at its start, linked in."""
    version = json.load(open(os.path.join(NODE, "@opencode-ai", "plugin", "package.json")))["version"]
    os.makedirs(os.path.join(config, "node_modules"), exist_ok=True)
    os.symlink(os.path.join(NODE, "@opencode-ai"), os.path.join(config, "node_modules", "@opencode-ai"))
    dependencies = {"@opencode-ai/plugin": version}
    with open(os.path.join(config, "package.json"), "w") as handle:
        json.dump({"dependencies": dependencies}, handle)
    with open(os.path.join(config, "package-lock.json"), "w") as handle:
        json.dump({"lockfileVersion": 3, "packages": {"": {"dependencies": dependencies}}}, handle)


def run(opencode: str, wakes: int, harness: str = "opencode") -> list[float]:
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
        os.makedirs(project)
        config = {"model": "scripted/scripted", "provider": {"scripted": {
            "npm": "@ai-sdk/openai-compatible", "options": {"baseURL": f"{model.url}/v1", "apiKey": "x"},
            "models": {"scripted": {}}}}}
        with open(os.path.join(project, f"{harness}.json"), "w") as handle:
            json.dump(config, handle)
        if harness == "opencode":
            _link_plugin_package(os.path.join(project, ".opencode"))
            _link_plugin_package(os.path.join(home, ".config", "opencode"))
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["AGENT_MAIL_DB"] = os.path.join(tmp, "mail.db")
        env["PYTHONPATH"] = os.path.join(ROOT, "src")
        cli = [sys.executable, "-m", "agent_mail"]
        subprocess.run([*cli, "setup", harness, "--agent", AGENT, "--dir", project], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        prefix = harness.upper()
        variables = {"HOME": home, "PWD": project, "PYTHONPATH": env["PYTHONPATH"], f"{prefix}_DISABLE_AUTOUPDATE": "1",
                     f"{prefix}_DISABLE_MODELS_FETCH": "1", f"{prefix}_DISABLE_LSP_DOWNLOAD": "1",
                     f"{prefix}_DISABLE_SHARE": "1", "npm_config_fetch_retries": "0"}
        if harness == "kilo":  # its background npm install of @kilocode/plugin goes nowhere
            variables.update(KILO_TELEMETRY_LEVEL="off", npm_config_registry="http://127.0.0.1:9/")
        command = " ".join(["env", "-u", "AGENT_MAIL_DB"] + [f"{k}={v}" for k, v in variables.items()] + [opencode])
        session = f"agent-mail-bench-{harness}-{os.getpid()}"
        tmux = ["tmux", "-S", os.path.join(tmp, "tmux.sock")]

        def until(predicate, what: str, timeout: float = 60) -> None:
            deadline = time.monotonic() + timeout
            while not predicate():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{NAMES[harness]}: {what}")
                time.sleep(0.01)

        def armed() -> bool:
            return json.loads(subprocess.run([*cli, "status", "--agent", AGENT], env=env, capture_output=True,
                                             check=True).stdout)["agents"][0]["watch_state"] == "armed"

        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "45", "-c", project, command],
                       check=True)
        try:
            until(lambda: "Ask anything" in subprocess.run([*tmux, "capture-pane", "-p", "-t", session],
                                                           capture_output=True, text=True).stdout,
                  "never reached its prompt")
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
    parser.add_argument("--harness", choices=sorted(NAMES), default="opencode")
    parser.add_argument("--opencode", default=os.environ.get("AGENT_MAIL_OPENCODE") or os.path.join(
        NODE, ".bin", "opencode"))
    parser.add_argument("--kilo", default=os.environ.get("AGENT_MAIL_KILO") or os.path.join(NODE, ".bin", "kilo"))
    args = parser.parse_args()
    program = args.kilo if args.harness == "kilo" else args.opencode
    if not os.path.exists(program) or shutil.which("tmux") is None:
        sys.exit(f"not run: {NAMES[args.harness]} (.ci/run installs it under .cache/node) or tmux is not installed")
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    samples = sorted(run(program, args.wakes, args.harness))
    median, p90 = statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]
    print(f"idle wake, {NAMES[args.harness]} end to end (send exits -> model asked): median {median * 1000:.0f} ms "
          f"over {len(samples)} wakes (min {samples[0] * 1000:.0f}, p90 {p90 * 1000:.0f}, "
          f"max {samples[-1] * 1000:.0f}); "
          f"target <= {TARGET_SECONDS * 1000:.0f} ms: "
          f"{'met' if median <= TARGET_SECONDS else 'NOT met'}; load {load}")


if __name__ == "__main__":
    main()
