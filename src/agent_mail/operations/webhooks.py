"""Webhooks: `webhook add/list/remove` (the operator's side, like tokens), the events queued in the mailbox's outbox
when they happen (new mail, a bounce, a reservation clash: in the committing transaction, whoever commits; an
identity deaf with unread mail: noticed by a server), and what a server POSTs for each (the body, its signature,
when to try again). The POSTing itself is the server's (agent_mail.server.webhooks).

Delivery is at least once: each delivery has an id (the X-Agent-Mail-Delivery header and the body's `id`), the same
on every attempt, for the receiver to drop repeats. The secret is kept in the mailbox (the server signs with it) and
never shown; a URL is shown with its path cut after the first part, since a Slack webhook's path is its secret.
"""

from __future__ import annotations

import os

from agent_mail import errors, model
from agent_mail.parts import checks
from agent_mail.parts.inputs import read_secret, secret_checked, shown_url, url_problem

EVENTS = ("mail", "deaf", "bounce", "clash")
DEAF_MINUTES_DEFAULT = 10.0
# How long a POST may take before it counts as no answer, and how long an event is tried before it is recorded
# failed (AGENT_MAIL_WEBHOOK_RETRY_SECONDS: shorter for tests).
POST_TIMEOUT_SECONDS = float(os.environ.get("AGENT_MAIL_WEBHOOK_TIMEOUT_SECONDS", "5"))
RETRY_SECONDS = float(os.environ.get("AGENT_MAIL_WEBHOOK_RETRY_SECONDS", "3600"))
FIRST_RETRY_SECONDS, LONGEST_PAUSE_SECONDS = 2.0, 300.0
RECENT, FAILURES = 5, 20
SIGNATURE_HEADER, DELIVERY_HEADER = "X-Agent-Mail-Signature", "X-Agent-Mail-Delivery"
DELIVERED_BY = ("agent-mail serve: events are queued in the mailbox from now on, and a running agent-mail serve on "
                "this mailbox POSTs them within seconds; a mailbox no server serves keeps them queued, and they fail "
                "once they have waited undelivered for {window}.")


def webhook_command(mailbox, *, action: str, id: str | None = None, url: str | None = None, agent=(), event=(),
                    secret_file: str | None = None, format: str | None = None, after_minutes: float | None = None,
                    with_body: bool = False, secret: str | None = None, emit=lambda document: None) -> dict:
    """`agent-mail webhook add|list|remove` on an open Mailbox. `secret`: the secret a client of agent-mail serve
    read from its --secret-file on its own machine."""
    store = mailbox.store
    checks.guard("webhook", {"action": action, "id": id, "url": url, "agent": list(agent), "event": list(event),
                             "secret_file": secret_file, "format": format, "after_minutes": after_minutes,
                             "with_body": with_body})
    problems: list[tuple[str | None, str]] = []
    if action != "add":
        problems += [(flag, "only applies to webhook add; drop it.") for flag, given in
                     (("url", url is not None), ("agent", agent), ("event", event), ("format", format is not None),
                      ("secret_file", secret_file is not None or secret is not None),
                      ("after_minutes", after_minutes is not None), ("with_body", with_body)) if given]
    if action == "remove" and id is None:
        problems.append(("id", "is required: the id of the webhook to remove (agent-mail webhook list shows them)."))
    if action != "remove" and id is not None:
        problems.append(("id", f"unexpected with webhook {action}; only remove takes an id."))
    if action == "add":
        if url is None:
            problems.append(("url", "is required: where to POST (http:// or https://)."))
        elif url_problem(url):
            problems.append(("url", url_problem(url)))
        if not agent and not event:
            problems.append(("agent", f"give at least one identity (--agent P:N: its new mail) or event kind "
                                      f"(--event: {', '.join(EVENTS)})."))
        if after_minutes is not None and "deaf" not in event:
            problems.append(("after_minutes", "only applies with --event deaf; add it, or drop --after-minutes."))
        if secret is None:
            if secret_file is None:
                problems.append(("secret_file", "is required: a file (mode 600) whose first line is the secret each "
                                                "POST is signed with (e.g. openssl rand -hex 32 > FILE)."))
            else:
                secret, problem = read_secret(secret_file)
                if problem:
                    problems.append(("secret_file", problem))
        else:
            secret, problem = secret_checked(secret)
            if problem:
                problems.append(("secret_file", problem))
    if problems:
        raise errors.InvalidInput(problems)
    if action == "add":
        return _add(mailbox, url, list(dict.fromkeys(agent)), list(dict.fromkeys(event)) or ["mail"], secret,
                    format or "json", (after_minutes or DEAF_MINUTES_DEFAULT) if "deaf" in event else None,
                    with_body, emit)
    if action == "list":
        with store.transaction():
            result = listed(store)
            emit(result)
        return result
    with store.transaction(write=True):
        dropped = store.remove_webhook(id)
        if dropped is None:
            raise errors.NotFound([("id", f"{id!r} names no webhook (agent-mail webhook list shows them).")])
        result = {"id": id, "removed": True, "dropped": dropped}
        emit(result)
    return result


