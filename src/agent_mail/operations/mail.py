"""The operations over one mailbox, returning plain data: send, read, watch, heartbeat, status and
cleanup here; the handling of mail, profiles and notifications, and search in modules of their own
(handling, profiles, search), loaded when first used, so a send or a read does not pay for them.

Every mutating operation takes `emit`, a function that delivers the result to
the caller (the CLI prints it). `emit` runs inside the transaction, before the
commit, so a result that could not be delivered changes nothing.

Locating the mailbox is operations/location.py's; checking inputs and reading liveness are parts/inputs.py's and
parts/liveness.py's.
"""

from __future__ import annotations

from agent_mail import errors, model, spec
from agent_mail.parts import liveness
from agent_mail.parts.checks import guarded
from agent_mail.parts.liveness import describe_liveness
from agent_mail.operations.location import resolve_location
from agent_mail.parts.mirror_files import Mirrors
from agent_mail.operations.results import invisible, next_steps, no_emit
from agent_mail.operations.results import project as _project

# Annotations are never evaluated (see the __future__ import); the names they use are
# imported for type checkers only, so the CLI does not pay for importing typing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from agent_mail.operations.deliveries import Delivery
    from agent_mail.store.base import Store
    from agent_mail.parts.waits import Waits

    Emit = Callable[[dict], None]  # receives the result document, inside the transaction


