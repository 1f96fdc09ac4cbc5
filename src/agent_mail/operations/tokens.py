"""The access tokens of `agent-mail serve`: `token create/list/rotate/revoke` (run on the mailbox itself, by its
operator) and the server's look-up of a presented token.

A token may expire (`create --expires-in`); `rotate ID` makes a new token with the same identities, note and
expiry, and leaves the old one valid for a grace (`--grace`, GRACE_DEFAULT), after which it is refused. The
server notes when a token was last used, to the minute (LAST_USED_STEP: one write a minute per token at most).

A token is `am_ID_SECRET`: the id names its row (shown by list, logged by the server), the secret is 32 random
bytes shown once by create; the mailbox keeps only the secret's SHA-256, compared in constant time. An unknown
id is compared against a hash too, so a guessed token is refused as fast as a wrong one.
"""

from __future__ import annotations

from agent_mail.parts import checks
from agent_mail import errors, model

PREFIX = "am_"
_UNKNOWN_HASH = "0" * 64  # what an unknown id's secret is compared against
GRACE_DEFAULT = "1h"  # how long a rotated token's old secret still works, unless --grace says otherwise
LAST_USED_STEP = 60.0  # seconds: last_used is written again only when older than this
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_seconds(text: str) -> float | None:
    """'90s', '15m', '12h', '30d', '2w' or a bare number of seconds, as seconds; None when not one of those."""
    text = text.strip().lower()
    unit = _UNITS.get(text[-1:]) if text[-1:].isalpha() else 1
    number = text[:-1] if text[-1:].isalpha() else text
    if unit is None or not number or not all(c.isdigit() or c == "." for c in number) or number.count(".") > 1:
        return None
    try:
        return float(number) * unit
    except ValueError:
        return None


def _later(seconds: float) -> str:
    import datetime

    return model.iso(model.now() + datetime.timedelta(seconds=seconds))


def _expired(row: dict, now: str | None = None) -> bool:
    return bool(row.get("expires_at")) and model.parse_iso(row["expires_at"]) <= model.parse_iso(now or model.now_iso())


def _hash(secret: str) -> str:
    import hashlib

    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


def scope_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a token's identity (P:N, P:*, '*'), or None."""
    if pattern == "*":
        return None
    project, colon, name = pattern.partition(":")
    if colon and name == "*":
        return None if model.is_name(project) else (f"{pattern!r}: the project {project!r} is not valid (lowercase "
                                                     "letters, digits and hyphens).")
    return model.identity_problem(pattern)


def token_command(store, *, action: str, id: str | None = None, agent=(), supervisor: bool = False,
                  note: str | None = None, expires_in: str | None = None, grace: str | None = None,
                  emit=lambda document: None) -> dict:
    """`agent-mail token create|list|rotate|revoke` on an open store."""
    checks.guard("token", {"action": action, "id": id, "agent": list(agent), "supervisor": supervisor, "note": note,
                           "expires_in": expires_in, "grace": grace})
    problems: list[tuple[str | None, str]] = []
    if action != "create":
        problems += [(flag, "only applies to token create; drop it.") for flag, given in
                     (("agent", agent), ("supervisor", supervisor), ("note", note is not None)) if given]
    if action not in ("create", "rotate") and expires_in is not None:
        problems.append(("expires_in", "only applies to token create and rotate; drop it."))
    if action != "rotate" and grace is not None:
        problems.append(("grace", "only applies to token rotate; drop it."))
    if action in ("revoke", "rotate") and id is None:
        problems.append(("id", f"is required: the id of the token to {action} (agent-mail token list shows them)."))
    if action not in ("revoke", "rotate") and id is not None:
        problems.append(("id", f"unexpected with token {action}; only rotate and revoke take an id."))
    lifetime = grace_seconds = None
    if expires_in is not None:
        lifetime = duration_seconds(expires_in)
        if lifetime is None or lifetime <= 0:
            problems.append(("expires_in", f"{expires_in!r} is not a duration: a positive number with s, m, h, d or "
                                           "w (30d, 12h, 90m), or of seconds."))
    if action == "rotate":
        grace_seconds = duration_seconds(grace if grace is not None else GRACE_DEFAULT)
        if grace_seconds is None:
            problems.append(("grace", f"{grace!r} is not a duration: a number with s, m, h, d or w (0 ends the old "
                                      "token at once, 10m, 1h), or of seconds."))
    if action == "create":
        problems += [("agent", p) for p in map(scope_problem, agent) if p]
        if not agent and not supervisor:
            problems.append(("agent", "give at least one identity the token acts as (project:name, project:* or "
                                      "'*'), or --supervisor for a token that only looks."))
    if problems:
        raise errors.InvalidInput(problems)
    if action == "create":
        return _create(store, list(dict.fromkeys(agent)), supervisor, note, lifetime, emit)
    if action == "rotate":
        return _rotate(store, id, lifetime, grace_seconds, emit)
    if action == "list":
        with store.transaction():
            listed = store.tokens()
            now = model.now_iso()
            for row in listed:
                row["expired"] = _expired(row, now)
            result = {"tokens": listed, "count": len(listed)}
            emit(result)
        return result
    with store.transaction(write=True):
        at = model.now_iso()
        if not store.revoke_token(id, at):
            known = store.token(id)
            why = "is revoked already" if known else "names no token (agent-mail token list shows them)"
            raise errors.NotFound([("id", f"{id!r} {why}.")])
        result = {"id": id, "revoked": True, "revoked_at": at}
        emit(result)
    return result