def _add(mailbox, url: str, agents: list[str], events: list[str], secret: str, format: str,
         after_minutes: float | None, with_body: bool, emit) -> dict:
    import secrets

    store = mailbox.store
    if agents:
        known = {row["agent"] for row in mailbox.status()["agents"]}
        unknown = [a for a in agents if a not in known]
        if unknown:
            raise errors.NotFound([("agent", f"{a!r} is not known to this mailbox (no mail, watch or profile yet): "
                                             "check the spelling (agent-mail status lists identities), or make it "
                                             f"known first (agent-mail profile {a} --human for a person).")
                                   for a in unknown])
    with store.transaction(write=True):
        row = {"id": secrets.token_hex(6), "url": url, "agents": agents, "events": events, "secret": secret,
               "format": format, "after_minutes": after_minutes, "with_body": with_body, "created": model.now_iso()}
        store.add_webhook(row)
        result = {"id": row["id"], "url": shown_url(url), "agents": agents, "events": events, "format": format,
                  "after_minutes": after_minutes, "with_body": with_body, "created": row["created"],
                  "delivered_by": DELIVERED_BY.format(window=_window())}
        emit(result)
    return result


def _window() -> str:
    return f"{RETRY_SECONDS / 3600:g} h" if RETRY_SECONDS >= 3600 else f"{RETRY_SECONDS:g} s"


def listed(store) -> dict:
    """webhook list's answer (in a transaction)."""
    tallies = store.webhook_tallies()
    hooks = []
    for row in store.webhooks():
        counts = tallies.get(row["id"], {})
        hooks.append({**row, "url": shown_url(row["url"]),
                      "deliveries": {state: counts.get(state, 0) for state in ("pending", "delivered", "failed")},
                      "recent": store.webhook_deliveries(row["id"], RECENT)})
    return {"webhooks": hooks, "failures": store.webhook_deliveries(None, FAILURES, "failed"), "count": len(hooks)}


# -- events, queued in the committing transaction -------------------------------------------------------

def _about(hook: dict, kind: str, *identities: str) -> bool:
    return kind in hook["events"] and (not hook["agents"] or any(i in hook["agents"] for i in identities))


def _queue(store, hooks: list[dict], kind: str, key: str, at: str, payload_of) -> None:
    rows = []
    for hook in hooks:
        delivery = model.new_message_id()
        rows.append({"id": delivery, "webhook_id": hook["id"], "event_key": f"{kind}:{key}", "kind": kind,
                     "created": at, "payload": {"id": delivery, "kind": kind, "time": at, "webhook": hook["id"],
                                                **payload_of(hook)}})
    store.queue_webhook_events(rows)


def queue_mail(store, hooks: list[dict], messages: list[dict]) -> None:
    """New mail (published now: sent, or a scheduled message fallen due): for webhooks about its recipient (a
    broadcast is mail for every identity but its sender)."""
    for m in messages:
        if m["recipient"] == model.BROADCAST:
            about = [h for h in hooks if "mail" in h["events"] and
                     (not h["agents"] or any(a != m["sender"] for a in h["agents"]))]
        else:
            about = [h for h in hooks if _about(h, "mail", m["recipient"])]
        if not about:
            continue

        def payload(hook, m=m):
            message = {k: m[k] for k in ("id", "sender", "recipient", "subject")}
            if hook["with_body"]:
                message["body"] = m["body"]
            return {"agent": m["recipient"], "message": message}

        _queue(store, about, "mail", m["id"], m.get("deliver_at") or m["created"], payload)


def queue_bounce(store, hooks: list[dict], event_id: str, sender: str, recipient: str, subject: str, reason: str,
                 at: str) -> None:
    about = [h for h in hooks if _about(h, "bounce", sender, recipient)]
    if about:
        _queue(store, about, "bounce", event_id, at, lambda hook: {
            "agent": sender, "message": {"id": None, "sender": sender, "recipient": recipient, "subject": subject},
            "reason": reason})


