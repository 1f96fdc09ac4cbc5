"""Which repository a reservation or a ref belongs to, and paths and patterns said relative to its root.

A repository is keyed so that clones of it on several machines share their reservations: its `origin` URL
normalised (the ssh and https spellings of one URL are one key: host/owner/name, lower-case host, no user,
port, scheme or .git), else its root directory; `--repo NAME` overrides. Paths given from anywhere inside the
repository (`./`, `..`, an absolute path, a symbolic link inside the tree) become paths from its root.

A ref (send's --ref) to a file inside a repository is stored as `KEY//PATH`: the repository's key, `//`, the path
from its root (`github.com/acme/widget//src/lib.rs`), so it names one file to a reader in any clone, on any machine.
Outside a repository it is the absolute path, which names the file on the sender's machine (and still opens, for a
repository keyed by its root directory: POSIX reads `//` as `/`).
"""

from __future__ import annotations

import os

from agent_mail import errors, model


class Repository:
    """key: what reservations are filed under; root: the work tree's directory (None with --repo outside one);
    fold: whether paths compare without case (core.ignorecase)."""

    __slots__ = ("key", "root", "fold", "_real_dirs")

    def __init__(self, key: str, root: str | None, fold: bool):
        self.key, self.root, self.fold = key, root, fold
        self._real_dirs: dict[str, str] = {}

    def _realpath(self, full: str) -> str:
        """os.path.realpath, with each directory resolved once (a commit names many files in few directories)."""
        directory, name = os.path.split(full)
        real_dir = self._real_dirs.get(directory)
        if real_dir is None:
            real_dir = self._real_dirs[directory] = os.path.realpath(directory)
        candidate = os.path.join(real_dir, name)
        if name in ("", ".", "..") or os.path.islink(candidate):
            return os.path.realpath(candidate)
        return candidate

    def path(self, given: str, cwd: str | None = None) -> str:
        """`given` (relative to `cwd`, or absolute) as a path from the root; InvalidInput if it lies outside."""
        return self._relative(given, cwd, what="path")

    def pattern(self, given: str, cwd: str | None = None) -> str:
        """A pattern as stored: `./x`, `../x` and absolute paths inside the tree are taken from `cwd` and
        anchored at the root (/src/x); anything else is already relative to the root (gitignore syntax)."""
        if given.startswith(("./", "../")) or given in (".", "..") or (os.path.isabs(given) and self.root and
                                                                        _inside(given, self.root)):
            trailing = "/" if given.endswith("/") else ""
            return "/" + self._relative(given, cwd, what="pattern").rstrip("/") + trailing
        return given

    def _relative(self, given: str, cwd: str | None, what: str) -> str:
        if self.root is None:  # --repo outside a work tree: the path is taken as said, tidied
            tidy = os.path.normpath(given).replace(os.sep, "/").lstrip("/")
            if tidy.startswith("..") or tidy == ".":
                raise errors.InvalidInput([(what, f"{given!r} is not a path inside the repository.")])
            return tidy
        base = cwd or os.getcwd()
        full = given if os.path.isabs(given) else os.path.join(base, given)
        real = self._realpath(full)  # links inside the tree resolved, so one file has one name
        if not _inside(real, self.root):
            plain = os.path.normpath(os.path.abspath(full))  # a link leading out of the tree: its own name
            if not _inside(plain, self.root):
                raise errors.InvalidInput([(what, f"{given!r} lies outside the repository at {self.root}.")])
            real = plain
        rel = real[len(self.root.rstrip(os.sep)) + 1:].replace(os.sep, "/")  # real lies inside the root
        if not rel:
            raise errors.InvalidInput([(what, f"{given!r} is the repository's root itself; use ** for everything.")])
        return rel


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def normalise_url(url: str) -> str:
    """host/owner/name of a git remote URL, whichever way it is spelt (ssh, scp-like, https, git://)."""
    text = url.strip()
    if "://" in text:
        text = text.split("://", 1)[1]
        host, _, path = text.partition("/")
    elif ":" in text and not text.startswith("/"):
        host, _, path = text.partition(":")
    else:
        return os.path.realpath(text) if os.path.isabs(text) else text
    host = host.rsplit("@", 1)[-1].split(":", 1)[0].lower()  # no user, no port
    path = path.strip("/")
    if path.endswith(".git"):
        path = path[:-4]
    return f"{host}/{path.rstrip('/')}"


