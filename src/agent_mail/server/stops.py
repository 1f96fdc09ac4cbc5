"""A served watch stopped by its client: the stop call `agent-mail serve` answers at POST /v1/watch/stop, and the
ids of the sessions a server holds for its waits.

On the mailbox's machine a watch stopped by SIGTERM, SIGINT or SIGHUP releases its session before it exits
(`released`), and a killed one leaves it armed with nothing holding it (`stale` at once). Through a server the
same, on SQLite and PostgreSQL, one server or several replicas behind a balancer:

- a watch's blocked request carries a key the client made (`stop_key`, a UUID); the server names that wait's
  session HOLDER.DIGEST.NONCE: HOLDER the server instance holding it, DIGEST the first 32 hex digits of the key's
  SHA-256 (the key itself is never stored, so reading the table does not give the power to stop a wait), NONCE
  a few random digits (a key sent again names another session);
- stopped by a signal, the client calls POST /v1/watch/stop with {agent, key, signal} before it exits (bounded:
  a server it cannot reach within about 2 s is not waited for). The call is the database's work, so any replica
  can take it: the session is released whoever holds it (`Store.release_keyed_session`), and its holder is told
  (`Store.announce_release`), which ends that wait without writing to the session again;
- a client that hangs up without that call (killed, its connection dropped) leaves its session armed and
  abandoned (`Store.abandon_sessions`): its id's holder becomes `gone`, which nothing holds, so `status` reads
  it as stale at once, as a killed watch's.

Standard library and the layers below only.
"""

from __future__ import annotations

import hashlib
import os

from agent_mail import errors, model
from agent_mail.protocols import http_api
from agent_mail.server import grants

FIELDS = ("agent", "key", "signal")


def digest(key: str) -> str:
    """The part of a session's id made from its client's key."""
    return hashlib.sha256(key.lower().encode("ascii")).hexdigest()[:32]


def session_id(holder: str, key: str | None) -> str:
    """The id of the session server instance `holder` holds for a wait: HOLDER.DIGEST.NONCE of the client's key,
    or HOLDER.UUID for a client that sent none (it cannot stop its wait; its hang-up still abandons it)."""
    if key is None:
        return f"{holder}.{model.new_message_id()}"
    return f"{holder}.{digest(key)}.{os.urandom(4).hex()}"


def checked_key(key: object) -> str | None:
    """A watch request's stop_key, checked (None: it sent none)."""
    if key is None:
        return None
    if not isinstance(key, str) or model.message_id_problem(key):
        raise errors.InvalidInput([("stop_key", "is a UUID the client makes for each blocked watch request; POST "
                                                f"{http_api.STOP_PATH} with it releases that wait's session.")])
    return key.lower()


def check(given: dict) -> dict:
    """The checked values of a stop call: {agent, key, signal}, every problem named by its field."""
    problems = [(key, f"is not a value of the stop call; it takes {', '.join(FIELDS)}.")
                for key in sorted(set(given) - set(FIELDS))]
    agent, key, number = given.get("agent"), given.get("key"), given.get("signal")
    if not isinstance(agent, str) or model.identity_problem(agent):
        problems.append(("agent", "is the identity whose wait to stop (project:name), as the watch named it."))
    if not isinstance(key, str) or model.message_id_problem(key):
        problems.append(("key", "is the stop_key (a UUID) the watch sent with its request."))
    if number is not None and (isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 64):
        problems.append(("signal", "is the number of the signal that stopped the client (1 to 64), or absent."))
    if problems:
        raise errors.InvalidInput(problems)
    return {"agent": agent, "key": key.lower(), "signal": number}


def grant(grant: dict, values: dict) -> str:
    """The identity the call acts as: stopping a wait is acting as its identity, so the token must name it (a
    supervisor's looking does not cover it)."""
    agent = values["agent"]
    if grants.covers(grant, agent):
        return agent
    raise errors.Forbidden(f"{agent!r}: {grants.scope(grant)}; it may not stop a wait of {agent}.", "agent")


def stop(store, values: dict) -> dict:
    """Release the session of `agent`'s wait made with `key` (nothing is changed when there is none): {agent,
    released (False: it had ended already), released_at}. A key sent with several waits stops them all."""
    agent, number = values["agent"], values["signal"]
    with store.transaction(write=True):
        found = store.release_keyed_session(agent, digest(values["key"]), model.now_iso(),
                                            f"signal {number}" if number else "stopped by its client")
        if found is None:
            raise errors.NotFound([("key", f"no wait of {agent} was made with this key (the stop_key of its "
                                           "request); nothing was changed.")])
    return {"agent": agent, "released": found["released"], "released_at": found["released_at"]}
