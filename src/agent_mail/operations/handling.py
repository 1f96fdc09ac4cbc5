"""Handling mail once it is there: ack, dismiss, archive and delete for a recipient, withdrawing a
scheduled message for its sender, and listing or saving a message's attachments.
"""

from __future__ import annotations

from agent_mail import errors, model
from agent_mail.parts.liveness import presence
from agent_mail.operations.results import invisible, next_steps, no_emit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from agent_mail.operations.results import Emit


class Handling:
    """The handling operations of one mailbox (Mailbox.ack, .dismiss, ... call these)."""

    def __init__(self, mailbox):  # the agent_mail.operations.mail.Mailbox whose operations these are
        self.store = mailbox.store
        self.mirrors = mailbox.mirrors
        self.host = mailbox.host

    def ack(self, *, agent: str, ids=(), all: bool = False, emit: Emit = no_emit) -> dict:
        """Record that `agent` acted on these messages (all outstanding ones with all=True)."""
        return self._handle(agent, ids, emit, "ack", "acked", "already_acked", "acked_at",
                            outstanding=self.store.read_unacked if all else None, stamp="acked_at",
                            count_unread_left=True)

    def dismiss(self, *, agent: str, ids, emit: Emit = no_emit) -> dict:
        """Mark messages read without returning them."""
        return self._handle(agent, ids, emit, "read", "dismissed", "already_read", "read_at")

    def archive(self, *, agent: str, ids, emit: Emit = no_emit) -> dict:
        """Take messages out of the inbox; `read --archived` still lists them."""
        return self._handle(agent, ids, emit, "archive", "archived", "already_archived", "archived_at")

    def delete(self, *, agent: str, ids, emit: Emit = no_emit) -> dict:
        """Remove messages from every view of `agent`; the other parties keep theirs."""
        return self._handle(agent, ids, emit, "delete", "deleted", "already_deleted", "deleted_at")

    def _handle(self, agent: str, ids, emit: Emit, flag: str, done: str, already_key: str, state: str, *,
                outstanding=None, stamp: str | None = None, count_unread_left: bool = False) -> dict:
        """Stamp `flag` (and read) on messages addressed to `agent`: the given ids, all or nothing,
        or every message `outstanding(agent, now)` lists that was delivered (read) already: mail
        nobody was shown is never settled in bulk."""
        wanted = list(dict.fromkeys(ids))
        now = model.now_iso()
        with self.mirrors.changing():
            self.store.note_active(agent, self.host, now)
            if outstanding is not None:
                fresh, already = outstanding(agent, now), []
            else:
                found = self._addressed_or_fail(agent, wanted, now)
                fresh = [found[i] for i in wanted if found[i][state] is None]
                already = [i for i in wanted if found[i][state] is not None]
            self.store.set_flags(agent, fresh, now, tuple(dict.fromkeys(("read", flag))))
            unread = self.store.count_unread(agent, now)  # after: what is left unread
            reachable = presence(self.store, agent)["reachable"]
            result = {"agent": agent}
            if stamp:
                result[stamp] = now if fresh else None
            result.update({
                done: [m["id"] for m in fresh],
                already_key: already,
                "count": len(fresh),
            })
            if count_unread_left:
                # with --all: unread mail is never settled in bulk, so all of it was left alone
                result["unread_left"] = unread if outstanding is not None else 0
            result.update({
                "reachable": reachable,
                "next": next_steps(agent, unread=unread, reachable=reachable),
            })
            if fresh:
                self.mirrors.render([agent])
            emit(result)
        return result

    def _addressed_or_fail(self, agent: str, wanted: list[str], now: str) -> dict[str, dict]:
        """The messages, all of them addressed to `agent`, or an error naming each one that is not."""
        found = self.store.addressed(agent, wanted, now)
        problems = []
        for message_id in wanted:
            if message_id in found:
                continue
            if self.store.visible_to(agent, [message_id], now):
                problems.append(("ids", f"message {message_id} was sent by {agent}, not addressed to it; nothing was "
                                        "changed."))
            else:
                problems.append(("ids", invisible(message_id, agent) + " Nothing was changed."))
        if problems:
            raise errors.NotFound(problems)
        return found

    def cancel(self, *, sender: str, ids, emit: Emit = no_emit) -> dict:
        """Withdraw scheduled messages of `sender` that have not fallen due."""
        wanted = list(dict.fromkeys(ids))
        now = model.now_iso()
        with self.store.transaction(write=True):
            self.store.note_active(sender, self.host, now)
            problems = []
            for message_id in wanted:
                message = self.store.get_message(message_id)
                if message is None or (message["sender"] != sender
                                       and not self.store.visible_to(sender, [message_id], now)):
                    problems.append(("ids", invisible(message_id, sender)))  # whether it exists, and whose, is not told
                elif message["sender"] != sender:
                    problems.append(("ids", f"message {message_id} was sent to {sender} by {message['sender']}; "
                                            "only its sender can cancel it."))
                elif message["cancelled_at"] is not None:
                    problems.append(("ids", f"message {message_id} was already cancelled at "
                                            f"{message['cancelled_at']}."))
                elif message["deliver_at"] is None or message["deliver_at"] <= now:
                    when = message["deliver_at"] or message["created"]
                    problems.append(("ids", f"message {message_id} was delivered at {when}; a delivered message "
                                            "cannot be withdrawn (send a correction instead)."))
            if problems:
                raise errors.InvalidInput([(f, m + " Nothing was cancelled.") for f, m in problems])
            for message_id in wanted:
                self.store.cancel(message_id, now)
            result = {"sender": sender, "cancelled": wanted, "count": len(wanted)}
            emit(result)
        return result

    def attachments(self, *, agent: str, id: str, save_to: str | None = None, overwrite: bool = False,
                    emit: Emit = no_emit) -> dict:
        """List a message's attachments, or write them into `save_to`.

        Saving writes every file under a temporary name first and moves them into place only after
        the result has been emitted: a save that cannot print, fails or is killed leaves nothing
        under a final name and replaces nothing.
        """
        now = model.now_iso()
        with self.store.transaction():
            if not self.store.visible_to(agent, [id], now):
                raise errors.NotFound([("id", invisible(id, agent))])
            listed = self.store.attachments_of([id]).get(id, [])
            contents = {}
            if save_to is not None:
                for attachment in listed:
                    contents[attachment["sha256"]] = self.store.attachment_content(attachment["sha256"])
        staged = None
        if save_to is not None:
            from agent_mail import files

            staged = files.stage_attachments(save_to, listed, contents, overwrite, own_file=self.store.own_file)
        result = {"agent": agent, "id": id, "attachments": listed, "count": len(listed),
                  "directory": staged.target if staged else None, "saved": staged.saved if staged else []}
        if staged is None:
            emit(result)
            return result
        try:
            emit(result)
        except BaseException:
            staged.discard()
            raise
        staged.publish()
        return result

