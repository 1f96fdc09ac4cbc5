"""What is done to a mailbox without opening it (store.Backend's report, doctor, locate), for a location that
names an agent-mail server (http:// or https://): `describe` reports the server and how the token is given
(never the token); doctor and copy refuse, since they work on a mailbox itself."""

from __future__ import annotations

import os

from agent_mail import errors


def report(location: str, source: str, given: str | None) -> dict:
    from agent_mail.urls import redact_url

    if os.environ.get("AGENT_MAIL_TOKEN"):
        token = "AGENT_MAIL_TOKEN"
    elif os.environ.get("AGENT_MAIL_TOKEN_FILE"):
        token = f"AGENT_MAIL_TOKEN_FILE ({os.environ['AGENT_MAIL_TOKEN_FILE']})"
    else:
        token = None
    return {"backend": "server", "url": redact_url(location), "source": source, "token_from": token,
            "ca": os.environ.get("AGENT_MAIL_CA") or None,
            "problem": None if token else "no token: set AGENT_MAIL_TOKEN or AGENT_MAIL_TOKEN_FILE (agent-mail token "
                                          "create, run where the mailbox is, makes one)."}


def _refuse(what: str):
    return errors.InvalidInput([("AGENT_MAIL_DB", f"names an agent-mail server: {what} works on a mailbox itself, "
                                                  "not through a server. Run it where the mailbox is, with "
                                                  "AGENT_MAIL_DB naming its file or postgresql:// URL.")])


def doctor(location: str, repair: bool, emit) -> dict:
    raise _refuse("doctor")


def locate(value: str, field: str) -> str:
    raise errors.InvalidInput([(field, "names an agent-mail server; copy moves a mailbox itself: give a SQLite file "
                                       "path or a postgresql:// URL.")])
