"""A mailbox on a database server inspected and checked (PostgreSQL: the store registry has made sure it can be
opened here), and the report `doctor` gives of any backend's mailbox.

The registry (store/__init__.py) names this module for every server location (postgresql://..., and a scheme
it does not know, which is reported as a mailbox that cannot be opened); `backend_for(location)` calls its
`report`, `doctor` and `locate`. SQLite files have theirs in store/sqlite_checks.py. None of them creates a
mailbox; only `describe`, `doctor` and `copy` import them.
"""

from __future__ import annotations

from agent_mail import errors, spec


def doctor_report(path: str, *, ok: bool, integrity: list, schema: dict | None, counts: dict, marker: dict | None,
                  leftovers: list[str]) -> dict:
    """What `doctor` reports of a mailbox, on every backend (`repair` and `next` filled in by the caller)."""
    return {"path": path, "ok": ok, "integrity": integrity, "schema": schema, "counts": counts,
            "damage_marker": marker, "temporary_files": leftovers, "temporary_files_removed": [], "repair": None,
            "next": []}


def report(location: str, source: str, given: str | None) -> dict:
    """What `describe` says of a server mailbox, its password never shown; a missing driver or an unknown
    scheme is reported as the problem."""
    from agent_mail.store import postgres
    from agent_mail.urls import redact_url

    found = {"backend": "postgresql", "url": redact_url(location), "source": source}

    try:
        return {**found, **postgres.inspect(location)}
    except errors.InvalidInput as exc:
        return {**found, "exists": None, "problem": exc.message}


def doctor(location: str, repair: bool, emit) -> dict:
    """Check a mailbox on a database server: its schema and counts. Integrity is the server's own business
    (a damaged server is repaired with its tools), so --repair has nothing to do there and repair stays null."""
    from agent_mail.store import postgres
    from agent_mail.urls import redact_url

    found = postgres.check(location)
    schema = found["schema"]
    ok = schema is None or schema["complete"]
    result = doctor_report(redact_url(location), ok=ok, integrity=[], schema=schema, counts=found["counts"],
                           marker=None, leftovers=[])
    result["next"] = [] if ok else [spec.Step("status")]  # any command applies migrations
    emit(result)
    return result


def locate(value: str, field: str) -> str:
    return value.strip()
