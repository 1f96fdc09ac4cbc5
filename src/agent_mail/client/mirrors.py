"""The notification mirror of an identity whose mailbox is an agent-mail server: its directory is on the client's
machine, so the setting is kept on that machine too, per server and identity, and the files are written there.

The setting lives in `mirrors.json` in the user's state directory for agent-mail (AGENT_MAIL_STATE_DIR, else
$XDG_STATE_HOME/agent-mail, else ~/.local/state/agent-mail), a 0600 file in a 0700 directory, replaced whole
(temporary file, then rename): {server URL: {identity: directory}}. The server never learns the path, and never
writes on a client's behalf: the documents come from it (POST /v1/follow) and are written here with
parts/notifications.py's guarantees (atomic, .notification never followed when it is a link, the directory never
created).

Standard library and the ground layers only: the client imports it.
"""

from __future__ import annotations

import os

from agent_mail import errors, jsonout
from agent_mail.parts import notifications

STATE_DIR_VAR = "AGENT_MAIL_STATE_DIR"
STATE_FILE = "mirrors.json"


def state_dir() -> str:
    given = os.environ.get(STATE_DIR_VAR, "").strip()
    if given:
        return os.path.abspath(os.path.expanduser(given))
    base = os.environ.get("XDG_STATE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "agent-mail")


def server_key(url: str) -> str:
    """The server as the settings name it: scheme, host, port and path (no credentials, no query)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path.rstrip('/')}"


def _load() -> dict:
    path = os.path.join(state_dir(), STATE_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            settings = jsonout.loads(handle.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise errors.AgentMailError(f"the mirror settings {path} cannot be read ({exc}); move it aside, then set "
                                    "the mirror directory again (agent-mail profile AGENT --mirror-dir DIR).") from None
    return settings if isinstance(settings, dict) else {}


def kept(url: str) -> dict[str, str]:
    """Every mirror kept on this machine for the server at `url`: {identity: directory} (no file: none)."""
    if not os.path.exists(os.path.join(state_dir(), STATE_FILE)):
        return {}
    mine = _load().get(server_key(url)) or {}
    return {agent: directory for agent, directory in mine.items() if isinstance(directory, str)}


def recorded(url: str, agent: str) -> str | None:
    """The mirror directory on this machine of `agent` on the server at `url`, or None."""
    directory = (_load().get(server_key(url)) or {}).get(agent)
    return directory if isinstance(directory, str) else None


def record(url: str, agent: str, directory: str | None) -> None:
    """Set (or, None, forget) `agent`'s mirror directory on this machine."""
    from agent_mail import files

    settings = _load()
    key = server_key(url)
    mine = dict(settings.get(key) or {})
    if directory is None:
        mine.pop(agent, None)
    else:
        mine[agent] = directory
    if mine:
        settings[key] = mine
    else:
        settings.pop(key, None)
    folder = state_dir()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        descriptor = files.open_dir(folder)
        try:
            ordered = {key: dict(sorted(value.items())) if isinstance(value, dict) else value
                       for key, value in sorted(settings.items())}
            files.write_atomic(descriptor, STATE_FILE, jsonout.dumps(ordered, end="\n").encode("utf-8"))
        finally:
            os.close(descriptor)
    except OSError as exc:
        raise errors.AgentMailError(f"the mirror settings cannot be saved in {folder} ({exc.strerror or exc}); "
                                    f"nothing was changed. Set {STATE_DIR_VAR} to a directory you can write.") from None


def write(agent: str, directory: str, email: dict | None, system: dict | None, *, email_too: bool = True) -> list[dict]:
    """Write the mirror's files into `directory` (a None document removes its file), as a local mirror is written;
    what happened to each, with its agent."""
    planned = ([(agent, directory, notifications.EMAIL_FILE, email)] if email_too else []) + \
        [(agent, directory, notifications.SYSTEM_FILE, system)]
    return notifications.write_documents(planned, None, set())


def remove(agent: str, directory: str) -> list[dict]:
    """Remove the mirror's files from a directory no longer used."""
    return [{"agent": agent, **notifications.write_document(directory, name, None)}
            for name in (notifications.EMAIL_FILE, notifications.SYSTEM_FILE)]


def problem(directory: str | None) -> str | None:
    return notifications.mirror_problem(directory) if directory else None