class Mailbox:
    """The operations over one store."""

    def __init__(self, store: Store, host: str | None = None):
        self.store = store
        # The machine the caller runs on, recorded with what it does (status's hosts): this one's, or a server's
        # client's as it said (shown, never trusted); "" where nobody said.
        self.host = model.machine_name() if host is None else host
        self.mirrors = Mirrors(store)  # the notification files, journaled with each transaction
        self._waits: Waits | None = None

    @property
    def waits(self) -> Waits:
        """The blocking waits (watch, a hook's waiter, notifications --follow)."""
        if self._waits is None:
            from agent_mail.parts.waits import Waits

            self._waits = Waits(self)
        return self._waits

    def publish_due(self) -> list[dict]:
        """Announce scheduled messages that fell due: render their recipients' mirrors. Needs no daemon:
        every command runs this first, and a blocked watch runs it when a message for it falls due."""
        now = model.now_iso()
        with self.store.transaction():
            pending = self.store.due_unpublished(now)
        if not pending:
            return []
        with self.mirrors.changing():
            due = self.store.due_unpublished(now)
            self.store.mark_published([d["message_id"] for d in due], now)
            hooks = self.store.webhooks() if due else []
            if hooks:  # mail that fell due is new mail now
                from agent_mail.operations import webhooks

                fallen = [self.store.get_message(d["message_id"]) for d in due]
                webhooks.queue_mail(self.store, hooks, [m for m in fallen if m is not None])
            direct = [d["recipient"] for d in due if d["recipient"] != model.BROADCAST]
            if any(d["recipient"] == model.BROADCAST for d in due):
                direct += self.store.mirrored_agents()
            return self.mirrors.render(direct)

    # -- send ----------------------------------------------------------------
    @guarded("send")
    def send(self, *, from_: str, to, subject: str, body: str | None = None, body_file: str | None = None,
             ref=(), refs: str | None = None, reply_to: str | None = None, no_ack: bool = False,
             delay_minutes: float | None = None, attach=(), require_reachable: bool = False,
             uploaded: dict | None = None, emit: Emit = no_emit) -> dict:
        """Store one copy of the message per recipient ('*' for everyone but the sender), in one transaction.
        uploaded: refs and attachments a client of agent-mail serve read on its own machine (inputs.prepare_send),
        and the send's idempotency key (`key`, a UUID the client made): the send's batch id, so a send repeated
        with it (its first answer lost) is stored once and answered with the receipt of what was stored."""
        from agent_mail.parts import inputs

        recipients = inputs.as_list(to)
        prepared, problems = inputs.prepare_send({
            "subject": subject, "body": body, "body_file": body_file, "ref": ref, "refs": refs,
            "reply_to": reply_to, "no_ack": no_ack, "to": recipients, "attach": attach,
        }, uploaded)
        checks = [("from", from_)] + [("to", r) for r in recipients]
        problems = inputs.identity_problems(checks) + problems
        if not recipients:
            problems.append(("to", "give at least one recipient."))
        if delay_minutes is not None and not 0 <= delay_minutes <= model.DELAY_MINUTES_MAX:
            problems.append(("delay_minutes", f"use a value from 0 to {model.DELAY_MINUTES_MAX:.0f}."))
        if reply_to is not None and not model.message_id_problem(reply_to) and not model.identity_problem(from_):
            with self.store.transaction():  # found with the other problems, so all are reported at once
                problems += self._reply_to_problems(from_, reply_to)
        key = (uploaded or {}).get("key")
        if key is not None and (not isinstance(key, str) or model.message_id_problem(key)):
            problems.append(("idempotency_key", "is a UUID the client makes for each send; a repeat of the send "
                                                "with it is stored once."))
        if problems:
            raise errors.InvalidInput(problems)
        recipients = prepared["recipients"]  # duplicates collapsed
        moment = model.now()
        created = model.iso(moment)
        deliver_at = model.iso(moment + model.timedelta(minutes=delay_minutes)) if delay_minutes else None
        batch = key.lower() if key is not None else model.new_message_id()
        with self.mirrors.changing():
            self.store.note_active(from_, self.host, created)
            earlier = self.store.batch_rows([batch]) if key is not None else []
            if earlier:  # this send, repeated: its first answer was lost
                receipt = _repeated(self.store, earlier, from_, recipients, prepared, reply_to, no_ack,
                                    require_reachable)
                emit(receipt)
                return receipt
            gone = self._reply_to_problems(from_, reply_to) if reply_to is not None else []
            if gone:  # deleted (cleanup) since the check above
                raise errors.NotFound(gone)
            seen = liveness.for_send(self.store, from_, recipients, require_reachable)
            reached, reachable, presence = seen["reached"], seen["reachable"], seen["sender"]
            attached = [{k: a[k] for k in ("name", "size", "sha256")} for a in prepared["attachments"]]
            deliveries, published, written, bounced = [], [], {}, []
            for recipient in recipients:
                entry = {"recipient": recipient, "id": None, "status": "delivered",
                         "reachable": reachable[recipient]}
                if reached.get(recipient):
                    entry["reached_by"] = reached[recipient]
                if recipient == model.BROADCAST:  # one message, each identity's own state: how many it is for
                    entry["identities"] = len(set(self.store.agent_counts(created)) - {from_})
                if require_reachable and not reachable[recipient]:
                    entry["status"] = "refused"
                    entry["reason"] = seen["refusals"][recipient]
                    bounce_id = model.new_message_id()
                    self.store.add_event(bounce_id, from_, "email.bounce", {
                        "recipient": recipient, "subject": prepared["subject"], "reason": entry["reason"],
                    }, created)
                    bounced.append((bounce_id, recipient, entry["reason"]))
                    deliveries.append(entry)
                    continue
                message = {
                    "id": model.new_message_id(), "sender": from_, "recipient": recipient,
                    "subject": prepared["subject"], "body": prepared["body"], "refs": prepared["refs"],
                    "reply_to": reply_to, "type": "broadcast" if recipient == model.BROADCAST else "direct",
                    "created": created, "deliver_at": deliver_at, "batch_id": batch,
                }
                self.store.insert_message(message, [a["name"] for a in prepared["attachments"]])
                for position, attachment in enumerate(prepared["attachments"]):
                    self.store.add_attachment(message["id"], position, attachment["name"], attachment["content"],
                                              attachment["sha256"], created)
                entry["id"] = message["id"]
                written[message["id"]] = {**message, "attachments": attached}  # mirrors list it from here
                if deliver_at:
                    entry["status"] = "scheduled"
                    entry["deliver_at"] = deliver_at
                else:
                    published.append(recipient)
                deliveries.append(entry)
            refused = [d for d in deliveries if d["status"] == "refused"]
            hooks = self.store.webhooks()
            if hooks:  # the events, queued with the mail: a server POSTs them once this commits
                from agent_mail.operations import webhooks

                webhooks.queue_mail(self.store, hooks, [m for m in written.values() if not m["deliver_at"]])
                for bounce_id, recipient, reason in bounced:
                    webhooks.queue_bounce(self.store, hooks, bounce_id, from_, recipient, prepared["subject"], reason,
                                          created)
            # The reply settles what it answers only if it went out to someone.
            acknowledged, touched = (self._settle_reply(from_, reply_to, no_ack, created)
                                     if len(refused) < len(deliveries) else (None, []))
            mirrors = self.mirrors.after_send(from_, [r for r in published if r != model.BROADCAST] + touched,
                                              everyone=model.BROADCAST in published, bounced=bool(refused),
                                              written=written)
            single = deliveries[0] if len(deliveries) == 1 else None
            lapsed = presence["watch_state"] in ("released", "stale") and not presence["reachable"]
            receipt = {
                "id": single["id"] if single else None,
                "recipient": single["recipient"] if single else None,
                "sender": from_,
                "subject": prepared["subject"],
                "type": "broadcast" if recipients == [model.BROADCAST] else "direct",
                "created": created,
                "refs": prepared["refs"],
                "attachments": attached,
                "reply_to": reply_to,
                "acknowledged": acknowledged,
                "batch_id": batch,
                "deliveries": deliveries,
                "delivered": sum(d["status"] == "delivered" for d in deliveries),
                "scheduled": sum(d["status"] == "scheduled" for d in deliveries),
                "refused": len(refused),
                "mirrors": mirrors,
                "sender_reachable": presence["reachable"],
                "next": [spec.Step("watch", agent=from_)] if lapsed else [],
            }
            emit(receipt)
        return receipt

    def _reply_to_problems(self, replier: str, reply_to: str) -> list[tuple[str, str]]:
        if self.store.visible_to(replier, [reply_to], model.now_iso()):
            return []
        return [("reply_to", invisible(reply_to, replier) + " Use an id from read.")]

    def _settle_reply(self, replier: str, reply_to: str | None, no_ack: bool, at: str) -> tuple[str | None, list]:
        """A reply marks the answered message read and acknowledged for the replier."""
        if reply_to is None:
            return None, []
        answered = self.store.addressed(replier, [reply_to], at).get(reply_to)
        if answered is None:
            return None, []
        self.store.set_flags(replier, [answered], at, ("read",) if no_ack else ("read", "ack"))
        return (None if no_ack else reply_to), [replier]

    # -- read --------------------------------------------------------------------
    @guarded("read")
    def read(self, *, agent: str, all: bool = False, from_: str | None = None, limit: int = 50,
             thread: str | None = None, archived: bool = False, no_mark_read: bool = False, ack: bool = False,
             fields: list[str] | None = None, delivery: Delivery | None = None, emit: Emit = no_emit) -> dict:
        """Take delivery of `agent`'s mail; see spec.COMMANDS['read'] for the modes. `delivery` (a server's, for
        a client that prints before it confirms): the marks are held for it rather than made, and the messages
        another reader's delivery holds are left out, until confirm_delivery makes them (or they expire)."""
        now = model.now_iso()
        if thread is not None or archived:
            with self.store.transaction():
                if thread is not None:
                    if not self.store.visible_to(agent, [thread], now):
                        raise errors.NotFound([("thread", invisible(thread, agent))])
                    messages = self.store.thread(thread, agent, now)
                else:
                    messages = self.store.archived(agent, now, sender=from_)[-limit:]
                result = self._read_result(agent, messages, fields, remaining=self.store.count_unread(agent, now),
                                           suggest_ack=False)
                emit(result)
            return result
        marking = not no_mark_read
        with self.mirrors.changing(write=marking or ack):
            self.store.note_active(agent, self.host, now)  # a read that marks nothing is a look: no trace
            # The page comes from arrival-ordered indexes, and whole rows only for it: the cost is the
            # page's, not the backlog's. The unread total is counted, not listed.
            # Mail handed to a reader through a server and not yet confirmed is left to it: one reader each.
            held = self.store.leased_ids(agent, now) if marking or ack else set()
            if all:
                listed = self.store.latest(agent, now, limit=limit, sender=from_)
            else:
                listed = self.store.unread(agent, now, limit=limit + len(held), sender=from_)
                listed = [m for m in listed if m["id"] not in held][:limit]
            found = self.store.addressed(agent, [m["id"] for m in listed], now)
            messages = [found[m["id"]] for m in listed]
            unread = self.store.count_unread(agent, now) - len(held)
            page_unread = sum(m["read_at"] is None and m["id"] not in held for m in messages)
            fresh = [m for m in messages if m["read_at"] is None and m["id"] not in held] if marking else []
            unacked = [m for m in messages if m["acked_at"] is None and m["id"] not in held] if ack else []
            if delivery is not None:
                delivery.hold(self.store, agent, fresh, unacked, now)
            else:
                if fresh:
                    self.store.set_flags(agent, fresh, now, ("read",))
                if unacked:
                    self.store.set_flags(agent, unacked, now, ("read", "ack"))
            for m in fresh + unacked:
                m["read_at"] = m["read_at"] or now
            for m in unacked:
                m["acked_at"] = now
            # Marking (or --ack) takes delivery of every unread message on the page; --no-mark-read of none.
            remaining = max(0, unread - (page_unread if marking or ack else 0))
            result = self._read_result(agent, messages, fields, remaining=remaining)
            changed = bool(fresh or unacked) and delivery is None
            if changed:
                self.mirrors.render([agent])
            emit(result)
        return result

    def _read_result(self, agent: str, messages: list[dict], fields: list[str] | None, remaining: int,
                     suggest_ack: bool = True) -> dict:
        attachments = self.store.attachments_of([m["id"] for m in messages])
        for message in messages:
            message["attachments"] = attachments.get(message["id"], [])
        listed = [_project(m, fields) for m in messages]
        reachable = liveness.presence(self.store, agent)["reachable"]
        # Only what has been delivered to the agent (read) is offered for acknowledging: `ack --all`
        # settles read mail only, so the hint can never settle mail the agent was not shown.
        to_ack = [m["id"] for m in messages if m["acked_at"] is None and m["read_at"] is not None
                  and m["sender"] != agent] if suggest_ack else []
        return {"agent": agent, "messages": listed, "count": len(listed), "remaining": remaining,
                "reachable": reachable,
                "next": next_steps(agent, unread=remaining, ack_ids=to_ack, reachable=reachable)}

    # -- liveness ----------------------------------------------------------------
    @guarded("heartbeat")
    def heartbeat(self, *, agent: str, emit: Emit = no_emit) -> dict:
        """Record that `agent` is present without a blocked watch."""
        at = model.now_iso()
        with self.store.transaction(write=True):
            self.store.record_heartbeat(agent, at)
            self.store.note_active(agent, self.host, at)
            unread = self.store.count_unread(agent, at)
            # The heartbeat just recorded makes it reachable for the next LIVENESS_SECONDS.
            result = {"agent": agent, "last_seen": at, "unread": unread, "reachable": True,
                      "next": next_steps(agent, unread=unread, reachable=True)}
            emit(result)
        return result

    @guarded("watch")
    def watch(self, *, agent: str, timeout_minutes: float | None = None, once: bool = False,
              timeout_seconds: float | None = None, wanted=None, session: str | None = None, emit: Emit = no_emit):
        """Block until `agent` has unread mail (or the timeout passes); return envelopes, consume nothing.
        timeout_seconds: a shorter wait than the command line allows (the MCP tool's bounded wait);
        wanted(): checked at each refresh, False ends the wait early (the MCP call was cancelled);
        session: the liveness session's id (a server's wait names it from its client's key)."""
        if once:
            return self._watch_result(agent, self.waits.envelopes(agent), emit=emit, heartbeat=True)
        minutes = model.WATCH_MINUTES_DEFAULT if timeout_minutes is None else timeout_minutes
        if timeout_seconds is not None:
            minutes = timeout_seconds / 60.0
        # Handlers first (in wait_armed): a signal that arrives once the session exists must still release it.
        messages = self.waits.wait_armed(agent, minutes * 60.0, wanted=wanted, session=session)
        # On a shared mailbox the sender may be on another machine, where this agent's mirror directory is not:
        # the watch, on the agent's machine, brings the mirror up to date (files only, best effort).
        return self._watch_result(agent, messages, emit=emit, render=bool(messages) and self.store.kind != "sqlite")

    def _watch_result(self, agent: str, messages: list[dict], *, emit: Emit, heartbeat: bool = False,
                      render: bool = False) -> dict:
        # A --once check records its heartbeat in the same transaction as its result: if the result
        # cannot be printed, the agent was not seen.
        with self.store.transaction(write=heartbeat):
            if render:
                self.mirrors.render([agent])
            if heartbeat:
                at = model.now_iso()
                self.store.record_heartbeat(agent, at)
                self.store.note_active(agent, self.host, at)
            facts = self.store.liveness(agent).get(agent)
            # Reachable after this call: another watch is armed (a --once check counts as presence).
            presence = describe_liveness(facts, model.now())
            reachable = presence["reachable"] if heartbeat else presence["watch_state"] == "armed"
            result = {
                "agent": agent,
                "messages": messages,
                "count": len(messages),
                "timeout": not messages,
                "reachable": reachable,
                "next": next_steps(agent, unread=len(messages), reachable=reachable),
            }
            emit(result)
        return result

    # -- overview -----------------------------------------------------------------
    @guarded("status")
    def status(self, *, agent: str | None = None, project: str | None = None, fields: list[str] | None = None,
               emit: Emit = no_emit) -> dict:
        """One row per identity seen in traffic, watches, heartbeats, profiles or activity (or just `agent`)."""
        now = model.now_iso()
        with self.store.transaction():
            if agent is not None:  # one identity: its own counts, not everyone's
                counts = {agent: {"unread": self.store.count_unread(agent, now),
                                  "unacked": self.store.count_unacked(agent, now)}}
            else:
                counts = self.store.agent_counts(now)
            facts = self.store.liveness(agent)
            live = liveness.live_sessions(self.store.harness_sessions_of(agent), model.now())
            harnesses = liveness.harnesses_of(self.store, agent, live)
            humans = self.store.humans()
            active = self.store.activity(agent, since=liveness.recent_since(model.now()))
        at = model.now()
        sessions = {name: len(of) for name, of in harnesses.items()}
        if agent is not None:
            names = [agent]
        else:
            names = sorted(set(counts) | set(sessions))
            if project is not None:
                names = [n for n in names if n.split(":", 1)[0] == project]
        rows = []
        for name in names:
            row = {"agent": name, **counts.get(name, {"unread": 0, "unacked": 0})}
            row.update(describe_liveness(facts.get(name), at, harnesses.get(name, ()), name in humans))
            row["sessions"] = sessions.get(name, 0)
            row["last_active"] = active.get(name, {}).get("last_active")
            row["hosts"] = liveness.hosts_of(active.get(name), [s for s in live if s["agent"] == name])
            rows.append({f: row[f] for f in fields} if fields else row)
        result = {"agents": rows, "count": len(rows)}
        emit(result)
        return result

    @guarded("cleanup")
    def cleanup(self, *, older_than: int, dry_run: bool = False, emit: Emit = no_emit) -> dict:
        """Delete messages (and what hangs off them, and old liveness rows and events) older than `older_than` days."""
        cutoff = model.iso(model.now() - model.timedelta(days=older_than))
        leftovers = self.store.leftovers()
        with self.store.transaction(write=not dry_run):
            counts = self.store.cleanup(cutoff, dry_run)
            result = {"dry_run": dry_run, "cutoff": cutoff, **counts, "temporary_files_deleted": len(leftovers)}
            emit(result)
        if not dry_run:
            self.store.remove_leftovers(leftovers)  # files of killed processes: nothing to roll back
        if not dry_run and counts["deleted_count"]:
            with self.store.transaction():
                self.mirrors.render(self.store.mirrored_agents())
        return result

    # -- handling, attachments, profiles and search: operations of their own modules ----------
    def _group(self, module: str):
        """The operations of a module of their own (handling, profiles, search), imported when first used."""
        if module == "handling":
            from agent_mail.operations.handling import Handling as group
        elif module == "profiles":
            from agent_mail.operations.profiles import Profiles as group
        else:
            from agent_mail.operations.search import Searching as group
        return group(self)

    @guarded("ack")
    def ack(self, **options) -> dict:
        """Record that an agent acted on messages; see Handling.ack for the options."""
        return self._group("handling").ack(**options)

    @guarded("dismiss")
    def dismiss(self, **options) -> dict:
        """Mark messages read without returning them; see Handling.dismiss."""
        return self._group("handling").dismiss(**options)

    @guarded("archive")
    def archive(self, **options) -> dict:
        """Take messages out of the inbox; see Handling.archive."""
        return self._group("handling").archive(**options)

    @guarded("delete")
    def delete(self, **options) -> dict:
        """Remove messages from every view of an agent; see Handling.delete."""
        return self._group("handling").delete(**options)

    @guarded("cancel")
    def cancel(self, **options) -> dict:
        """Withdraw scheduled messages that have not fallen due; see Handling.cancel."""
        return self._group("handling").cancel(**options)

    @guarded("attachments")
    def attachments(self, **options) -> dict:
        """List a message's attachments, or save them; see Handling.attachments."""
        return self._group("handling").attachments(**options)

    @guarded("profile")
    def profile(self, **options) -> dict:
        """Show, or change, an agent's optional settings; see Profiles.profile."""
        return self._group("profiles").profile(**options)

    @guarded("notifications")
    def notifications(self, **options) -> dict:
        """An agent's unread mirror and system channel; see Profiles.notifications."""
        return self._group("profiles").notifications(**options)

    @guarded("search")
    def search(self, **options) -> dict:
        """Messages matching a query, ranked; see Searching.search."""
        return self._group("search").search(**options)

    @guarded("reserve")
    def reserve(self, **options) -> dict:
        """Reserve files for an agent; see reservations.reserve (the pattern matching loads only for these)."""
        from agent_mail.operations import reservations

        return reservations.reserve(self, **options)

    @guarded("release")
    def release(self, **options) -> dict:
        """Release an agent's reservations; see reservations.release."""
        from agent_mail.operations import reservations

        return reservations.release(self, **options)

    @guarded("reservations")
    def reservations(self, **options) -> dict:
        """The reservations in force, or a check of paths against them; see reservations.reservations."""
        from agent_mail.operations import reservations

        return reservations.reservations(self, **options)

    @guarded("hook")
    def hook(self, **options) -> dict:
        """One step of a harness's hook carried for a client (agent-mail serve); see telling.served_step."""
        from agent_mail.operations import telling

        return telling.served_step(self, **options)

    def wait_armed(self, agent: str, seconds: float, look_for=None, wanted=None, also: tuple[int, ...] = (),
                   **options) -> list[dict]:
        """Block as a watch does until look_for() finds something; see Waits.wait_armed (options: stop_on)."""
        return self.waits.wait_armed(agent, seconds, look_for, wanted, also=also, **options)

    def wait_unarmed(self, agent: str, seconds: float, look_for=None, wanted=None, also: tuple[int, ...] = (),
                     **options) -> list[dict]:
        """Block until look_for() finds something, holding no watch session; see Waits.wait_unarmed."""
        return self.waits.wait_unarmed(agent, seconds, look_for, wanted, also, **options)