def _git(args: list[str], cwd: str) -> tuple[int, str]:
    import subprocess  # only when git must be asked: the pre-tool hook's path does without (~4 ms to import)

    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise errors.AgentMailError(f"could not run git to find the repository ({exc}).") from None
    return done.returncode, done.stdout.strip()


# What makes reading .git/config ourselves unfaithful to git: these leave the question to git itself.
_GIT_ENV = ("GIT_DIR", "GIT_WORK_TREE", "GIT_CONFIG", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_COUNT",
            "GIT_COMMON_DIR", "GIT_CEILING_DIRECTORIES")
_UNUSUAL = ("[include", "insteadof", "ignorecase", "worktreeconfig")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return handle.read()
    except OSError:
        return None


def _config_values(text: str) -> dict[str, str]:
    """remote.origin.url and core.ignorecase from a git config file's text (the last setting wins)."""
    values, section = {}, ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            head = line[1:line.find("]")] if "]" in line else line[1:]
            name, _, sub = head.partition(" ")
            section = name.lower() + ("." + sub.strip().strip('"') if sub else "")
            continue
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if value.startswith('"') and value.endswith('"') and len(value) > 1:
            value = value[1:-1]
        values[f"{section}.{key.strip().lower()}"] = value
    return {k: v for k, v in values.items() if k in ("remote.origin.url", "core.ignorecase")}


