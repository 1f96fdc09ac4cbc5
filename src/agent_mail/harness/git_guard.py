"""`agent-mail guard`: git hooks that refuse a change to files another live identity holds exclusively.

`guard install [--dir REPO]` puts a pre-commit and a pre-push hook in the repository's hooks directory (the
one git runs: core.hooksPath when set, else .git/hooks, shared by every worktree). A hook already there is
kept, renamed NAME.agent-mail-original, and run first by ours with the same arguments and input; its
refusal stands. `guard uninstall` renames it back (the same file: its bytes and mode), or removes ours when
there was none. Our hooks are known by their marker line, so installing twice changes nothing.

The hooks run `agent-mail guard pre-commit` / `guard pre-push` (one process): the paths the change touches
(both sides of a rename: git lists them with --no-renames as a deletion and an addition), checked as
`reservations --check` checks them, for the session's identity: AGENT_MAIL_AGENT, else the identity
`agent-mail setup` recorded in the repository (.claude/settings.local.json's env, or the --agent of our
hooks in .codex/hooks.json or .gemini/settings.json). Without an identity, without a mailbox, or with nothing
reserved that the change touches, the guard says nothing. When the mailbox cannot be reached it says so and
lets the change through, or refuses it when strict (AGENT_MAIL_GUARD=strict, or git config agent-mail.guard
strict). Any other failure of its own refuses, saying why. Every refusal names git's bypass: --no-verify.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

from agent_mail import errors, jsonout, model

HOOKS = ("pre-commit", "pre-push")
MARK = "# agent-mail guard:"  # the line that tells our hooks from the repository's own
KEPT = ".agent-mail-original"  # the suffix a hook that was there is kept under
STRICT_ENV = "AGENT_MAIL_GUARD"
STRICT_CONFIG = "agent-mail.guard"
_ZERO = "0" * 40
_SAY = "agent-mail guard: "


def _git(args: list[str], cwd: str, check: bool = True) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise errors.AgentMailError(f"could not run git ({exc}).") from None
    if check and done.returncode != 0:
        said = done.stderr.decode("utf-8", "replace").strip()
        raise errors.AgentMailError(f"git {' '.join(args)} failed: {said}")
    return done.stdout.decode("utf-8", "surrogateescape") if done.returncode == 0 else ""


# -- install and uninstall --------------------------------------------------------------------------------
def _hooks_dir(directory: str | None) -> tuple[str, str]:
    """(the work tree's root, the hooks directory git runs hooks from)."""
    base = os.path.realpath(os.path.expanduser(directory or os.getcwd()))
    if not os.path.isdir(base):
        raise errors.InvalidInput([("dir", f"{base} is not a directory; give a git repository's directory.")])
    done = subprocess.run(["git", "rev-parse", "--show-toplevel", "--git-path", "hooks"], cwd=base,
                          capture_output=True, text=True)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) != 2:
        raise errors.InvalidInput([("dir", f"{base} is not inside a git work tree: the guard is installed in a "
                                           "repository's hooks.")])
    root = lines[0]
    hooks = lines[1] if os.path.isabs(lines[1]) else os.path.join(base, lines[1])  # honours core.hooksPath
    return root, os.path.normpath(hooks)


def _script(hook: str) -> str:
    python = shlex.quote(sys.executable)
    head = (f"#!/bin/sh\n{MARK} {hook}. Written by `agent-mail guard install`; `agent-mail guard uninstall` "
            "puts back what was here.\n"
            f"# Refuses a change to files another live identity holds exclusively; git commit --no-verify "
            "(git push --no-verify) skips every hook.\n"
            f'original="$(dirname "$0")/{hook}{KEPT}"\n')
    if hook == "pre-push":  # the refs come on stdin, which both hooks read
        return head + ('input="$(mktemp)" || exit 1\ntrap \'rm -f "$input"\' EXIT\ncat > "$input"\n'
                       'if [ -x "$original" ]; then "$original" "$@" < "$input" || exit $?; fi\n'
                       f'{python} -m agent_mail guard pre-push < "$input"\n')
    return head + ('if [ -x "$original" ]; then "$original" "$@" || exit $?; fi\n'
                   f"exec {python} -m agent_mail guard pre-commit\n")


