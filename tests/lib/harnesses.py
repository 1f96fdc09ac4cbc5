"""What the end-to-end tests of the real harness CLIs share. The CLIs themselves are found by lib/tools.py's
find()/require() (an AGENT_MAIL_<NAME> override, the pinned copy `.ci/run` installs under .cache/node, or one on
PATH), and a module that drives one is marked requires("claude") etc.: skipped with the reason where it is
missing, failed under CI, where it is required."""

from __future__ import annotations

import json
import os

HELD = "This arrived while you worked"  # what the stop guard's reason says


def private_tmp(home) -> str:
    """A temporary directory inside the test's own (TMPDIR for a harness), so what a harness leaves in its
    temporary directory (sockets, notes, error reports) goes with the test's."""
    path = os.path.join(str(home), "tmp")
    os.makedirs(path, exist_ok=True)
    return path


URGENT = "Stop the deploy"  # the subject of the mail that lands during a turn


def send_urgent_mail(agent: str) -> None:
    """Mail for `agent` from another process, as a colleague would send it mid-turn."""
    from tests.lib.cli import am_process, process_env

    done = am_process("send", "--from", "boss:lead", "--to", agent, "--subject", URGENT, env=process_env())
    assert done.returncode == 0, done.stderr


def status_of(agent: str) -> dict:
    """`agent-mail status --agent AGENT`'s row, from another process."""
    from tests.lib.cli import am_process

    return json.loads(am_process("status", "--agent", agent).stdout)["agents"][0]


def chat_tools(request: dict) -> list[str]:
    """The names of the tools a Chat Completions request offers the model."""
    return [t.get("function", {}).get("name") for t in request.get("tools") or []]


def mail_during_the_turn(is_turn, history, send):
    """A model script for the stop guard: in the session's first turn, mail lands (send()) while the model
    answers "All done."; once the stop guard sends the turn back (its reason in the history), the model
    answers "I will handle it next." is_turn(request): a request of the session's own loop; history(request):
    the part of it holding the conversation."""
    sent = []

    def script(request):
        if not is_turn(request):
            return None
        if HELD in json.dumps(history(request)):
            return [{"type": "text", "text": "I will handle it next."}]
        if not sent:
            send()
            sent.append(True)
        return [{"type": "text", "text": "All done."}]

    return script


def wakers(project, harness: str) -> set[int]:
    """The processes of `agent-mail hook HARNESS wait` running in `project`: the session's detached idle waker
    (agent_mail.harness.waker), which keeps the hook's command line and directory."""
    found = set()
    mark = f"\0hook\0{harness}\0wait\0".encode()
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if entry.isdigit() and mark in handle.read() and os.readlink(f"/proc/{entry}/cwd") == str(project):
                    found.add(int(entry))
        except OSError:
            continue
    return found


WOKEN = "new mail arrived while you were idle"  # how the waker's prompt begins


class Terminal:
    """A harness run interactively in a tmux session of its own (its own server socket under `directory`), as a
    person runs it: keys typed, the screen read. Killed, with its server, on leaving the `with`."""

    def __init__(self, directory, name: str, cwd, command: str):
        self.tmux = ["tmux", "-S", os.path.join(str(directory), "tmux.sock")]
        self.name, self.cwd, self.command = name, str(cwd), command

    def __enter__(self) -> Terminal:
        import subprocess

        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "160", "-y", "45", "-c", self.cwd,
                        self.command], check=True)
        return self

    def __exit__(self, *exc) -> None:
        import subprocess

        subprocess.run([*self.tmux, "kill-session", "-t", self.name], capture_output=True)
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)

    def screen(self) -> str:
        import subprocess

        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True,
                              text=True).stdout

    def type(self, *keys: str) -> None:
        """Each key (or text) sent, a moment apart, as typed."""
        import subprocess
        import time

        for key in keys:
            subprocess.run([*self.tmux, "send-keys", "-t", self.name, key], check=True)
            time.sleep(0.3)

    def wait_for(self, predicate, seconds: float, why: str):
        from tests.lib.waiting import until

        return until(predicate, seconds, lambda: f"{why}:\n{self.screen()}", interval=0.2)


# -- What every harness driven through the Chat Completions API is checked for, end to end ------------------------
def tool_results(request: dict) -> int:
    """How many tool results a Chat Completions request carries."""
    return sum(m.get("role") == "tool" for m in request.get("messages", []))


class ChatHarness:
    """A harness CLI as its end-to-end tests drive it through a scripted Chat Completions model: `run(project,
    model, prompt)` runs one prompt headless (and checks it ended well); `main(request)`: a request of the
    session's own loop, not a side call (a title, a summary); `mcp(request, name)`: how it names our MCP tool
    `name` to its model; `write(path, text)`: its tool call that creates a file, as (name, input); `live`: the
    words status's reached_by says of its live session; `agent`: the identity setup gave it."""

    def __init__(self, run, main, mcp, write, live: str, agent: str = "proj:coder"):
        self.run, self.main, self.mcp, self.write, self.live, self.agent = run, main, mcp, write, live, agent

    def loop(self, model) -> list[dict]:
        return [r for r in model.requests if self.main(r)]

    def unread(self) -> int:
        from tests.lib.cli import am_process

        return json.loads(am_process("read", self.agent, "--no-mark-read").stdout)["count"]