def _new_secret() -> tuple[str, str]:
    import secrets

    return secrets.token_hex(6), secrets.token_urlsafe(32)


def _rotate(store, old_id: str, lifetime: float | None, grace: float, emit) -> dict:
    token_id, secret = _new_secret()
    with store.transaction(write=True):
        old = store.token(old_id)
        now = model.now_iso()
        if old is None or old["revoked_at"] or _expired(old, now):
            why = ("names no token (agent-mail token list shows them)" if old is None else
                   f"was revoked at {old['revoked_at']}" if old["revoked_at"] else f"expired at {old['expires_at']}")
            raise errors.NotFound([("id", f"{old_id!r} {why}: nothing to rotate; token create makes a new one.")])
        until = _later(grace)
        if old["expires_at"] and old["expires_at"] < until:
            until = old["expires_at"]  # the grace never lengthens a token's life
        expires_at = _later(lifetime) if lifetime is not None else old["expires_at"]
        if lifetime is None and old["expires_at"] is None:
            expires_at = None
        row = {"id": token_id, "secret_hash": _hash(secret), "agents": old["agents"],
               "supervisor": old["supervisor"], "note": old["note"], "created": now, "expires_at": expires_at}
        store.add_token(row)
        store.end_token(old_id, until, rotated_to=token_id)
        result = {"id": token_id, "token": f"{PREFIX}{token_id}_{secret}", "agents": old["agents"],
                  "supervisor": old["supervisor"], "note": old["note"], "created": now, "expires_at": expires_at,
                  "replaces": old_id, "old_valid_until": until}
        emit(result)
    return result


def _create(store, agents: list[str], supervisor: bool, note: str | None, lifetime: float | None, emit) -> dict:
    token_id, secret = _new_secret()
    with store.transaction(write=True):
        row = {"id": token_id, "secret_hash": _hash(secret), "agents": agents, "supervisor": supervisor,
               "note": note, "created": model.now_iso(),
               "expires_at": _later(lifetime) if lifetime is not None else None}
        store.add_token(row)
        result = {"id": token_id, "token": f"{PREFIX}{token_id}_{secret}", "agents": agents,
                  "supervisor": supervisor, "note": note, "created": row["created"], "expires_at": row["expires_at"]}
        emit(result)
    return result