def found_cheaply(base: str) -> tuple[str, dict[str, str]] | None:
    """(the work tree's root, its config values) read from the files, without running git; None when anything
    is unusual enough that only git should say (then it is asked)."""
    if any(os.environ.get(name) for name in _GIT_ENV):
        return None
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for path in (os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config"), "/etc/gitconfig"):
        text = _read(path)
        if text is not None and any(word in text.lower() for word in _UNUSUAL):
            return None
    directory = os.path.realpath(base)
    while True:
        dot_git = os.path.join(directory, ".git")
        if os.path.isdir(dot_git):
            common = dot_git
            break
        if os.path.isfile(dot_git):  # a worktree's or submodule's: "gitdir: PATH"
            text = _read(dot_git) or ""
            if not text.startswith("gitdir: "):
                return None
            gitdir = os.path.join(directory, text[8:].strip())
            shared = _read(os.path.join(gitdir, "commondir"))
            common = os.path.join(gitdir, shared.strip()) if shared else gitdir
            break
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
    config = _read(os.path.join(common, "config"))
    if config is None or "[include" in config.lower() or "insteadof" in config.lower() or \
            "worktree" in config.lower():
        return None
    return directory, _config_values(config)


def locate(repo: str | None = None, cwd: str | None = None) -> Repository:
    """The repository the working directory lies in (keyed as above), or the one `repo` names. Read from
    .git/config where that is what git would say (no git process: this is on the harness's pre-tool path),
    else asked of git."""
    base = cwd or os.getcwd()
    cheap = found_cheaply(base)
    if cheap is not None:
        root, values = cheap
        return _keyed(repo, root, values)
    code, out = _git(["rev-parse", "--show-toplevel"], base)
    root = os.path.realpath(out) if code == 0 and out else None
    if root is None:
        if repo is None:
            raise errors.InvalidInput([("repo", f"{base} is not inside a git repository: reservations belong to "
                                                "one. Run this inside the repository, or name it with "
                                                f"{errors.arg('repo')} NAME.")])
        return Repository(repo, None, False)
    _, config = _git(["config", "--get-regexp", r"^(remote\.origin\.url|core\.ignorecase)$"], root)
    return _keyed(repo, root, dict(line.split(" ", 1) for line in config.splitlines() if " " in line))


KEY_MAX_CHARS = 1000


def from_client(located: dict, repo: str | None = None) -> Repository:
    """The repository a client located on its own machine (`located`: {key, fold}), as a server takes it: it never
    looks at files of its own for it, and the paths and patterns arrive said from the root (a client without
    `located` names the key with `repo`)."""
    if not located and repo is not None:
        return Repository(repo, None, False)
    located = located if isinstance(located, dict) else {"": located}
    key, fold = located.get("key"), located.get("fold", False)
    if not isinstance(key, str) or not key.strip() or len(key) > KEY_MAX_CHARS or "\x00" in key \
            or model.has_surrogates(key) or not isinstance(fold, bool) or set(located) - {"key", "fold"}:
        raise errors.InvalidInput([("located", "the repository as the client located it on its own machine: "
                                               f"{{key: its key (1-{KEY_MAX_CHARS} characters of UTF-8 text, no "
                                               "NUL), fold: true when its core.ignorecase folds case}; agent-mail "
                                               "sends it itself when "
                                               "AGENT_MAIL_DB names a server (or name the key with repo).")])
    return Repository(key, None, fold)


def for_server(repo: str | None, patterns=(), paths=(), cwd: str | None = None) -> tuple[dict, list[str], list[str]]:
    """The client's side of a reservation command sent to a server: the repository located here ({key, fold}),
    the patterns anchored as stored (./x -> /x) and the paths said from its root. InvalidInput as the command
    would give it here. `paths`: (the argument's name, the path) pairs; `cwd`: where they are said from."""
    repository = locate(repo, cwd)
    problems, anchored, relative = [], [], []
    for given in patterns:
        try:
            anchored.append(repository.pattern(given, cwd))
        except errors.InvalidInput as exc:
            problems += [("patterns", m) for _, m in exc.pairs()]
    for field, given in paths:
        try:
            relative.append(repository.path(given, cwd))
        except errors.InvalidInput as exc:
            problems += [(field, m) for _, m in exc.pairs()]
    if problems:
        raise errors.InvalidInput(problems)
    return {"key": repository.key, "fold": repository.fold}, anchored, relative


def _keyed(repo: str | None, root: str, values: dict[str, str]) -> Repository:
    fold = values.get("core.ignorecase", "false").lower() in ("true", "yes", "on", "1")
    if repo is not None:
        return Repository(repo, root, fold)
    url = values.get("remote.origin.url")
    return Repository(normalise_url(url) if url else root, root, fold)


REF_SEPARATOR = "//"  # between a ref's repository key and its path from the root


def shared_ref(absolute: str, found: dict | None = None) -> str:
    """The stored form of a ref to the existing `absolute` path: `KEY//PATH` inside a git repository, else the
    path itself. `found`: directory -> its Repository (or None outside one), shared by one send's refs."""
    directory = absolute if os.path.isdir(absolute) else os.path.dirname(absolute)
    cache = found if found is not None else {}
    if directory not in cache:
        try:
            cache[directory] = locate(None, directory)
        except errors.AgentMailError:  # not inside a repository (or git cannot say): the path as it is
            cache[directory] = None
    repository = cache[directory]
    if repository is None or repository.root is None:
        return absolute
    try:
        relative = repository.path(absolute, directory)
    except errors.InvalidInput:  # the root itself, or a link leading out of the tree
        return absolute if not os.path.samefile(absolute, repository.root) else repository.key + REF_SEPARATOR + "."
    return repository.key + REF_SEPARATOR + relative


def stored_ref_problem(ref: str) -> str | None:
    """Why text a client sends as a ref it resolved on its own machine is not one (an absolute path, or
    `KEY//PATH`), or None. The server never looks for it."""
    if os.path.isabs(ref):
        return None
    key, separator, path = ref.rpartition(REF_SEPARATOR)
    if separator and key.strip() and len(key) <= KEY_MAX_CHARS and path and not path.startswith("/") \
            and ".." not in path.split("/"):
        return None
    return (f"{ref!r} is neither an absolute path nor a path in a repository (KEY//PATH, as agent-mail stores a "
            "ref inside a git repository): through a server a ref is what the sender's machine resolved.")
