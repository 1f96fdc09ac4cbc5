"""The SQL both backends share, written once, with hooks for where the dialects differ.

A backend subclasses `SQLStore` and sets its dialect: the column that orders messages by insertion
(`SEQ`), how a stored timestamp becomes comparable (`_ts`), index hints (`_hint`), and how a
statement reaches its driver (`_x`, `_many`; queries are written with `:name` and `?` placeholders,
which a driver of another style translates once per statement text). Everything else (the
visibility rule, fan-out state, counts, threads, cleanup) is the same text on every engine; what only some
commands use is in modules of its own (KEPT_ELSEWHERE below), loaded by the first call that needs them.

Timestamps are ISO 8601 text in UTC with microseconds, so text order is time order; SQLite also
orders through julianday() because mailboxes of older implementations stored local offsets.
"""

from __future__ import annotations

from agent_mail.store.base import Store
from agent_mail.store.sql_values import decode_json, decode_refs, encode_json, ids_clause, page

_FLAG_COLUMNS = {"read": "read_at", "ack": "acked_at", "archive": "archived_at", "delete": "deleted_at"}


def _statements(module: str):
    """The statement module `module` (store/MODULE.py), imported when one of its methods is first called: they are
    SQLStore methods, kept apart because only a few commands need them (see KEPT_ELSEWHERE)."""
    if module == "sql_overview":
        from agent_mail.store import sql_overview as statements
    elif module == "sql_bulk":
        from agent_mail.store import sql_bulk as statements
    elif module == "sql_reservations":
        from agent_mail.store import sql_reservations as statements
    elif module == "sql_waits":
        from agent_mail.store import sql_waits as statements
    elif module == "sql_webhooks":
        from agent_mail.store import sql_webhooks as statements
    else:
        from agent_mail.store import sql_deliveries as statements
    return statements


