"""What a token may do through `agent-mail serve`: for a command and its checked values, which identity the
call acts as (send's --from, cancel's sender, the agent whose mail is read, handled or watched) or looks at
(search --agent, status, a read that marks nothing), and whether the token's grant covers it.

A grant names identities (`P:N` exactly, `P:*` a project, `*` any) and may be a supervisor's, which adds looking
at everything without acting as anyone it does not name. A refusal is errors.Forbidden (exit 4), naming the
identity and the token's scope, never the token.
"""

from __future__ import annotations

from agent_mail import errors

# The argument naming the identity each command acts as (checked values, by the operation's keywords).
ACTS_AS = {"send": "from_", "cancel": "sender", "read": "agent", "ack": "agent", "watch": "agent",
           "heartbeat": "agent", "dismiss": "agent", "archive": "agent", "delete": "agent", "attachments": "agent",
           "profile": "agent", "notifications": "agent", "reserve": "agent", "release": "agent", "hook": "agent"}
# What a refused call would have done, in words (`{}`: the identity), where "NAME as IDENTITY" reads badly.
DOING = {"hook": "run a harness session's hooks as {}", "profile": "change the profile of {} (human, mirror "
         "directory, size); a dashboard's --as needs a token that names that human", "notifications": "dismiss or "
         "clear the notifications of {}", "read": "take delivery of {}'s mail", "attachments": "save the attachments "
         "of {}'s mail", "watch": "watch for {}'s mail", "heartbeat": "record a heartbeat of {}"}
# Commands over the whole mailbox that only an operator's token ('*') may run.
OPERATOR_ONLY = ("cleanup", "import", "webhook")


def covers(grant: dict, identity: str) -> bool:
    """Whether the grant names `identity` (exactly, by its project, or by '*')."""
    project = identity.partition(":")[0]
    return any(p == "*" or p == identity or p == f"{project}:*" for p in grant["agents"])


def scope(grant: dict) -> str:
    """The token's scope in words, for an error."""
    names = ", ".join(grant["agents"]) or "no identity"
    return f"token {grant['id']} acts as {names}" + (" and may look at everything (supervisor)" if grant["supervisor"]
                                                       else "")


def _looks_only(name: str, values: dict) -> bool:
    """Whether the call only looks at the identity's mail (what a supervisor may do for anyone)."""
    if name == "read":
        return bool(values.get("no_mark_read") or values.get("thread") or values.get("archived")) and \
            not values.get("ack")
    if name == "attachments":
        return True  # listing or fetching content changes nothing in the mailbox
    if name == "profile":
        return not (values.get("human") or values.get("mirror_dir") is not None
                    or values.get("max_entries") is not None or values.get("clear"))
    if name == "notifications":
        return not (values.get("dismiss") or values.get("clear_email") or values.get("follow"))
    return False


def _refuse(field: str | None, text: str) -> errors.Forbidden:
    return errors.Forbidden(text, field)


def check(grant: dict, name: str, values: dict) -> str | None:
    """The identity the call acts as (None: it acts as nobody), or errors.Forbidden when the grant does not
    cover what it does. `values`: as calls.check returned them."""
    everyone = "*" in grant["agents"]
    if name in OPERATOR_ONLY:
        if not everyone:
            raise _refuse(None, f"{name} works on the whole mailbox: it needs an operator's token (--agent '*'); "
                                f"{scope(grant)}.")
        return None
    if name in ACTS_AS:
        key = ACTS_AS[name]
        identity = values[key]
        if identity is None:  # hook's --agent, which the command line fills in from AGENT_MAIL_AGENT
            raise errors.InvalidInput([(key, "is required through a server: the identity this call acts as.")])
        if covers(grant, identity):
            return identity
        if grant["supervisor"] and _looks_only(name, values):
            return None
        hint = " A supervisor's token may look without marking: read --no-mark-read." if name == "read" else ""
        raise _refuse(key.rstrip("_"), f"{identity!r}: {scope(grant)}; it may not "
                                       f"{DOING.get(name, name + ' as {}').format(identity)}.{hint}")
    if name in ("search", "export", "status"):
        agent = values.get("agent")
        if everyone or grant["supervisor"] or (agent is not None and covers(grant, agent)):
            return None
        project = values.get("project")
        if name == "status" and agent is None and project is not None and covers(grant, f"{project}:x") and \
                f"{project}:*" in grant["agents"]:
            return None
        what = f"{agent!r}'s mail" if agent else ("the project " + repr(project) if project else "every identity")
        raise _refuse("agent" if agent else None, f"{what}: {scope(grant)}; looking at others needs a supervisor's "
                                                  f"token (token create --supervisor), or --agent naming your own "
                                                  "identity.")
    if name == "reservations":  # --check asks for --agent; a supervisor may look at anyone's, and at all of them
        agent = values.get("agent")
        if everyone or grant["supervisor"] or (agent is not None and covers(grant, agent)):
            return agent
        if agent is None and not values.get("check") and (values.get("path") or values.get("paths")):
            return None  # who holds these paths, and are they live: what any identity asks before an edit (a
            # refused reserve names the holders anyway)
        what = f"{agent!r}" if agent else "every identity's reservations"
        raise _refuse("agent" if agent else None, f"{what}: {scope(grant)}; ask who holds a file with --path, "
                                                  "give --agent naming your own identity (reservations --check "
                                                  "--agent, or your own list), or use a supervisor's token to see "
                                                  "everyone's.")
    if name == "doctor":
        if everyone or grant["supervisor"]:
            return None
        raise _refuse(None, f"doctor looks at the whole mailbox: {scope(grant)}; it needs a supervisor's token.")
    raise _refuse(None, f"{name} cannot be called through the server.")


SERVER_MAILBOX = "(the server's mailbox)"


def without_location(result: object, location: str) -> object:
    """`doctor`'s report through a server, with the mailbox's file path or database URL (and the directory it is
    in) replaced by SERVER_MAILBOX wherever they appear: a client learns the mailbox's health, never where the
    server keeps it."""
    import os

    from agent_mail.urls import redact_url

    names = {location, redact_url(location)}
    if "://" not in location:
        names |= {os.path.abspath(location), os.path.realpath(location)}
        names |= {os.path.dirname(name) for name in list(names) if os.path.dirname(name) not in ("", os.sep)}
    ordered = sorted((n for n in names if n), key=len, reverse=True)  # the longest first: the file before its folder

    def hidden(value: object) -> object:
        if isinstance(value, str):
            if not any(name in value for name in ordered):
                return value  # as it was (a next Step stays one)
            value = str(value)
            for name in ordered:
                value = value.replace(name, SERVER_MAILBOX)
            return value
        if isinstance(value, dict):
            return {key: hidden(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [hidden(item) for item in value]
        return value

    return hidden(result)
