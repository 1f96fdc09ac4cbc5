"""What `read`, `send` and the after-tool hook cost beside the interpreter's own floor, in one run (issue 33).

    python bench/bench_floor.py [--rounds 101] [--cli PATH] [--also LABEL=PATH ...]

The floor is `python -I -S -c pass`: the interpreter starting and stopping, no site, nothing imported. Each
round runs, as whole processes and one after the other, the floor, `agent-mail read AGENT --no-mark-read` (four
unread messages), a `send`, and the after-tool hook as `agent-mail setup claude-code` wrote it (its own argv and
its AGENT_MAIL_DB, with a PostToolUse document on stdin, for a session already told: nothing new, the common
case), then the same hook through `sh -c` as Claude Code runs it. Each command's ratio to the floor is taken
round by round (pairing keeps the ratio meaningful while the machine's speed drifts); the table prints the
medians. The bar: read, send and the hook at most 2.3x the floor.

The CLI is the `agent-mail` script of a virtual environment (default: reinstalled from this tree, as the other
benches do); its interpreter is the `python` beside it, which the floor runs too. --also times another
installation's script in the same rounds (an older version, a virtual environment without setuptools), each on a
mailbox of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, ours, table  # noqa: E402

AGENT = "bench:coder"
HEADERS = ("measure (whole process)", "median ms", "x floor (median of paired ratios)", "bar")
BAR = 2.3


def _run(argv: list[str], env: dict, stdin: bytes = b"") -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, input=stdin, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed ({done.returncode}): {done.stderr.decode()}")
    return took


def _hook_argv(command: str, base: dict) -> tuple[list[str], dict]:
    """The argv and environment a POSIX shell gives `command` (`NAME=value ... program args`)."""
    words = shlex.split(command)
    env = dict(base)
    while words and "=" in words[0] and not words[0].startswith("/"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return words, env


def _commands(cli: str, tmp: str) -> dict[str, tuple[list[str], dict, bytes]]:
    """read, send and the after-tool hook of the CLI `cli`, on a mailbox of its own in `tmp` (a session told)."""
    env = cli_env(os.path.join(tmp, "mail.db"))
    project = os.path.join(tmp, "project")
    os.makedirs(project)
    subprocess.run([cli, "setup", "claude-code", "--agent", AGENT, "--dir", project], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(project, ".claude", "settings.local.json"), encoding="utf-8") as handle:
        settings = json.load(handle)
    command = settings["hooks"]["PostToolUse"][0]["hooks"][0]["command"]
    bare = {k: v for k, v in env.items() if k != "AGENT_MAIL_DB"}  # the hook names its mailbox itself
    hook, hook_env = _hook_argv(command, bare)
    start = json.dumps({"session_id": "bench", "hook_event_name": "SessionStart"}).encode()
    tool = json.dumps({"session_id": "bench", "hook_event_name": "PostToolUse", "tool_name": "Bash",
                       "tool_input": {"command": "ls"}, "tool_response": {"stdout": ""}}).encode()
    for i in range(4):
        subprocess.run([cli, "send", "--from", "bench:lead", "--to", AGENT, "--subject", f"m{i}"], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    subprocess.run(hook, input=start, env=hook_env, check=True, stdout=subprocess.DEVNULL)  # the session told
    return {
        "read": ([cli, "read", AGENT, "--no-mark-read"], env, b""),
        "send": ([cli, "send", "--from", "bench:lead", "--to", "bench:other", "--subject", "s", "--body", "b"],
                 env, b""),
        "hook": (hook, hook_env, tool),
        "hook (sh -c)": (["sh", "-c", command], bare, tool),
    }


LABELS = {"read": "read AGENT --no-mark-read (4 unread)", "send": "send (one recipient)",
          "hook": "after-tool hook, nothing new (its argv, as set up)",
          "hook (sh -c)": "the same hook through sh -c (as Claude Code runs it)"}


def rows(clis: dict[str, str], rounds: int = 101) -> list[tuple]:
    """The floor and each CLI's (clis: {label: agent-mail script}) read, send and hook, interleaved round by round."""
    python = os.path.join(os.path.dirname(next(iter(clis.values()))), "python")
    with tempfile.TemporaryDirectory() as tmp:
        commands = {("", "floor"): ([python, "-I", "-S", "-c", "pass"], dict(os.environ), b"")}
        for label, cli in clis.items():
            os.makedirs(os.path.join(tmp, label))
            for name, command in _commands(cli, os.path.join(tmp, label)).items():
                commands[(label, name)] = command
        for argv, variables, stdin in commands.values():  # warm: compiled modules written, caches filled
            for _ in range(3):
                _run(argv, variables, stdin)
        samples: dict[tuple, list[float]] = {key: [] for key in commands}
        for _ in range(rounds):
            for key, (argv, variables, stdin) in commands.items():
                samples[key].append(_run(argv, variables, stdin))
    floor = samples[("", "floor")]
    result = [("python -I -S -c pass (the floor)", f"{statistics.median(floor):.1f}", "1.00", "")]
    for (label, name), values in samples.items():
        if name == "floor":
            continue
        ratio = statistics.median(v / f for v, f in zip(values, floor, strict=True))
        bar = "" if name == "hook (sh -c)" else ("met" if ratio <= BAR else "not met")
        result.append((f"{label}: {LABELS[name]}" if len(clis) > 1 else LABELS[name],
                       f"{statistics.median(values):.1f}", f"{ratio:.2f}", bar))
    load = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
    result.append((f"rounds {rounds}; load (1, 5, 15 min) at the end", load, "-", "-"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--cli", help="the agent-mail script to time (default: reinstalled from this tree)")
    parser.add_argument("--also", action="append", default=[], metavar="LABEL=SCRIPT",
                        help="another installation's agent-mail script, timed in the same rounds (repeatable)")
    args = parser.parse_args()
    clis = {"this tree": args.cli or ours()}
    for given in args.also:
        label, _, script = given.partition("=")
        clis[label] = script
    print(table(rows(clis, args.rounds), HEADERS))


if __name__ == "__main__":
    main()
