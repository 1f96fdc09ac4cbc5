"""What the tests of OpenCode and Kilo Code CLI share. Kilo is built on OpenCode (the same plugin API, events, tools
and config format), and `agent-mail setup` gives both the same plugin: the model's requests are told apart the same
way, and what `H run` (one prompt, then exit) proves is proven by the same scenarios. Each scenario takes `run(prompt)`
(the harness run once in the set-up project, against `model`) and is called by the harness's own test module."""

from __future__ import annotations

import json
import os
import subprocess

from agent_mail import spec
from tests.lib.cli import am_process, process_env
from tests.lib.harnesses import URGENT, chat_tools, send_urgent_mail, status_of


def main(request: dict) -> bool:
    """A request of the session's own loop (it offers the tools), not a side call (the title)."""
    return "write" in chat_tools(request)


def tool_results(request: dict) -> int:
    return sum(m.get("role") == "tool" for m in request.get("messages", []))


def loop(model) -> list[dict]:
    return [r for r in model.requests if main(r)]


def waiters(project, harness: str) -> list[int]:
    """The `agent-mail hook HARNESS wait` processes the plugin runs in `project` (the plugin starts them in its
    process's directory, the project's)."""
    found = []
    mark = f"\0hook\0{harness}\0wait\0".encode()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if entry.isdigit() and mark in handle.read() and os.readlink(f"/proc/{entry}/cwd") == str(project):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def mail_reaches_the_model_once_and_the_mcp_tools_run(run, model, agent: str, live: str) -> None:
    """Mail sent before the session is in the first prompt's context (envelope, no body), told once; the read tool
    takes delivery; while the session runs its identity is reachable as `live` says ("a live OpenCode session"),
    and not once the harness has exited."""
    assert am_process("send", "--from", "boss:lead", "--to", agent, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0
    during = []

    def script(request):
        if not main(request):
            return None
        if tool_results(request):
            return [{"type": "text", "text": "done"}]
        during.append(status_of(agent))  # while the session lives
        return [{"type": "tool_use", "name": "agent-mail_read", "input": {}}]

    model.script = script
    run("Check your mail.")
    assert during[0]["reachable"] and live in during[0]["reached_by"]
    assert not status_of(agent)["reachable"]  # the harness exited: no longer live
    requests = loop(model)
    assert "agent-mail_read" in chat_tools(requests[0]) and "agent-mail_send" in chat_tools(requests[0])
    first = json.dumps(requests[0]["messages"])
    assert f"you are {agent}" in first and "Fix the flaky test" in first and "test_login" not in first
    assert f"waiting. {spec.MAIL_IS_DATA}" in first  # the note says mail is data, not the person's instructions
    last = json.dumps(requests[-1]["messages"])
    assert "test_login" in last  # the read tool ran, and its result reached the model
    # told once: nothing told it again after the prompt (nor after the read, whose result showed it)
    assert last.count(f"you are {agent}") == 1 and "new message" not in last
    assert json.loads(am_process("read", agent, "--no-mark-read").stdout)["count"] == 0  # the read tool took it


def mail_after_a_tool_is_told_once_and_not_marked_read(run, model, project, agent: str) -> None:
    sent = []

    def script(request):
        if not main(request):
            return None
        results = tool_results(request)
        if results == 0:
            return [{"type": "tool_use", "name": "write", "input": {"filePath": str(project / "a.txt"),
                                                                    "content": "a\n"}}]
        if results == 1 and not sent:
            send_urgent_mail(agent)
            sent.append(True)
            return [{"type": "tool_use", "name": "write", "input": {"filePath": str(project / "b.txt"),
                                                                    "content": "b\n"}}]
        return [{"type": "text", "text": "done"}]

    model.script = script
    run("Write two files.")
    assert (project / "b.txt").read_text() == "b\n"
    last = json.dumps(loop(model)[-1]["messages"])
    assert last.count(URGENT) == 1  # told after the tool, once, though the hook ran again since
    assert json.loads(am_process("read", agent, "--no-mark-read").stdout)["count"] == 1


def a_reserved_file_is_not_written_while_a_free_one_is(run, model, project) -> None:
    """A write and an edit of files another identity holds are refused (the plugin throws the hook's reason, which
    the model gets as the tool's error: who holds it and the send that asks them); a free file is written."""
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free, edited = project / "src" / "lib.rs", project / "notes.txt", project / "src" / "main.rs"
    edited.write_text("fn main() {}\n")
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr
    calls = [("write", {"filePath": str(held), "content": "x\n"}),
             ("edit", {"filePath": str(edited), "oldString": "fn main() {}", "newString": "fn main() { x() }"}),
             ("write", {"filePath": str(free), "content": "new\n"})]

    def script(request):
        if not main(request):
            return None
        results = tool_results(request)
        if results < len(calls):
            return [{"type": "tool_use", "name": calls[results][0], "input": calls[results][1]}]
        return [{"type": "text", "text": "done"}]

    model.script = script
    run("Write the files.")
    assert not held.exists() and edited.read_text() == "fn main() {}\n"
    assert free.read_text() == "new\n"
    said = json.dumps(loop(model)[-1]["messages"])
    assert said.count("held by proj:holder") == 2 and "parser rewrite" in said
    assert "agent-mail send --from proj:coder --to proj:holder" in said
