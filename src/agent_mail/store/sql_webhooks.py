"""Statements over webhooks and their outbox: the bodies of the SQLStore methods of the same name (store/base.py
says what each promises), loaded only by the webhook command, by a server's deliveries, and by a commit that
queues an event. Written once for every engine; a claim on PostgreSQL also skips rows another replica's claim
holds locked (FOR UPDATE SKIP LOCKED), where SQLite's one writer at a time makes the lease column enough."""

from __future__ import annotations


_COLUMNS = "id, url, agents, events, format, after_minutes, with_body, created"
_DELIVERY_COLUMNS = ("o.id, o.webhook_id, o.kind, o.created, o.due_at, o.attempts, o.state, o.last_status, "
                     "o.last_error, o.done_at")


def _webhook(row: dict) -> dict:
    import json  # loaded only where a webhook is (a send to a mailbox with none never loads it)
    row["agents"] = json.loads(row["agents"])
    row["events"] = json.loads(row["events"])
    row["with_body"] = bool(row["with_body"])
    return row


def add_webhook(store, row: dict) -> None:
    import json  # loaded only where a webhook is (a send to a mailbox with none never loads it)
    store.tell_supervisors()  # an open console's webhooks page shows it
    store._x(f"INSERT INTO webhooks ({_COLUMNS}, secret) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
             (row["id"], row["url"], json.dumps(row["agents"]), json.dumps(row["events"]), row["format"],
              row["after_minutes"], int(row["with_body"]), row["created"], row["secret"]))


def parsed(rows: list[dict]) -> list[dict]:
    """SQLStore.webhooks' rows (store/sql.py asks, for every send) as the store gives them."""
    return [_webhook(r) for r in rows]


def remove_webhook(store, webhook_id: str) -> int | None:
    if not store._x("DELETE FROM webhooks WHERE id = ?", (webhook_id,)).rowcount:
        return None
    store.tell_supervisors()
    return store._x("DELETE FROM webhook_outbox WHERE webhook_id = ? AND state = 'pending'", (webhook_id,)).rowcount


def queue_webhook_events(store, rows: list[dict]) -> int:
    import json  # loaded only where a webhook is (a send to a mailbox with none never loads it)
    if not rows:
        return 0
    added = 0
    for r in rows:  # one at a time: a repeated event (its key queued before) is skipped, the rest go in
        added += store._x(
            "INSERT INTO webhook_outbox (id, webhook_id, event_key, kind, payload, created, due_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (webhook_id, event_key) DO NOTHING",
            (r["id"], r["webhook_id"], r["event_key"], r["kind"], json.dumps(r["payload"], ensure_ascii=False),
             r["created"], r["created"])).rowcount
    if added:
        store._wake("")  # the channel every commit notifies: a server's deliveries wait there
    return added


def claim_webhook_deliveries(store, holder: str, now: str, lease_until: str, limit: int) -> list[dict]:
    import json  # loaded only where a webhook is (a send to a mailbox with none never loads it)
    skip = " FOR UPDATE OF o SKIP LOCKED" if store.kind == "postgresql" else ""
    rows = store._query(
        "SELECT o.id, o.webhook_id, o.kind, o.payload, o.created, o.attempts, w.url, w.secret, w.format "
        "FROM webhook_outbox o JOIN webhooks w ON w.id = o.webhook_id WHERE o.state = 'pending' AND o.due_at <= ? "
        f"AND (o.lease_until IS NULL OR o.lease_until <= ?) ORDER BY o.due_at, o.id LIMIT ?{skip}",
        (now, now, limit))
    for row in rows:
        store._x("UPDATE webhook_outbox SET lease_until = ?, leased_by = ? WHERE id = ?",
                 (lease_until, holder, row["id"]))
        row["payload"] = json.loads(row["payload"])
    return rows


def settle_webhook_delivery(store, delivery_id: str, holder: str, state: str, status: int | None,
                            error: str | None, due_at: str | None, at: str) -> bool:
    kept = bool(store._x(
        "UPDATE webhook_outbox SET state = ?, attempts = attempts + 1, last_status = ?, last_error = ?, "
        "due_at = COALESCE(?, due_at), done_at = ?, lease_until = NULL, leased_by = NULL "
        "WHERE id = ? AND leased_by = ? AND state = 'pending'",
        (state, status, error, due_at, at if state != "pending" else None, delivery_id, holder)).rowcount)
    if kept:  # the looks at everything are told of each attempt (a console's webhooks page shows it), and the
        store.tell_supervisors()  # servers' deliveries look again (one pending again is slept on until it is due)
    return kept


def next_webhook_due(store) -> str | None:
    return store._value("SELECT MIN(CASE WHEN lease_until IS NOT NULL AND lease_until > due_at THEN lease_until "
                        "ELSE due_at END) FROM webhook_outbox WHERE state = 'pending'")


def webhook_deliveries(store, webhook_id: str | None, limit: int, state: str | None = None) -> list[dict]:
    where = " AND ".join([c for c, given in (("o.webhook_id = :webhook", webhook_id), ("o.state = :state", state))
                          if given is not None]) or "1 = 1"
    return store._query(f"SELECT {_DELIVERY_COLUMNS} FROM webhook_outbox o WHERE {where} "
                        "ORDER BY o.created DESC, o.id DESC LIMIT :limit",
                        {"webhook": webhook_id, "state": state, "limit": limit})


def webhook_tallies(store) -> dict[str, dict[str, int]]:
    tallies: dict[str, dict[str, int]] = {}
    for webhook_id, state, count in store._x("SELECT webhook_id, state, COUNT(*) FROM webhook_outbox "
                                             "GROUP BY webhook_id, state").fetchall():
        tallies.setdefault(webhook_id, {})[state] = count
    return tallies
