"""The notification files of identities with a mirror directory, kept in step with the mailbox.

Files are rendered inside the transaction that changed what they show, and journaled: if that
transaction rolls back, every file it wrote gets its earlier bytes back.
"""

from __future__ import annotations

import os

from agent_mail import errors, model

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent_mail.store.base import Store


class Mirrors:
    """Renders the unread mirror and the system channel, and journals each file written in a transaction."""

    def __init__(self, store: Store):
        self.store = store
        self._rendered: set[str] = set()  # agents whose files the current transaction rewrote
        # (directory, file name) -> its bytes before the current transaction first wrote it
        self._journal: dict[tuple[str, str], bytes | None] | None = None
        self._new_folders: set[str] = set()  # mirror directories whose .notification this transaction may make

    def changing(self, write: bool = True) -> Changing:
        """A transaction whose notification files are put back if it rolls back.

        Files are rendered inside the transaction (from the state about to be committed, and
        serialised by the write lock). If the result then cannot be emitted (or the commit
        fails), every file the transaction wrote gets its earlier bytes back, and the files of
        identities still mirrored are redrawn from the state that stands: a failed command
        leaves no file behind, not even in a mirror directory it failed to record.
        """
        return Changing(self, write)

    def _begin(self) -> None:
        self._rendered, self._journal, self._new_folders = set(), {}, set()

    def _end(self) -> None:
        self._rendered, self._journal, self._new_folders = set(), None, set()

    def _put_back(self) -> None:
        """After a rollback: every file the transaction wrote gets its earlier bytes back, mirrors redrawn."""
        journal, rendered, new_folders = self._journal, self._rendered, self._new_folders
        self._journal = None
        if not journal:
            return
        from agent_mail.parts import notifications

        def put_back():
            for (directory, name), before in journal.items():
                notifications.write_bytes(directory, name, before)
            for directory in new_folders:  # made by this transaction: gone with it (if left empty)
                notifications.remove_empty_folder(directory)

        put_back_done = False
        try:
            with self.store.transaction(write=True):
                put_back()
                put_back_done = True
                self.render(rendered, system=True)
        except errors.AgentMailError:
            if not put_back_done:  # the lock could not be had: the files go back all the same
                put_back()

    def write(self, directory: str, name: str, document: dict | None) -> dict:
        """Write one notification file, remembering what it held in case the transaction rolls back."""
        from agent_mail.parts import notifications

        return notifications.write_documents([("", directory, name, document)], self._journal, self._new_folders)[0]

    def render(self, agents, *, email: bool = True, system: bool = False, written: dict | None = None) -> list[dict]:
        """Rewrite the notification files of those `agents` that have a mirror directory.

        written: {id: message} of rows the current transaction stored (each with its attachments'
        [{name, size, sha256}]): listed from memory rather than read back, once per recipient.
        """
        return self.render_each({agent: (email, system) for agent in agents}, written)

    def render_all(self, except_agent: str | None = None, written: dict | None = None) -> list[dict]:
        return self.render([a for a in self.store.mirrored_agents() if a != except_agent], written=written)

    def after_send(self, sender: str, recipients: list[str], *, everyone: bool, bounced: bool,
                   written: dict) -> list[dict]:
        """A send's mirrors in one pass: its recipients' (everyone's but the sender's for a broadcast) email
        mirror, and the sender's system channel when a recipient bounced."""
        wanted = {agent: (True, False) for agent in
                  ([a for a in self.store.mirrored_agents() if a != sender] if everyone else []) + recipients}
        if bounced:
            wanted[sender] = (wanted.get(sender, (False, False))[0], True)
        return self.render_each(wanted, written)

    def render_each(self, wanted: dict[str, tuple[bool, bool]], written: dict | None = None) -> list[dict]:
        """Rewrite, for each agent with a mirror directory, its email mirror and/or system channel (wanted:
        {agent: (email, system)}): every document made first, then all written in one go."""
        results, planned = [], []
        for agent in sorted(wanted):
            email, system = wanted[agent]
            profile = self.store.profile(agent)
            if not profile or not profile["mirror_dir"]:
                continue
            if self.store.kind != "sqlite" and not os.path.isdir(profile["mirror_dir"]):
                # A shared mailbox: the directory is on the machine of the identity, kept current there by its
                # watch or `notifications --follow`, not on this one.
                results.append({"agent": agent, "path": profile["mirror_dir"], "status": "elsewhere"})
                continue
            self._rendered.add(agent)
            from agent_mail.parts import notifications  # here: most sends reach nobody with a mirror

            if email:
                planned.append((agent, profile["mirror_dir"], notifications.EMAIL_FILE,
                                self.unread_mirror(agent, profile, written)))
            if system:
                events = self.store.events(agent)
                planned.append((agent, profile["mirror_dir"], notifications.SYSTEM_FILE,
                                notifications.system_channel(events) if events else None))
        if not planned:
            return results
        return results + notifications.write_documents(planned, self._journal, self._new_folders)

    def unread_mirror(self, agent: str, profile: dict | None, written: dict | None = None) -> dict | None:
        """The unread mirror document of `agent` (None when nothing is unread); see render for `written`."""
        from agent_mail.parts import notifications

        limit = (profile or {}).get("max_entries") or notifications.DEFAULT_MAX_ENTRIES
        now = model.now_iso()
        # The newest entries through the index, an exact count beside them; whole rows only for those listed.
        listed = [m["id"] for m in reversed(self.store.unread(agent, now, limit=limit, newest=True))]
        if not listed:
            return None
        written = written or {}
        earlier = [i for i in listed if i not in written]  # stored before this transaction: read them
        found = self.store.addressed(agent, earlier, now) if earlier else {}
        attachments = self.store.attachments_of(earlier) if earlier else {}
        for message_id in listed:
            if message_id in written:
                found[message_id] = written[message_id]
                attachments[message_id] = written[message_id]["attachments"]
        newest = [found[i] for i in listed]
        return notifications.unread_mirror(agent, newest, self.store.count_unread(agent, now), attachments)


class Changing:
    """Mirrors.changing(): the store's transaction, with the files it wrote put back when it does not commit (the block
    raised, or the commit failed). A class rather than a contextlib.contextmanager: contextlib is about half a
    millisecond of every command's start."""

    __slots__ = ("mirrors", "write", "transaction")

    def __init__(self, mirrors: Mirrors, write: bool):
        self.mirrors, self.write, self.transaction = mirrors, write, None

    def __enter__(self) -> None:
        self.mirrors._begin()
        try:
            self.transaction = self.mirrors.store.transaction(write=self.write)
            self.transaction.__enter__()
        except BaseException:
            self.mirrors._end()
            raise

    def __exit__(self, kind, exc, traceback) -> bool:
        try:
            try:
                self.transaction.__exit__(kind, exc, traceback)  # commits, or rolls back and raises again
            except BaseException:
                self.mirrors._put_back()
                raise
            if kind is not None:
                self.mirrors._put_back()
            return False
        finally:
            self.mirrors._end()
