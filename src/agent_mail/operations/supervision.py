"""The supervisor's views of a mailbox, read without changing it (standard library only): what the dashboard shows,
whether it reads the mailbox itself or through `agent-mail serve`.

A `Supervisor` wraps one opened store. Every method reads in one transaction and marks nothing
read: looking at another identity's inbox or a thread is not taking delivery of it. The Textual
application (agent_mail.dashboard.app) only lays these rows out.
"""

from __future__ import annotations

import datetime as _dt

from agent_mail import model
from agent_mail.operations import mail

# Problems, worst first: the order the Fleet table puts identities in.
DEAF = "deaf with mail"
OVERDUE = "overdue"
STALE = "stale"
BOUNCED = "bounced"
PROBLEMS = (DEAF, OVERDUE, STALE, BOUNCED)

DEFAULT_OVERDUE_MINUTES = 30
FEED_SIZE = 200


def age_seconds(moment: str | None, at: _dt.datetime) -> float | None:
    parsed = model.parse_iso(moment)
    return None if parsed is None else max(0.0, (at - parsed).total_seconds())


def short_age(seconds: float | None) -> str:
    """12s, 4m, 3h, 2d; '-' for never."""
    if seconds is None:
        return "-"
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def recipient_state(row: dict, now: str) -> str:
    """One recipient row's state, spelled: scheduled, withdrawn, unread, read, acked, archived, deleted."""
    if row.get("cancelled_at"):
        return "withdrawn"
    if row.get("deliver_at") and row["deliver_at"] > now:
        return "scheduled"
    for column, word in (("deleted_at", "deleted"), ("archived_at", "archived"), ("acked_at", "acked"),
                         ("read_at", "read")):
        if row.get(column):
            return word
    return "unread"


