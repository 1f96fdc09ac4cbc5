"""The git guard (issue 22): real `git commit` and `git push` through the hooks `agent-mail guard install`
writes, on SQLite and PostgreSQL where the mailbox matters."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from tests.lib.cli import process_env

from agent_mail import spec

pytestmark = pytest.mark.backends


def git(*args: str, cwd, env=None, check=True) -> subprocess.CompletedProcess:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env or process_env())
    if check:
        assert done.returncode == 0, done.stderr
    return done


def as_agent(agent: str | None, **extra: str) -> dict:
    env = process_env(**extra)
    env.pop("AGENT_MAIL_AGENT", None)
    if agent:
        env["AGENT_MAIL_AGENT"] = agent
    return env


@pytest.fixture
def repo(tmp_path, monkeypatch, am):
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    git("init", "-q", "-b", "main", cwd=root)
    git("config", "user.email", "t@example.com", cwd=root)
    git("config", "user.name", "T", cwd=root)
    git("remote", "add", "origin", "git@github.com:acme/widget.git", cwd=root)
    (root / "src" / "lib.rs").write_text("fn main() {}\n")
    (root / "README.md").write_text("hi\n")
    git("add", ".", cwd=root)
    git("commit", "-q", "-m", "first", cwd=root)
    monkeypatch.chdir(root)
    return root


def commit(root, agent, path="src/lib.rs", text="changed\n", **extra) -> subprocess.CompletedProcess:
    (root / path).write_text(text)
    git("add", path, cwd=root)
    return git("commit", "-q", "-m", f"change {path}", cwd=root, env=as_agent(agent, **extra), check=False)


def test_a_commit_of_a_held_file_is_refused_naming_the_holder_and_the_holder_commits(am, repo):
    assert am("guard", "install").json["hooks"][0]["action"] == "installed"
    am("reserve", "a:x", "src/**", "--reason", "parser rewrite").assert_ok()
    refused = commit(repo, "b:y")
    assert refused.returncode != 0
    assert "held by a:x (/src/**" in refused.stderr and '"parser rewrite"' in refused.stderr
    assert "agent-mail send --from b:y --to a:x" in refused.stderr and "--no-verify" in refused.stderr
    assert git("log", "--format=%s", cwd=repo).stdout.splitlines() == ["first"]
    done = git("commit", "-q", "-m", "by the holder", cwd=repo, env=as_agent("a:x"), check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    # a file nobody holds goes through for anyone, silently
    other = commit(repo, "b:y", "README.md")
    assert other.returncode == 0 and other.stderr == ""


def test_a_rename_into_or_out_of_a_reserved_path_is_refused(am, repo):
    am("guard", "install").assert_ok()
    am("reserve", "a:x", "docs/").assert_ok()
    (repo / "docs").mkdir()
    git("mv", "README.md", "docs/README.md", cwd=repo)
    refused = git("commit", "-q", "-m", "move", cwd=repo, env=as_agent("b:y"), check=False)
    assert refused.returncode != 0 and "docs/README.md: held by a:x" in refused.stderr
    git("reset", "-q", "--hard", cwd=repo)
    am("release", "a:x", "--all").assert_ok()
    am("reserve", "a:x", "src/lib.rs").assert_ok()
    git("mv", "src/lib.rs", "src/main.rs", cwd=repo)
    refused = git("commit", "-q", "-m", "move out", cwd=repo, env=as_agent("b:y"), check=False)
    assert refused.returncode != 0 and "src/lib.rs: held by a:x" in refused.stderr


def test_silent_without_an_identity_and_without_reservations(am, repo, mailbox_path):
    am("guard", "install").assert_ok()
    quiet = commit(repo, "b:y")  # nothing reserved
    assert quiet.returncode == 0 and quiet.stderr == ""
    am("reserve", "a:x", "src/**").assert_ok()
    nobody = commit(repo, None, text="again\n")  # no identity: nobody to check for
    assert nobody.returncode == 0 and nobody.stderr == ""


def test_the_identity_setup_recorded_is_used(am, repo):
    am("guard", "install").assert_ok()
    am("setup", "claude-code", "--agent", "b:y").assert_ok()
    am("reserve", "a:x", "src/**").assert_ok()
    refused = commit(repo, None)
    assert refused.returncode != 0 and "you are b:y, from" in refused.stderr and "held by a:x" in refused.stderr


def test_a_push_of_commits_touching_a_held_file_is_refused(am, repo, tmp_path):
    git("init", "-q", "--bare", str(tmp_path / "remote.git"), cwd=tmp_path)
    git("remote", "set-url", "origin", str(tmp_path / "remote.git"), cwd=repo)
    git("push", "-q", "origin", "main", cwd=repo, env=as_agent(None))
    am("guard", "install").assert_ok()
    (repo / "src" / "lib.rs").write_text("x\n")
    git("commit", "-q", "-am", "before the reservation", cwd=repo, env=as_agent("b:y"))
    am("reserve", "a:x", "src/lib.rs").assert_ok()
    refused = git("push", "-q", "origin", "main", cwd=repo, env=as_agent("b:y"), check=False)
    assert refused.returncode != 0 and "this push changes" in refused.stderr and "held by a:x" in refused.stderr
    assert "git push --no-verify" in refused.stderr
    pushed = git("push", "-q", "origin", "main", cwd=repo, env=as_agent("a:x"), check=False)
    assert pushed.returncode == 0, pushed.stderr


@pytest.mark.sqlite_only
def test_an_existing_hook_still_runs_and_uninstall_restores_it_byte_for_byte(am, repo):
    hooks = repo / ".git" / "hooks"
    original = b"#!/bin/sh\necho 'their hook ran' >&2\ntest ! -e STOP\n"
    (hooks / "pre-commit").write_bytes(original)
    os.chmod(hooks / "pre-commit", 0o744)
    (hooks / "shared").write_text("#!/bin/sh\necho 'their push hook ran' >&2\n")
    os.chmod(hooks / "shared", 0o755)
    (hooks / "pre-push").symlink_to("shared")
    installed = am("guard", "install").json
    assert [h["action"] for h in installed["hooks"]] == ["chained", "chained"]
    assert set(installed) == set(spec.COMMANDS["guard"].output)
    assert am("guard", "install").json["hooks"][0]["action"] == "unchanged"
    am("reserve", "a:x", "src/**").assert_ok()
    ok = commit(repo, "a:x")
    assert ok.returncode == 0 and "their hook ran" in ok.stderr
    (repo / "STOP").write_text("")
    theirs = commit(repo, "a:x", text="again\n")  # their refusal stands
    assert theirs.returncode != 0 and "their hook ran" in theirs.stderr
    (repo / "STOP").unlink()
    refused = commit(repo, "b:y", text="third\n")
    assert refused.returncode != 0 and "their hook ran" in refused.stderr and "held by a:x" in refused.stderr
    done = am("guard", "uninstall").json
    assert set(done) <= set(spec.COMMANDS["guard"].output)
    assert [h["action"] for h in done["hooks"]] == ["restored", "restored"]
    assert (hooks / "pre-commit").read_bytes() == original
    assert stat.S_IMODE(os.stat(hooks / "pre-commit").st_mode) == 0o744
    assert os.readlink(hooks / "pre-push") == "shared"
    assert sorted(p.name for p in hooks.iterdir() if not p.name.endswith(".sample")) == ["pre-commit", "pre-push",
                                                                                          "shared"]
    # without the guard, b:y's commit goes through (their hook still runs)
    assert commit(repo, "b:y", text="fourth\n").returncode == 0


@pytest.mark.sqlite_only
def test_core_hooks_path_is_respected_and_uninstall_removes_only_ours(am, repo):
    git("config", "core.hooksPath", ".githooks", cwd=repo)
    result = am("guard", "install").json
    assert result["hooks_dir"] == str(repo / ".githooks")
    am("reserve", "a:x", "src/**").assert_ok()
    assert commit(repo, "b:y").returncode != 0
    assert [h["action"] for h in am("guard", "uninstall").json["hooks"]] == ["removed", "removed"]
    assert list((repo / ".githooks").iterdir()) == []


@pytest.mark.sqlite_only
def test_an_unreachable_mailbox_is_said_and_let_through_unless_strict(am, repo, tmp_path):
    am("guard", "install").assert_ok()
    for unreachable in ("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2", str(tmp_path)):
        let = commit(repo, "b:y", text=f"{unreachable}\n", AGENT_MAIL_DB=unreachable)
        assert let.returncode == 0, let.stderr
        assert "cannot reach the mailbox" in let.stderr and "Let through unchecked" in let.stderr
        strict = commit(repo, "b:y", text=f"{unreachable} strict\n", AGENT_MAIL_DB=unreachable,
                        AGENT_MAIL_GUARD="strict")
        assert strict.returncode != 0 and "cannot reach the mailbox" in strict.stderr
        assert "--no-verify" in strict.stderr
    git("config", "agent-mail.guard", "strict", cwd=repo)
    refused = commit(repo, "b:y", text="config\n", AGENT_MAIL_DB=str(tmp_path))
    assert refused.returncode != 0 and "Refused (agent-mail.guard is strict)" in refused.stderr


@pytest.mark.sqlite_only
def test_an_error_of_its_own_refuses_saying_why(am, repo):
    am("guard", "install").assert_ok()
    refused = commit(repo, "Not An Identity")
    assert refused.returncode != 0 and "could not check this commit" in refused.stderr
    assert "--no-verify" in refused.stderr
