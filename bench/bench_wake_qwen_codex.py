"""How fast an idle Qwen Code or Codex session is woken by mail (issue 28): send exits -> the model is asked.

    python bench/bench_wake_qwen_codex.py [--wakes 10] [--only qwen|codex]

Each harness runs interactively in a tmux of its own against tests/lib/fake_model.py (local, instant), set up by
`agent-mail setup HARNESS` as a person would, idle after one turn typed by hand. Then, --wakes times: once the
session's waker is armed (status: watch_state armed), a `send` from another process; the time from that process's
exit until the scripted model receives the turn the wake started (a request holding the new subject). So the
figure is our waker's reaction plus the harness's own:

- Qwen Code: the waker appends a prompt to the session's dual-output input file, which Qwen Code polls every
  500 ms: about 0.25 s on average from that alone.
- Codex: the waker runs `codex queue`, which Codex's shared app-server (the daemon interactive `codex` starts)
  takes at once. Without that app-server (features.daemon_auto_start = false) a session's own process looks at its
  queue about every 10 s, counted from the end of its last turn: 0-10 s, 5 s on average (not measured here). The
  app-server this run started is ended at the end, by the ids it recorded under the run's CODEX_HOME.

"Idle" is after the turn's background work too: Qwen Code asks the model for a prompt suggestion and runs its
memory extraction right after a turn, and a prompt submitted then waits for them (about 0.8 s more, seen).

The interpreter is this one (python -m agent_mail, with its PYTHONPATH), as the hooks setup writes use it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # for tests.lib
from common import table  # noqa: E402

AGENT = "bench:coder"
# How often each harness looks for what the waker handed it (Qwen Code's input file: every 500 ms; Codex's shared
# app-server takes `codex queue` at once). A real send comes at any moment of that period, so each wake waits a
# random part of it first (for Codex, a second at random).
PHASE = {"qwen": 0.5, "codex": 1.0}
BIN = os.path.join(ROOT, ".cache", "node", "node_modules", ".bin")


def _until(predicate, what: str, timeout: float = 60.0, screen=None):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}\n{screen() if screen else ''}")
        time.sleep(0.01)


class Tmux:
    def __init__(self, directory: str, cwd: str, command: str):
        self.base = ["tmux", "-S", os.path.join(directory, "tmux.sock")]
        self.name = f"agent-mail-bench-{os.getpid()}"
        subprocess.run([*self.base, "new-session", "-d", "-s", self.name, "-x", "200", "-y", "50", "-c", cwd,
                        command], check=True)

    def screen(self) -> str:
        return subprocess.run([*self.base, "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True).stdout

    def keys(self, *typed: str) -> None:
        for key in typed:
            subprocess.run([*self.base, "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.3)

    def close(self) -> None:
        subprocess.run([*self.base, "kill-session", "-t", self.name], capture_output=True)
        subprocess.run([*self.base, "kill-server"], capture_output=True)


def _qwen(tmp: str, project: str, model, env: dict) -> tuple[Tmux, callable]:
    home = os.path.join(tmp, "home")
    os.makedirs(os.path.join(home, ".qwen"))
    with open(os.path.join(home, ".qwen", "settings.json"), "w") as handle:
        json.dump({"general": {"enableAutoUpdate": False}, "privacy": {"usageStatisticsEnabled": False},
                   "telemetry": {"enabled": False}}, handle)
    os.makedirs(os.path.join(project, ".qwen"))
    with open(os.path.join(project, ".qwen", "settings.json"), "w") as handle:
        json.dump({"model": {"name": "scripted"}}, handle)
    _setup("qwen", project, env)
    passed = {"HOME": home, "OPENAI_API_KEY": "x", "OPENAI_BASE_URL": f"{model.url}/v1", "OPENAI_MODEL": "scripted",
              "QWEN_USAGE_STATISTICS_ENABLED": "false", "TMPDIR": tmp, "PATH": os.environ["PATH"],
              "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={v}" for k, v in passed.items()),
                          os.path.join(BIN, "qwen"), "--auth-type", "openai"])
    terminal = Tmux(tmp, project, command)
    _until(lambda: "Approve this server" in terminal.screen(), "qwen: no MCP approval asked", screen=terminal.screen)
    terminal.keys("1", "Enter")
    _until(lambda: "Type your message" in terminal.screen(), "qwen: no prompt", screen=terminal.screen)

    def main(request: dict) -> bool:
        messages = request.get("messages") or [{}]
        return any(t.get("function", {}).get("name") == "write_file" for t in request.get("tools") or []) and \
            "You are Qwen Code" in json.dumps(messages[0])
    return terminal, main


def _codex(tmp: str, project: str, model, env: dict) -> tuple[Tmux, callable]:
    home = os.path.join(tmp, "codex-home")
    os.makedirs(home)
    _setup("codex", project, env)
    with open(os.path.join(home, "config.toml"), "w") as handle:
        handle.write('model = "gpt-test"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\n'
                     f'name = "scripted"\nbase_url = "{model.url}/v1"\nenv_key = "SCRIPTED_KEY"\n'
                     f'wire_api = "responses"\n\n[projects."{project}"]\ntrust_level = "trusted"\n')
    passed = {"CODEX_HOME": home, "HOME": home, "SCRIPTED_KEY": "test", "TMPDIR": tmp, "PATH": os.environ["PATH"],
              "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={v}" for k, v in passed.items()),
                          os.path.join(BIN, "codex")])
    terminal = Tmux(tmp, project, command)
    _until(lambda: "Hooks need review" in terminal.screen(), "codex: no hooks review", 90, terminal.screen)
    terminal.keys("2", "Enter")  # trust the project's hooks, as a person does once

    def at_prompt() -> bool:
        shown = terminal.screen()
        if "t trust all" in shown:
            terminal.keys("t", "Escape")
        return "Ask Codex" in shown
    _until(at_prompt, "codex: no prompt", screen=terminal.screen)

    def main(request: dict) -> bool:
        return any(tool.get("name") == "mcp__agent_mail" for tool in request.get("tools", []))
    return terminal, main


def _stop_daemon(home: str) -> None:
    """End the Codex app-server daemon (and its updater) this run's CODEX_HOME started, by the ids it recorded, if
    each is still a process running from there."""
    import signal

    for name in ("daemon.pid", "daemon-updater.pid", "app-server.pid", "app-server-updater.pid"):
        try:
            with open(os.path.join(home, "app-server-daemon", name)) as handle:
                pid = json.load(handle)["pid"]
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if home.encode() in handle.read():
                    os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError, KeyError, TypeError):
            continue


def _setup(harness: str, project: str, env: dict) -> None:
    subprocess.run([sys.executable, "-m", "agent_mail", "setup", harness, "--agent", AGENT, "--dir", project],
                   env=env, check=True, stdout=subprocess.DEVNULL)


def wakes(harness: str, count: int) -> tuple:
    from tests.lib.fake_model import FakeModel

    if not os.path.exists(os.path.join(BIN, harness)) or shutil.which("tmux") is None:
        return (f"idle wake, {harness}", "not run: it or tmux is not installed", "-", "-")
    samples: list[float] = []
    def answer(request: dict) -> list:
        model.last = time.monotonic()
        return [{"type": "text", "text": "ok"}]
    with tempfile.TemporaryDirectory() as tmp, FakeModel(answer) as model:
        model.last = time.monotonic()
        project = os.path.join(tmp, "project")
        os.makedirs(project)
        env = {**os.environ, "AGENT_MAIL_DB": os.path.join(tmp, "mail.db")}
        terminal, main = (_qwen if harness == "qwen" else _codex)(tmp, project, model, env)
        try:
            def status() -> dict:
                done = subprocess.run([sys.executable, "-m", "agent_mail", "status", "--agent", AGENT], env=env,
                                      capture_output=True, check=True)
                return json.loads(done.stdout)["agents"][0]

            terminal.keys("hello", "Enter")
            _until(lambda: any(main(r) for r in model.requests), f"{harness}: the first turn", screen=terminal.screen)
            load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
            for i in range(count):
                _until(lambda: status()["watch_state"] == "armed", f"{harness}: the waker never armed", 60,
                       terminal.screen)
                # Idle: the turn's background work done too (Qwen Code asks the model for a prompt suggestion and
                # runs its memory extraction after a turn), no request for a second and a half.
                _until(lambda: time.monotonic() - model.last > 1.5, f"{harness}: never quiet", 60, terminal.screen)
                time.sleep(random.uniform(0.0, PHASE[harness]))  # mail comes at any moment of the harness's poll
                subject = f"wake {i}"
                subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "bench:lead", "--to", AGENT,
                                "--subject", subject], env=env, check=True, stdout=subprocess.DEVNULL)
                sent = time.perf_counter()
                _until(lambda: any(main(r) and subject in json.dumps(r) for r in model.requests),  # noqa: B023
                       f"{harness}: not woken", 60, terminal.screen)
                samples.append(time.perf_counter() - sent)
        finally:
            terminal.close()
            _stop_daemon(os.path.join(tmp, "codex-home"))
    ordered = sorted(samples)
    spread = (f"n {len(ordered)}, min {ordered[0]:.2f}, p90 {ordered[int(0.9 * (len(ordered) - 1))]:.2f}, max "
              f"{ordered[-1]:.2f}; load {load}")
    name = {"qwen": "Qwen Code (dual-output input file)", "codex": "Codex (codex queue)"}[harness]
    return (f"idle wake, {name}: send exits -> model asked, median s", f"{statistics.median(samples):.2f}",
            "1.00", spread)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=10)
    parser.add_argument("--only", choices=("qwen", "codex"))
    args = parser.parse_args()
    rows = [wakes(harness, args.wakes) for harness in ("qwen", "codex") if args.only in (None, harness)]
    print(table(rows, ("measure", "agent-mail", "target", "spread")))


if __name__ == "__main__":
    main()
