"""The wake-ups of a SQLite mailbox, and the presence of the watches waiting for them: one named pipe per
waiting watch in a private directory beside the mailbox (see WakePipe), written to by the senders of its
mail, locked by its watch for as long as it waits.
"""

from __future__ import annotations

import os

from agent_mail import model

TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3


def presence(path: str, db: sqlite3.Connection, facts: dict[str, dict], agent: str | None) -> dict[str, dict]:
    """The stored liveness `facts` of the mailbox at `path`, with what its armed sessions' pipes tell: a pipe
    whose lock is held is a live watch, seen now (unless it stopped refreshing for HUNG_SECONDS: hung); a pipe
    whose process is gone is a dead watch, stale at once; a pipe without a lock (an older agent-mail's watch)
    counts by its refreshes, as before. A session without a pipe counts by its row, unless its id says nothing
    holds it (a server's wait whose client hung up: Store.abandon_sessions): stale at once, as a killed watch."""
    from agent_mail.store.base import GONE_HOLDER, gone_since, holder_gone
    from agent_mail.store.sql import SQLStore

    # The servers whose waits hold sessions here (BellHub): their own pipe's lock is every such session's presence
    # (their identities' pipes, named after the server too, say nothing more).
    servers = {session: held for session, (_, _, held) in pipe_presence(path, EVERY_WAIT).items()}
    pipes = pipe_presence(path, agent, skip=servers)
    where = "AND agent = ?" if agent is not None else ""
    params = (agent,) if agent is not None else ()
    # Without pipes only an abandoned session says more than its row (found by the ids' index: GONE_HOLDER.*).
    if not pipes and not servers and db.execute(
            f"SELECT 1 FROM watch_sessions WHERE id >= ? AND id < ? AND state = 'armed' {where} LIMIT 1",
            (GONE_HOLDER + ".", GONE_HOLDER + "/", *params)).fetchone() is None:
        return facts
    now = model.now()
    spoken = {name for name, _, _ in pipes.values()}
    armed: dict[str, list] = {}  # identity: [(the moment an armed session was last known alive, alive now)]
    for session, name, last_seen in db.execute(
            f"SELECT id, agent, last_seen FROM watch_sessions WHERE state = 'armed' {where}", params):
        stored = model.parse_iso(last_seen)
        holder, dot, _ = session.partition(".")
        if holder_gone(session):  # its server's client hung up: nothing holds it
            seen = (gone_since(stored, now), False)
            spoken.add(name)
        elif dot and holder in servers:  # a wait a server carries: alive while the server holds its pipe's lock
            spoken.add(name)
            if servers[holder] is False:  # the server is gone
                seen = (gone_since(stored, now), False)
            elif stored is not None and (now - stored).total_seconds() > model.HUNG_SECONDS:
                seen = (stored, False)  # the server stopped refreshing its sessions: hung
            else:
                seen = (now, True)
        elif session not in pipes:
            seen = (stored, False)
        else:
            _, touched, held = pipes[session]
            if held is None:  # a live watch that holds no lock: its refreshes tell
                seen = (touched, True)
            elif held:  # alive; hung if it stopped refreshing long ago
                seen = (touched if (now - touched).total_seconds() > model.HUNG_SECONDS else now, True)
            else:  # its process is gone
                seen = (gone_since(stored, now), False)
        armed.setdefault(name, []).append(seen)
    for name, seen in armed.items():
        if name not in spoken:
            continue  # no pipe of its speaks: the stored facts stand
        entry = SQLStore.fact_entry(facts, name)
        times = [moment for moment, _ in seen if moment is not None]
        entry["armed_seen"] = max(times) if times else None
        live = [moment for moment, alive in seen if alive and moment is not None]
        if live and (entry["session_seen"] is None or max(live) > entry["session_seen"]):
            entry["session_seen"] = max(live)
    return facts


# The pipe name's identity of a listener woken by every message (a supervisor's dashboard): no identity is empty.
EVERYTHING = ""


