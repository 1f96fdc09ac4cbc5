"""The pre-tool hook (issue 22): an edit of a file another live identity holds is denied before it is written,
in each harness's documented deny shape (inputs shaped as each harness sends them), on SQLite and PostgreSQL.
The real Claude Code run is in test_claude_code.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from tests.lib.cli import am_process, process_env

from agent_mail.parts import repos

pytestmark = pytest.mark.backends

ME, HOLDER = "proj:coder", "proj:holder"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "remote", "add", "origin", "https://github.com/acme/widget.git"], cwd=root, check=True)
    (root / "src" / "lib.rs").write_text("fn main() {}\n")
    monkeypatch.chdir(root)
    return root


def pretool(harness: str, tool: str, tool_input, cwd, agent: str = ME) -> subprocess.CompletedProcess:
    event = "BeforeTool" if harness == "gemini" else "PreToolUse"
    document = {"session_id": "s-1", "transcript_path": "/tmp/t.jsonl", "cwd": str(cwd), "hook_event_name": event,
                "tool_name": tool, "tool_input": tool_input, "tool_use_id": "toolu_1"}
    env = process_env()
    env.pop("AGENT_MAIL_AGENT", None)
    return am_process("hook", harness, "pretool", "--agent", agent, input=json.dumps(document).encode(), env=env,
                      cwd=str(cwd))


def reserve(*patterns: str) -> None:
    done = am_process("reserve", HOLDER, *patterns, "--reason", "parser rewrite")
    assert done.returncode == 0, done.stderr


def test_claude_code_edit_of_a_held_file_is_denied_with_the_holder_and_how_to_ask(repo):
    reserve("src/**")
    for tool, given in (("Edit", {"file_path": str(repo / "src" / "lib.rs"), "old_string": "a", "new_string": "b"}),
                        ("Write", {"file_path": "src/new.rs", "content": "x"}),
                        ("MultiEdit", {"file_path": str(repo / "src" / "lib.rs"), "edits": []}),
                        ("NotebookEdit", {"notebook_path": str(repo / "src" / "n.ipynb"), "new_source": "x"})):
        done = pretool("claude-code", tool, given, repo)
        assert done.returncode == 0, done.stderr
        output = json.loads(done.stdout)["hookSpecificOutput"]
        assert output["hookEventName"] == "PreToolUse" and output["permissionDecision"] == "deny"
        reason = output["permissionDecisionReason"]
        assert f"held by {HOLDER}" in reason and '"parser rewrite"' in reason and "until 20" in reason
        assert f"agent-mail send --from {ME} --to {HOLDER} --subject" in reason


def test_reads_other_tools_free_files_and_the_holder_pass_silently(repo, tmp_path):
    reserve("src/lib.rs")
    lib = str(repo / "src" / "lib.rs")
    for harness, tool, given, agent in (
            ("claude-code", "Read", {"file_path": lib}, ME),
            ("claude-code", "Bash", {"command": "cat src/lib.rs"}, ME),
            ("claude-code", "Edit", {"file_path": str(repo / "README.md")}, ME),
            ("claude-code", "Edit", {"file_path": str(tmp_path / "elsewhere.txt")}, ME),  # outside any repository
            ("claude-code", "Edit", {"file_path": lib}, HOLDER),
            ("codex", "apply_patch", {"command": "*** Begin Patch\n*** Update File: README.md\n*** End Patch"}, ME),
            ("codex", "Bash", {"command": "sed -n 1p src/lib.rs"}, ME)):  # not a patch: passes, no mailbox opened
        done = pretool(harness, tool, given, repo, agent)
        assert done.returncode == 0 and done.stdout == b"" and done.stderr == b"", (tool, done)
    quiet = pretool("gemini", "read_file", {"file_path": lib}, repo)
    assert quiet.returncode == 0 and json.loads(quiet.stdout) == {}


def test_gemini_and_codex_edits_are_denied_in_their_own_shapes(repo):
    reserve("src/")
    gemini = pretool("gemini", "replace", {"file_path": str(repo / "src" / "lib.rs"), "old_string": "a",
                                           "new_string": "b", "instruction": "x"}, repo)
    output = json.loads(gemini.stdout)
    assert output["decision"] == "deny" and f"held by {HOLDER}" in output["reason"]
    patch = "*** Begin Patch\n*** Update File: README.md\n*** Move to: src/readme.md\n*** End Patch\n"
    codex = pretool("codex", "Bash", {"command": f"apply_patch <<'EOF'\n{patch}EOF\n"}, repo)
    output = json.loads(codex.stdout)["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny" and "src/readme.md is held by" in output["permissionDecisionReason"]


def test_a_path_from_a_subdirectory_is_the_repository_path(repo):
    reserve("src/lib.rs")
    done = pretool("claude-code", "Edit", {"file_path": "lib.rs"}, repo / "src")
    assert json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


@pytest.mark.sqlite_only
def test_the_repository_read_from_its_files_is_the_one_git_names(repo, tmp_path, monkeypatch):
    """locate() reads .git/config itself (no git process on the hot path): it must agree with git."""
    subprocess.run(["git", "config", "core.ignorecase", "true"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "x"], cwd=repo, check=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@e"})
    subprocess.run(["git", "worktree", "add", "-q", str(tmp_path / "wt")], cwd=repo, check=True)
    for where in (repo, repo / "src", tmp_path / "wt"):
        cheap = repos.found_cheaply(str(where))
        assert cheap is not None
        monkeypatch.setenv("GIT_CEILING_DIRECTORIES", "/nonexistent")  # forces asking git
        asked = repos.locate(cwd=str(where))
        monkeypatch.delenv("GIT_CEILING_DIRECTORIES")
        found = repos.locate(cwd=str(where))
        assert (found.key, found.root, found.fold) == (asked.key, asked.root, asked.fold) == (
            "github.com/acme/widget", os.path.realpath(where if where.name == "wt" else repo), True)


@pytest.mark.sqlite_only  # -S: no site-packages; what the hook itself imports on the path run before every edit
def test_the_hook_before_every_edit_imports_no_json_or_regular_expressions(repo):
    """The pre-tool hook costs about what `read` does: its JSON input is decoded by the C scanner json.loads
    uses (jsonout.loads), so neither a denial nor a free edit loads json, re or enum (~4 ms of a start)."""
    import sys

    reserve("src/**")
    code = ("import sys; from agent_mail.cli.main import main; code = main(sys.argv[1:]); "
            "print(code, sorted({'re', 'enum', 'json', 'subprocess', 'pathspec', 'typing'} & set(sys.modules)), "
            "file=sys.stderr)")
    for path in ("src/lib.rs", "README.md"):
        document = {"session_id": "s-1", "cwd": str(repo), "hook_event_name": "PreToolUse", "tool_name": "Edit",
                    "tool_input": {"file_path": str(repo / path), "old_string": "a", "new_string": "b"}}
        env = process_env()
        env.pop("AGENT_MAIL_AGENT", None)
        done = subprocess.run([sys.executable, "-S", "-c", code, "hook", "claude-code", "pretool", "--agent", ME],
                              input=json.dumps(document).encode(), env=env, cwd=str(repo), capture_output=True)
        assert done.stderr.decode().strip().splitlines()[-1] == "0 []", done.stderr
        assert ("deny" in done.stdout.decode()) == (path == "src/lib.rs"), done.stdout
