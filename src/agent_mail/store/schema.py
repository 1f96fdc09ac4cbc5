"""The tables and columns of a mailbox, named once: what copy, export, import and doctor move and check.

Each backend creates these tables through its own migrations (store/sqlite_schema.py, store/postgres.py); this
module only names them. Imported where a whole table is handled, never on the send/read path.
"""

from __future__ import annotations

MESSAGE_COLUMNS = ("id", "sender", "recipient", "subject", "body", "refs", "reply_to", "type", "ttl_hours", "created",
                   "read_at", "acked_at", "deliver_at", "cancelled_at", "batch_id", "archived_at", "deleted_at")
#: One agent's state of a message: on the row for direct mail, in broadcast_acks for broadcasts.
STATE_COLUMNS = ("read_at", "acked_at", "archived_at", "deleted_at")
PROFILE_COLUMNS = ("agent", "human", "mirror_dir", "max_entries", "updated_at")
EVENT_COLUMNS = ("id", "agent", "source", "payload", "created", "dismissed_at")
ACTIVITY_COLUMNS = ("agent", "host", "last_active")
HARNESS_COLUMNS = ("id", "harness", "agent", "pid", "host", "started_at", "last_seen", "told_seq", "told_at",
                   "told_event", "waiter", "ended_at")

# table -> (its columns, whether it is numbered by the backend's insertion sequence, its key), in the order a
# copy writes them (what a row refers to comes first).
TABLES = {
    "messages": (MESSAGE_COLUMNS, True, ("id",)),
    "broadcast_acks": (("message_id", "agent", *STATE_COLUMNS), False, ("message_id", "agent")),
    "scheduled": (("message_id", "recipient", "deliver_at", "published_at"), False, ("message_id",)),
    "attachment_blobs": (("sha256", "size", "content", "created"), False, ("sha256",)),
    "attachments": (("message_id", "position", "name", "size", "sha256"), False, ("message_id", "position")),
    "profiles": (PROFILE_COLUMNS, False, ("agent",)),
    "system_events": (EVENT_COLUMNS, True, ("id",)),
    "watchers": (("agent", "started_at", "last_seen"), False, ("agent",)),
    "watch_sessions": (("id", "agent", "started_at", "last_seen", "state", "released_at", "released_reason", "host"),
                       False, ("id",)),
    "heartbeats": (("agent", "last_seen"), False, ("agent",)),
    "harness_sessions": (HARNESS_COLUMNS, False, ("id",)),
    # When each identity last did something, on each machine (status's last_active and hosts): liveness, copied
    # with the mailbox as its sessions are, never exported.
    "activity": (ACTIVITY_COLUMNS, False, ("agent", "host")),
    # A token's hash and grant, and file reservations: a moved mailbox keeps its team's tokens working and its
    # holders' claims (a reservation's key is its holder's pattern in a repository, as reserve renews it).
    "tokens": (("id", "secret_hash", "agents", "supervisor", "note", "created", "revoked_at", "expires_at",
                "last_used", "rotated_to"), False, ("id",)),
    "reservations": (("id", "repo", "agent", "pattern", "exclusive", "reason", "created", "renewed_at",
                      "expires_at"), False, ("repo", "agent", "pattern")),
    # Webhooks, with the secret each signs with (the server needs it): a moved mailbox keeps notifying its people.
    "webhooks": (("id", "url", "agents", "events", "secret", "format", "after_minutes", "with_body", "created"),
                 False, ("id",)),
}
#: Where applied migrations are recorded (every backend has it; copied by no one: each target has its own).
MIGRATIONS_TABLE = "schema_migrations"
#: Deliveries a reader has been answered but has not confirmed (a client of `agent-mail serve`): held for a
#: moment, so copied by no one (a copy's messages stay unread, delivered again).
DELIVERIES_TABLE = "deliveries"
#: The webhooks' deliveries, pending and done (agent-mail serve POSTs them): a server's work queue and its recent
#: record, copied by no one (a copy starts with an empty outbox).
OUTBOX_TABLE = "webhook_outbox"
#: Every table of a mailbox.
ALL_TABLES = (*TABLES, DELIVERIES_TABLE, OUTBOX_TABLE, MIGRATIONS_TABLE)
#: The tables doctor requires of a complete SQLite mailbox (it has never asked for `watchers`, the seed lineage's
#: and unused, nor `harness_sessions`).
REQUIRED_TABLES = ("messages", "broadcast_acks", "watch_sessions", "heartbeats", "scheduled", "attachments",
                   "attachment_blobs", "profiles", "system_events", MIGRATIONS_TABLE)
#: Tables of liveness rows, which cleanup sweeps by the column of when each was last seen.
LIVENESS_TABLES = {"watch_sessions": "last_seen", "watchers": "last_seen", "heartbeats": "last_seen",
                   "harness_sessions": "last_seen", "activity": "last_active"}
#: Where SQLite keeps its search index (an FTS5 table, with shadow tables named after it): derived from the
#: messages, so never copied or repaired, only rebuilt.
SQLITE_SEARCH_TABLE = "message_search"

# Columns holding timestamps: a copy writes them as UTC, so that text order is time order on every backend
# (mailboxes of older implementations stored local offsets, which SQLite orders through julianday()).
STAMPS = frozenset({"created", "read_at", "acked_at", "deliver_at", "cancelled_at", "archived_at", "deleted_at",
                    "published_at", "updated_at", "dismissed_at", "started_at", "last_seen", "released_at",
                    "told_at", "ended_at", "revoked_at", "renewed_at", "expires_at", "last_used",
                    "last_active"})
