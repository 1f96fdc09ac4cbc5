"""Statements over file reservations: the bodies of the SQLStore methods of the same name (store/base.py says
what each promises), loaded only by the reservation commands. Written once for every engine."""

from __future__ import annotations

from agent_mail.store.sql_values import ids_clause

_COLUMNS = "id, repo, agent, pattern, exclusive, reason, created, renewed_at, expires_at"


def reservations_in(store, repo: str | None, now: str, agent: str | None = None) -> list[dict]:
    """Reservations in `repo` (every repository's when None) not expired at `now` (of `agent`, if given), oldest
    first."""
    where = ("repo = :repo AND " if repo is not None else "") + "expires_at > :now" + (
        " AND agent = :agent" if agent is not None else "")
    rows = store._query(f"SELECT {_COLUMNS} FROM reservations WHERE {where} ORDER BY created, id",
                        {"repo": repo, "now": now, "agent": agent})
    for row in rows:
        row["exclusive"] = bool(row["exclusive"])
    return rows


def save_reservations(store, rows: list[dict]) -> None:
    """Insert each row, or renew the one of its repository, holder and pattern (mode, reason, renewed_at and
    expires_at replaced; its id and created kept)."""
    store.tell_supervisors()
    store._many(
        f"INSERT INTO reservations ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (repo, agent, pattern) DO UPDATE SET exclusive = excluded.exclusive, reason = excluded.reason, "
        "renewed_at = excluded.renewed_at, expires_at = excluded.expires_at",
        [(r["id"], r["repo"], r["agent"], r["pattern"], int(r["exclusive"]), r["reason"], r["created"],
          r["renewed_at"], r["expires_at"]) for r in rows])


def delete_reservations(store, ids: list[str]) -> int:
    """Delete these reservations; how many there were."""
    if not ids:
        return 0
    store.tell_supervisors()
    marks, params = ids_clause(ids)
    return store._x(f"DELETE FROM reservations WHERE id IN ({marks})", params).rowcount


def expire_reservations(store, repo: str, now: str) -> int:
    """Delete the reservations of `repo` that expired by `now`; how many."""
    return store._x("DELETE FROM reservations WHERE repo = ? AND expires_at <= ?", (repo, now)).rowcount