def _kept_in(module: str, name: str):
    """A method that is the function `name` of store/`module`.py, imported when first called."""

    def method(self, *args, **kwargs):
        return getattr(_statements(module), name)(self, *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = getattr(Store, name).__doc__
    return method


class _Fragments:
    """The pieces of SQL the queries are built from, spelled in one dialect."""

    def __init__(self, store: type[SQLStore]):
        seq, ts, hint = store.SEQ, store._ts, store._hint
        self.m_arrived = ts("COALESCE(m.deliver_at, m.created)")
        self.envelope = (f"m.{seq} AS seq, m.id, m.sender, m.recipient, m.subject, m.type, m.created, m.deliver_at, "
                         f"{self.m_arrived} AS arrival")
        # What a watch lists: the envelope, and the arrival order (arrival, then seq).
        self.lean = f"m.{seq} AS seq, m.id, m.sender, m.subject, m.type, m.created, {self.m_arrived} AS arrival"
        self.columns = f"{self.envelope}, m.body, m.refs, m.reply_to"
        # Visible to recipients: not withdrawn, and due (a scheduled message is invisible until then).
        self.visible = "m.cancelled_at IS NULL AND (m.deliver_at IS NULL OR m.deliver_at <= :now)"
        # A broadcast `m` that :agent has not read, or not acted on (ack, archive, delete). NOT IN builds the
        # agent's set once from its partial index and probes it: several times cheaper than a correlated
        # lookup per broadcast into a table that holds every agent's state.
        self.not_read_by = (f"m.id NOT IN (SELECT message_id FROM broadcast_acks {hint('idx_broadcast_acks_read')} "
                            "WHERE agent = :agent AND read_at IS NOT NULL)")
        self.not_done_by = (f"m.id NOT IN (SELECT message_id FROM broadcast_acks {hint('idx_broadcast_acks_done')} "
                            "WHERE agent = :agent AND (acked_at IS NOT NULL OR archived_at IS NOT NULL "
                            "OR deleted_at IS NOT NULL))")
        # "`:agent` may see this message": its sender always; a recipient (the addressee, or anyone but the
        # sender for a broadcast) once it is due and not withdrawn, unless that recipient deleted it.
        self.party = (
            "(m.sender = :agent OR ((m.recipient = :agent OR m.recipient = '*') AND "
            "m.cancelled_at IS NULL AND (m.deliver_at IS NULL OR m.deliver_at <= :now))) "
            "AND NOT (m.recipient = :agent AND m.deleted_at IS NOT NULL) "
            "AND NOT (m.recipient = '*' AND EXISTS (SELECT 1 FROM broadcast_acks d WHERE d.message_id = m.id "
            "AND d.agent = :agent AND d.deleted_at IS NOT NULL))"
        )
        self.direct, self.broadcast = self.addressed_to(self.columns)

    def addressed_to(self, columns: str, hint: str = "", first: str = "") -> tuple[str, str]:
        """The two halves of "mail for :agent", with this agent's own state: on the row for direct mail, in
        broadcast_acks for broadcasts; `first` ANDed ahead of the rest, messages read by index `hint`."""
        direct = (f"SELECT {columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at FROM messages m {hint} "
                  f"WHERE {first}m.recipient = :agent AND {self.visible}")
        broadcast = (f"SELECT {columns}, b.read_at, b.acked_at, b.archived_at, b.deleted_at FROM messages m {hint} "
                     "LEFT JOIN broadcast_acks b ON b.message_id = m.id AND b.agent = :agent "
                     f"WHERE {first}m.recipient = '*' AND m.sender != :agent AND {self.visible}")
        return direct, broadcast


_TOKEN_COLUMNS = "id, agents, supervisor, note, created, expires_at, last_used, rotated_to, revoked_at"


def _token(row: dict) -> dict:
    import json  # here, not at the top: this module is on every command's path

    row["agents"] = json.loads(row["agents"])
    row["supervisor"] = bool(row["supervisor"])
    return row


class SQLStore(Store):
    """The queries of a mailbox in a SQL database; subclasses supply the connection and the dialect."""

    #: The column numbering messages (and system events) in insertion order.
    SEQ = "rowid"
    #: Whether `status` aggregates broadcast state by joining it to the messages at once, rather than checking
    #: that every row belongs to a visible broadcast and then counting it per agent from an index (SQLite's
    #: fastest path; PostgreSQL's planner does the join in one pass for less than the check alone).
    _BROADCAST_STATE_BY_JOIN = False
    F: _Fragments

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.F = _Fragments(cls)

    # -- dialect hooks -------------------------------------------------------
    #: A step of a whole thread: the rows (m) answering a row of it (t) or sharing its send (PostgreSQL looks
    #: both up at once, with a BitmapOr of the two indexes).
    _THREAD_STEP = ("messages m JOIN thread t ON m.reply_to = t.id OR "
                    "(t.batch_id IS NOT NULL AND m.batch_id = t.batch_id)")
    #: How many of the newest rows a search walks in order before asking the full-text index for the rest
    #: (0: the engine's own plan, which SQLite's FTS5 makes in rowid order anyway).
    SEARCH_WINDOW = 0
    #: (column, value) of a message's INSERT that indexes it there, the value a format of its placeholder;
    #: empty where the index is a table of its own.
    _SEARCH_COLUMN = ("", "")

    def _index_inserted(self, entry: dict) -> None:
        """Index the row just inserted, where the index is a table of its own."""

    def _index_batch(self, entries: dict[str, dict]) -> None:
        """Index rows just inserted ({message id: entry}), where the index is a table of its own."""

    def _search_source(self) -> tuple[str, str, str]:
        """(FROM clause with messages as m, the match condition on :q, the column hits are ordered by)."""
        raise NotImplementedError

    def _search_text(self, query, subject_only: bool, marks: tuple[tuple[str, ...], ...]) -> str:
        """The backend's query text for `query` and the route marks rows must carry (index.routes)."""
        raise NotImplementedError

    def _unindex(self, where: str, params: dict) -> None:
        """Take the messages matching `where` out of the search index, before they are deleted."""

    @staticmethod
    def _ts(expression: str) -> str:
        """`expression` (a stored timestamp) made comparable in time order."""
        return expression

    @staticmethod
    def _hint(index: str) -> str:
        """An index hint after a table name, where the engine takes one."""
        return ""

    def _x(self, sql: str, params: object = ()):
        """Run one statement; return a cursor to iterate or fetch from."""
        raise NotImplementedError

    def _many(self, sql: str, rows: list) -> int:
        """Run one statement for each parameter set in `rows`; how many rows they changed."""
        raise NotImplementedError

    @staticmethod
    def _distinct(column: str, table: str) -> str:
        """A query of the distinct non-null values of `column` in `table`."""
        return f"SELECT DISTINCT {column} FROM {table}"

    def _wake(self, recipient: str) -> None:
        """Queue a wake-up for `recipient`'s watches ('*': everyone), sent if the transaction commits."""
        raise NotImplementedError

    # -- transactions: the template; each backend supplies its driver's error type and the steps -----------
    #: The driver's base exception: what `_fail` turns into errors.StorageError.
    _driver_error: type[Exception] = Exception

    def transaction(self, write: bool = False, patience: float | None = None) -> Transaction:
        return Transaction(self, write, patience)

    #: The statement that records activity (note_active): one row per identity and machine, moved forward only.
    _ACTIVE = ("INSERT INTO activity (agent, host, last_active) VALUES {rows} ON CONFLICT (agent, host) DO UPDATE "
               "SET last_active = excluded.last_active WHERE activity.last_active < excluded.last_active")

    def _write_active(self) -> None:
        """Write what note_active queued, before the commit (PostgreSQL sends it with the commit instead)."""
        rows, self._active = self._active, {}
        self._x(self._ACTIVE.format(rows=", ".join(["(?, ?, ?)"] * len(rows))),
                [value for (agent, host), at in rows.items() for value in (agent, host, at)])

    def _start(self, write: bool, patience: float | None, doing: str) -> None:
        """Begin (write: take the write lock first, waiting up to `patience`); StorageError if it cannot."""
        raise NotImplementedError

    def _finish(self, write: bool, doing: str) -> None:
        """Commit, with the queued wake-ups; StorageError (after rolling back) if it cannot."""
        raise NotImplementedError

    def _rollback(self) -> None:
        raise NotImplementedError

    def _fail(self, exc: Exception, doing: str):
        """The driver's error `exc`, met while `doing`, as an errors.StorageError to raise."""
        raise NotImplementedError

    def _rows(self, sql: str, params: object = ()):
        """A cursor yielding plain tuples, with `description` (what _query zips into dicts)."""
        return self._x(sql, params)

    def _query(self, sql: str, params: object = ()) -> list[dict]:
        cursor = self._rows(sql, params)
        names = [column[0] for column in cursor.description]
        rows = [dict(zip(names, row, strict=True)) for row in cursor]
        if "refs" in names:
            for message in rows:
                message["refs"] = decode_refs(message["refs"])
        return rows

    def _value(self, sql: str, params: object = ()):
        return self._x(sql, params).fetchone()[0]

    # -- messages ---------------------------------------------------------
    def insert_message(self, message: dict, attachment_names=()) -> None:
        """Store one row, indexed for search in the same transaction (its attachments' names included)."""
        from agent_mail.store import index

        entry = index.document(message, attachment_names)
        column, value = self._SEARCH_COLUMN
        column, value = (f", {column}", f", {value.format(':search')}") if column else ("", "")
        self._x(
            "INSERT INTO messages (id, sender, recipient, subject, body, refs, reply_to, type, created, deliver_at, "
            f"batch_id{column}) VALUES (:id, :sender, :recipient, :subject, :body, :refs, :reply_to, :type, :created, "
            f":deliver_at, :batch_id{value})",
            {"deliver_at": None, "batch_id": None, **message,
             "refs": encode_json(message["refs"]) if message["refs"] else None,
             **({"search": index.tsvector(entry)} if column else {})},
        )
        self._index_inserted(entry)
        if message.get("deliver_at"):
            self._x("INSERT INTO scheduled (message_id, recipient, deliver_at) VALUES (?, ?, ?)",
                    (message["id"], message["recipient"], message["deliver_at"]))
        self._wake(message["recipient"])  # a scheduled one too: its watch learns when it falls due

    def get_message(self, message_id: str) -> dict | None:
        rows = self._query(
            f"SELECT {self.F.columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at, m.cancelled_at "
            "FROM messages m WHERE m.id = ?",
            (message_id,),
        )
        return rows[0] if rows else None

    def archived(self, agent: str, now: str, *, sender: str | None = None) -> list[dict]:
        direct, broadcast = self.F.direct, self.F.broadcast
        direct += " AND m.deleted_at IS NULL AND m.archived_at IS NOT NULL"
        broadcast += " AND b.deleted_at IS NULL AND b.archived_at IS NOT NULL"
        if sender is not None:
            direct += " AND m.sender = :sender"
            broadcast += " AND m.sender = :sender"
        return self._query(f"SELECT * FROM ({direct} UNION ALL {broadcast}) AS mail ORDER BY arrival, seq",
                           {"agent": agent, "sender": sender, "now": now})

    def addressed(self, agent: str, message_ids: list[str], now: str) -> dict[str, dict]:
        found, key = {}, self._hint("sqlite_autoindex_messages_1")  # by id (no stats: SQLite read every broadcast)
        for start in range(0, len(message_ids), 500):
            marks, params = ids_clause(message_ids[start:start + 500])
            by_id = self.F.addressed_to(self.F.columns, key, f"m.id IN ({marks}) AND ")
            for message in self._query(" UNION ALL ".join(by_id), {"agent": agent, "now": now, **params}):
                found[message["id"]] = message
        return found

    def count_unread(self, agent: str, now: str) -> int:
        params = {"agent": agent, "now": now}
        direct = self._value(
            f"SELECT COUNT(*) FROM messages m WHERE m.recipient = :agent AND m.read_at IS NULL AND {self.F.visible}",
            params)
        return direct + self._count_broadcasts(agent, now, self.F.not_read_by)

    def count_unacked(self, agent: str, now: str) -> int:
        direct = self._value(
            "SELECT COUNT(*) FROM messages m WHERE m.recipient = :agent AND m.acked_at IS NULL "
            f"AND m.archived_at IS NULL AND m.deleted_at IS NULL AND {self.F.visible}", {"agent": agent, "now": now})
        return direct + self._count_broadcasts(agent, now, self.F.not_done_by)

    def _count_broadcasts(self, agent: str, now: str, unsettled: str) -> int:
        """Visible broadcasts from others that `agent` has not settled (read, or acted on): one walk of the
        covering broadcast index with one probe each; exact whatever other writers did."""
        return self._value(
            f"SELECT COUNT(*) FROM messages m {self._hint('idx_messages_broadcasts')} WHERE m.recipient = '*' "
            f"AND m.sender != :agent AND {self.F.visible} AND {unsettled}", {"agent": agent, "now": now})

    def unread(self, agent: str, now: str, *, limit: int | None = None, newest: bool = False,
               sender: str | None = None, lean: bool = False, layout_level: int | None = None) -> list[dict]:
        # Each half walks its arrival-ordered index and stops at the page: unread direct mail through the
        # partial index of unread rows, unread broadcasts through the broadcast index (skipping those the
        # agent read, found in its read set). Without a limit every row is fetched anyway, and the merge
        # below orders them, so the engine is spared the tie-break sort.
        F, seq = self.F, self.SEQ
        params = {"agent": agent, "now": now, "sender": sender, "limit": limit}
        order = "DESC" if newest else "ASC"
        by_sender = " AND m.sender = :sender" if sender is not None else ""
        ordered = (f"ORDER BY {F.m_arrived} {order}, m.{seq} {order} LIMIT :limit" if limit is not None else "")
        direct_columns = F.lean if lean else f"{F.envelope}, m.read_at, m.acked_at, m.archived_at, m.deleted_at"
        broadcast_columns = F.lean if lean else (f"{F.envelope}, NULL AS read_at, NULL AS acked_at, "
                                                 "NULL AS archived_at, NULL AS deleted_at")
        direct = (f"SELECT {direct_columns} FROM messages m {self._hint('idx_messages_unread_arrival')} "
                  f"WHERE m.recipient = :agent AND m.read_at IS NULL AND {F.visible}{by_sender} {ordered}")
        broadcast = (f"SELECT {broadcast_columns} "
                     f"FROM messages m {self._hint('idx_messages_broadcast_arrival')} WHERE m.recipient = '*' "
                     f"AND m.sender != :agent AND {F.visible}{by_sender} AND {F.not_read_by} {ordered}")
        if lean and layout_level is not None and limit is None:
            laid_out = self._unread_laid_out(direct, broadcast, lean_columns=F.lean, params=params,
                                             layout_level=layout_level)
            if laid_out is not None:
                return laid_out
        if lean:  # only envelopes: sort the tuples, then make one dict per envelope
            found = self._x(direct, params).fetchall() + self._x(broadcast, params).fetchall()
            found.sort(key=lambda row: (row[6], row[0]))
            if limit is not None:
                found = found[-limit:] if newest else found[:limit]
            return [{"id": r[1], "sender": r[2], "subject": r[3], "type": r[4], "created": r[5]} for r in found]
        rows = self._query(direct, params) + self._query(broadcast, params)
        return page(rows, limit, newest)

    def _unread_laid_out(self, direct: str, broadcast: str, *, lean_columns: str, params: dict,
                         layout_level: int):
        """Every unread envelope already laid out as JSON (jsonout.Rendered), where the engine can; else None."""
        return None

    def latest(self, agent: str, now: str, *, limit: int, sender: str | None = None) -> list[dict]:
        F, seq = self.F, self.SEQ
        params = {"agent": agent, "now": now, "sender": sender, "limit": limit}
        by_sender = " AND m.sender = :sender" if sender is not None else ""
        direct = (f"SELECT {F.envelope}, m.read_at, m.acked_at, m.archived_at, m.deleted_at FROM messages m "
                  f"{self._hint('idx_messages_recipient_arrival')} WHERE m.recipient = :agent "
                  f"AND m.archived_at IS NULL AND m.deleted_at IS NULL AND {F.visible}{by_sender} "
                  f"ORDER BY {F.m_arrived} DESC, m.{seq} DESC LIMIT :limit")
        broadcast = (f"SELECT {F.envelope}, b.read_at, b.acked_at, b.archived_at, b.deleted_at FROM messages m "
                     f"{self._hint('idx_messages_broadcast_arrival')} LEFT JOIN broadcast_acks b "
                     "ON b.message_id = m.id AND b.agent = :agent WHERE m.recipient = '*' AND m.sender != :agent "
                     f"AND {F.visible}{by_sender} AND b.archived_at IS NULL AND b.deleted_at IS NULL "
                     f"ORDER BY {F.m_arrived} DESC, m.{seq} DESC LIMIT :limit")
        return page(self._query(direct, params) + self._query(broadcast, params), limit, newest=True)

    def read_unacked(self, agent: str, now: str) -> list[dict]:
        F = self.F
        params = {"agent": agent, "now": now}
        direct = (f"SELECT {F.columns}, m.read_at, m.acked_at, m.archived_at, m.deleted_at FROM messages m "
                  "WHERE m.recipient = :agent AND m.read_at IS NOT NULL AND m.acked_at IS NULL "
                  f"AND m.archived_at IS NULL AND m.deleted_at IS NULL AND {F.visible}")
        broadcast = (f"SELECT {F.columns}, b.read_at, b.acked_at, b.archived_at, b.deleted_at "
                     f"FROM broadcast_acks b {self._hint('idx_broadcast_acks_open')} "
                     "JOIN messages m ON m.id = b.message_id "
                     "WHERE b.agent = :agent AND b.read_at IS NOT NULL AND b.acked_at IS NULL "
                     "AND b.archived_at IS NULL AND b.deleted_at IS NULL AND m.recipient = '*' AND m.sender != :agent "
                     f"AND {F.visible}")
        return page(self._query(direct, params) + self._query(broadcast, params), None, newest=False)

    def set_flags(self, agent: str, messages: list[dict], at: str, flags: tuple[str, ...]) -> None:
        self.tell_supervisors()
        columns = [_FLAG_COLUMNS[f] for f in flags]
        updates = ", ".join(f"{c} = COALESCE({c}, :at)" for c in columns)
        direct = [{"at": at, "id": m["id"]} for m in messages if m["recipient"] != "*"]
        if direct:
            self._many(f"UPDATE messages SET {updates} WHERE id = :id", direct)
        broadcast = [{"at": at, "id": m["id"], "agent": agent} for m in messages if m["recipient"] == "*"]
        values = ", ".join(":at" if c in columns else "NULL" for c in _FLAG_COLUMNS.values())
        merge = ", ".join(f"{c} = COALESCE(broadcast_acks.{c}, excluded.{c})" for c in columns)
        if broadcast:
            self._many(
                f"INSERT INTO broadcast_acks (message_id, agent, {', '.join(_FLAG_COLUMNS.values())}) "
                f"VALUES (:id, :agent, {values}) ON CONFLICT (message_id, agent) DO UPDATE SET {merge}",
                broadcast,
            )

    def _thread_root(self, message_id: str) -> str:
        """The first message of the thread `message_id` is in (as far back as cleanup left it)."""
        root, seen = message_id, set()
        while root not in seen:
            seen.add(root)
            row = self._x("SELECT reply_to FROM messages WHERE id = ?", (root,)).fetchone()
            if row is None or not row[0]:
                break
            if self._x("SELECT 1 FROM messages WHERE id = ?", (row[0],)).fetchone() is None:
                break  # the parent was cleaned up: this is as far back as the thread goes
            root = row[0]
        return root

    def thread(self, message_id: str, agent: str, now: str) -> list[dict]:
        root = self._thread_root(message_id)
        # The messages of the thread this agent may see (the one visibility rule), withdrawn ones
        # left out; the state columns are this agent's own (null on what it sent to others).
        own = "CASE WHEN m.recipient = '*' AND m.sender != :agent THEN b.{0} WHEN m.recipient = :agent THEN m.{0} END"
        return self._query(
            # (replies found by their index, named: most messages reply to nothing, so SQLite's statistics
            # call the index useless and it would scan every message at each step)
            "WITH RECURSIVE thread(id) AS (SELECT r.id FROM messages r WHERE r.id = :root "
            f"UNION SELECT m.id FROM thread t CROSS JOIN messages m {self._hint('idx_messages_reply_to')} "
            "WHERE m.reply_to = t.id) "
            f"SELECT {self.F.columns}, {own.format('read_at')} AS read_at, "
            f"{own.format('acked_at')} AS acked_at, {own.format('archived_at')} AS archived_at "
            # (the thread's rows looked up by id: joined instead, SQLite would first scan every message, in
            # arrival order or into a Bloom filter: 100-200 ms at 200,000 messages)
            "FROM messages m LEFT JOIN broadcast_acks b ON b.message_id = m.id AND b.agent = :agent "
            f"WHERE m.id IN (SELECT id FROM thread) AND m.cancelled_at IS NULL AND {self.F.party} "
            "ORDER BY arrival, seq",
            {"root": root, "agent": agent, "now": now},
        )

    def visible_to(self, agent: str, message_ids: list[str], now: str) -> set[str]:
        marks, params = ids_clause(message_ids)
        return {r[0] for r in self._x(
            f"SELECT m.id FROM messages m WHERE m.id IN ({marks}) AND {self.F.party}",
            {"agent": agent, "now": now, **params})}

    # -- scheduled delivery -------------------------------------------------------
    def due_unpublished(self, now: str) -> list[dict]:
        return self._query("SELECT message_id, recipient, deliver_at FROM scheduled WHERE published_at IS NULL "
                           "AND deliver_at <= ?", (now,))

    def mark_published(self, message_ids: list[str], at: str) -> None:
        if message_ids:
            self._many("UPDATE scheduled SET published_at = ? WHERE message_id = ?", [(at, i) for i in message_ids])

    def next_due(self, agent: str, now: str) -> str | None:
        return self._value("SELECT MIN(deliver_at) FROM scheduled WHERE published_at IS NULL AND deliver_at > ? "
                           "AND recipient IN (?, '*')", (now, agent))

    def cancel(self, message_id: str, at: str) -> None:
        self._x("UPDATE messages SET cancelled_at = ? WHERE id = ?", (at, message_id))
        self._x("DELETE FROM scheduled WHERE message_id = ?", (message_id,))

    # -- attachments ----------------------------------------------------------
    def add_attachment(self, message_id: str, position: int, name: str, content: bytes, sha256: str,
                       at: str) -> None:
        self._x("INSERT INTO attachment_blobs (sha256, size, content, created) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (sha256) DO NOTHING", (sha256, len(content), content, at))
        self._x("INSERT INTO attachments (message_id, position, name, size, sha256) VALUES (?, ?, ?, ?, ?)",
                (message_id, position, name, len(content), sha256))

    def attachments_of(self, message_ids: list[str]) -> dict[str, list[dict]]:
        listed: dict[str, list[dict]] = {}
        for start in range(0, len(message_ids), 500):
            marks, params = ids_clause(message_ids[start:start + 500])
            for row in self._x(f"SELECT message_id, name, size, sha256 FROM attachments WHERE message_id IN ({marks}) "
                               "ORDER BY message_id, position", params):
                listed.setdefault(row[0], []).append({"name": row[1], "size": row[2], "sha256": row[3]})
        return listed

    def attachment_content(self, sha256: str) -> bytes | None:
        row = self._x("SELECT content FROM attachment_blobs WHERE sha256 = ?", (sha256,)).fetchone()
        return None if row is None else bytes(row[0])

    # -- what sits beside the mail: profiles, system events, every identity's counts, liveness, sessions ----
    # -- profiles and the system channel ---------------------------------------------
    def profile(self, agent: str) -> dict | None:
        rows = self._query("SELECT agent, human, mirror_dir, max_entries, updated_at FROM profiles WHERE agent = ?",
                           (agent,))
        if not rows:
            return None
        rows[0]["human"] = bool(rows[0]["human"])
        return rows[0]

    def save_profile(self, profile: dict) -> None:
        self._x(
            "INSERT INTO profiles (agent, human, mirror_dir, max_entries, updated_at) "
            "VALUES (:agent, :human, :mirror_dir, :max_entries, :updated_at) ON CONFLICT (agent) DO UPDATE SET "
            "human = excluded.human, mirror_dir = excluded.mirror_dir, max_entries = excluded.max_entries, "
            "updated_at = excluded.updated_at",
            {**profile, "human": int(bool(profile["human"]))},
        )

    def mirrored_agents(self) -> list[str]:
        return [r[0] for r in self._x("SELECT agent FROM profiles WHERE mirror_dir IS NOT NULL ORDER BY agent")]

    def humans(self) -> set[str]:
        return {r[0] for r in self._x("SELECT agent FROM profiles WHERE human = 1")}

    def add_event(self, event_id: str, agent: str, source: str, payload: dict, at: str) -> None:
        self._x("INSERT INTO system_events (id, agent, source, payload, created) VALUES (?, ?, ?, ?, ?)",
                (event_id, agent, source, encode_json(payload), at))

    def events(self, agent: str) -> list[dict]:
        return [
            {"id": r[0], "source": r[1], **decode_json(r[2]), "created": r[3]}
            for r in self._x(f"SELECT id, source, payload, created FROM system_events WHERE agent = ? "
                             f"AND dismissed_at IS NULL ORDER BY {self.SEQ}", (agent,))
        ]

    def dismiss_events(self, agent: str, event_ids: list[str], at: str) -> list[str]:
        """Dismiss these events of `agent`; return the ids that were open."""
        marks, params = ids_clause(event_ids)
        found = [r[0] for r in self._x(
            f"SELECT id FROM system_events WHERE agent = :agent AND dismissed_at IS NULL AND id IN ({marks})",
            {"agent": agent, **params})]
        if found:
            self._many("UPDATE system_events SET dismissed_at = ? WHERE id = ?", [(at, i) for i in found])
        return found

    # -- overview and maintenance ---------------------------------------------
    def agent_counts(self, now: str) -> dict[str, dict]:
        counts: dict[str, dict] = {}
        params = {"now": now}
        visible = self.F.visible

        def entry(agent: str) -> dict:
            return counts.setdefault(agent, {"unread": 0, "unacked": 0})

        # The partial indexes of open mail cover these counts (SQLite is told so: its planner would otherwise
        # take an arrival-ordered index and read every row).
        for key, index, condition in (
            ("unread", "idx_messages_unread", "read_at IS NULL"),
            ("unacked", "idx_messages_unacked", "acked_at IS NULL AND archived_at IS NULL AND deleted_at IS NULL"),
        ):
            for agent, n in self._x(
                f"SELECT recipient, COUNT(*) FROM messages m {self._hint(index)} WHERE {condition} "
                f"AND recipient != '*' AND {visible} GROUP BY recipient", params):
                entry(agent)[key] = n
        # Separate DISTINCTs: each walks its index skipping duplicates; a UNION would sort every row.
        for sql in (self._distinct("sender", "messages"),
                    self._distinct("recipient", f"messages {self._hint('idx_messages_recipient')}"),
                    self._distinct("agent", "watch_sessions"), "SELECT agent FROM heartbeats",
                    "SELECT agent FROM profiles", self._distinct("agent", "activity")):
            for (agent,) in self._x(sql):
                if agent != "*":
                    entry(agent)
        sent_broadcasts = dict(self._x(
            f"SELECT sender, COUNT(*) FROM messages m WHERE recipient = '*' AND {visible} GROUP BY sender", params
        ).fetchall())
        total_broadcasts = sum(sent_broadcasts.values())
        if total_broadcasts:
            settled = self._broadcast_state(params)
            for agent, row in counts.items():
                waiting = total_broadcasts - sent_broadcasts.get(agent, 0)
                read, done = settled.get(agent, (0, 0))
                row["unread"] += waiting - read
                row["unacked"] += waiting - done
        return counts

    def _broadcast_state(self, params: dict) -> dict[str, tuple[int, int]]:
        """{agent: (broadcasts read, broadcasts acted on)} over visible broadcasts from others.

        Every broadcast_acks row is made for a visible broadcast by someone else (state is only
        ever recorded for mail an agent could see, cancelling works only before a message is
        visible, and cleanup removes a message's rows with it). When a count of the rows that
        belong to visible broadcasts confirms that, the rows are aggregated per agent straight
        from an index; otherwise (a mailbox some other writer left inconsistent) they are joined
        to their messages, which is exact but reads every row's message.
        """
        visible = self.F.visible
        total = belonging = 0
        if not self._BROADCAST_STATE_BY_JOIN:
            total = self._value("SELECT COUNT(*) FROM broadcast_acks")
            belonging = self._value(
                f"SELECT COUNT(*) FROM messages m {self._hint('idx_messages_broadcasts')} JOIN broadcast_acks b "
                f"ON b.message_id = m.id WHERE m.recipient = '*' AND {visible}", params)
        acted = ("CASE WHEN b.acked_at IS NOT NULL OR b.archived_at IS NOT NULL OR b.deleted_at IS NOT NULL "
                 "THEN 1 ELSE 0 END")
        if self._BROADCAST_STATE_BY_JOIN or total != belonging:
            sql = (f"SELECT b.agent, COUNT(b.read_at), SUM({acted}) FROM messages m JOIN broadcast_acks b "
                   f"ON b.message_id = m.id WHERE m.recipient = '*' AND m.sender != b.agent AND {visible} "
                   "GROUP BY b.agent")
            return {agent: (read, int(done)) for agent, read, done in self._x(sql, params)}
        state: dict[str, tuple[int, int]] = {}
        for agent, read in self._x("SELECT agent, COUNT(*) FROM broadcast_acks b WHERE read_at IS NOT NULL "
                                   "GROUP BY agent"):
            state[agent] = (read, 0)
        for agent, done in self._x("SELECT agent, COUNT(*) FROM broadcast_acks b WHERE b.acked_at IS NOT NULL "
                                   "OR b.archived_at IS NOT NULL OR b.deleted_at IS NOT NULL GROUP BY agent"):
            state[agent] = (state.get(agent, (0, 0))[0], done)
        return state

    # -- liveness ------------------------------------------------------------
    def note_active(self, agent: str, host: str | None, at: str) -> None:
        # Queued, and written once at the commit: an operation that notes its identity twice writes one row.
        key = (agent, host or "")
        if at > self._active.get(key, ""):
            self._active[key] = at

    def activity(self, agent: str | None = None, *, since: str) -> dict[str, dict]:
        where = "agent = :agent" if agent is not None else "1 = 1"
        found: dict[str, dict] = {}
        for kind, name, host, at in self._x(
                f"SELECT 'active', agent, host, last_active FROM activity WHERE {where} UNION ALL "
                f"SELECT 'armed', agent, host, MAX(last_seen) FROM watch_sessions WHERE state = 'armed' "
                f"AND host IS NOT NULL AND {where} GROUP BY agent, host", {"agent": agent}):
            entry = found.setdefault(name, {"last_active": None, "hosts": {}})
            if kind == "active":
                entry["last_active"] = max(entry["last_active"] or "", at)
                if not host or at < since:
                    continue
            entry["hosts"][host] = max(entry["hosts"].get(host, ""), at)
        return found

    def open_session(self, session_id: str, agent: str, at: str, host: str | None = None) -> None:
        self.tell_supervisors()
        self._x("INSERT INTO watch_sessions (id, agent, started_at, last_seen, state, host) "
                "VALUES (?, ?, ?, ?, 'armed', ?)", (session_id, agent, at, at, host))

    def touch_session(self, session_id: str, at: str) -> None:
        self._x("UPDATE watch_sessions SET last_seen = ? WHERE id = ? AND state = 'armed'", (at, session_id))

    def release_session(self, session_id: str, at: str, reason: str) -> None:
        self.tell_supervisors()
        self._x("UPDATE watch_sessions SET state = 'released', released_at = :at, released_reason = :reason, "
                "last_seen = :at WHERE id = :id AND state = 'armed'", {"at": at, "reason": reason, "id": session_id})

    def record_heartbeat(self, agent: str, at: str) -> None:
        self._x("INSERT INTO heartbeats (agent, last_seen) VALUES (?, ?) "
                "ON CONFLICT (agent) DO UPDATE SET last_seen = excluded.last_seen", (agent, at))

    def _latest(self, column: str) -> str:
        """Two columns: the latest `column` of a group, as stored, and anything (its sort key, where used)."""
        return f"MAX({column}), NULL"

    def liveness(self, agent: str | None = None) -> dict[str, dict]:
        from agent_mail.model import parse_iso

        where = "agent = :agent" if agent is not None else "1 = 1"
        # One statement (each part a latest time per identity, and the session count as text), one round trip.
        parts = (
            ("session_seen", f"SELECT 'session_seen', agent, {self._latest('last_seen')} FROM watch_sessions "
                             f"WHERE {where} GROUP BY agent"),
            ("armed_seen", f"SELECT 'armed_seen', agent, {self._latest('last_seen')} FROM watch_sessions "
                           f"WHERE state = 'armed' AND {where} GROUP BY agent"),
            ("released_at", f"SELECT 'released_at', agent, {self._latest('released_at')} FROM watch_sessions "
                            f"WHERE state = 'released' AND {where} GROUP BY agent"),
            ("heartbeat", f"SELECT 'heartbeat', agent, {self._latest('last_seen')} FROM heartbeats WHERE {where} "
                          "GROUP BY agent"),
            ("sessions", f"SELECT 'sessions', agent, CAST(COUNT(*) AS TEXT), NULL FROM watch_sessions WHERE {where} "
                         "GROUP BY agent"),
        )
        facts: dict[str, dict] = {}
        for key, name, value, _ in self._x(" UNION ALL ".join(sql for _, sql in parts), {"agent": agent}):
            self.fact_entry(facts, name)[key] = int(value) if key == "sessions" else parse_iso(value)
        return facts

    @staticmethod
    def fact_entry(facts: dict, name: str) -> dict:
        return facts.setdefault(name, {"armed_seen": None, "released_at": None, "session_seen": None,
                                       "heartbeat": None, "sessions": 0})

    # -- harness sessions (hooks) -------------------------------------------
    def harness_session(self, session_id: str) -> dict | None:
        from agent_mail.store.schema import HARNESS_COLUMNS

        rows = self._query(f"SELECT {', '.join(HARNESS_COLUMNS)} FROM harness_sessions WHERE id = ?", (session_id,))
        return rows[0] if rows else None

    def save_harness_session(self, session: dict) -> None:
        from agent_mail.store.schema import HARNESS_COLUMNS

        self._x(
            f"INSERT INTO harness_sessions ({', '.join(HARNESS_COLUMNS)}) "
            f"VALUES ({', '.join(':' + c for c in HARNESS_COLUMNS)}) "
            f"ON CONFLICT (id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in HARNESS_COLUMNS[1:])}",
            {c: session.get(c) for c in HARNESS_COLUMNS})

    def harness_sessions_of(self, agent: str | None = None) -> list[dict]:
        where = "ended_at IS NULL" + (" AND agent = :agent" if agent is not None else "")
        return self._query(f"SELECT id, harness, agent, pid, host, started_at, last_seen, waiter FROM harness_sessions "
                           f"WHERE {where}", {"agent": agent})

    def untold(self, agent: str, now: str, told_seq: int, told_at: str | None, limit: int) -> tuple[list[dict], int]:
        """(the oldest `limit` unread envelopes for `agent` it has not been told of, how many there are): mail
        committed after message `told_seq` (writers are serialised, so insertion order is commit order), and
        delayed mail that fell due after `told_at`. Reads only the rows since, and the delayed mail that
        arrived since (the arrival index)."""
        F = self.F
        params = {"agent": agent, "now": now, "seq": told_seq, "since": told_at or now}
        unread = (f"((m.recipient = :agent AND m.read_at IS NULL) OR (m.recipient = '*' AND m.sender != :agent "
                  f"AND {F.not_read_by})) AND {F.visible}")
        rows = self._query(
            f"SELECT {F.envelope} FROM messages m WHERE m.{self.SEQ} > :seq AND {unread} "
            f"UNION SELECT {F.envelope} FROM messages m {self._hint('idx_messages_arrival')} WHERE {F.m_arrived} > "
            f"{self._ts(':since')} AND {F.m_arrived} <= {self._ts(':now')} AND m.deliver_at IS NOT NULL AND {unread}",
            params)
        return page(rows, limit, newest=False), len(rows)

    def newest_seq(self) -> int:
        return self.mail_marker() or 0  # the newest message, as the watch's safety net reads it

    def events_since(self, agent: str, after: int) -> tuple[list[dict], int]:
        """(undismissed system events of `agent` after event `after`, the newest event in insertion order)."""
        rows = self._x(f"SELECT {self.SEQ}, id, source, payload, created FROM system_events WHERE agent = ? "
                       f"AND dismissed_at IS NULL AND {self.SEQ} > ? ORDER BY {self.SEQ}", (agent, after)).fetchall()
        newest = self._value(f"SELECT COALESCE(MAX({self.SEQ}), 0) FROM system_events")
        return [{"id": r[1], "source": r[2], **decode_json(r[3]), "created": r[4]} for r in rows], newest

    def mail_marker(self) -> object:
        return self._value(f"SELECT MAX({self.SEQ}) FROM messages")

    # -- the access tokens of `agent-mail serve`, and the sessions a server holds ----------------------------
    def add_token(self, token: dict) -> None:
        import json

        self._x("INSERT INTO tokens (id, secret_hash, agents, supervisor, note, created, expires_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (token["id"], token["secret_hash"], json.dumps(token["agents"]), int(token["supervisor"]),
                 token["note"], token["created"], token.get("expires_at")))

    def end_token(self, token_id: str, until: str, rotated_to: str) -> None:
        """A rotated token: valid until `until` (its grace), replaced by `rotated_to`."""
        self._x("UPDATE tokens SET expires_at = ?, rotated_to = ? WHERE id = ?", (until, rotated_to, token_id))
        self.wake_waits()  # a grace of 0 ends the waits made with it now

    def note_token_use(self, token_id: str, at: str) -> None:
        self._x("UPDATE tokens SET last_used = ? WHERE id = ? AND (last_used IS NULL OR last_used < ?)",
                (at, token_id, at))

    def tokens(self) -> list[dict]:
        return [_token(r) for r in self._query(f"SELECT {_TOKEN_COLUMNS} FROM tokens ORDER BY created, id")]

    def token(self, token_id: str) -> dict | None:
        rows = self._query(f"SELECT {_TOKEN_COLUMNS}, secret_hash FROM tokens WHERE id = ?", (token_id,))
        return _token(rows[0]) if rows else None

    def revoke_token(self, token_id: str, at: str) -> bool:
        changed = self._x("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (at, token_id))
        if not changed.rowcount:
            return False
        self.wake_waits()  # every wait looks again, and one made with this token finds it revoked
        return True

    def wake_waits(self) -> None:
        self._wake("*")

    def tell_supervisors(self) -> None:
        """Wake only the looks at everything (a console, a dashboard: the "" channel) when the transaction commits:
        a change they show that is not mail (a message read or acked, a watch started or ended, a reservation).
        No identity's watch is woken by it."""
        self._wake("")

    def touch_sessions(self, prefix: str, at: str) -> int:
        # The sessions a server holds are named INSTANCE.UUID: one statement refreshes them all.
        return self._x("UPDATE watch_sessions SET last_seen = :at WHERE state = 'armed' AND "
                       "substr(id, 1, :n) = :prefix", {"at": at, "n": len(prefix), "prefix": prefix}).rowcount

    def release_sessions(self, session_ids: list[str], at: str, reason: str) -> None:
        self.tell_supervisors()
        for start in range(0, len(session_ids), 500):  # within any engine's limit on parameters
            chunk = session_ids[start:start + 500]
            self._x(f"UPDATE watch_sessions SET state = 'released', released_at = ?, released_reason = ?, "
                    f"last_seen = ? WHERE state = 'armed' AND id IN ({', '.join('?' * len(chunk))})",
                    (at, reason, at, *chunk))

    def abandon_sessions(self, session_ids: list[str]) -> None:
        self.tell_supervisors()
        from agent_mail.store.base import GONE_HOLDER

        # Each new id is made from the old one in SQL: one statement per position of its key part (a server's ids
        # all have it at the same place), within any engine's limit on parameters. A released session keeps its id.
        by_start: dict[int, list[str]] = {}
        for session in session_ids:
            by_start.setdefault(session.find(".") + 2, []).append(session)
        for start, ids in by_start.items():
            for first in range(0, len(ids), 500):
                chunk = ids[first:first + 500]
                self._x(f"UPDATE watch_sessions SET id = '{GONE_HOLDER}.' || substr(id, {int(start)}) "
                        f"WHERE state = 'armed' AND id IN ({', '.join('?' * len(chunk))})", tuple(chunk))

    def release_keyed_session(self, agent: str, key: str, at: str, reason: str) -> dict | None:
        # Inside the write transaction nobody renames a session meanwhile (abandoning one takes the write lock too),
        # so the ids read are the ids released. `key` is hex digits: nothing in it is special to LIKE.
        rows = self._query("SELECT id, state, released_at FROM watch_sessions WHERE agent = ? AND id LIKE ?",
                           (agent, f"%.{key}.%"))
        if not rows:
            return None
        armed = sorted(row["id"] for row in rows if row["state"] == "armed")
        if armed:
            self.release_sessions(armed, at, reason)
            for session in armed:
                self.announce_release(agent, session)
        ended = [row["released_at"] for row in rows if row["released_at"] is not None]
        return {"sessions": armed, "released": bool(armed), "released_at": at if armed else max(ended, default=None)}

    def announce_release(self, agent: str, session_id: str) -> None:
        """Tell the server holding `session_id` (released by its client's stop call) that its wait is over, when
        the transaction commits: here `agent`'s waits are woken, and a server's asks whether its session is still
        armed (PostgreSQL says which session, on the identity's channel)."""
        self._wake(agent)

    def session_state(self, session_id: str) -> str | None:
        rows = self._query("SELECT state FROM watch_sessions WHERE id = ?", (session_id,))
        return rows[0]["state"] if rows else None

    def webhooks(self) -> list[dict]:
        # Here, not in sql_webhooks: every send asks, and a mailbox with no webhook loads nothing more for it.
        rows = self._query("SELECT id, url, agents, events, format, after_minutes, with_body, created FROM webhooks "
                           "ORDER BY created, id")
        return _statements("sql_webhooks").parsed(rows) if rows else []


# Statements over every identity's mail at once, and over whole tables: loaded only by the commands that use them.
KEPT_ELSEWHERE = {"sql_overview": ("recent_rows", "batch_rows", "broadcast_tallies", "whole_thread", "search_rows",
                                   "oldest_unacked", "open_bounces", "sends_per_hour", "open_over_time", "cleanup"),
                  "sql_bulk": ("table_counts", "read_rows", "write_rows", "count_stored", "stored_messages", "last_seq",
                               "attachment_blob", "stored_profiles", "stored_events", "blob_size", "restore_blob",
                               "restore_profile", "restore_event", "restore_messages"),
                  "sql_reservations": ("reservations_in", "save_reservations", "delete_reservations",
                                       "expire_reservations"), "sql_waits": ("unread_of_many", "next_due_of_many"),
                  "sql_deliveries": ("leased_ids", "holds_of_many", "lease_deliveries", "lease_of",
                                     "end_lease"),
                  "sql_webhooks": ("add_webhook", "remove_webhook", "queue_webhook_events",
                                   "claim_webhook_deliveries", "settle_webhook_delivery", "next_webhook_due",
                                   "webhook_deliveries", "webhook_tallies")}
for _module, _name in [(module, name) for module, names in KEPT_ELSEWHERE.items() for name in names]:
    setattr(SQLStore, _name, _kept_in(_module, _name))


class Transaction:
    """SQLStore.transaction(): begun on entering the block, committed at its end, rolled back when the block raises (a
    driver's error raised again as errors.StorageError). A class rather than a contextlib.contextmanager: contextlib
    is about half a millisecond of every command's start."""

    __slots__ = ("store", "write", "patience", "doing")

    def __init__(self, store: SQLStore, write: bool, patience: float | None):
        self.store, self.write, self.patience = store, write, patience
        self.doing = "writing" if write else "reading"

    def __enter__(self) -> SQLStore:
        self.store._start(self.write, self.patience, self.doing)
        self.store._wakes, self.store._active = set(), {}
        return self.store

    def __exit__(self, kind, exc, traceback) -> bool:
        if kind is None:
            if self.write and self.store._active:  # the activity noted, written before the commit
                try:
                    self.store._write_active()
                except BaseException as failed:
                    self.store._rollback()
                    if isinstance(failed, self.store._driver_error):
                        raise self.store._fail(failed, self.doing) from None
                    raise
            self.store._finish(self.write, self.doing)
            return False
        self.store._rollback()
        if isinstance(exc, self.store._driver_error):
            raise self.store._fail(exc, self.doing) from None
        return False
