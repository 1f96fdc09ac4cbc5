"""What the hooks each harness runs on every tool call cost, beside `read` in the same run (issue 28: at most
`read` + 5 ms each).

    python bench/bench_harness_hooks.py [--rounds 21] [--harness NAME ...] [--cli PATH]

For each harness `agent-mail setup HARNESS` is run in a throwaway project; the commands it wrote for the
after-a-tool hook (`hook HARNESS context`) and the before-an-edit hook (`hook HARNESS pretool`) are read back
from the harness's own file and run as the harness runs them (through `sh -c`; Copilot CLI's `bash` entries
through `bash -c`), whole processes, with the input document that harness passes (Copilot CLI's camelCase
included): the after-tool hook with nothing new (the common case), and the pre-edit hook for an edit of a free
file in a git repository where another identity holds `src/**`. Beside them, interleaved round by round so
machine noise falls on all alike, `agent-mail read AGENT --no-mark-read` as a whole process. Medians.
OpenCode runs its hooks from a plugin inside its own process (no shell): the argv its plugin spawns is timed.
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
from common import cli_env, table  # noqa: E402

AGENT = "bench:coder"
HEADERS = ("harness: hook (as set up), median ms", "hook", "agent-mail read (same run)", "difference (bar: +5)")

# Where each harness's setup writes its hooks, and the input it passes to the after-tool and pre-edit hooks.
FILES = {"claude-code": os.path.join(".claude", "settings.local.json"), "codex": os.path.join(".codex", "hooks.json"),
         "gemini": os.path.join(".gemini", "settings.json"), "qwen": os.path.join(".qwen", "settings.json"),
         "copilot": os.path.join(".github", "hooks", "agent-mail.json"),
         "opencode": os.path.join(".opencode", "plugin", "agent-mail.js")}


def _after_tool(harness: str) -> dict:
    if harness == "copilot":
        return {"sessionId": "bench", "timestamp": 1, "cwd": ".", "toolName": "bash",
                "toolArgs": json.dumps({"command": "ls"}), "toolResult": {"resultType": "success"}}
    event = "AfterTool" if harness == "gemini" else "PostToolUse"
    if harness == "opencode":
        return {"session_id": "bench", "hook_event_name": "PostToolUse", "tool_name": "bash"}
    tool = {"gemini": "run_shell_command", "qwen": "run_shell_command"}.get(harness, "Bash")
    return {"session_id": "bench", "hook_event_name": event, "tool_name": tool, "tool_input": {"command": "ls"},
            "tool_response": {"stdout": ""}}


def _edit(harness: str, project: str, path: str) -> dict:
    full = os.path.join(project, path)
    if harness == "copilot":
        return {"sessionId": "bench", "timestamp": 1, "cwd": project, "toolName": "edit",
                "toolArgs": json.dumps({"path": full, "old_str": "a", "new_str": "b"})}
    if harness == "codex":
        patch = f"*** Begin Patch\n*** Update File: {full}\n@@\n-a\n+b\n*** End Patch\n"
        return {"session_id": "bench", "hook_event_name": "PreToolUse", "cwd": project, "tool_name": "apply_patch",
                "tool_input": {"command": patch}}
    if harness == "opencode":  # what its plugin passes: OpenCode's own argument names
        return {"cwd": project, "session_id": "bench", "hook_event_name": "PreToolUse", "tool_name": "edit",
                "tool_input": {"filePath": full, "oldString": "a", "newString": "b"}}
    event = "BeforeTool" if harness == "gemini" else "PreToolUse"
    tool = {"claude-code": "Edit", "gemini": "replace", "qwen": "edit"}[harness]
    return {"session_id": "bench", "hook_event_name": event, "cwd": project, "tool_name": tool,
            "tool_input": {"file_path": full, "old_string": "a", "new_string": "b"}}


def _commands(document: object, harness: str) -> dict[str, str]:
    """{event word: the command that runs it} found anywhere in a harness's settings document."""
    found: dict[str, str] = {}

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and f" hook {harness} " in value:
            found.setdefault(value.split(f" hook {harness} ", 1)[1].split()[0], value)

    walk(document)
    return found


