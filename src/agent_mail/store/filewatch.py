"""Kernel notification of writes in a directory, so a blocked watch sleeps instead of polling.

Linux inotify through ctypes (standard library only; imported only by `watch`).
`open_watch` returns None where it is unavailable, and the caller falls back to
polling. Events only say "look now": the database itself says what changed.
"""

from __future__ import annotations

import os
import select
import sys

_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
# Writes to the WAL or database, and the WAL being created, renamed in or removed.
_MASK = 0x2 | 0x8 | 0x80 | 0x100 | 0x200  # MODIFY | CLOSE_WRITE | MOVED_TO | CREATE | DELETE


class DirectoryWatch:
    """An inotify descriptor watching one directory."""

    def __init__(self, fd: int):
        self.fd = fd

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for a write in the directory; True if one came."""
        try:
            ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        except InterruptedError:
            return True
        if not ready:
            return False
        try:
            while os.read(self.fd, 65536):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        return True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def open_watch(directory: str) -> DirectoryWatch | None:
    """Watch `directory` for writes, or None where the kernel offers no way to (caller polls)."""
    if not sys.platform.startswith("linux") or os.environ.get("AGENT_MAIL_NO_INOTIFY"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), _MASK) < 0:
            os.close(fd)
            return None
    except (OSError, AttributeError):
        return None
    return DirectoryWatch(fd)