class Supervisor:
    """Read-only views of one mailbox for the human who runs the fleet."""

    def __init__(self, mailbox: mail.Mailbox):
        self.mailbox = mailbox
        self.store = mailbox.store
        self._identities: int | None = None  # how many identities the last fleet() listed

    def _fleet_size(self, now: str) -> int:
        """How many identities there are (a broadcast is for all of them but its sender): the last fleet()'s
        count when there was one (the feeder reads the fleet just before the feed), else counted now."""
        if self._identities is None:
            self._identities = len(self.store.agent_counts(now))
        return self._identities

    # -- fleet ----------------------------------------------------------------------------------------
    def fleet(self, overdue_minutes: float = DEFAULT_OVERDUE_MINUTES) -> list[dict]:
        """One row per identity, problems first (deaf with mail, overdue, stale, bounced), then by name."""
        status = self.mailbox.status()["agents"]
        self._identities = len(status)
        now = model.now_iso()
        at = model.now()
        with self.store.transaction():
            liveness = self.store.liveness()
            humans = self.store.humans()
            bounces = self.store.open_bounces()
            oldest = self.store.oldest_unacked(now, [r["agent"] for r in status if r["unacked"]])
        names = {r["agent"] for r in status}
        rows = list(status) + [{"agent": a, "unread": 0, "unacked": 0, "sessions": 0, "last_active": None,
                                "hosts": [], **_liveness_row(liveness.get(a), at)}
                               for a in sorted(set(bounces) - names)]
        reserved = self.reservations()
        fleet = []
        for row in rows:
            agent = row["agent"]
            listening = row["reachable"]  # what status, send receipts and --require-reachable say
            oldest_age = age_seconds(oldest.get(agent), at) if row["unacked"] else None
            problems = []
            if row["unread"] and not listening and agent not in humans:  # a human reads here, not by a watch
                problems.append(DEAF)
            if oldest_age is not None and oldest_age > overdue_minutes * 60:
                problems.append(OVERDUE)
            if row["watch_state"] == "stale":
                problems.append(STALE)
            if bounces.get(agent):
                problems.append(BOUNCED)
            fleet.append({
                "agent": agent,
                "project": agent.split(":", 1)[0],
                "human": agent in humans,
                "watch_state": row["watch_state"],
                "listening": listening,
                "reached_by": row["reached_by"],
                "sessions": row["sessions"],
                "unread": row["unread"],
                "unacked": row["unacked"],
                "oldest_unacked_age": oldest_age,
                "last_seen": row["last_seen"],
                "last_seen_age": age_seconds(row["last_seen"], at),
                "last_active": row["last_active"],
                "last_active_age": age_seconds(row["last_active"], at),
                "hosts": row["hosts"],
                "bounces": bounces.get(agent, 0),
                "reserved": len(reserved.get(agent, [])),
                "reserved_dead": sum(not r["held"] for r in reserved.get(agent, [])),
                "problems": problems,
            })
        fleet.sort(key=lambda r: (min((PROBLEMS.index(p) for p in r["problems"]), default=len(PROBLEMS)),
                                  r["agent"]))
        return fleet

    # -- traffic --------------------------------------------------------------------------------------
    def feed(self, limit: int = FEED_SIZE) -> list[dict]:
        """The newest sends, newest first: one entry per send (a fan-out's rows together), with each
        recipient's state, or for a broadcast how many have read and acted on it."""
        now = model.now_iso()
        with self.store.transaction():
            rows = self.store.recent_rows(limit * 4)
            batches = sorted({r["batch_id"] for r in rows if r["batch_id"]})
            seen_rows = {r["id"] for r in rows}
            rows += [r for r in self.store.batch_rows(batches) if r["id"] not in seen_rows]
            tallies = self.store.broadcast_tallies([r["id"] for r in rows if r["recipient"] == "*"])
            attachments = self.store.attachments_of([r["id"] for r in rows])
            fleet_size = self._fleet_size(now) if any(r["recipient"] == "*" for r in rows) else 0
        return group_sends(rows, tallies, attachments, now, fleet_size)[:limit]

    def message(self, message_id: str) -> dict | None:
        """One send in full (body, refs, attachments, every recipient's state), found by any of its row ids."""
        now = model.now_iso()
        with self.store.transaction():
            row = self.store.get_message(message_id)
            if row is None:
                return None
            rows = self.store.batch_rows([row["batch_id"]]) if row.get("batch_id") else [row]
            if not rows:
                rows = [row]
            tallies = self.store.broadcast_tallies([r["id"] for r in rows if r["recipient"] == "*"])
            attachments = self.store.attachments_of([r["id"] for r in rows])
            fleet_size = self._fleet_size(now) if row["recipient"] == "*" else 0
        sends = group_sends(rows, tallies, attachments, now, fleet_size)
        return sends[0] if sends else None

    def thread(self, message_id: str) -> list[dict]:
        """The whole thread `message_id` is in, one entry per send, in arrival order."""
        now = model.now_iso()
        with self.store.transaction():
            rows = self.store.whole_thread(message_id)
            tallies = self.store.broadcast_tallies([r["id"] for r in rows if r["recipient"] == "*"])
            attachments = self.store.attachments_of([r["id"] for r in rows])
            fleet_size = self._fleet_size(now) if any(r["recipient"] == "*" for r in rows) else 0
        return list(reversed(group_sends(list(reversed(rows)), tallies, attachments, now, fleet_size)))

    def inbox(self, agent: str, limit: int = 100) -> dict:
        """`agent`'s inbox as it would see it with `read --all --no-mark-read`: newest last, its own states; and
        the files it holds."""
        result = self.mailbox.read(agent=agent, all=True, limit=limit, no_mark_read=True)
        return {"agent": agent, "messages": result["messages"], "unread": result["remaining"],
                "reservations": self.reservations().get(agent, [])}

    # -- file reservations ----------------------------------------------------------------------------
    def reservations(self) -> dict[str, list[dict]]:
        """Every reservation not released or expired, by holder: [{repo, pattern, mode, reason, expires_at, held}],
        held false when the holder is dead (past the grace): it blocks nobody."""
        from agent_mail.operations.reservations import Holders

        at = model.now()
        with self.store.transaction():
            rows = self.store.reservations_in(None, model.iso(at))
            holders = Holders(self.store, [r["agent"] for r in rows], at) if rows else None
        held: dict[str, list[dict]] = {}
        for row in rows:
            held.setdefault(row["agent"], []).append({
                "repo": row["repo"], "pattern": row["pattern"], "mode": "exclusive" if row["exclusive"] else "shared",
                "reason": row["reason"], "expires_at": row["expires_at"], "held": holders.held(row)})
        return held

    # -- pictures -------------------------------------------------------------------------------------
    def hourly(self, by: str = "project", hours: int = 24) -> dict:
        """Sends per hour over the last `hours`, one series per project (or identity): {"hours": [...],
        "series": {name: [count per hour]}}, the busiest series first."""
        at = model.now().astimezone(_dt.timezone.utc).replace(minute=0, second=0, microsecond=0)
        hours_list = [(at - _dt.timedelta(hours=n)).strftime("%Y-%m-%dT%H") for n in range(hours - 1, -1, -1)]
        with self.store.transaction():
            rows = self.store.sends_per_hour(model.iso(at - _dt.timedelta(hours=hours - 1)))
        index = {h: n for n, h in enumerate(hours_list)}
        series: dict[str, list[int]] = {}
        for hour, sender, count in rows:
            if hour not in index:
                continue
            name = sender.split(":", 1)[0] if by == "project" else sender
            series.setdefault(name, [0] * hours)[index[hour]] += count
        ordered = dict(sorted(series.items(), key=lambda item: (-sum(item[1]), item[0])))
        return {"hours": hours_list, "series": ordered}

    def backlog(self, hours: int = 24) -> dict:
        """Unread and unacked direct mail at each hour over the last `hours` (and now)."""
        at = model.now()
        moments = [at - _dt.timedelta(hours=n) for n in range(hours, -1, -1)]
        with self.store.transaction():
            counts = self.store.open_over_time([model.iso(m) for m in moments])
        return {"moments": [model.iso(m) for m in moments], "unread": [c[0] for c in counts],
                "unacked": [c[1] for c in counts]}


