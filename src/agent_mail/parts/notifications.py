"""The notification views: the unread mirror and the system channel, and their files.

Both are derived from the mailbox, never the other way round: rendering or clearing
them marks nothing read. Files are written atomically (temp file in the same
directory, then rename), so a reader sees the old document or the new one, never a
torn one.
"""

from __future__ import annotations

import os

from agent_mail import jsonout, model

NOTIFICATION_DIR = ".notification"
EMAIL_FILE = "email.json"
SYSTEM_FILE = "system.json"
DEFAULT_MAX_ENTRIES = model.MAX_ENTRIES_DEFAULT


def email_instructions(agent: str) -> str:
    return (
        f"You have unread mail. Handle each entry, then mark it read without fetching it again: "
        f"agent-mail dismiss {agent} ID... (or agent-mail read {agent} for refs and attachments). "
        "Deleting or clearing this file marks nothing read."
    )


def unread_mirror(agent: str, newest_first: list[dict], total: int, attachments: dict[str, list[dict]]) -> dict | None:
    """The unread mirror document, or None when nothing is unread.

    `newest_first` holds at most max_entries unread messages; `total` counts them all.
    """
    if total == 0 or not newest_first:
        return None
    emails = []
    for message in newest_first:
        body = message["body"] or ""
        # Bodies are whole: the send cap bounds them. Only rows written before the cap can be longer.
        truncated = len(body) > model.BODY_MAX_CHARS
        emails.append({
            "id": message["id"],
            "from": message["sender"],
            "subject": message["subject"],
            "message": body[:model.BODY_MAX_CHARS] if truncated else body,
            "message_chars": len(body),
            "message_truncated": truncated,
            "received_at": message["deliver_at"] or message["created"],
            "type": message["type"],
            "refs": message["refs"],
            "attachments": [a["name"] for a in attachments.get(message["id"], [])],
        })
    return {
        "instructions": email_instructions(agent),
        "data": {
            "count": total,
            "newest_received_at": emails[0]["received_at"],
            "email_ids": [e["id"] for e in emails],
            "emails": emails,
        },
    }


def system_channel(events: list[dict]) -> dict:
    return {"events": events}


def mirror_problem(directory: str) -> str | None:
    """Why notification files cannot be written into `directory` now, or None."""
    import stat

    try:
        info = os.stat(directory)
    except FileNotFoundError:
        return (f"the mirror directory {directory} no longer exists; it is not recreated. Create it again, or run "
                "agent-mail profile AGENT --clear mirror-dir.")
    except OSError as exc:
        return f"the mirror directory {directory} cannot be used: {exc.strerror or exc}."
    if not stat.S_ISDIR(info.st_mode):
        return f"the mirror directory {directory} is not a directory."
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"the mirror directory {directory} is not writable by this user."
    folder = os.path.join(directory, NOTIFICATION_DIR)
    try:
        inner = os.lstat(folder)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{folder} cannot be used: {exc.strerror or exc}."
    if stat.S_ISLNK(inner.st_mode):
        return f"{folder} is a symbolic link; it is never followed. Remove it."
    if not stat.S_ISDIR(inner.st_mode):
        return f"{folder} is not a directory. Remove it."
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{folder} is not writable by this user."
    return None


def _notification_dir(directory: str, create: bool) -> int | None:
    """A descriptor of DIRECTORY/.notification, made inside DIRECTORY if asked; None if absent.

    DIRECTORY itself is never created (a user who removed it meant it), and neither it nor
    .notification is followed if it is a symbolic link.
    """
    from agent_mail import files

    outer = files.open_dir(directory)
    try:
        if create:
            try:
                os.mkdir(NOTIFICATION_DIR, 0o700, dir_fd=outer)
            except FileExistsError:
                pass
        try:
            return os.open(NOTIFICATION_DIR, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) |
                           getattr(os, "O_NOFOLLOW", 0), dir_fd=outer)
        except FileNotFoundError:
            return None
    finally:
        os.close(outer)


def has_folder(directory: str) -> bool:
    """Whether DIRECTORY/.notification exists (as anything: what is there is not ours to judge here)."""
    try:
        os.lstat(os.path.join(directory, NOTIFICATION_DIR))
    except OSError:
        return False
    return True


def remove_empty_folder(directory: str) -> None:
    """Remove DIRECTORY/.notification if it is an empty directory; anything else stays as it is."""
    from agent_mail import files

    try:
        outer = files.open_dir(directory)
    except OSError:
        return
    try:
        os.rmdir(NOTIFICATION_DIR, dir_fd=outer)  # fails on a file, a link, or a folder with anything in it
    except OSError:
        pass
    finally:
        os.close(outer)


def _failure(directory: str, exc: OSError) -> str:
    problem = mirror_problem(directory)
    return problem or f"{exc.strerror or exc}"


def read_document(directory: str, name: str) -> bytes | None:
    """The current bytes of DIRECTORY/.notification/NAME, or None if there is no such file."""
    from agent_mail import files

    try:
        folder = _notification_dir(directory, create=False)
    except OSError:
        return None
    if folder is None:
        return None
    try:
        return files.read_file(folder, name)
    finally:
        os.close(folder)


def write_bytes(directory: str, name: str, data: bytes | None) -> dict:
    """Put `data` at DIRECTORY/.notification/NAME atomically, or remove the file when None.

    Returns what happened; never raises for file-system trouble (the caller reports it).
    """
    from agent_mail import files

    path = os.path.join(directory, NOTIFICATION_DIR, name)
    try:
        folder = _notification_dir(directory, create=data is not None)
        if folder is None:
            return {"path": path, "status": "absent"}
        try:
            if data is None:
                try:
                    os.unlink(name, dir_fd=folder)
                except FileNotFoundError:
                    return {"path": path, "status": "absent"}
                return {"path": path, "status": "removed"}
            files.write_atomic(folder, name, data)
        finally:
            os.close(folder)
        return {"path": path, "status": "rendered"}
    except OSError as exc:
        if data is None and isinstance(exc, FileNotFoundError):
            return {"path": path, "status": "absent"}
        return {"path": path, "status": "failed", "error": _failure(directory, exc)}


def write_document(directory: str, name: str, document: dict | None) -> dict:
    """Write `document` to DIRECTORY/.notification/NAME atomically, or remove the file when None."""
    data = None if document is None else (jsonout.dumps(document) + "\n").encode("utf-8")
    return write_bytes(directory, name, data)


def write_documents(planned: list[tuple[str, str, str, dict | None]], journal: dict | None,
                    new_folders: set) -> list[dict]:
    """Write each planned (agent, directory, name, document), in order; what happened to each, with its agent.
    `journal`, when a transaction keeps one: the bytes each file held before its first write here (so a
    rollback can put them back), and `new_folders` the directories whose .notification this made."""
    results = []
    for agent, directory, name, document in planned:
        if journal is not None and (directory, name) not in journal:
            journal[(directory, name)] = read_document(directory, name)
            if not has_folder(directory):
                new_folders.add(directory)
        results.append({"agent": agent, **write_document(directory, name, document)})
    return results