def _ours(path: str) -> bool:
    if os.path.islink(path):
        return False  # we write files; a link is the repository's own (kept as the link it is)
    try:
        with open(path, "rb") as handle:
            return MARK.encode() in handle.read(4096)
    except OSError:
        return False


def _write_hook(path: str, text: str) -> None:
    temporary = f"{path}.agent-mail-tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(temporary, 0o755)
    os.replace(temporary, path)


def install(directory: str | None = None) -> dict:
    root, hooks = _hooks_dir(directory)
    done = []
    for hook in HOOKS:
        path, kept = os.path.join(hooks, hook), os.path.join(hooks, hook + KEPT)
        script = _script(hook)
        if _ours(path):
            with open(path, encoding="utf-8") as handle:
                action = "unchanged" if handle.read() == script else "updated"
        elif os.path.lexists(path):
            if os.path.lexists(kept):
                raise errors.InvalidInput([("dir", f"{kept} is in the way: a hook was kept there before and is not "
                                                   f"ours to overwrite. Move it, then install again.")])
            action = "chained"
        else:
            action = "installed"
        if action == "chained":
            os.rename(path, kept)  # the same file, bytes and mode: uninstall renames it back
        if action != "unchanged":
            os.makedirs(hooks, exist_ok=True)
            _write_hook(path, script)
        done.append({"hook": hook, "path": path, "action": action,
                     "runs_first": kept if os.path.lexists(kept) else None})
    return {"dir": root, "hooks_dir": hooks, "hooks": done, "strict": _strict(root),
            "notes": ["A commit or push touching files another live identity holds exclusively is refused, naming "
                      "the holder. It checks as AGENT_MAIL_AGENT, else the identity agent-mail setup recorded in "
                      "the repository; without one, or with nothing reserved, it says nothing.",
                      "git commit --no-verify (git push --no-verify) is git's bypass: it skips every hook.",
                      f"When the mailbox cannot be reached the guard says so and lets the change through; to refuse "
                      f"instead: git config {STRICT_CONFIG} strict (or {STRICT_ENV}=strict)."]}


def uninstall(directory: str | None = None) -> dict:
    root, hooks = _hooks_dir(directory)
    done = []
    for hook in HOOKS:
        path, kept = os.path.join(hooks, hook), os.path.join(hooks, hook + KEPT)
        if _ours(path):
            if os.path.lexists(kept):
                os.replace(kept, path)
                action = "restored"
            else:
                os.remove(path)
                action = "removed"
        else:
            action = "not installed" if not os.path.lexists(path) else "left alone (not ours)"
        done.append({"hook": hook, "path": path, "action": action})
    return {"dir": root, "hooks_dir": hooks, "hooks": done}


# -- the hooks: what a change touches, checked ------------------------------------------------------------
def _names(output: str) -> list[str]:
    """Paths from git's -z output (NUL-separated; git log puts a newline between commits)."""
    seen: dict[str, None] = {}
    for name in output.split("\0"):
        name = name.strip("\n")
        if name:
            seen.setdefault(name, None)
    return list(seen)


def staged_paths(root: str) -> list[str]:
    """Every path the commit being made touches; a rename's both sides (as a deletion and an addition)."""
    return _names(_git(["diff", "--cached", "--name-only", "--no-renames", "-z"], root))


