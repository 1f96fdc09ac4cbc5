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
