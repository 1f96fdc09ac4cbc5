"""The two looks `agent-mail serve` answers beside the commands, for a client far from the mailbox:

- an identity's notification documents, the contents of its mirror's two files (`POST /v1/follow`): what
  `profile --mirror-dir`, `notifications` and `notifications --follow` write on the client's machine when the
  mailbox is a server. Given `after` (the fingerprint of what the client last wrote) and `wait_seconds`, it answers
  once they differ: asked at once, on every wake-up for the identity (mail committed to it, a broadcast), when a
  delayed message for it falls due, and every SAFETY_CHECK_SECONDS (mail whose wake-up was lost).
- the supervisor's views (`POST /v1/dashboard`): the fleet, the feed, an inbox, a thread, the charts, as
  agent_mail.operations.supervision reads them for a dashboard on this machine. Given `after` (the mail marker of the
  last answer) and `wait_seconds`, it answers once any message has been stored since.

Each wait holds no transaction, listens as a watch does, and ends early when `wanted()` says so (the server
stopping, the token revoked, the client gone). The standard library and the layers below only.
"""

from __future__ import annotations

import hashlib
import json
import time

from agent_mail.protocols import http_api
from agent_mail import errors, model
from agent_mail.parts import notifications

SAFETY_CHECK_SECONDS = 15.0  # as a watch's look for mail whose wake-up was lost (waits.SAFETY_CHECK_SECONDS)
WAIT_SECONDS_MAX = float(http_api.LOOK_WAIT_MAX)  # the longest one request waits (the client asks again)
VIEWS = ("fleet", "feed", "inbox", "thread", "message", "hourly", "backlog", "reservations")
CHART_BY = ("project", "identity")


def fingerprint(email: dict | None, system: dict | None) -> str:
    """A short digest of a mirror's two documents: equal exactly when the files would hold the same bytes."""
    text = json.dumps([email, system], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def documents(mailbox, agent: str) -> dict:
    """`agent`'s mirror as files would hold it: email (the unread mirror; None: no file) and system (the system
    channel; None: no file), rendered as the mailbox's own mirrors render them (its profile's max entries)."""
    store = mailbox.store
    with store.transaction():
        profile = store.profile(agent)
        email = mailbox.mirrors.unread_mirror(agent, profile)
        events = store.events(agent)
        unread = store.count_unread(agent, model.now_iso())
    system = notifications.system_channel(events) if events else None
    return {"agent": agent, "unread": unread, "email": email, "system": system,
            "fingerprint": fingerprint(email, system), "at": model.now_iso()}


def _wait(mailbox, agent: str | None, seconds: float, changed, wanted) -> None:
    """Block until changed() (asked at once, at each wake-up for `agent` or, None, for any message, when a delayed
    message for `agent` falls due, and every SAFETY_CHECK_SECONDS), wanted() turns False, or `seconds` pass."""
    from agent_mail.parts.waits import Waits

    store = mailbox.store
    if agent is None:
        store.listen_everything()
    else:
        store.listen(agent)
    waits = Waits(mailbox)
    now = time.monotonic()
    deadline, check_at = now + seconds, now + SAFETY_CHECK_SECONDS * store.idle_scale
    look, due_at = True, None
    while True:
        if due_at is not None and time.monotonic() >= due_at:
            mailbox.publish_due()
            look = True
        if look:
            if changed():
                return
            look = False
            if agent is not None:
                until_due = waits.next_due(agent)
                due_at = None if until_due is None else time.monotonic() + until_due
        now = time.monotonic()
        if now >= deadline or not wanted():
            return
        if now >= check_at:
            store.check_still_there()
            check_at = now + SAFETY_CHECK_SECONDS * store.idle_scale
            look = True
            continue
        # wanted() asked every REFRESH_SECONDS, or (asked_when_woken) at wake-ups and checks only
        asking = deadline if getattr(wanted, "when_woken", False) else now + model.REFRESH_SECONDS
        wake = min(deadline, check_at, asking, due_at if due_at is not None else deadline)
        if store.wait_for_wake(max(0.0, wake - now)):
            look = True


def _wait_seconds(given: dict) -> float | None:
    wait = given.get("wait_seconds")
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 < wait <= WAIT_SECONDS_MAX:
        raise errors.InvalidInput([("wait_seconds", f"must be a number of seconds above 0 and at most "
                                                    f"{WAIT_SECONDS_MAX:g}.")])
    return float(wait)


def _known(given: dict, allowed: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise errors.InvalidInput([(key, f"is not a value of {what}; it takes {', '.join(allowed)}.")
                                   for key in unknown])


def check_follow(given: dict) -> dict:
    """The checked values of a look at an identity's mirror: {agent, after, wait_seconds}."""
    from agent_mail import calls

    _known(given, ("agent", "after", "wait_seconds"), "follow")
    after = given.get("after")
    if after is not None and not isinstance(after, str):
        raise errors.InvalidInput([("after", "is the fingerprint of an earlier answer (a string).")])
    values = calls.check("notifications", {"agent": given.get("agent")}, with_inputs=False)
    return {"agent": values["agent"], "after": after, "wait_seconds": _wait_seconds(given)}


def follow(mailbox, values: dict, wanted) -> dict:
    """The mirror's documents, once their fingerprint differs from `after` or the wait is over."""
    agent = values["agent"]
    mailbox.publish_due()
    if values["wait_seconds"] is not None and values["after"] is not None:
        _wait(mailbox, agent, values["wait_seconds"],
              lambda: documents(mailbox, agent)["fingerprint"] != values["after"], wanted)
    return documents(mailbox, agent)


def _view_problem(name: str, arguments) -> str | None:
    if not isinstance(arguments, dict):
        return "is an object of that view's values ({} for none)."
    allowed = {"fleet": ("overdue_minutes",), "inbox": ("agent",), "thread": ("id",), "message": ("id",),
               "hourly": ("by",)}.get(name, ())
    extra = sorted(set(arguments) - set(allowed))
    if extra:
        return f"takes {', '.join(allowed) or 'no values'}, not {', '.join(extra)}."
    if name == "fleet" and "overdue_minutes" in arguments:
        minutes = arguments["overdue_minutes"]
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)) or not 0 < minutes <= 10**6:
            return "overdue_minutes is a number of minutes above 0."
    if name == "inbox" and (not isinstance(arguments.get("agent"), str) or not model.is_identity(arguments["agent"])):
        return "agent is the identity whose inbox to show (project:name)."
    if name in ("thread", "message") and (not isinstance(arguments.get("id"), str) or not arguments["id"].strip()):
        return "id is a message id."
    if name == "hourly" and arguments.get("by", "project") not in CHART_BY:
        return f"by is one of {', '.join(CHART_BY)}."
    return None


