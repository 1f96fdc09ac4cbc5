"""The end of a harness session whose hooks reach the mailbox through `agent-mail serve`.

The server cannot see this machine's processes, so it counts such a session as live while its hooks show signs of
life (parts.liveness.SERVED_SESSION_SECONDS). A harness killed in the middle of a turn runs no more hooks and no
waiter of ours watches it then (a waiter or waker runs only while the session is idle), and its end hook never
comes: without more, the session would count as live, and `send --require-reachable` take it for one at work, for
minutes. So the first hook of each session starts a detached watcher here, on the agent's machine, which waits for
the harness process to end and then ends the session through the server: it stops counting within about a second
of the harness's end, however it ended. One watcher per session: it holds an flock on its file while it runs, and
a hook that finds it held starts none. Ending a session that its end hook ended already changes nothing.
"""

from __future__ import annotations

import os

from agent_mail import errors

POLL_SECONDS = 0.25  # how often a watcher looks at its harness where it cannot sleep on a pidfd


def ends_directory() -> str:
    """Where the watchers keep their lock files ($XDG_STATE_HOME/agent-mail/ends)."""
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    if not state or not os.path.isabs(state):
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "agent-mail", "ends")


def _name(pid: int, session_id: str) -> str:
    """The watcher's lock file: the harness's process and the session's id (letters, digits, - and _ kept)."""
    kept = "".join(c if c.isascii() and (c.isalnum() or c in "-_") else "_" for c in session_id[:80])
    return f"{pid}-{len(session_id)}-{kept}.lock"


def watch(pid: int | None, session_id: str, end) -> None:
    """Make sure one detached watcher waits for the harness process `pid` to end, then calls `end()` (the served
    `end` hook). A harness already gone is ended at once. Best effort: where no watcher can start, the session still
    stops counting once it has been quiet a while."""
    from agent_mail.files import pid_alive

    if pid is None:
        return
    if not pid_alive(pid):
        try:
            end()
        except errors.AgentMailError:
            pass
        return
    import fcntl

    directory = ends_directory()
    path = os.path.join(directory, _name(pid, session_id))
    try:  # every served hook comes here: its directory is made only the first time
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        from agent_mail import files

        try:
            files.make_private_dirs(directory)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except (OSError, errors.AgentMailError):
            return
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return  # its watcher runs
    first = os.fork()
    if first:
        os.close(fd)
        os.waitpid(first, 0)
        return
    try:  # the first child: a session of its own, then the watcher as its child, which init adopts
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for stream in (0, 1, 2):
            os.dup2(null, stream)
        os.closerange(3, fd)  # a harness that waits for its hook's pipes to close (Vibe): the watcher holds none
        os.closerange(fd + 1, 1024)
        import signal

        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        _wait_for_end(pid)
        try:
            end()
        except errors.AgentMailError:
            pass  # the session stops counting by itself once it has been quiet a while
        try:
            os.unlink(path)
        except OSError:
            pass
    finally:
        os._exit(0)


def _wait_for_end(pid: int) -> None:
    """Until the process `pid` has ended (a zombie counts as ended): asleep on its pidfd where there is one."""
    import time

    from agent_mail.files import pid_alive, process_handle, wait_readable

    handle = process_handle(pid)
    while pid_alive(pid):
        if handle is None or wait_readable([handle], 5.0):  # ready: it ended (pid_alive says so next)
            time.sleep(POLL_SECONDS if handle is None else 0.01)  # never a busy loop on a pidfd that stays ready