def _liveness_row(facts: dict | None, at: _dt.datetime) -> dict:
    return mail.describe_liveness(facts, at)


def group_sends(rows: list[dict], tallies: dict, attachments: dict, now: str, fleet_size: int) -> list[dict]:
    """Message rows (newest first) -> one entry per send: a fan-out's rows share a batch."""
    sends: dict[str, dict] = {}
    for row in rows:
        key = row.get("batch_id") or row["id"]
        send = sends.get(key)
        if send is None:
            send = sends[key] = {
                "id": row["id"], "ids": [], "sender": row["sender"], "recipients": [], "subject": row["subject"],
                "body": row["body"], "refs": row["refs"], "reply_to": row["reply_to"], "type": row["type"],
                "created": row["created"], "deliver_at": row["deliver_at"], "seq": row["seq"],
                "attachments": attachments.get(row["id"], []), "states": {}, "broadcast": None,
                "withdrawn_at": None,
            }
        send["ids"].append(row["id"])
        if row.get("cancelled_at"):
            send["withdrawn_at"] = max(send["withdrawn_at"] or "", row["cancelled_at"])
        send["recipients"].append(row["recipient"])
        if row["seq"] < send["seq"]:  # a fan-out is known by its first row
            send["id"], send["seq"] = row["id"], row["seq"]
        if row["recipient"] == "*":
            tally = tallies.get(row["id"], {"read": 0, "acked": 0})
            send["broadcast"] = {**tally, "of": max(0, fleet_size - 1)}
            send["states"]["*"] = recipient_state(row, now) if row.get("cancelled_at") or (
                row.get("deliver_at") and row["deliver_at"] > now) else "sent"
        else:
            send["states"][row["recipient"]] = recipient_state(row, now)
    for send in sends.values():
        send["recipients"].sort()
        send["at"] = landed_at(send, now)
    # Newest first by that moment: a scheduled send is not newer than what landed after it was sent.
    return sorted(sends.values(), key=lambda s: (model.parse_iso(s["at"]), s["seq"]), reverse=True)


def landed_at(send: dict, now: str) -> str:
    """When a send landed: when it fell due if it was scheduled (and some copy was not withdrawn), else when
    it was sent. A send still scheduled, or withdrawn, has not landed: it is placed when it was sent."""
    due = send["deliver_at"]
    if due and due <= now and set(send["states"].values()) != {"withdrawn"}:
        return due
    return send["created"]