def check_dashboard(given: dict) -> dict:
    """The checked values of a look at the supervisor's views: {views: {name: values}, after, wait_seconds}."""
    _known(given, ("views", "after", "wait_seconds"), "dashboard")
    views = given.get("views") or {}
    if not isinstance(views, dict):
        raise errors.InvalidInput([("views", f"is an object naming the views wanted ({', '.join(VIEWS)}).")])
    problems = [(f"views.{name}", f"is not a view; the views are {', '.join(VIEWS)}.") for name in views
                if name not in VIEWS]
    problems += [(f"views.{name}", problem) for name, arguments in views.items() if name in VIEWS
                 for problem in [_view_problem(name, arguments)] if problem]
    after = given.get("after")
    if after is not None and (isinstance(after, bool) or not isinstance(after, int)):
        problems.append(("after", "is the marker of an earlier answer (an integer)."))
    if problems:
        raise errors.InvalidInput(problems)
    return {"views": views, "after": after, "wait_seconds": _wait_seconds(given)}


def grant(grant: dict, look: str, values: dict) -> str | None:
    """The identity a look acts as (None: it acts as nobody), or errors.Forbidden: keeping a mirror current is acting
    as its identity, as `notifications --follow` is; the dashboard's views look at everyone (a supervisor's or an
    operator's token)."""
    from agent_mail.server import grants

    if look == "follow":
        return grants.check(grant, "notifications", {"agent": values["agent"], "follow": True})
    if "*" in grant["agents"] or grant["supervisor"]:
        return None
    raise errors.Forbidden(f"the dashboard looks at every identity: {grants.scope(grant)}; it needs a supervisor's "
                           "token (token create --supervisor) or an operator's (--agent '*').")


def dashboard(mailbox, values: dict, wanted) -> dict:
    """The views asked for, read once any message was stored after `after` or the wait is over; and the marker to
    wait from next."""
    from agent_mail.operations import supervision

    store = mailbox.store
    mailbox.publish_due()
    if values["wait_seconds"] is not None and values["after"] is not None:
        _wait(mailbox, None, values["wait_seconds"], lambda: (store.mail_marker() or 0) != values["after"], wanted)
    marker = store.mail_marker() or 0
    supervisor, read = supervision.Supervisor(mailbox), {}
    for name, arguments in values["views"].items():
        if name == "fleet":
            read[name] = supervisor.fleet(arguments.get("overdue_minutes", supervision.DEFAULT_OVERDUE_MINUTES))
        elif name == "feed":
            read[name] = supervisor.feed()
        elif name == "inbox":
            read[name] = supervisor.inbox(arguments["agent"])
        elif name == "thread":
            read[name] = supervisor.thread(arguments["id"])
        elif name == "message":
            read[name] = supervisor.message(arguments["id"])
        elif name == "hourly":
            read[name] = supervisor.hourly(by=arguments.get("by", "project"))
        elif name == "backlog":
            read[name] = supervisor.backlog()
        else:
            read[name] = supervisor.reservations()
    return {"marker": int(marker), "views": read}
