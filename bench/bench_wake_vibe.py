"""How fast `agent-mail run` wakes an idle Mistral Vibe, which has no wake of its own and no prompt hook.

    python bench/bench_wake_vibe.py [--wakes 10] [--cli 'python -m agent_mail']

`agent-mail setup vibe` in a throwaway project (its HOME's ~/.vibe/hooks.toml), then `agent-mail run --agent P:N --
vibe` in tmux against the scripted model (tests/lib/fake_model.py: local, instant, named in ~/.vibe/config.toml),
idle at its prompt. Each round: a `send` process commits a message for P:N; measured from that process's exit to
(1) the scripted model receiving the turn the wake started (run saw the mail, found the prompt empty and idle, typed
the one-line trigger, saw it on the screen, pressed Enter; Vibe asked the model) and (2) the model receiving the
envelope (that turn ended with a text answer; Vibe's post_agent hook sent the turn back with the envelope; Vibe asked
the model again). Between rounds the turns end and run's wake interval (WAKE_INTERVAL_SECONDS) passes. Vibe is found
in .cache/vibe (`.ci/run` installs it) or AGENT_MAIL_VIBE.
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
            raise RuntimeError(f"Mistral Vibe under run: {what}")
        time.sleep(0.005)


def _summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered), "min_ms": ordered[0],
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))], "max_ms": ordered[-1], "n": len(ordered),
            "samples_ms": [round(s, 1) for s in samples]}


def measure(cli: list[str], wakes: int) -> dict:
    from tests.lib.fake_model import FakeModel

    from agent_mail.harness.run import WAKE_INTERVAL_SECONDS, trigger_text

    vibe = os.environ.get("AGENT_MAIL_VIBE") or os.path.join(ROOT, ".cache", "vibe", "bin", "vibe")
    if not os.path.exists(vibe) or shutil.which("tmux") is None:
        raise SystemExit("not run: Mistral Vibe (.cache/vibe, or AGENT_MAIL_VIBE) or tmux is not installed")

    def main_turn(request: dict) -> bool:
        return any(t.get("function", {}).get("name") == "bash" for t in request.get("tools") or [])

    triggered: list[float] = []
    told: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, \
            FakeModel(lambda r: [{"type": "text", "text": "ok from the model"}] if main_turn(r) else None) as model:
        project, home = os.path.join(tmp, "project"), os.path.join(tmp, "home")
        os.makedirs(project)
        os.makedirs(os.path.join(home, ".vibe"))
        os.makedirs(os.path.join(home, "tmp"))
        with open(os.path.join(home, ".vibe", "config.toml"), "w") as handle:
            handle.write(f'active_model = "scripted"\nenable_update_checks = false\nenable_telemetry = false\n'
                         f'enable_connectors = false\nshow_greeting = false\n\n[[providers]]\nname = "scripted"\n'
                         f'api_base = "{model.url}/v1"\napi_key_env_var = ""\nbackend = "generic"\n\n[[models]]\n'
                         f'name = "scripted"\nprovider = "scripted"\nalias = "scripted"\n')
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["AGENT_MAIL_DB"] = os.path.join(tmp, "mail.db")
        env["HOME"] = home
        env["PYTHONPATH"] = os.path.join(ROOT, "src") + os.pathsep + env.get("PYTHONPATH", "")
        subprocess.run([*cli, "setup", "vibe", "--agent", AGENT, "--dir", project], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        variables = {"HOME": home, "TMPDIR": os.path.join(home, "tmp"), "PYTHONPATH": env["PYTHONPATH"],
                     "PATH": env["PATH"], "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
        if os.environ.get("AGENT_MAIL_RUN_LOG"):  # why a wake waited, step by step
            variables["AGENT_MAIL_RUN_LOG"] = os.environ["AGENT_MAIL_RUN_LOG"]
        command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={v}" for k, v in variables.items()), *cli,
                              "run", "--agent", AGENT, "--", vibe])
        session = f"agent-mail-bench-vibe-{os.getpid()}"
        tmux = ["tmux", "-S", os.path.join(tmp, "tmux.sock")]
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "45", "-c", project, command],
                       check=True)
        try:
            def screen() -> str:
                return subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                      text=True).stdout

            def idle() -> bool:
                lines = [line.rstrip() for line in screen().splitlines()]
                return ">" in lines and not any("to interrupt" in line for line in lines)

            def requests() -> list[dict]:
                return [r for r in model.requests if main_turn(r)]

            def armed() -> bool:  # run's wait is armed at the empty prompt: Vibe is done starting
                rows = json.loads(subprocess.run([*cli, "status"], env=env, capture_output=True, check=True).stdout)
                return any(r["agent"] == AGENT and r["watch_state"] == "armed" for r in rows["agents"])

            _until(lambda: idle() and armed(), "never reached its prompt", 120)
            load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
            woken = 0.0
            for i in range(wakes):
                _until(lambda: idle() and time.monotonic() > woken + WAKE_INTERVAL_SECONDS + 0.5,  # noqa: B023
                       "the last turn did not end", 60)
                before = len(requests())
                subprocess.run([*cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", f"wake {i}"],
                               env=env, check=True, stdout=subprocess.DEVNULL)
                sent = time.perf_counter()
                _until(lambda: len(requests()) > before, f"round {i}: not woken:\n{screen()}", 30)  # noqa: B023
                triggered.append((time.perf_counter() - sent) * 1000)
                _until(lambda: any(f"wake {i}" in json.dumps(r["messages"]) for r in requests()[before:]),  # noqa: B023
                       f"round {i}: the envelope never reached the model:\n{screen()}", 30)
                told.append((time.perf_counter() - sent) * 1000)
                woken = time.monotonic()
                if trigger_text(AGENT) not in json.dumps(requests()[before]["messages"][-1]):
                    raise RuntimeError(f"round {i}: the woken turn did not start with the trigger")
        finally:
            subprocess.run([*tmux, "kill-server"], capture_output=True)
    return {"woken": _summary(triggered), "told": _summary(told), "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wakes", type=int, default=10, help="rounds (at least 10 for the figure)")
    parser.add_argument("--cli", default=f"{shlex.quote(sys.executable)} -m agent_mail",
                        help="the agent-mail command to run (default: this tree's, with this Python)")
    args = parser.parse_args()
    result = measure(shlex.split(args.cli), args.wakes)
    for name, what in (("woken", "the woken turn"), ("told", "the envelope")):
        figure = result[name]
        print(f"run wake, Mistral Vibe end to end: send exits -> {what} at the model: median "
              f"{figure['median_ms']:.1f} ms (n {figure['n']}, min {figure['min_ms']:.1f}, p90 {figure['p90_ms']:.1f}, "
              f"max {figure['max_ms']:.1f}; load {result['load']}; target <= 1000 ms)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