def pushed_paths(root: str, refs: str) -> list[str]:
    """Every path the commits being pushed touch (pre-push's stdin: local ref, sha, remote ref, sha a line)."""
    found: list[str] = []
    for line in refs.splitlines():
        parts = line.split()
        if len(parts) != 4 or set(parts[1]) == {"0"}:
            continue  # a deleted ref pushes no change
        local, remote = parts[1], parts[3]
        known = set(remote) != {"0"} and subprocess.run(["git", "cat-file", "-e", f"{remote}^{{commit}}"], cwd=root,
                                                        capture_output=True).returncode == 0
        commits = [f"{remote}..{local}"] if known else [local, "--not", "--remotes"]
        found += _names(_git(["log", "--format=", "--name-only", "--no-renames", "-z", *commits], root))
    return list(dict.fromkeys(found))


def recorded_identity(root: str) -> tuple[str | None, str | None]:
    """(identity, where it came from): AGENT_MAIL_AGENT, else what agent-mail setup recorded in `root`."""
    given = os.environ.get("AGENT_MAIL_AGENT", "").strip()
    if given:
        return given, "AGENT_MAIL_AGENT"
    claude = os.path.join(root, ".claude", "settings.local.json")
    document = _json(claude)
    agent = (document.get("env") or {}).get("AGENT_MAIL_AGENT") if isinstance(document.get("env"), dict) else None
    if isinstance(agent, str) and agent:
        return agent, claude
    for path in (os.path.join(root, ".codex", "hooks.json"), os.path.join(root, ".gemini", "settings.json")):
        hooks = _json(path).get("hooks")
        for groups in (hooks.values() if isinstance(hooks, dict) else ()):
            for group in groups if isinstance(groups, list) else ():
                for hook in (group.get("hooks") or []) if isinstance(group, dict) else ():
                    words = str(hook.get("command", "") if isinstance(hook, dict) else "").split()
                    if "agent_mail" in words and "hook" in words and "--agent" in words[:-1]:
                        return words[words.index("--agent") + 1], path
    return None, None


def _json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise errors.AgentMailError(f"cannot read {path} for the identity agent-mail setup recorded: {exc}. Fix "
                                    "it, or set AGENT_MAIL_AGENT.") from None
    return document if isinstance(document, dict) else {}


def _strict(root: str) -> bool:
    said = os.environ.get(STRICT_ENV, "").strip() or _git(["config", "--get", STRICT_CONFIG], root, check=False)
    return said.strip().lower() == "strict"


def refusal(result: dict, agent: str, source: str, action: str) -> str:
    """What a refused commit or push is told: each path and its holder, how to ask them, and the bypass."""
    lines = [f"{_SAY}refused: this {action} changes files another live identity holds exclusively (you are "
             f"{agent}, from {source}):"]
    for c in result["conflicts"]:
        # (a terminal shows this: what another identity wrote is shown with its control characters written out)
        why = f": {jsonout.quoted(c['reason'])}" if c["reason"] else ""
        lines.append(f"  {model.visible(c['pattern'])}: held by {c['holder']} ({model.visible(c['holder_pattern'])}, "
                     f"since {c['since']}, until {c['expires_at']}){why}")
    lines += [f"Ask: {step}" for step in result["next"]]
    lines.append(f"Or wait for the release. To {action} anyway, git's own bypass skips every hook: git {action} "
                 "--no-verify.")
    return "\n".join(lines)


def run_hook(hook: str, stdin_text: str = "", served=None) -> int:
    """The pre-commit or pre-push check, as git runs it; the exit status (0 lets the change through). `served`:
    the client's caller when AGENT_MAIL_DB names an agent-mail server (agent_mail.client.commands.Served)."""
    action = "commit" if hook == "pre-commit" else "push"
    try:
        return _check(hook, action, stdin_text, served)
    except errors.AgentMailError as exc:
        _say(f"{_SAY}refused: the guard could not check this {action}: {exc.message}\nFix that, or {action} "
             f"without the guard: git {action} --no-verify.")
        return errors.EXIT_FAILED


