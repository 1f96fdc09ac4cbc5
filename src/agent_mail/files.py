"""Files agent-mail writes outside the mailbox: private directories, atomic documents, saved attachments.

Everything here is written under a temporary name and moved into place whole, so a reader (or
a retry after a kill) never finds a half-written file under a final name. Names of saved
attachments come from other agents, so they are treated as hostile: reduced to a single path
component of printable characters, with `.` and `..` replaced. Files are opened relative to a
descriptor of their directory with O_NOFOLLOW, so a link planted there is never followed.
"""

from __future__ import annotations

import os
import stat

from agent_mail import errors

_FORBIDDEN = set('<>:"|?*')
_MAX_NAME_BYTES = 200
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
# Temporary files carry the writer's process id, so leftovers of a killed writer can be told apart
# from a live writer's files and swept: .NAME.am-PID-RANDOM.part
TEMP_MARK = ".am-"
TEMP_SUFFIX = ".part"


def pid_alive(pid: int | None) -> bool:
    """Whether process `pid` (on this machine) still runs; True when unknown. A zombie (ended, not yet reaped by its
    parent) has ended: a harness killed under a parent that has not waited for it yet counts as gone."""
    if not pid:
        return True  # unknown: assume so
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: there, unless it is a zombie
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc here: the signal said it is there


def process_handle(pid: int | None) -> int | None:
    """A descriptor that reads as ready once process `pid` ends (a pidfd: Linux 5.3 and later), to sleep on with
    other descriptors (wait_readable); None where there is none (the caller polls pid_alive instead). The caller
    closes it."""
    opener = getattr(os, "pidfd_open", None)
    if not pid or opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None


def same_file(path: str, others: list[str]) -> bool:
    """Whether `path` is one of the files `others` (the same device and inode, whatever the names and links), by
    stat alone: nothing is opened."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    for other in others:
        try:
            found = os.stat(other)
        except (OSError, ValueError):
            continue
        if (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino):
            return True
    return False


# ---------------------------------------------------------------- directories


def make_private_dirs(path: str) -> list[str]:
    """Create `path` and any missing parents, each 0700 whatever the umask; return those created, outermost first."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    created = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue
        os.chmod(directory, 0o700)  # mkdir's mode is filtered by the umask
        created.append(directory)
    return created


def remove_created_dirs(created: list[str]) -> None:
    """Undo make_private_dirs: remove the directories it created, innermost first, if still empty."""
    for directory in reversed(created):
        try:
            os.rmdir(directory)
        except OSError:
            return


def _temp_name(name: str) -> str:
    return f".{name}{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}{TEMP_SUFFIX}"


def _writer_pid(name: str, mark: str, suffix: str) -> int | None:
    """The process id in a temporary name of ours (`...{mark}PID-...{suffix}`), or None if it is not one."""
    if not name.startswith(".") or mark not in name:
        return None
    tail = name.rsplit(mark, 1)[1]
    for ending in (suffix, suffix + "-wal", suffix + "-shm", suffix + "-journal"):
        if tail.endswith(ending):
            tail = tail[: -len(ending)]
            break
    else:
        return None
    pid, _, rest = tail.partition("-" if "-" in tail else ".")
    return int(pid) if pid.isdigit() and rest else None


STALE_AFTER_SECONDS = 60.0  # and untouched this long: a process id alone could be another namespace's


def stale_temporary_files(directory: str, *, mark: str = TEMP_MARK, suffix: str = TEMP_SUFFIX,
                          prefix: str = ".") -> list[str]:
    """Names in `directory` that are temporary files of ours whose writer process is gone."""
    import time

    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stale, now = [], time.time()
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = _writer_pid(name, mark, suffix)
        if pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            if now - os.lstat(os.path.join(directory, name)).st_mtime >= STALE_AFTER_SECONDS:
                stale.append(name)
        except OSError:
            pass
    return sorted(stale)


def sweep(directory: str, names: list[str]) -> list[str]:
    """Remove these regular files from `directory` (never following links); return the ones removed."""
    removed = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                os.unlink(path)
                removed.append(name)
        except OSError:
            pass
    return removed