def open_mailbox() -> OpenMailbox:
    """Open (creating on first use) the mailbox this invocation resolves, for a `with` block: closed at its end."""
    return OpenMailbox()


class OpenMailbox:
    """open_mailbox(): opened on entering the block (mail whose delivery time has come published), closed at its end. A
    class rather than a contextlib.contextmanager: contextlib is about half a millisecond of every command's start."""

    __slots__ = ("store",)

    def __init__(self):
        self.store = None

    def __enter__(self) -> Mailbox:
        from agent_mail.store import open_store

        location, _ = resolve_location()
        self.store = open_store(location)
        try:
            mailbox = Mailbox(self.store)
            mailbox.publish_due()
        except BaseException:
            self.store.close()
            raise
        return mailbox

    def __exit__(self, kind, exc, traceback) -> bool:
        self.store.close()
        return False


def _what_differs(store, rows: list[dict], from_: str, recipients: list[str], prepared: dict,
                  reply_to: str | None, require_reachable: bool) -> str | None:
    """What of a send repeated under an idempotency key is not what the key first stored (sender, recipients,
    subject, body, refs, reply, attachments), in words; None when it is the same send. A first send with
    --require-reachable may have stored fewer recipients than it named (the refused ones are not stored)."""
    from agent_mail.store.sql_values import decode_refs

    first = rows[0]
    stored = {row["recipient"] for row in rows}
    named = set(recipients)
    if first["sender"] != from_:
        return "sender"
    if stored != named and not (require_reachable and stored <= named):
        return "list of recipients"
    if first["subject"] != prepared["subject"]:
        return "subject"
    if (first["body"] or "") != (prepared["body"] or ""):
        return "body"
    refs = first["refs"] if isinstance(first["refs"], list) else decode_refs(first["refs"])
    if refs != list(prepared["refs"] or []):
        return "set of refs"
    if (first["reply_to"] or None) != reply_to:
        return "reply_to"
    attached = [(a["name"], a["sha256"]) for a in store.attachments_of([first["id"]]).get(first["id"], [])]
    if attached != [(a["name"], a["sha256"]) for a in prepared["attachments"]]:
        return "set of attachments"
    return None