def _plugin_commands(text: str, harness: str) -> dict[str, list[str]]:
    """OpenCode's plugin: {event: the argv it spawns} from its COMMAND and AGENT constants."""
    lines = {line.split(" = ", 1)[0].removeprefix("const "): line.split(" = ", 1)[1].rstrip(";")
             for line in text.splitlines() if line.startswith("const ") and " = " in line}
    command, agent = json.loads(lines["COMMAND"]), json.loads(lines["AGENT"])
    return {event: [*command, event, "--agent", agent] for event in ("context", "pretool")}


def _time(argv: list[str], env: dict, stdin: bytes = b"") -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, input=stdin, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    took = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"{argv} failed ({done.returncode}): {done.stderr.decode()}")
    return took


def rows(cli: str, rounds: int, harnesses: list[str]) -> list[tuple]:
    python = os.path.join(os.path.dirname(cli), "python")
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        env = cli_env(os.path.join(tmp, "mail.db"))
        bare = {k: v for k, v in env.items() if k != "AGENT_MAIL_DB"}  # the hooks name their mailbox themselves
        for i in range(4):  # some history: direct mail and broadcasts
            subprocess.run([cli, "send", "--from", "bench:lead", "--to", AGENT if i % 2 else "*", "--subject",
                            f"m{i}"], env=env, check=True, stdout=subprocess.DEVNULL)
        subprocess.run([cli, "heartbeat", "bench:holder"], env=env, check=True, stdout=subprocess.DEVNULL)
        samples: dict[str, list[float]] = {"read": []}
        runs = {}
        for harness in harnesses:
            project = os.path.join(tmp, harness)
            os.makedirs(project)
            subprocess.run(["git", "init", "-q", project], check=True)
            subprocess.run([cli, "reserve", "bench:holder", "src/**"], cwd=project, env=env, check=True,
                           stdout=subprocess.DEVNULL)
            subprocess.run([python, "-m", "agent_mail", "setup", harness, "--agent", AGENT, "--dir", project],
                           env=env, check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(project, FILES[harness])) as handle:
                text = handle.read()
            if harness == "opencode":  # no shell: the plugin spawns the command itself, its mailbox given
                argvs = {e: (a, {**bare, "AGENT_MAIL_DB": env["AGENT_MAIL_DB"]})
                         for e, a in _plugin_commands(text, harness).items()}
            else:
                shell = ["bash", "-c"] if harness == "copilot" else ["sh", "-c"]
                argvs = {e: ([*shell, c], bare) for e, c in _commands(json.loads(text), harness).items()}
            start = {"sessionId": "bench", "timestamp": 1, "cwd": project, "source": "new"} if harness == "copilot" \
                else {"session_id": "bench", "hook_event_name": "SessionStart"}
            subprocess.run(argvs["context"][0], input=json.dumps(start).encode(), env=argvs["context"][1],
                           cwd=project, check=True, stdout=subprocess.DEVNULL)  # told what there is: now quiet
            runs[f"{harness}: after a tool, nothing new"] = (*argvs["context"],
                                                             json.dumps(_after_tool(harness)).encode(), project)
            runs[f"{harness}: before an edit, free file"] = (*argvs["pretool"],
                                                             json.dumps(_edit(harness, project, "README.md")).encode(),
                                                             project)
        for name in runs:
            samples[name] = []
        for _ in range(rounds):
            samples["read"].append(_time([cli, "read", AGENT, "--no-mark-read"], env))
            for name, (argv, environment, stdin, project) in runs.items():
                started = time.perf_counter()
                done = subprocess.run(argv, input=stdin, env=environment, cwd=project, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
                samples[name].append((time.perf_counter() - started) * 1000)
                if done.returncode != 0 or done.stdout.strip() not in (b"", b"{}"):
                    raise RuntimeError(f"{name}: exit {done.returncode}, said {done.stdout!r} {done.stderr!r}")
    read = statistics.median(samples["read"])
    for name in runs:
        median = statistics.median(samples[name])
        out.append((name, f"{median:.1f}", f"{read:.1f}", f"{median - read:+.1f}"))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--harness", action="append", choices=sorted(FILES), help="only these (default: all)")
    parser.add_argument("--cli", default=os.path.join(os.path.dirname(sys.executable), "agent-mail"),
                        help="the agent-mail executable to time (default: beside this Python)")
    args = parser.parse_args()
    print(table(rows(args.cli, args.rounds, args.harness or list(FILES)), HEADERS))


if __name__ == "__main__":
    main()
