"""Inspect, check and repair a mailbox of each backend: what `describe`, `doctor` and `copy` need beyond a store.

The registry (store/__init__.py) names each backend's family here ("sqlite": a file; "server": a database
server reached by URL), and `backend_for(location)` calls `<family>_report`, `<family>_doctor` and
`<family>_locate`. None of them creates a mailbox; all of them are imported only by those commands.
"""

from __future__ import annotations

import os

from agent_mail import errors


# ---------------------------------------------------------------- a SQLite file


def sqlite_report(location: str, source: str, given: str | None) -> dict:
    """What `describe` says of the SQLite mailbox at `location` (resolved from `given`, as written)."""
    from agent_mail.store import sqlite

    report = {"backend": "sqlite", "path": location, "source": source}
    if given and os.path.abspath(os.path.expanduser(given)) != location:
        report["link"] = os.path.abspath(os.path.expanduser(given))
    return {**report, **sqlite.inspect(location)}


def sqlite_doctor(location: str, repair: bool, emit) -> dict:
    from agent_mail import doctor

    return doctor.doctor(location, repair, emit)


def sqlite_locate(value: str, field: str) -> str:
    """The mailbox file `value` names on the command line; the one to copy from (--from) must exist."""
    path = os.path.realpath(os.path.expanduser(value))
    if field == "from" and not os.path.isfile(path):
        raise errors.InvalidInput([(field, f"{path} is not a mailbox file; nothing was copied.")])
    return path


# ---------------------------------------------------------------- a database server


def server_report(location: str, source: str, given: str | None) -> dict:
    """What `describe` says of a server mailbox, its password never shown; a missing driver or an unknown
    scheme is reported as the problem."""
    from agent_mail.store import backend_module, backend_name, redact_url

    report = {"backend": backend_name(location), "url": redact_url(location), "source": source}
    try:
        module = backend_module(location)
    except errors.AgentMailError as exc:
        return {**report, "exists": None, "problem": exc.message}
    try:
        return {**report, **module.inspect(location)}
    except errors.InvalidInput as exc:
        return {**report, "exists": None, "problem": exc.message}


def server_doctor(location: str, repair: bool, emit) -> dict:
    from agent_mail import doctor
    from agent_mail.store import backend_module

    return doctor.doctor_server(location, backend_module(location), emit)


def server_locate(value: str, field: str) -> str:
    return value.strip()
