"""The notification views: the unread mirror and the system channel, and their files.

Both are derived from the mailbox, never the other way round: rendering or clearing
them marks nothing read. Files are written atomically (temp file in the same
directory, then rename), so a reader sees the old document or the new one, never a
torn one.
"""

from __future__ import annotations

import os

from agent_mail import jsonout, model, spec

NOTIFICATION_DIR = ".notification"
EMAIL_FILE = "email.json"
SYSTEM_FILE = "system.json"
DEFAULT_MAX_ENTRIES = spec.MAX_ENTRIES_DEFAULT


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


def write_document(directory: str, name: str, document: dict | None) -> dict:
    """Write `document` to DIRECTORY/.notification/NAME atomically, or remove the file when None.

    Returns what happened; never raises for file-system trouble (the caller reports it).
    """
    folder = os.path.join(directory, NOTIFICATION_DIR)
    path = os.path.join(folder, name)
    try:
        if document is None:
            try:
                os.unlink(path)
            except FileNotFoundError:
                return {"path": path, "status": "absent"}
            return {"path": path, "status": "removed"}
        os.makedirs(folder, mode=0o700, exist_ok=True)
        data = (jsonout.dumps(document) + "\n").encode("utf-8")
        temporary = os.path.join(folder, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(temporary, path)
        except BaseException:
            try:
                os.unlink(temporary)
            except OSError:
                pass
            raise
        return {"path": path, "status": "rendered"}
    except OSError as exc:
        return {"path": path, "status": "failed", "error": f"{exc.strerror or exc}"}
