"""`setup HARNESS` edits a person's settings files as text and `--remove` gives back the bytes it found (issue 33):
4-space and inline formatting, a missing final newline, a file of {} the person had, Qwen Code's empty dualOutput,
and OpenCode's commented opencode.json (JSONC); with the originals setup keeps, and without them (the edit itself
is undone); a person's entry added since setup stays."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from agent_mail.harness import json_text
from tests.lib.cli import am_process

AGENT = "proj:coder"

# Each harness's JSON files, as a person might have written them: 4-space indentation, inline arrays and objects,
# no final newline (Codex's config.toml is text setup edits between marker lines; its hooks.json is JSON).
FOUR_SPACES = {
    "claude-code": {".claude/settings.local.json": '{\n    "model": "opus",\n    "permissions": '
                    '{"allow": ["Bash(ls)"]},\n    "env": {"FOO": "1"}\n}',
                    ".mcp.json": '{\n    "mcpServers": {\n        "other": {"command": "x", "args": ["-v"]}\n    }\n}'},
    "codex": {".codex/hooks.json": '{\n    "hooks": {\n        "Stop": [{"hooks": [{"type": "command", "command": '
              '"echo"}]}]\n    }\n}'},
    "gemini": {".gemini/settings.json": '{\n    "theme": "Dracula",\n    "mcpServers": {"other": {"command": "x"}}'
               '\n}\n'},
    "qwen": {".qwen/settings.json": '{\n    "model": {"name": "x"},\n    "tools": {"visible": ["a"]},\n'
             '    "dualOutput": {}\n}'},
    "copilot": {".mcp.json": '{\n\t"mcpServers": {\n\t\t"other": {"type": "stdio", "command": "x"}\n\t}\n}'},
    "opencode": {"opencode.json": '// my project\n{\n  "$schema": "https://opencode.ai/config.json",\n'
                 '  /* the model I use */\n  "model": "fake/fake-model",\n  "mcp": {\n'
                 '    "other": {"type": "local", "command": ["x"]}, // mine\n  },\n}\n'},
    # Kilo reads kilo.jsonc too: setup merges into the one that is there
    "kilo": {"kilo.jsonc": '// my project\n{\n    "$schema": "https://app.kilo.ai/config.json",\n'
             '    /* the model I use */\n    "model": "fake/fake-model",\n}'},
}


def run_setup(project, harness, *extra, env=None):
    done = am_process("setup", harness, "--agent", AGENT, "--dir", str(project), *extra, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def state_directory(home) -> str:
    return os.path.join(str(home), ".local", "state", "agent-mail", "setup")


def write_files(project, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())


def tree(project) -> dict[str, bytes]:
    return {str(p.relative_to(project)): p.read_bytes() for p in sorted(project.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("keep_originals", [True, False], ids=["originals", "edit-undone"])
@pytest.mark.parametrize("harness", sorted(FOUR_SPACES))
def test_remove_gives_back_the_exact_bytes_setup_found(tmp_path, harness, keep_originals):
    project = tmp_path / "project"
    project.mkdir()
    write_files(project, FOUR_SPACES[harness])
    found = tree(project)
    run_setup(project, harness)
    for name, text in FOUR_SPACES[harness].items():
        after = (project / name).read_text()
        json_text.parse(after, comments=name in ("opencode.json", "kilo.jsonc"))  # still one document
        # Setup edited the file in its own style: the same indentation, the person's first lines as they were.
        assert json_text.indent_unit(after) == json_text.indent_unit(text)
        assert after.splitlines()[:2] == text.splitlines()[:2]
        assert ("\n" if text.endswith("\n") else "") == ("\n" if after.endswith("\n") else "")
    if not keep_originals:  # without what setup kept, --remove undoes its own edit
        shutil.rmtree(state_directory(os.environ["HOME"]), ignore_errors=True)
    removed = run_setup(project, harness, "--remove")
    if keep_originals or harness != "qwen":
        assert tree(project) == found, removed["files"]
    else:  # Qwen's empty dualOutput, filled by setup, is not told from one setup made without the originals
        assert json.loads((project / ".qwen/settings.json").read_text()) == {"model": {"name": "x"},
                                                                              "tools": {"visible": ["a"]}}


def test_a_settings_file_of_braces_the_person_had_stays(tmp_path):
    project = tmp_path / "project"
    (project / ".claude").mkdir(parents=True)
    (project / ".claude" / "settings.local.json").write_text("{}")
    (project / ".mcp.json").write_text("{}\n")
    found = tree(project)
    run_setup(project, "claude-code")
    assert json.loads((project / ".claude" / "settings.local.json").read_text())["hooks"]
    run_setup(project, "claude-code", "--remove")
    assert tree(project) == found


def test_an_entry_the_person_added_after_setup_stays_and_ours_go(tmp_path):
    project = tmp_path / "project"
    write_files(project, {".gemini/settings.json": '{\n    "theme": "Dracula"\n}\n'})
    run_setup(project, "gemini")
    path = project / ".gemini" / "settings.json"
    document = json.loads(path.read_text())
    assert document["ui"] == {"errorVerbosity": "full"}  # Gemini's "This request failed" note is not shown for mail
    document["vimMode"] = True
    path.write_text(json.dumps(document, indent=4) + "\n")
    run_setup(project, "gemini", "--remove")
    assert json.loads(path.read_text()) == {"theme": "Dracula", "vimMode": True}


def test_an_error_verbosity_the_person_chose_is_theirs(tmp_path):
    project = tmp_path / "project"
    text = '{\n  "ui": {"errorVerbosity": "low"}\n}\n'
    write_files(project, {".gemini/settings.json": text})
    run_setup(project, "gemini")
    assert json.loads((project / ".gemini" / "settings.json").read_text())["ui"] == {"errorVerbosity": "low"}
    run_setup(project, "gemini", "--remove")
    assert (project / ".gemini" / "settings.json").read_text() == text


def test_a_commented_opencode_json_keeps_its_comments(tmp_path):
    project = tmp_path / "project"
    write_files(project, {"opencode.json": FOUR_SPACES["opencode"]["opencode.json"]})
    run_setup(project, "opencode")
    text = (project / "opencode.json").read_text()
    for comment in ("// my project", "/* the model I use */", "// mine"):
        assert comment in text
    document = json_text.parse(text, comments=True).value
    assert list(document["mcp"]) == ["other", "agent-mail"] and document["model"] == "fake/fake-model"
    assert run_setup(project, "opencode")["files"][0]["action"] == "unchanged"  # a second run changes no byte


def test_a_broken_jsonc_file_is_refused_naming_where(tmp_path):
    project = tmp_path / "project"
    write_files(project, {"opencode.json": '{\n  // fine\n  "model": "x" /* never closed\n}\n'})
    done = am_process("setup", "opencode", "--agent", AGENT, "--dir", str(project))
    assert done.returncode == 2 and done.stdout == b""
    error = json.loads(done.stderr)
    assert "comments allowed" in error["error"] and "unterminated comment" in error["error"]
    assert (project / "opencode.json").read_text().endswith("never closed\n}\n")
    assert not (project / ".opencode").exists()


@pytest.mark.parametrize("harness", ["gemini", "copilot"])
def test_setup_of_a_harness_without_a_wake_of_its_own_names_run(tmp_path, harness):
    notes = " ".join(run_setup(tmp_path, harness)["notes"])
    assert f"agent-mail run -- {harness}" in notes
