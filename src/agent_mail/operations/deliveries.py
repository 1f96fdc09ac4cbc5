"""Delivery in two steps, for a reader on another machine (a client of `agent-mail serve`): deliver, then confirm.

On the mailbox's own machine `read` prints its result inside the transaction that marks the mail read, so a
result that was not written marks nothing. Through a server the answer crosses a network and the client prints
it after the server has committed: a client killed (or unable to write) in between would leave mail marked read
that nobody saw. So the server holds the marks instead of making them (a Delivery: one row per message in the
`deliveries` table, until DELIVERY_HOLD_SECONDS from now), and answers with the delivery's id; the client prints,
then confirms, and only then are the messages marked read (acknowledged, for read --ack), as of the moment they
were handed over, in one transaction. A client that could not print cancels, and the mail is unread for the next
read at once; a client that died says nothing, and its mail is delivered again once the hold expires. While held,
the messages are unread (status, watch and notifications count them) but another read leaves them to the reader
they were handed to, so concurrent readers still get each message once.
"""

from __future__ import annotations

import datetime as _dt
import secrets

from agent_mail import errors, model

DELIVERY_HOLD_SECONDS = 60.0  # how long a delivery's messages wait for its confirmation before another read has them
_PREFIX = "dlv_"


class Delivery:
    """A delivery a read makes (mail.Mailbox.read's `delivery`): its id and how many marks it holds."""

    def __init__(self, seconds: float = DELIVERY_HOLD_SECONDS):
        self.id = _PREFIX + secrets.token_hex(16)
        self.seconds = seconds
        self.held = 0

    def hold(self, store, agent: str, fresh: list[dict], unacked: list[dict], now: str) -> None:
        """Hold the marks a read of `agent` makes (`fresh` read, `unacked` read and acknowledged) for this
        delivery, within the read's transaction."""
        acking = {m["id"] for m in unacked}
        marks = [(m["id"], "read") for m in fresh if m["id"] not in acking] + [(m["id"], "read,ack") for m in unacked]
        if marks:
            expires = model.iso(model.parse_iso(now) + _dt.timedelta(seconds=self.seconds))
            store.lease_deliveries(self.id, agent, marks, now, expires)
        self.held += len(marks)


def checked(given: dict) -> tuple[str, bool]:
    """(delivery id, printed) from POST /v1/delivered's values, or errors.InvalidInput naming each one at fault."""
    problems = [(key, "is not a value of /v1/delivered (it takes delivery and printed).")
                for key in sorted(set(given) - {"delivery", "printed"})]
    delivery = given.get("delivery")
    if not isinstance(delivery, str) or not delivery.startswith(_PREFIX) or len(delivery) != len(_PREFIX) + 32 or \
            any(c not in "0123456789abcdef" for c in delivery[len(_PREFIX):]):
        problems.append(("delivery", "must be the delivery id a read answered with (its X-Agent-Mail-Delivery "
                                     "header: dlv_ and 32 hex digits)."))
    if not isinstance(given.get("printed"), bool):
        problems.append(("printed", "must be true (the result was written: mark its messages) or false (it was "
                                    "not: make them unread again)."))
    if problems:
        raise errors.InvalidInput(problems)
    return delivery, given["printed"]


def settle(mailbox, delivery: str, printed: bool, may_act_as) -> dict:
    """Confirm (`printed`: the messages were written where the reader reads them) or cancel delivery
    `delivery`: make the marks it holds (as of the moment it was handed over) or drop them. `may_act_as(agent)`
    raises errors.Forbidden when the caller may not take delivery as the delivery's identity. Confirming or
    cancelling again, or a delivery that expired and was handed to another reader, settles nothing."""
    store = mailbox.store
    with mailbox.mirrors.changing(write=True):
        holds = store.lease_of(delivery)
        agents = sorted({h["agent"] for h in holds})
        for agent in agents:
            may_act_as(agent)
        marked = 0
        if printed and holds:
            now = model.now_iso()
            by_mark: dict[tuple[str, str, str], list[str]] = {}
            for h in holds:
                by_mark.setdefault((h["agent"], h["flags"], h["at"]), []).append(h["message_id"])
            for (agent, flags, at), ids in by_mark.items():
                found = store.addressed(agent, ids, now)
                messages = [found[i] for i in ids if i in found]
                store.set_flags(agent, messages, at, tuple(flags.split(",")))
                marked += len(messages)
        store.end_lease(delivery)
        if marked:
            mailbox.mirrors.render(agents)
    return {"delivery": delivery, "agent": agents[0] if agents else None,
            "confirmed" if printed else "cancelled": marked if printed else len(holds)}