def queue_clash(store, hooks: list[dict], agent: str, repo: str, conflicts: list[dict], at: str) -> None:
    holders = sorted({c["holder"] for c in conflicts})
    about = [h for h in hooks if _about(h, "clash", agent, *holders)]
    if about:
        _queue(store, about, "clash", model.new_message_id(), at, lambda hook: {
            "agent": agent, "repo": repo, "patterns": sorted({c["pattern"] for c in conflicts}),
            "holders": [{"holder": c["holder"], "pattern": c["holder_pattern"], "reason": c["reason"]}
                        for c in conflicts]})


def queue_deaf(mailbox, now=None) -> int:
    """Queue a deaf event for each identity that has had unread mail for a deaf webhook's minutes with nobody
    listening (not reachable, and not seen listening within those minutes): once per identity and oldest unread
    message, so several servers looking at once queue it once. How many webhooks looked (0: none asks)."""
    store = mailbox.store
    with store.transaction():
        hooks = [h for h in store.webhooks() if "deaf" in h["events"]]
    if not hooks:
        return 0
    at = now or model.now()
    at_iso = model.iso(at)
    rows = [row for row in mailbox.status()["agents"] if row["unread"] and not row["reachable"]]
    if not rows:
        return len(hooks)
    with store.transaction(write=True):
        for row in rows:
            oldest = store.unread(row["agent"], at_iso, limit=1)
            if not oldest:
                continue
            arrived = model.parse_iso(oldest[0].get("deliver_at") or oldest[0]["created"])
            seen = model.parse_iso(row.get("last_seen"))
            for hook in hooks:
                if not _about(hook, "deaf", row["agent"]):
                    continue
                quiet = at - model.timedelta(minutes=hook["after_minutes"])
                if arrived > quiet or (seen is not None and seen > quiet):
                    continue
                since = model.iso(max(arrived, seen) if seen is not None else arrived)
                first = oldest[0]
                told = {"agent": row["agent"], "unread": row["unread"], "since": since,
                        "after_minutes": hook["after_minutes"], "reached_by": row.get("reached_by"),
                        "message": {"id": first["id"], "sender": first["sender"], "recipient": row["agent"],
                                    "subject": first["subject"]}}
                _queue(store, [hook], "deaf", f"{row['agent']}:{first['id']}", at_iso, lambda h, told=told: told)
    return len(hooks)


# -- what a server POSTs --------------------------------------------------------------------------------

def body_of(payload: dict, format: str) -> bytes:
    """The raw body of a POST: the event as JSON, or {"text": ...} for a Slack-compatible incoming webhook."""
    import json

    if format == "slack":
        payload = {"text": slack_text(payload)}
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def signature(secret: str, body: bytes) -> str:
    import hashlib
    import hmac

    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def _slack_escaped(text: object) -> str:
    """Text from mail as Slack shows text: its three control characters escaped (no mention, link or markup)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(payload: dict) -> str:
    e = _slack_escaped
    kind, message = payload["kind"], payload.get("message") or {}
    if kind == "mail":
        text = f"agent-mail: new mail for {e(message['recipient'])} from {e(message['sender'])}: " \
               f"\"{e(message['subject'])}\""
        if "body" in message:
            text += "\n" + e(message["body"])
    elif kind == "deaf":
        text = f"agent-mail: {e(payload['agent'])} has {payload['unread']} unread and nobody listening since " \
               f"{payload['since']} (oldest: \"{e(message.get('subject', ''))}\" from {e(message.get('sender', ''))})"
    elif kind == "bounce":
        text = f"agent-mail: mail from {e(message['sender'])} to {e(message['recipient'])} bounced " \
               f"(\"{e(message['subject'])}\"): {e(payload['reason'])}"
    else:
        held = ", ".join(f"{e(h['pattern'])} held by {e(h['holder'])}" for h in payload["holders"])
        text = f"agent-mail: {e(payload['agent'])} could not reserve {e(', '.join(payload['patterns']))} in " \
               f"{e(payload['repo'])}: {held}"
    return f"{text} [{payload['id']}]"


def outcome(status: int | None, error: str | None, attempts: int, created: str, now) -> tuple[str, str | None]:
    """After an attempt (the answer's status, or the error when none came; `attempts` before this one): the
    delivery's state ('delivered', 'failed', or 'pending' again) and when it is due again."""
    if status is not None and 200 <= status < 300:
        return "delivered", None
    if status is not None and status not in (408, 429) and status < 500:
        return "failed", None  # refused (a 4xx), or sent elsewhere (a redirect): trying again will not help
    pause = min(FIRST_RETRY_SECONDS * (2 ** attempts), LONGEST_PAUSE_SECONDS)
    again = now + model.timedelta(seconds=pause)
    if again > model.parse_iso(created) + model.timedelta(seconds=RETRY_SECONDS):
        return "failed", None
    return "pending", model.iso(again)