# ---------------------------------------------------------------- atomic documents


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """Write `data` to `name` in the directory `dir_fd` whole: temporary file, then rename over it."""
    temporary = _temp_name(name)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(temporary, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def open_dir(path: str) -> int:
    """A descriptor of the directory `path` (the last component must not be a link)."""
    return os.open(path, os.O_RDONLY | _DIRECTORY | _NOFOLLOW)


def read_file(dir_fd: int, name: str) -> bytes | None:
    """The content of the regular file `name`, or None if there is none (links are not followed)."""
    try:
        fd = os.open(name, os.O_RDONLY | _NOFOLLOW, dir_fd=dir_fd)
    except (FileNotFoundError, OSError):
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


# ---------------------------------------------------------------- saved attachments


def safe_name(name: str, index: int) -> str:
    """One harmless file name for attachment number `index` called `name`."""
    last = str(name).replace("\\", "/").split("/")[-1]
    cleaned = "".join(ch for ch in last if ch.isprintable() and ch not in _FORBIDDEN).strip().rstrip(".")
    if cleaned in ("", ".", ".."):
        cleaned = f"attachment-{index + 1}"
    encoded = cleaned.encode("utf-8", "ignore")
    if len(encoded) > _MAX_NAME_BYTES:
        stem, dot, suffix = cleaned.rpartition(".")
        suffix = f".{suffix}" if dot and len(suffix) <= 16 else ""
        room = _MAX_NAME_BYTES - len(suffix.encode("utf-8"))
        cleaned = encoded[:room].decode("utf-8", "ignore") + suffix
    return cleaned


def _unique(names: list[str]) -> list[str]:
    seen: set[str] = set()
    unique = []
    for name in names:
        candidate, n = name, 2
        stem, dot, suffix = name.rpartition(".")
        while candidate in seen:
            candidate = f"{stem} ({n}).{suffix}" if dot and stem else f"{name} ({n})"
            n += 1
        seen.add(candidate)
        unique.append(candidate)
    return unique


class StagedSave:
    """Attachments written under temporary names in their directory, not yet under their own.

    `publish()` moves them all into place (or none: a failure puts back what it had moved);
    `discard()` removes the temporary files and any directory the save created. Until
    publish, nothing under a final name exists or has changed.
    """

    def __init__(self, target: str, dir_fd: int, created_dirs: list[str], overwrite: bool):
        self.target = target
        self.dir_fd = dir_fd
        self.created_dirs = created_dirs
        self.overwrite = overwrite
        self.staged: list[tuple[str, str]] = []  # (temporary name, final name)
        self.saved: list[dict] = []

    def publish(self) -> None:
        done: list[tuple[str, str, str | None]] = []  # (temporary, final, backup of what it replaced)
        try:
            for temporary, final in self.staged:
                backup = None
                if self.overwrite:
                    try:
                        existing = os.stat(final, dir_fd=self.dir_fd, follow_symlinks=False)
                    except FileNotFoundError:
                        existing = None
                    if existing is not None:
                        if not stat.S_ISREG(existing.st_mode):
                            raise FileExistsError(f"{final} exists and is not a regular file")
                        backup = _temp_name(final)
                        os.link(final, backup, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd,
                                follow_symlinks=False)
                    os.replace(temporary, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                else:
                    os.link(temporary, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
                    os.unlink(temporary, dir_fd=self.dir_fd)
                done.append((temporary, final, backup))
        except OSError as exc:
            for _temporary, final, backup in reversed(done):
                try:
                    if backup is not None:
                        os.replace(backup, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
                    else:
                        os.unlink(final, dir_fd=self.dir_fd)
                except OSError:
                    pass
            self.discard()
            raise errors.AgentMailError(f"could not save into {self.target}: {exc.strerror or exc}; nothing was "
                                        "saved and nothing was replaced.") from None
        for _temporary, _final, backup in done:
            if backup is not None:
                try:
                    os.unlink(backup, dir_fd=self.dir_fd)
                except OSError:
                    pass
        self.close()

    def discard(self) -> None:
        for temporary, _final in self.staged:
            try:
                os.unlink(temporary, dir_fd=self.dir_fd)
            except OSError:
                pass
        self.staged = []
        self.close()
        remove_created_dirs(self.created_dirs)

    def close(self) -> None:
        if self.dir_fd >= 0:
            os.close(self.dir_fd)
            self.dir_fd = -1


def stage_attachments(directory: str, attachments: list[dict], contents: dict[str, bytes | None],
                      overwrite: bool, own_file=None) -> StagedSave:
    """Check every name and write every attachment under a temporary name in `directory`; all or nothing.
    `own_file(path)`: whether a path is one of the mailbox's own files, never replaced, --overwrite or not."""
    import hashlib

    target = os.path.realpath(os.path.expanduser(directory))
    try:
        created = make_private_dirs(target)
    except OSError as exc:
        raise errors.InvalidInput(
            [("save_to", f"cannot use {directory!r} as a directory: {exc.strerror or exc}.")]
        ) from None
    try:
        dir_fd = open_dir(target)
    except OSError as exc:
        remove_created_dirs(created)
        raise errors.InvalidInput(
            [("save_to", f"cannot use {directory!r} as a directory: {exc.strerror or exc}.")]
        ) from None
    staged = StagedSave(target, dir_fd, created, overwrite)
    try:
        sweep(target, stale_temporary_files(target))  # what a killed save left behind
        names = _unique([safe_name(a["name"], i) for i, a in enumerate(attachments)])
        problems = []
        for attachment, name in zip(attachments, names, strict=True):
            content = contents.get(attachment["sha256"])
            if content is None or hashlib.sha256(content).hexdigest() != attachment["sha256"]:
                said = f"the stored content of attachment {attachment['name']!r} is missing or damaged; nothing was " \
                       "saved."
                raise errors.StorageError(said, told=said)
            if own_file is not None and own_file(os.path.join(target, name)):
                problems.append(("save_to", f"{os.path.join(target, name)} would be one of the mailbox's own files "
                                              "(the database or SQLite's files beside it): never replaced; choose "
                                              "another directory."))
                continue
            try:
                existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not overwrite:
                problems.append(("save_to", f"{os.path.join(target, name)} already exists; nothing was saved. "
                                              f"Choose another directory, or pass {errors.arg('overwrite')}."))
            elif not stat.S_ISREG(existing.st_mode):
                problems.append(("save_to", f"{os.path.join(target, name)} exists and is not a regular file; "
                                              "it is never replaced."))
        if problems:
            raise errors.InvalidInput(problems)
        for attachment, name in zip(attachments, names, strict=True):
            temporary = _temp_name(name)
            staged.staged.append((temporary, name))
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dir_fd)
            with os.fdopen(fd, "wb") as handle:
                handle.write(contents[attachment["sha256"]])
            staged.saved.append({"name": name, "path": os.path.join(target, name), "size": attachment["size"],
                                 "sha256": attachment["sha256"]})
    except OSError as exc:
        staged.discard()
        raise errors.AgentMailError(f"could not save into {target}: {exc.strerror or exc}; nothing was "
                                    "left behind.") from None
    except BaseException:
        staged.discard()
        raise
    return staged


# ---------------------------------------------------------------- new files written whole


def write_new(output: str, field: str, write) -> str:
    """Create the new file `output` (never replacing one; readable by its owner only) with what `write(raw)` writes
    to a binary file: written aside, synced, then linked into place, so nothing is ever found half written under its
    name. Returns its absolute path; InvalidInput naming `field` when it exists or its directory does not."""
    target = os.path.abspath(os.path.expanduser(output))
    if os.path.lexists(target):
        raise errors.InvalidInput([(field, f"{target} exists; nothing was written. Name a new file (an export "
                                           "never overwrites one).")])
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise errors.InvalidInput([(field, f"{directory} is not a directory; nothing was written.")])
    aside = os.path.join(directory, f".{os.path.basename(target)}.am-{os.getpid()}.part")
    try:
        # 0600, as the mailbox, its attachments and its tokens are: an export holds the mail itself
        with os.fdopen(os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as raw:
            write(raw)
            raw.flush()
            os.fsync(raw.fileno())
        os.link(aside, target)  # fails rather than replace a file that appeared meanwhile
    except FileExistsError:
        raise errors.InvalidInput([(field, f"{target} exists; nothing was written.")]) from None
    except OSError as exc:
        raise errors.AgentMailError(f"could not write {target} ({exc.strerror}); nothing was written.") from None
    finally:
        try:
            os.unlink(aside)
        except OSError:
            pass
    return target


def wait_readable(descriptors: list[int], timeout: float | None) -> set[int]:
    """Sleep until some of `descriptors` can be read (or are closed or in error) or `timeout` seconds pass (None:
    for as long as it takes); those that can. poll(), never select(): select() cannot watch a descriptor numbered
    1,024 or more ("filedescriptor out of range"), which a server holding many connections hands out (issue 27).
    An interrupted sleep (a signal) returns nothing ready."""
    import select

    poller = select.poll()
    for fd in descriptors:
        poller.register(fd, select.POLLIN | select.POLLPRI)
    milliseconds = None if timeout is None else max(0, int(timeout * 1000 + 0.999))  # never early: rounded up
    try:
        return {fd for fd, _ in poller.poll(milliseconds)}
    except InterruptedError:
        return set()
