"""Seed a large mailbox fast, identically for this project and the reference.

The mailbox is first created by the implementation's own CLI (so each gets its own
schema), then filled with direct SQL into the seed lineage's `messages` and
`broadcast_acks` tables, which both implementations read. One transaction,
executemany: 200,000 messages take a few seconds.

No statistics are gathered (no `ANALYZE`): rows written by another tool leave none, and a
mailbox that grew in use has only what the product itself gathers.

Shape: `agents` identities in 20 projects; direct messages between random pairs, a
share of broadcasts (`broadcasts`, 1 % by default); 90 % of direct messages read and
80 % acknowledged; every broadcast read by a share of the agents (`broadcast_readers`,
90 % by default). Bodies are 100 to 600 characters.

The backlog shape of issue 9 is broadcasts=0.02, broadcast_readers=0: 2 % broadcasts
that nobody has read, about 4,000 unread per agent at 200,000 messages.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
import uuid


def agent_names(agents: int) -> list[str]:
    return [f"proj{i % 20}:agent{i}" for i in range(agents)]


def seed(db_path: str, messages: int, agents: int, rng_seed: int = 7, broadcasts: float = 0.01,
         broadcast_readers: float = 0.9) -> dict:
    rng = random.Random(rng_seed)
    names = agent_names(agents)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows, acks = [], []
    for i in range(messages):
        created = (start + dt.timedelta(seconds=i * 10)).isoformat()
        sender = rng.choice(names)
        body = "x" * rng.randint(100, 600)
        message_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if rng.random() < broadcasts:
            rows.append((message_id, sender, "*", f"broadcast {i}", body, None, None, "broadcast", created, None, None))
            for reader in rng.sample(names, int(agents * broadcast_readers)):
                if reader != sender:
                    acks.append((message_id, reader, created, None))
            continue
        recipient = rng.choice(names)
        read = created if rng.random() < 0.9 else None
        acked = created if read and rng.random() < 0.89 else None
        rows.append((message_id, sender, recipient, f"subject {i}", body, None, None, "direct", created, read, acked))
    db = sqlite3.connect(db_path, timeout=30)
    db.execute("BEGIN IMMEDIATE")
    for start in range(0, len(rows), 100_000):  # in slices: a million rows at once would hold them all twice
        db.executemany(
            "INSERT INTO messages (id, sender, recipient, subject, body, refs, reply_to, type, created, read_at, "
            "acked_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows[start:start + 100_000])
    db.executemany("INSERT INTO broadcast_acks (message_id, agent, read_at, acked_at) VALUES (?, ?, ?, ?)", acks)
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    # No ANALYZE: a mailbox that grew in use has only the statistics the product gathers itself.
    db.close()
    return {"messages": messages, "agents": agents, "broadcast_acks": len(acks)}
