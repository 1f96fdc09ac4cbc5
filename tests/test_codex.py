"""The real Codex CLI, set up by `agent-mail setup codex`, against a scripted model.

Codex is the npm package @openai/codex (`.ci/run` installs the pinned version under .cache/node); the
model is tests/fake_model.py speaking the OpenAI Responses API on 127.0.0.1, configured as a custom
provider in a throwaway CODEX_HOME. `codex exec --trust --dangerously-bypass-hook-trust` stands for a
user who trusted the project and reviewed its hooks once. Skipped with the reason where Codex is not
installed; required in CI.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import am_process, process_env
from fake_model import FakeModel
from harnesses import HELD, URGENT, harness, mail_during_the_turn, private_tmp, send_urgent_mail

AGENT = "proj:coder"


CODEX, pytestmark = harness("codex", "AGENT_MAIL_CODEX", "@openai/codex")
pytest.importorskip("mcp", reason="the mcp extra is not installed")


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    directory.mkdir()
    (tmp_path / "codex-home").mkdir()
    done = am_process("setup", "codex", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def _run(project, model: FakeModel, prompt: str) -> list[dict]:
    home = project.parent / "codex-home"
    (home / "config.toml").write_text(
        'model = "gpt-test"\nmodel_provider = "scripted"\n\n[model_providers.scripted]\nname = "scripted"\n'
        f'base_url = "{model.url}/v1"\nenv_key = "SCRIPTED_KEY"\nwire_api = "responses"\n')
    env = process_env(CODEX_HOME=str(home), HOME=str(home), SCRIPTED_KEY="test", TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    proc = subprocess.run([CODEX, "exec", "--trust", "--dangerously-bypass-hook-trust", "--skip-git-repo-check",
                           "--json", prompt], cwd=str(project), env=env, capture_output=True, text=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _tool_results(request: dict) -> list:
    return [item for item in request.get("input", []) if isinstance(item, dict)
            and item.get("type") == "function_call_output"]


def _main(request: dict) -> bool:
    return any(tool.get("name") == "mcp__agent_mail" for tool in request.get("tools", []))


def test_mail_reaches_codex_and_its_mcp_tools_run_without_approval(project):
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0

    def script(request):
        if not _main(request):
            return None
        if _tool_results(request):
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "namespace": "mcp__agent_mail", "name": "read", "input": {}}]

    with FakeModel(script) as model:
        events = _run(project, model, "Check your mail.")
    loop = [r for r in model.requests if _main(r)]
    first = json.dumps(loop[0]["input"])
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "test_login" not in first
    calls = [e["item"] for e in events if e.get("type") == "item.completed"
             and e["item"].get("type") == "mcp_tool_call"]
    assert calls and calls[0]["server"] == "agent-mail" and calls[0]["error"] is None
    assert "test_login" in json.dumps(_tool_results(loop[-1]))
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 0


def test_mail_during_a_codex_turn_holds_the_stop_once(project):
    script = mail_during_the_turn(_main, lambda request: request["input"], lambda: send_urgent_mail(AGENT))
    with FakeModel(script) as model:
        events = _run(project, model, "Do the task.")
    loop = [r for r in model.requests if _main(r)]
    held = [r for r in loop if HELD in json.dumps(r["input"])]
    assert len(held) == 1 and URGENT in json.dumps(held[0]["input"])
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                and e["item"].get("type") == "agent_message"]
    assert messages[-1] == "I will handle it next."
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # told, not consumed
    # Issue 20 #4: the model is told it is mail, not an error. #3: Codex's SessionEnd ended the session, so
    # the identity has no live session once `codex exec` is over.
    assert "it is mail for you, not an error" in json.dumps(held[0]["input"])
    row = json.loads(am_process("status", "--agent", AGENT).stdout)["agents"][0]
    assert row["sessions"] == 0 and row["reachable"] is False


def test_an_apply_patch_of_a_reserved_file_is_denied_before_it_is_written(project):
    """Issue 22: Codex's PreToolUse hook denies an apply_patch (run in its shell, reported as Bash) touching a file
    another live identity holds; the reason reaches the model; a patch of a free file goes through."""
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"
    held.write_text("fn main() {}\n")
    free.write_text("old\n")
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def patch(path: str, old: str, new: str) -> str:
        return (f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {path}\n@@\n-{old}\n+{new}\n*** End Patch\n"
                "EOF\n")

    def script(request):
        if not _main(request):
            return None
        results = len(_tool_results(request))
        if results == 0:
            return [{"type": "tool_use", "name": "exec_command", "input": {"cmd": patch("src/lib.rs", "fn main() {}",
                                                                                         "fn start() {}")}}]
        if results == 1:
            return [{"type": "tool_use", "name": "exec_command", "input": {"cmd": patch("notes.txt", "old", "new")}}]
        return [{"type": "text", "text": "done"}]

    with FakeModel(script) as model:
        _run(project, model, "Rename main.")
    assert held.read_text() == "fn main() {}\n"
    assert free.read_text() == "new\n"
    said = json.dumps(_tool_results([r for r in model.requests if _main(r)][-1]))
    assert "held by proj:holder" in said and "parser rewrite" in said
    assert "agent-mail send --from proj:coder --to proj:holder" in said