def _repeated(store, rows: list[dict], from_: str, recipients: list[str], prepared: dict, reply_to: str | None,
              no_ack: bool, require_reachable: bool) -> dict:
    """The receipt of a send already stored under its idempotency key (`rows`: what it stored; nothing is
    written again)."""
    differs = _what_differs(store, rows, from_, recipients, prepared, reply_to, require_reachable)
    if differs:
        first = rows[0]
        raise errors.InvalidInput([("idempotency_key", f"was given with another send: batch {first['batch_id']}, "
                                                       f"sent by {first['sender']} at {first['created']} to "
                                                       f"{', '.join(sorted({r['recipient'] for r in rows}))} with the "
                                                       f"subject {first['subject']!r}, had another {differs}. A key "
                                                       "repeats one send; make a new key for each send. Nothing was "
                                                       "sent.")])
    seen = liveness.for_send(store, from_, [row["recipient"] for row in rows], False)
    deliveries = []
    for row in rows:
        entry = {"recipient": row["recipient"], "id": row["id"], "status": "scheduled" if row["deliver_at"]
                 else "delivered", "reachable": seen["reachable"][row["recipient"]]}
        if row["deliver_at"]:
            entry["deliver_at"] = row["deliver_at"]
        if row["recipient"] == model.BROADCAST:
            entry["identities"] = len(set(store.agent_counts(model.now_iso())) - {from_})
        deliveries.append(entry)
    single = deliveries[0] if len(deliveries) == 1 else None
    answered = store.addressed(from_, [reply_to], model.now_iso()).get(reply_to) if reply_to else None
    return {
        "id": single["id"] if single else None, "recipient": single["recipient"] if single else None,
        "sender": from_, "subject": prepared["subject"],
        "type": "broadcast" if recipients == [model.BROADCAST] else "direct", "created": rows[0]["created"],
        "refs": prepared["refs"],
        "attachments": [{k: a[k] for k in ("name", "size", "sha256")} for a in prepared["attachments"]],
        "reply_to": reply_to, "acknowledged": reply_to if answered and not no_ack else None,
        "batch_id": rows[0]["batch_id"], "deliveries": deliveries,
        "delivered": sum(d["status"] == "delivered" for d in deliveries),
        "scheduled": sum(d["status"] == "scheduled" for d in deliveries), "refused": 0, "mirrors": [],
        "sender_reachable": seen["sender"]["reachable"], "next": [],
    }
