"""Which mailbox this invocation uses, and how it was chosen: AGENT_MAIL_DB (a SQLite path or a
postgresql:// URL), else the project's `.agent-mail-db` file (found as git finds its repository: in the
working directory or the nearest directory above it that has one; `agent-mail setup` writes it), else the
default file. Also what needs the location but no open mailbox: describe's report, doctor and copy.
(Opening it is agent_mail.operations.mail.open_mailbox.)
"""

from __future__ import annotations

import os

from agent_mail.parts import checks
from agent_mail import errors

DEFAULT_PATH = os.path.join("~", ".agent-mail", "mail.db")
ENV_VAR = "AGENT_MAIL_DB"
PROJECT_FILE = ".agent-mail-db"  # one line: the mailbox of this directory tree (a path, relative to it, or a URL)
PROJECT_FILE_MAX_BYTES = 4096


def _no_emit(document: dict) -> None:
    """Used when the caller wants the returned value only."""


# Annotations are never evaluated (see the __future__ import); the names they use are
# imported for type checkers only, so the CLI does not pay for importing typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    Emit = Callable[[dict], None]  # receives the result document, inside the transaction


def resolve_location() -> tuple[str, str]:
    """(where the mailbox is, how it was chosen): a PostgreSQL URL as given, or the real path of a SQLite
    file (symbolic links resolved, so the permission check and the wake-up both look at the directory the
    mailbox really lives in). How: AGENT_MAIL_DB, the path of the project file that named it, or "default"."""
    location, source, _ = _located()
    return location, source


def _located() -> tuple[str, str, str]:
    """(location, source, the value as it was written)."""
    from agent_mail.urls import scheme_of

    override = os.environ.get(ENV_VAR, "")
    if override:  # set but empty counts as unset, as shells make it easy to write
        if not override.strip():
            raise errors.InvalidInput([(ENV_VAR, f"is set to {override!r}, which names no file. Unset it for the "
                                                 f"default mailbox ({DEFAULT_PATH}), or give a path.")])
        if scheme_of(override.strip()) is not None:
            return override.strip(), ENV_VAR, override
        return os.path.realpath(os.path.expanduser(override)), ENV_VAR, override
    found = find_project_file()
    if found is not None:
        value = read_project_file(found)
        if scheme_of(value) is not None:
            return value, found, value
        given = os.path.join(os.path.dirname(found), os.path.expanduser(value))
        return os.path.realpath(given), found, given
    return os.path.realpath(os.path.expanduser(DEFAULT_PATH)), "default", DEFAULT_PATH


def server_url() -> str | None:
    """The agent-mail server this invocation's mailbox is (AGENT_MAIL_DB or the project file naming an
    http(s):// URL), or None for a mailbox opened here."""
    from agent_mail.urls import scheme_of

    try:
        location = _located()[0]
    except errors.InvalidInput:
        return None  # the command that opens it reports the problem
    return location if scheme_of(location) in ("http", "https") else None


def find_project_file(start: str | None = None) -> str | None:
    """The `.agent-mail-db` in `start` (default: the working directory) or the nearest directory above it, or
    None. One stat a directory: a command's start-up pays a handful."""
    try:
        directory = os.path.abspath(start or os.getcwd())
    except OSError:  # the working directory was removed
        return None
    while True:
        candidate = os.path.join(directory, PROJECT_FILE)
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def read_project_file(path: str) -> str:
    """The mailbox a project file names: its first line that is neither empty nor a # comment."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read(PROJECT_FILE_MAX_BYTES)
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.InvalidInput([(path, f"cannot be read ({exc}); it names this directory's mailbox. Fix or "
                                          f"remove it, or set {ENV_VAR}.")]) from None
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return line
    raise errors.InvalidInput([(path, f"names no mailbox: write its path (or a postgresql:// URL) on one line, "
                                      f"or remove the file, or set {ENV_VAR}.")])


def storage_report() -> dict:
    """What `describe` says about the mailbox; never creates it, never shows a password."""
    from agent_mail.store import backend_for

    try:
        location, source, given = _located()
    except errors.InvalidInput as exc:
        source = ENV_VAR if os.environ.get(ENV_VAR) else (find_project_file() or ENV_VAR)
        return {"backend": "sqlite", "path": None, "source": source, "exists": False, "problem": exc.message}
    return backend_for(location).report(location, source, given)


def doctor(*, repair: bool = False, emit: Emit = _no_emit) -> dict:
    """Check the mailbox this invocation resolves (never creating it); rebuild it with `repair` if damaged."""
    checks.guard("doctor", {"repair": repair})
    from agent_mail.store import backend_for

    location, _ = resolve_location()
    return backend_for(location).doctor(location, repair, emit)


def copy_mailbox(*, from_: str, to: str | None = None, merge: bool = False, dry_run: bool = False,
                 emit: Emit = _no_emit) -> dict:
    """Copy the mailbox at `from_` into `to` (default: the one this invocation resolves)."""
    checks.guard("copy", {"from_": from_, "to": to, "merge": merge, "dry_run": dry_run})
    from agent_mail.operations import copying
    from agent_mail.store import backend_for

    def located(value: str, field: str) -> str:
        if not value.strip():
            raise errors.InvalidInput([(field, "is empty; give a SQLite file path or a postgresql:// URL.")])
        return backend_for(value.strip()).locate(value, field)

    source = located(from_, "from")
    target = located(to, "to") if to is not None else resolve_location()[0]
    result = copying.copy(source, target, merge=merge, dry_run=dry_run)
    emit(result)
    return result