def _unreachable(root: str, action: str, why: str) -> int:
    strict = _strict(root)
    _say(f"{_SAY}cannot reach the mailbox to check this {action} against reservations: {why}\n"
         + (f"Refused ({STRICT_CONFIG} is strict). Fix the mailbox, or {action} anyway with git's bypass: "
            f"git {action} --no-verify." if strict else
            f"Let through unchecked. To refuse instead: git config {STRICT_CONFIG} strict "
            f"(or {STRICT_ENV}=strict)."))
    return errors.EXIT_FAILED if strict else errors.EXIT_OK


CHECK_BATCH = 20_000  # paths in one reservations --check through a server: well under its bound on a request's items


def _served_check(served, root: str, agent: str, paths: list[str]) -> dict:
    """reservations --check through the server: the repository located in this checkout, the paths from its root
    (git gives them so), only the values sent."""
    from agent_mail.parts import repos

    located, _, relative = repos.for_server(None, (), [("paths", p) for p in paths], cwd=root)
    # A commit of more paths than one request may carry (the server's bound on a request's items) is checked in
    # batches, and the answers joined: refused if any batch holds a conflict.
    merged: dict = {"ok": True, "conflicts": [], "next": []}
    for start in range(0, len(relative), CHECK_BATCH):
        result = served.reservations_check(agent, located, relative[start:start + CHECK_BATCH])
        merged["ok"] = merged["ok"] and result["ok"]
        merged["conflicts"] += result["conflicts"]
        merged["next"] += [step for step in result["next"] if step not in merged["next"]]
    return merged


def _check(hook: str, action: str, stdin_text: str, served=None) -> int:
    from agent_mail import calls
    from agent_mail.operations import location, mail
    from agent_mail.urls import scheme_of

    root = _git(["rev-parse", "--show-toplevel"], os.getcwd()).strip()
    agent, source = recorded_identity(root)
    if agent is None:
        return errors.EXIT_OK  # nobody to check for: silent
    problem = model.identity_problem(agent)
    if problem:
        raise errors.InvalidInput([("agent", f"{agent!r} ({source}): {problem}")])
    paths = staged_paths(root) if hook == "pre-commit" else pushed_paths(root, stdin_text)
    if not paths:
        return errors.EXIT_OK
    if served is not None:  # AGENT_MAIL_DB names an agent-mail server: the check is carried there
        calls.check("reservations", {"agent": agent, "paths": paths, "check": True}, with_inputs=False)
        try:
            result = _served_check(served, root, agent, paths)
        except served.Unreachable as exc:
            return _unreachable(root, action, exc.message)
        if result["ok"]:
            return errors.EXIT_OK
        _say(refusal(result, agent, source, action))
        return errors.EXIT_FAILED
    where, _ = location.resolve_location()
    if scheme_of(where) is None and not os.path.exists(where):
        return errors.EXIT_OK  # no mailbox, so nothing reserved (and none is created here)
    opened = mail.open_mailbox()
    try:
        mailbox = opened.__enter__()
    except errors.AgentMailError as exc:
        return _unreachable(root, action, exc.message)
    try:
        result = calls.call("reservations", {"agent": agent, "paths": paths, "check": True}, mailbox=mailbox)
    finally:
        opened.__exit__(None, None, None)
    if result["ok"]:
        return errors.EXIT_OK
    _say(refusal(result, agent, source, action))
    return errors.EXIT_FAILED


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def main(values: dict, emit, served=None) -> int:
    """`agent-mail guard ACTION [--dir REPO]`, as the command line starts it (`served`: as the client starts it,
    when AGENT_MAIL_DB names an agent-mail server: install and uninstall are the same, the check is carried
    there)."""
    from agent_mail import calls  # noqa: F401  (a front end enters through the call layer: see _check)

    action = values["action"]
    if action == "install":
        emit(install(values["dir"]))
    elif action == "uninstall":
        emit(uninstall(values["dir"]))
    else:
        text = sys.stdin.read() if action == "pre-push" and sys.stdin is not None else ""
        return run_hook(action, text, served)
    return errors.EXIT_OK
