"""The real Gemini CLI, set up by `agent-mail setup gemini`, against a scripted model.

Gemini CLI is the npm package @google/gemini-cli (`.ci/run` installs the pinned version under
.cache/node); the model is tests/lib/fake_model.py speaking the Gemini API on 127.0.0.1
(GOOGLE_GEMINI_BASE_URL), with a throwaway HOME. GEMINI_CLI_TRUST_WORKSPACE stands for a user who
trusted the project folder once. Skipped with the reason where Gemini CLI is not installed; required
in CI.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.lib.cli import am_process, process_env
from tests.lib.fake_model import FakeModel
from tests.lib.harnesses import HELD, URGENT, mail_during_the_turn, private_tmp, send_urgent_mail
from tests.lib.tools import find

AGENT = "proj:coder"


GEMINI = find("gemini")
pytestmark = pytest.mark.requires("gemini")
pytest.importorskip("mcp", reason="the mcp extra is not installed")


@pytest.fixture
def project(tmp_path, mailbox_path):
    directory = tmp_path / "project"
    directory.mkdir()
    home = tmp_path / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({"security": {"auth": {
        "selectedType": "gemini-api-key"}}}))
    done = am_process("setup", "gemini", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def _run(project, model: FakeModel, prompt: str) -> dict:
    home = project.parent / "gemini-home"
    env = process_env(HOME=str(home), GEMINI_API_KEY="test", GOOGLE_GEMINI_BASE_URL=model.url,
                      GEMINI_CLI_TRUST_WORKSPACE="true", TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")  # the session finds its mailbox through what setup recorded
    proc = subprocess.run([GEMINI, "-p", prompt, "--output-format", "json"], cwd=str(project), env=env,
                          capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def _main(request: dict) -> bool:
    return any(f["name"] == "mcp_agent-mail_read" for t in request.get("tools", [])
               for f in t.get("functionDeclarations", []))


def _has_tool_result(request: dict) -> bool:
    return any("functionResponse" in part for content in request.get("contents", [])
               for part in content.get("parts", []))


def test_mail_reaches_gemini_and_its_mcp_tools_run_without_a_prompt(project):
    assert am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", "Fix the flaky test",
                      "--body", "It is test_login.", env=process_env()).returncode == 0

    def script(request):
        if not _main(request):
            return None
        if _has_tool_result(request):
            return [{"type": "text", "text": "done"}]
        return [{"type": "tool_use", "name": "mcp_agent-mail_read", "input": {}}]

    with FakeModel(script) as model:
        result = _run(project, model, "Check your mail.")
    loop = [r for r in model.requests if _main(r)]
    first = json.dumps(loop[0]["contents"])
    assert "you are proj:coder" in first and "Fix the flaky test" in first and "test_login" not in first
    calls = result["stats"]["tools"]["byName"]["mcp_agent-mail_read"]
    assert calls["success"] == 1 and calls["fail"] == 0
    assert "test_login" in json.dumps(loop[-1]["contents"])
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 0


def test_mail_during_a_gemini_turn_is_sent_back_once(project):
    script = mail_during_the_turn(_main, lambda request: request["contents"], lambda: send_urgent_mail(AGENT))
    with FakeModel(script) as model:
        result = _run(project, model, "Do the task.")
    loop = [r for r in model.requests if _main(r)]
    held = [r for r in loop if HELD in json.dumps(r["contents"])]
    assert len(held) == 1 and URGENT in json.dumps(held[0]["contents"])
    assert "I will handle it next." in result["response"]
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # told, not consumed
    # Issue 20 #4: the user is shown who wrote and the subject (Gemini CLI prefixes "Agent execution blocked:"),
    # the model is told it is mail, not an error.
    assert "it is mail for you, not an error" in json.dumps(held[0]["contents"])
    assert any(f'from boss:lead: "{URGENT}"' in w for w in result.get("warnings", [])), result.get("warnings")


def test_a_write_of_a_reserved_file_is_denied_before_it_is_written(project):
    """Issue 22: the BeforeTool hook denies write_file of a file another live identity holds (decision deny);
    the reason reaches the model; a write of a free file goes through (edits approved)."""
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=project, check=True)
    (project / "src").mkdir()
    held, free = project / "src" / "lib.rs", project / "notes.txt"
    held.write_text("fn main() {}\n")
    done = am_process("reserve", "proj:holder", "src/**", "--reason", "parser rewrite", cwd=str(project))
    assert done.returncode == 0, done.stderr

    def script(request):
        if not _main(request):
            return None
        results = sum("functionResponse" in part for content in request.get("contents", [])
                      for part in content.get("parts", []))
        if results == 0:
            return [{"type": "tool_use", "name": "write_file", "input": {"file_path": str(held), "content": "x\n"}}]
        if results == 1:
            return [{"type": "tool_use", "name": "write_file", "input": {"file_path": str(free), "content": "new\n"}}]
        return [{"type": "text", "text": "done"}]

    home = project.parent / "gemini-home"
    env = process_env(HOME=str(home), GEMINI_API_KEY="test", GEMINI_CLI_TRUST_WORKSPACE="true",
                      TMPDIR=private_tmp(home))
    env.pop("AGENT_MAIL_DB")
    with FakeModel(script) as model:
        env["GOOGLE_GEMINI_BASE_URL"] = model.url
        proc = subprocess.run([GEMINI, "-p", "Rename main.", "--output-format", "json", "--approval-mode", "auto_edit"],
                              cwd=str(project), env=env, capture_output=True, text=True, timeout=180,
                              stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert held.read_text() == "fn main() {}\n"
    assert free.read_text() == "new\n"
    said = json.dumps([r["contents"] for r in model.requests if _main(r)][-1])
    assert "held by proj:holder" in said and "parser rewrite" in said
    assert "agent-mail send --from proj:coder --to proj:holder" in said
