"""The access tokens of `agent-mail serve`: `token create/list/revoke` (run on the mailbox itself, by its
operator) and the server's look-up of a presented token.

A token is `am_ID_SECRET`: the id names its row (shown by list, logged by the server), the secret is 32 random
bytes shown once by create; the mailbox keeps only the secret's SHA-256, compared in constant time. An unknown
id is compared against a hash too, so a guessed token is refused as fast as a wrong one.
"""

from __future__ import annotations

from agent_mail.parts import checks
from agent_mail import errors, model

PREFIX = "am_"
_UNKNOWN_HASH = "0" * 64  # what an unknown id's secret is compared against


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
                  note: str | None = None, emit=lambda document: None) -> dict:
    """`agent-mail token create|list|revoke` on an open store."""
    checks.guard("token", {"action": action, "id": id, "agent": list(agent), "supervisor": supervisor, "note": note})
    problems: list[tuple[str | None, str]] = []
    if action != "create":
        problems += [(flag, "only applies to token create; drop it.") for flag, given in
                     (("agent", agent), ("supervisor", supervisor), ("note", note is not None)) if given]
    if action == "revoke" and id is None:
        problems.append(("id", "is required: the id of the token to revoke (agent-mail token list shows them)."))
    if action != "revoke" and id is not None:
        problems.append(("id", f"unexpected with token {action}; only revoke takes an id."))
    if action == "create":
        problems += [("agent", p) for p in map(scope_problem, agent) if p]
        if not agent and not supervisor:
            problems.append(("agent", "give at least one identity the token acts as (project:name, project:* or "
                                      "'*'), or --supervisor for a token that only looks."))
    if problems:
        raise errors.InvalidInput(problems)
    if action == "create":
        return _create(store, list(dict.fromkeys(agent)), supervisor, note, emit)
    if action == "list":
        with store.transaction():
            listed = store.tokens()
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


def _create(store, agents: list[str], supervisor: bool, note: str | None, emit) -> dict:
    import secrets

    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    with store.transaction(write=True):
        row = {"id": token_id, "secret_hash": _hash(secret), "agents": agents, "supervisor": supervisor,
               "note": note, "created": model.now_iso()}
        store.add_token(row)
        result = {"id": token_id, "token": f"{PREFIX}{token_id}_{secret}", "agents": agents,
                  "supervisor": supervisor, "note": note, "created": row["created"]}
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
    if row["revoked_at"]:
        raise errors.Forbidden(f"token {token_id} was revoked at {row['revoked_at']}; ask the operator for a new "
                               "one.", unauthenticated=True)
    return {"id": token_id, "agents": row["agents"], "supervisor": row["supervisor"]}


def still_valid(store, grant: dict) -> None:
    """Raise errors.Forbidden if the token of `grant` was revoked since (a wait asks this when woken)."""
    with store.transaction():
        row = store.token(grant["id"])
    if row is None or row["revoked_at"]:
        raise errors.Forbidden(f"token {grant['id']} was revoked while this call waited; it ended.",
                               unauthenticated=True)
