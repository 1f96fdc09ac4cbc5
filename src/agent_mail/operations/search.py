"""Search: messages matching a query, ranked, each send shown once with its recipients.

The query language and the snippets are agent_mail.parts.query_language's; this is the operation over a mailbox.
"""

from __future__ import annotations

import datetime as _dt

from agent_mail import errors, model, spec
from agent_mail.operations.results import invisible, no_emit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent_mail.operations.results import Emit


class Searching:
    """The search operation of one mailbox (Mailbox.search calls this)."""

    _SEARCH_CHUNK = 200  # rows asked of the index at a time (a send to several is several rows)

    def __init__(self, mailbox):  # the agent_mail.operations.mail.Mailbox whose operations these are
        self.store = mailbox.store

    def search(self, *, query: str, agent: str | None = None, from_: str | None = None, to: str | None = None,
               since_days: float | None = None, thread: str | None = None, limit: int = 20,
               fields: list[str] | None = None, emit: Emit = no_emit) -> dict:
        """Messages matching `query`, ranked: subject matches first, then the rest, newest first in each."""
        from agent_mail.parts import query_language as words

        parsed = words.parse(query)
        if not self.store.searchable():
            raise errors.AgentMailError(
                "this mailbox has no search index: the SQLite library Python uses here was built without FTS5. "
                "Run agent-mail with a Python whose sqlite3 has FTS5 (python.org and most distributions' do).")
        now = model.now_iso()
        since = model.iso(model.now() - _dt.timedelta(days=since_days)) if since_days is not None else None
        if self.store.index_behind():  # rows another tool stored since: indexed before looking
            with self.store.transaction(write=True):
                self.store.index_missing()
        with self.store.transaction():
            thread_ids = None
            if thread is not None:
                if agent is not None and not self.store.visible_to(agent, [thread], now):
                    raise errors.NotFound([("thread", invisible(thread, agent))])
                thread_ids = [row["id"] for row in self.store.whole_thread(thread)]
                if thread not in thread_ids:
                    raise errors.NotFound([("thread", f"no message {thread} exists in this mailbox.")])
            found: dict[str, tuple[dict, str]] = {}  # one per send (its batch), in ranked order
            more = False
            for subject_only in (True, False):
                before = None
                while not more:
                    rows = self.store.search_rows(parsed, subject_only=subject_only, now=now, before=before,
                                                  limit=self._SEARCH_CHUNK, agent=agent, sender=from_, recipient=to,
                                                  since=since, thread_ids=thread_ids)
                    for row in rows:
                        key = row["batch_id"] or row["id"]
                        if key in found:
                            continue
                        if len(found) == limit:
                            more = True
                            break
                        found[key] = (row, "subject" if subject_only else "text")
                    if len(rows) < self._SEARCH_CHUNK:
                        break
                    before = rows[-1]["seq"]
                if more:
                    break
            results = self._search_results(list(found.values()), parsed, agent)
        listed = [{f: r[f] for f in (fields or spec.SEARCH_FIELDS)} for r in results]
        reader = agent or (results[0]["sender"] if results else None)
        result = {"query": shown_query(parsed), "results": listed, "count": len(listed), "more": more,
                  "next": [spec.Step("read", agent=reader, thread=results[0]["id"])] if results else []}
        emit(result)
        return result

    def _search_results(self, hits: list[tuple[dict, str]], parsed, agent: str | None) -> list[dict]:
        from agent_mail.parts import query_language as words

        # A send to several: its recipients (all of them for its sender or the supervisor; a recipient sees its
        # own copy only), and the first copy's id for those who see them all.
        batches = {row["batch_id"] for row, _ in hits if row["batch_id"] and row["type"] != "broadcast"
                   and (agent is None or row["sender"] == agent)}
        copies: dict[str, list[dict]] = {}
        for row in self.store.batch_rows(sorted(batches)):
            copies.setdefault(row["batch_id"], []).append(row)
        names = self.store.attachments_of([row["id"] for row, _ in hits])
        results = []
        for row, matched in hits:
            shown_id, recipients = row["id"], [row["recipient"]]
            if row["batch_id"] in copies:
                shown_id = copies[row["batch_id"]][0]["id"]
                recipients = [c["recipient"] for c in copies[row["batch_id"]]]
            results.append({"id": shown_id, "sender": row["sender"], "recipients": recipients,
                            "subject": row["subject"], "attachments": [a["name"] for a in names.get(row["id"], [])],
                            "matched": matched, "type": row["type"], "created": row["created"],
                            "deliver_at": row["deliver_at"], "reply_to": row["reply_to"],
                            "withdrawn": row["cancelled_at"] is not None})
            results[-1]["snippet"] = words.snippet(row["subject"], row["body"], parsed, results[-1]["attachments"])
        return results


def shown_query(parsed) -> str:
    """The query as understood, in the language's own forms."""
    shown = [" OR ".join(t.shown() for t in group) for group in parsed.groups]
    return " ".join(shown + [f"-{t.shown()}" for t in parsed.excluded])

