"""The access tokens of `agent-mail serve` (store/base.py says what each method promises), written once for
every engine, and the one refresh of every watch session a server holds. Only a token's hash is stored; the
secret is shown once, by `token create`."""

from __future__ import annotations

_COLUMNS = "id, agents, supervisor, note, created, revoked_at"


def _token(row: dict) -> dict:
    import json  # here, not at the top: sql.py loads this module on every command's path

    row["agents"] = json.loads(row["agents"])
    row["supervisor"] = bool(row["supervisor"])
    return row


class Tokens:
    """SQLStore's token table, and the server's sessions (a mixin: `_x`, `_query` and `_wake` are the store's)."""

    def add_token(self, token: dict) -> None:
        import json

        self._x("INSERT INTO tokens (id, secret_hash, agents, supervisor, note, created) VALUES (?, ?, ?, ?, ?, ?)",
                (token["id"], token["secret_hash"], json.dumps(token["agents"]), int(token["supervisor"]),
                 token["note"], token["created"]))

    def tokens(self) -> list[dict]:
        return [_token(r) for r in self._query(f"SELECT {_COLUMNS} FROM tokens ORDER BY created, id")]

    def token(self, token_id: str) -> dict | None:
        rows = self._query(f"SELECT {_COLUMNS}, secret_hash FROM tokens WHERE id = ?", (token_id,))
        return _token(rows[0]) if rows else None

    def revoke_token(self, token_id: str, at: str) -> bool:
        changed = self._x("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (at, token_id))
        if not changed.rowcount:
            return False
        self.wake_waits()  # every wait looks again, and one made with this token finds it revoked
        return True

    def wake_waits(self) -> None:
        self._wake("*")

    def touch_sessions(self, prefix: str, at: str) -> int:
        # The sessions a server holds are named INSTANCE.UUID: one statement refreshes them all.
        return self._x("UPDATE watch_sessions SET last_seen = :at WHERE state = 'armed' AND "
                       "substr(id, 1, :n) = :prefix", {"at": at, "n": len(prefix), "prefix": prefix}).rowcount

    def release_sessions(self, session_ids: list[str], at: str, reason: str) -> None:
        for start in range(0, len(session_ids), 500):  # within any engine's limit on parameters
            chunk = session_ids[start:start + 500]
            self._x(f"UPDATE watch_sessions SET state = 'released', released_at = ?, released_reason = ?, "
                    f"last_seen = ? WHERE state = 'armed' AND id IN ({', '.join('?' * len(chunk))})",
                    (at, reason, at, *chunk))

    def abandon_sessions(self, session_ids: list[str]) -> None:
        from agent_mail.store.base import GONE_HOLDER

        # Each new id is made from the old one in SQL: one statement per position of its key part (a server's ids
        # all have it at the same place), within any engine's limit on parameters. A released session keeps its id.
        by_start: dict[int, list[str]] = {}
        for session in session_ids:
            by_start.setdefault(session.find(".") + 2, []).append(session)
        for start, ids in by_start.items():
            for first in range(0, len(ids), 500):
                chunk = ids[first:first + 500]
                self._x(f"UPDATE watch_sessions SET id = '{GONE_HOLDER}.' || substr(id, {int(start)}) "
                        f"WHERE state = 'armed' AND id IN ({', '.join('?' * len(chunk))})", tuple(chunk))

    def release_keyed_session(self, agent: str, key: str, at: str, reason: str) -> dict | None:
        # Inside the write transaction nobody renames a session meanwhile (abandoning one takes the write lock too),
        # so the ids read are the ids released. `key` is hex digits: nothing in it is special to LIKE.
        rows = self._query("SELECT id, state, released_at FROM watch_sessions WHERE agent = ? AND id LIKE ?",
                           (agent, f"%.{key}.%"))
        if not rows:
            return None
        armed = sorted(row["id"] for row in rows if row["state"] == "armed")
        if armed:
            self.release_sessions(armed, at, reason)
            for session in armed:
                self.announce_release(agent, session)
        ended = [row["released_at"] for row in rows if row["released_at"] is not None]
        return {"sessions": armed, "released": bool(armed), "released_at": at if armed else max(ended, default=None)}

    def announce_release(self, agent: str, session_id: str) -> None:
        """Tell the server holding `session_id` (released by its client's stop call) that its wait is over, when
        the transaction commits: here `agent`'s waits are woken, and a server's asks whether its session is still
        armed (PostgreSQL says which session, on the identity's channel)."""
        self._wake(agent)

    def session_state(self, session_id: str) -> str | None:
        rows = self._query("SELECT state FROM watch_sessions WHERE id = ?", (session_id,))
        return rows[0]["state"] if rows else None