class WakePipe:
    """This process's own wake-up: a named pipe in the private directory beside the mailbox, called
    IDENTITY@PID-SESSION. A sender that commits mail for IDENTITY (or a broadcast) writes a byte into every
    such pipe of its recipients (ring_bells); nothing else does. So a blocked watch sleeps in the kernel
    until its own mail comes.

    The watch also holds an exclusive lock (flock) on its pipe for as long as the pipe is there: that is its
    presence. The kernel frees the lock when the process dies, however it dies, so a reader that finds the
    lock free knows the watch is gone (pipe_presence), at once and without the watch ever writing. The lock
    is taken before the pipe gets its name (it is made under a temporary name, then renamed), so a named
    pipe of a live watch is never found unlocked."""

    def __init__(self, path: str, reader: int, writer: int, session: str | None, locked: bool):
        self.path, self.reader, self.writer, self.session, self.locked = path, reader, writer, session, locked

    @classmethod
    def open(cls, mailbox: str, agent: str, session: str | None) -> WakePipe | None:
        """The pipe of `agent`'s watch `session` on the mailbox at `mailbox`; None where one cannot be made."""
        from agent_mail import files

        bells = bell_dir(mailbox)
        owner = f"{os.getpid()}-{session or os.urandom(4).hex()}"
        pipe = os.path.join(bells, f"{agent}@{owner}")
        making = os.path.join(bells, f".{owner}.new")  # no '@': no sender or reader takes it for a pipe
        try:
            files.make_private_dirs(bells)
            os.mkfifo(making, 0o600)
        except OSError:
            return None
        try:
            reader = os.open(making, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            # Our own writer end keeps the pipe from reading as closed (EOF) between senders.
            writer = os.open(making, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            os.unlink(making)
            return None
        locked = _lock(reader)
        try:
            os.rename(making, pipe)
        except OSError:
            for fd in (reader, writer):
                os.close(fd)
            os.unlink(making)
            return None
        return cls(pipe, reader, writer, session, locked)

    def wait(self, timeout: float, also: tuple[int, ...] = ()) -> bool:
        """Sleep until the pipe is written to or one of `also` reads as ready (True) or `timeout` passes (False)."""
        from agent_mail.files import wait_readable

        ready = wait_readable([self.reader, *also], timeout)  # poll, not select: fds numbered 1,024 and more
        if self.reader not in ready:
            return bool(ready)
        try:
            while os.read(self.reader, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        return True

    def touch(self) -> bool:
        """Mark the pipe refreshed now (its mtime); False if it cannot be."""
        try:
            os.utime(self.reader if os.utime in os.supports_fd else self.path)
            return True
        except OSError:
            return False

    def close(self) -> None:
        try:  # the name first: a pipe that is still there is never found with its lock free
            os.unlink(self.path)
        except OSError:
            pass
        for fd in (self.reader, self.writer):
            try:
                os.close(fd)
            except OSError:
                pass


def bell_dir(path: str) -> str:
    """Where the wake-ups of the mailbox at `path` live: a private directory beside it."""
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.wake")


def ring_bells(path: str, recipients) -> None:
    """Wake the watches waiting for mail for `recipients` ('*': every watch): one byte into each of their
    pipes. Never blocks and never fails a send: a pipe whose reader is gone (its watch was killed) is
    removed once its process is gone, and mail whose wake-up is lost is still found by every watch's
    periodic look at the mailbox."""
    bells = bell_dir(path)
    try:
        names = os.listdir(bells)
    except OSError:
        return  # no watch has ever waited here
    import errno
    import stat

    everyone = "*" in recipients
    for name in names:
        agent, at, owner = name.partition("@")
        if not at or not (everyone or agent in recipients or agent == EVERYTHING):
            continue
        pipe = os.path.join(bells, name)
        try:
            fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nobody reads it: a watch that was killed
                _sweep_pipe(pipe, owner)
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, b"\0")
        except OSError:
            pass  # full: a wake-up is pending already
        finally:
            os.close(fd)


def _lock(fd: int) -> bool:
    """Take the exclusive lock on a pipe (its watch's presence); False where the file system has no locks."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def _held(pipe: str) -> bool | None:
    """Whether the watch that made `pipe` holds its lock (alive); False when the lock is free (its process
    is gone); None when it cannot be told (no such pipe, or no locks here)."""
    import fcntl
    import stat

    try:
        fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released with the descriptor, below
        return False
    except BlockingIOError:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)


def pipe_presence(path: str, agent: str | None, skip=()) -> dict[str, tuple]:
    """{watch session: (identity, when its pipe was last touched, held)} for the waiting watches of `agent`
    (or all) that have a pipe: held True, its watch holds the pipe's lock (alive); False, its watch is gone
    (killed); None, its watch holds no lock (an older agent-mail, or no locks here) and is alive by its
    process, so its refreshes tell."""
    bells = bell_dir(path)
    try:
        names = os.listdir(bells)
    except OSError:
        return {}
    from agent_mail import files  # only where some watch has waited (a brief command's start does without it)

    found = {}
    for name in names:
        identity, at, owner = name.partition("@")
        pid, _, session = owner.partition("-")
        if not at or not session or identity == EVERYTHING or (agent != identity if agent is not None else
                                                               identity == EVERY_WAIT) or session in skip:
            continue
        pipe = os.path.join(bells, name)
        try:
            mtime = os.stat(pipe).st_mtime
        except OSError:
            continue
        held = _held(pipe)
        if not held and (not pid.isdigit() or not files.pid_alive(int(pid))):
            held = False  # its process is gone: killed
        elif held is False:
            held = None  # free, yet its process runs: a watch that never took the lock
        found[session] = (identity, model.from_timestamp(mtime), held)
    return found


def _sweep_pipe(pipe: str, owner: str) -> None:
    from agent_mail import files

    pid = owner.partition("-")[0]
    if pid.isdigit() and not files.pid_alive(int(pid)):
        try:
            os.unlink(pipe)
        except OSError:
            pass


# The pipe name's identity of a server's own wake-up for every wait it carries (BellHub): rung by a broadcast and by
# Store.wake_waits (a revoked or expired token, a stopping wait), never by a direct message. Its lock is the presence
# of every session the server holds (named INSTANCE.DIGEST.NONCE: presence above).
EVERY_WAIT = "*"


class BellHub:
    """The wake-ups of every wait one `agent-mail serve` process carries on a SQLite mailbox (issue 27), watched on
    the server's event loop (loop.add_reader): no thread and no poll per wait. One pipe per identity that at least
    one wait is for (IDENTITY@PID-INSTANCE, rung by every sender of mail for it, in this process or any other), the
    dashboard's EVERYTHING pipe while one waits (rung by every message), and the server's EVERY_WAIT pipe (rung by
    a broadcast and by a revocation: every wait looks again, its token asked about). `on_wake(agents)` is called on
    the loop with the identities whose waits are to look again, or None for every wait. It has the interface of
    postgres_hub.Hub that agent_mail.server.waits uses (subscribe, unsubscribe, stop); a stop call's release is
    announced on the identity's pipe only, so the waits ask whether their sessions were released
    (announces_releases False)."""

    announces_releases = False
    reconnects = 0

    def __init__(self, path: str, instance: str, on_wake, loop):
        self.path, self.instance, self._on_wake, self._loop = path, instance, on_wake, loop
        self._pipes: dict[str, WakePipe] = {}  # identity (or EVERYTHING, EVERY_WAIT): its pipe, while waited for
        self._counts: dict[str, int] = {}

    def start(self) -> None:
        """Make the server's own pipe (StorageError if it cannot be: a file system without named pipes)."""
        self._open(EVERY_WAIT)

    def subscribe(self, agent: str):
        """Count a wait for `agent` in; the future is done at once, the identity's pipe made (mail committed after
        that rings it): failed with StorageError where it cannot be made."""
        from concurrent.futures import Future

        done: Future = Future()
        self._counts[agent] = self._counts.get(agent, 0) + 1
        try:
            if agent not in self._pipes:
                self._open(agent)
            done.set_result(True)
        except Exception as exc:
            done.set_exception(exc)
        return done

    def unsubscribe(self, agent: str) -> None:
        left = self._counts.get(agent, 0) - 1
        if left > 0:
            self._counts[agent] = left
            return
        self._counts.pop(agent, None)
        self._close(agent)

    def stop(self) -> None:
        for agent in list(self._pipes):
            self._close(agent)

    def _open(self, agent: str) -> None:
        from agent_mail import errors

        pipe = WakePipe.open(self.path, agent, self.instance)
        if pipe is None:
            raise errors.StorageError(f"the server could not make a wake-up pipe beside the mailbox {self.path} "
                                      f"(in {bell_dir(self.path)}); nothing was changed. Ask again.")
        self._pipes[agent] = pipe
        self._loop.add_reader(pipe.reader, self._rung, agent, pipe)

    def _close(self, agent: str) -> None:
        pipe = self._pipes.pop(agent, None)
        if pipe is None:
            return
        try:
            if not self._loop.is_closed():
                self._loop.remove_reader(pipe.reader)
        except (RuntimeError, ValueError, OSError):
            pass
        pipe.close()

    def _rung(self, agent: str, pipe: WakePipe) -> None:
        try:
            while os.read(pipe.reader, 4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return
        self._on_wake(None if agent == EVERY_WAIT else {agent})