def mail_reaches_once_and_the_mcp_tools_run(project, harness: ChatHarness) -> None:
    """Mail waiting at the start is in the first request's context (envelope only), once; the model's read tool runs
    and its result (the body) reaches the model; the session is live while it runs and not after its end."""
    from tests.lib.cli import am_process, process_env
    from tests.lib.fake_model import FakeModel

    agent = harness.agent
    assert am_process("send", "--from", "boss:lead", "--to", agent, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0
    during = []

    def script(request):
        if not harness.main(request):
            return None
        if tool_results(request):
            return [{"type": "text", "text": "done"}]
        during.append(status_of(agent))  # while the session lives
        return [{"type": "tool_use", "name": harness.mcp(request, "read"), "input": {}}]

    with FakeModel(script) as model:
        harness.run(project, model, "Check your mail.")
    assert during[0]["reachable"] and harness.live in during[0]["reached_by"]
    assert not status_of(agent)["reachable"]  # its session's end: no longer live
    loop = harness.loop(model)
    assert all(harness.mcp(loop[0], name) in chat_tools(loop[0]) for name in ("read", "send", "reserve"))
    first = json.dumps(loop[0]["messages"])
    assert f"you are {agent}" in first and "Fix the flaky test" in first and "test_login" not in first
    last = json.dumps(loop[-1]["messages"])
    assert "test_login" in last  # the read tool ran, and its result reached the model
    # told once: no hook told it again after the start (nor after the read, whose result showed it)
    assert last.count(f"you are {agent}") == 1 and "new message" not in last
    assert harness.unread() == 0


def mail_after_a_tool_is_told_once_and_not_marked_read(project, harness: ChatHarness) -> None:
    from tests.lib.fake_model import FakeModel

    sent = []

    def script(request):
        if not harness.main(request):
            return None
        results = tool_results(request)
        if results == 0:
            name, given = harness.write(project / "a.txt", "a\n")
            return [{"type": "tool_use", "name": name, "input": given}]
        if results == 1 and not sent:
            send_urgent_mail(harness.agent)
            sent.append(True)
            name, given = harness.write(project / "b.txt", "b\n")
            return [{"type": "tool_use", "name": name, "input": given}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        harness.run(project, model, "Write two files.")
    last = json.dumps(harness.loop(model)[-1]["messages"])
    assert last.count(URGENT) == 1  # told after the tool, once, though hooks ran again since
    assert harness.unread() == 1


def what_the_read_tool_showed_is_not_told_again(project, harness: ChatHarness) -> None:
    """Mail that lands just before the model calls the read tool is shown by the tool's result: the hooks after it
    (after the tool, the next prompt) do not tell it again."""
    from tests.lib.fake_model import FakeModel

    def script(request):
        if not harness.main(request):
            return None
        if tool_results(request):
            return [{"type": "text", "text": "done"}]
        send_urgent_mail(harness.agent)
        return [{"type": "tool_use", "name": harness.mcp(request, "read"), "input": {}}]

    with FakeModel(script) as model:
        harness.run(project, model, "Check your mail.")
    last = json.dumps(harness.loop(model)[-1]["messages"])
    assert URGENT in last and "new message" not in last


def mail_during_a_turn_holds_the_stop_once(project, harness: ChatHarness) -> None:
    from tests.lib.fake_model import FakeModel

    script = mail_during_the_turn(harness.main, lambda request: request["messages"],
                                  lambda: send_urgent_mail(harness.agent))
    with FakeModel(script) as model:
        proc = harness.run(project, model, "Do the task.")
    held = [r for r in harness.loop(model) if HELD in json.dumps(r["messages"])]
    assert len(held) == 1 and URGENT in json.dumps(held[0]["messages"])
    assert "it is mail for you, not an error" in json.dumps(held[0]["messages"])
    assert "I will handle it next." in proc.stdout
    assert harness.unread() == 1  # told, not consumed


def a_write_of_a_reserved_file_is_refused_while_a_free_one_is_written(project, harness: ChatHarness) -> None:
    """New files (a harness's create tool may refuse to overwrite one it has not read): the one under another
    identity's reservation is refused, with who holds it, why and the send that asks them; the free one is
    written."""
    import subprocess

    from tests.lib.cli import am_process
    from tests.lib.fake_model import FakeModel

    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def script(request):
        if not harness.main(request):
            return None
        results = tool_results(request)
        if results < 2:
            name, given = harness.write(held if results == 0 else free, "x\n" if results == 0 else "new\n")
            return [{"type": "tool_use", "name": name, "input": given}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        harness.run(project, model, "Write the files.")
    assert not held.exists()
    assert free.read_text() == "new\n"
    said = json.dumps(harness.loop(model)[-1]["messages"])
    assert "held by proj:holder" in said and "parser rewrite" in said
    assert f"agent-mail send --from {harness.agent} --to proj:holder" in said
