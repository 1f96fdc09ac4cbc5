"""Saving attachments into a directory the caller chose: never outside it, never over a file unasked.

Names come from other agents, so they are treated as hostile: reduced to a single
path component of printable characters, with `.` and `..` replaced. Files are
opened relative to a descriptor of the directory with O_NOFOLLOW, so a link
planted in the directory is never followed; without --overwrite they are created
with O_EXCL, so nothing existing is ever replaced.
"""

from __future__ import annotations

import hashlib
import os
import stat

from agent_mail import errors

_FORBIDDEN = set('<>:"|?*')
_MAX_NAME_BYTES = 200


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


def save_attachments(directory: str, attachments: list[dict], contents: dict[str, bytes | None],
                     overwrite: bool) -> tuple[str, list[dict]]:
    """Write `attachments` into `directory`; all or nothing. Returns (directory, what was written)."""
    target = os.path.realpath(os.path.expanduser(directory))
    try:
        os.makedirs(target, mode=0o700, exist_ok=True)
        dir_fd = os.open(target, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise errors.InvalidInput(
            [("--save-to", f"cannot use {directory!r} as a directory: {exc.strerror or exc}.")]
        ) from None
    try:
        names = _unique([safe_name(a["name"], i) for i, a in enumerate(attachments)])
        problems = []
        for attachment, name in zip(attachments, names, strict=True):
            content = contents.get(attachment["sha256"])
            if content is None or hashlib.sha256(content).hexdigest() != attachment["sha256"]:
                raise errors.StorageError(f"the stored content of attachment {attachment['name']!r} is missing or "
                                          "damaged; nothing was saved.")
            try:
                existing = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not overwrite:
                problems.append(("--save-to", f"{os.path.join(target, name)} already exists; nothing was saved. "
                                              "Choose another directory, or pass --overwrite."))
            elif not stat.S_ISREG(existing.st_mode):
                problems.append(("--save-to", f"{os.path.join(target, name)} exists and is not a regular file; "
                                              "it is never replaced."))
        if problems:
            raise errors.InvalidInput(problems)
        saved: list[dict] = []
        try:
            for attachment, name in zip(attachments, names, strict=True):
                _write(dir_fd, name, contents[attachment["sha256"]], overwrite)
                saved.append({"name": name, "path": os.path.join(target, name), "size": attachment["size"],
                              "sha256": attachment["sha256"]})
        except OSError as exc:
            remove_saved(saved)
            raise errors.AgentMailError(f"could not save into {target}: {exc.strerror or exc}; nothing was "
                                        "left behind.") from None
        return target, saved
    finally:
        os.close(dir_fd)


def _write(dir_fd: int, name: str, content: bytes, overwrite: bool) -> None:
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    if overwrite:
        temporary = f".{name}.{os.urandom(4).hex()}.part"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o600, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=dir_fd)
            except OSError:
                pass
            raise
        return
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
    except BaseException:
        os.unlink(name, dir_fd=dir_fd)
        raise


def remove_saved(saved: list[dict]) -> None:
    for entry in saved:
        try:
            os.unlink(entry["path"])
        except OSError:
            pass