def authenticate(store, presented: str | None) -> dict:
    """The grant of a presented token: {id, agents, supervisor}; errors.Forbidden (unauthenticated) when it is
    missing, malformed, unknown or revoked. The error never repeats what was presented."""
    import hmac

    if not presented:
        raise errors.Forbidden("no token: send Authorization: Bearer TOKEN (the client reads AGENT_MAIL_TOKEN or "
                               "AGENT_MAIL_TOKEN_FILE). The mailbox's operator creates one with agent-mail token "
                               "create.", unauthenticated=True)
    token_id, _, secret = presented.removeprefix(PREFIX).partition("_")
    with store.transaction():
        row = store.token(token_id) if presented.startswith(PREFIX) and len(token_id) == 12 else None
    matches = hmac.compare_digest(_hash(secret), row["secret_hash"] if row else _UNKNOWN_HASH)
    if row is None or not matches:
        raise errors.Forbidden("the token is not valid here (unknown, mistyped, or of another mailbox); ask the "
                               "operator for one: agent-mail token create.", unauthenticated=True)
    _refuse_ended(row, token_id)
    _note_use(store, row)
    return {"id": token_id, "agents": row["agents"], "supervisor": row["supervisor"]}


def _refuse_ended(row: dict, token_id: str, while_waiting: bool = False) -> None:
    """errors.Forbidden (unauthenticated) when the token of `row` is revoked, expired or past its rotation's grace."""
    ending = " while this call waited; it ended" if while_waiting else ""
    if row["revoked_at"]:
        raise errors.Forbidden(f"token {token_id} was revoked at {row['revoked_at']}{ending}; ask the operator for "
                               "a new one.", unauthenticated=True)
    if _expired(row):
        if row.get("rotated_to"):
            raise errors.Forbidden(f"token {token_id} was rotated to {row['rotated_to']} and its grace ended at "
                                   f"{row['expires_at']}{ending}; use the new token (ask the operator for it).",
                                   unauthenticated=True)
        raise errors.Forbidden(f"token {token_id} expired at {row['expires_at']}{ending}; ask the operator for a new "
                               "one (agent-mail token rotate or create).", unauthenticated=True)


def _note_use(store, row: dict) -> None:
    """Write the token's last_used when it is unset or older than LAST_USED_STEP (best effort: a mailbox too busy
    to take the write keeps the older time, and the request goes on)."""
    now = model.now()
    last = model.parse_iso(row.get("last_used"))
    if last is not None and (now - last).total_seconds() < LAST_USED_STEP:
        return
    try:
        with store.transaction(write=True):
            store.note_token_use(row["id"], model.iso(now))
    except errors.StorageError:
        pass


def wake_if_expired(store, since: str, now: str) -> bool:
    """Wake every wait (Store.wake_waits) when a token not revoked expired after `since` and by `now` (an expiry
    or a rotation's grace ending): each wait asks about its token again, and one made with that token ends. A
    server asks this now and then (app.Server.main_loop); whether it woke them."""
    with store.transaction():
        listed = store.tokens()
    if not any(t["expires_at"] and since < t["expires_at"] <= now and not t["revoked_at"] for t in listed):
        return False
    with store.transaction(write=True):
        store.wake_waits()
    return True


def still_valid(store, grant: dict) -> None:
    """Raise errors.Forbidden if the token of `grant` was revoked or ran out since (a wait asks this when woken)."""
    with store.transaction():
        row = store.token(grant["id"])
    if row is None:
        raise errors.Forbidden(f"token {grant['id']} was removed while this call waited; it ended.",
                               unauthenticated=True)
    _refuse_ended(row, grant["id"], while_waiting=True)


def session_grant(store, token_id: str, signed_by) -> dict:
    """The grant of a console session made with token `token_id` (agent_mail.server.console): `signed_by(key)`
    says whether the session's signature was made with that token's key (its stored secret hash), so a session
    ends with its token (revoked, expired, rotated past its grace, removed). errors.Forbidden (unauthenticated)
    otherwise; the error never repeats the session."""
    with store.transaction():
        row = store.token(token_id) if isinstance(token_id, str) and len(token_id) == 12 else None
    if row is None or not signed_by(row["secret_hash"]):
        raise errors.Forbidden("the console's session is not valid here (signed by no token of this mailbox); sign "
                               "in again.", unauthenticated=True)
    _refuse_ended(row, token_id)
    return {"id": token_id, "agents": row["agents"], "supervisor": row["supervisor"]}
