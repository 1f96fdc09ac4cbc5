"""The webhooks' deliveries of one `agent-mail serve` process: a background task that POSTs what the mailbox's
outbox holds (agent_mail.operations.webhooks queues it, in the transaction of the commit that made each event).

It waits on the same wake-ups as the server's waits (ServedWaits.until_changed on the channel every commit
notifies: PostgreSQL's LISTEN connection, SQLite's wake-up pipes), so a delivery starts within milliseconds of its
commit, and otherwise sleeps until the next retry falls due or the next look for deaf identities. Each look claims
the deliveries due with a lease (Store.claim_webhook_deliveries: FOR UPDATE SKIP LOCKED on PostgreSQL, SQLite's one
writer), so with several replicas each is POSTed by one of them; a server killed mid-POST leaves its lease to run
out (LEASE_SECONDS), and another server (or this one restarted) POSTs it again: at least once, the delivery's id the
same each time. The POST itself is urllib's, in a thread, at most POSTS_AT_ONCE at a time.
"""

from __future__ import annotations

import asyncio
import os

import anyio

from agent_mail import __version__, errors, model
from agent_mail.operations import webhooks

CLAIM_BATCH = 16
POSTS_AT_ONCE = 8
# How long a claimed delivery is this server's: a server killed mid-POST leaves it to another after this long.
LEASE_SECONDS = 6 * webhooks.POST_TIMEOUT_SECONDS
# How long the task sleeps with nothing due and no wake-up (a wake-up or a due retry ends the sleep sooner).
IDLE_SECONDS = 3600.0
# Where the mailbox cannot be woken through (a SQLite server without wake-up pipes): how often it looks.
POLL_SECONDS = 1.0
# Deaf identities are looked for every tenth of the shortest --after-minutes, within these bounds.
DEAF_LOOK_MIN_SECONDS, DEAF_LOOK_MAX_SECONDS = 0.5, 30.0


def post(url: str, body: bytes, headers: dict, timeout: float) -> tuple[int | None, str | None]:
    """POST `body` to `url`: (the answer's status, None), or (None, why no answer came). Redirects are not
    followed (a 3xx is the answer)."""
    import http.client
    import socket
    import urllib.error
    import urllib.request

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with opener.open(request, timeout=timeout) as answer:
            answer.read(65536)
            return answer.status, None
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (TimeoutError, socket.timeout):
        return None, f"no answer within {timeout:g} s"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            return None, f"no answer within {timeout:g} s"
        return None, f"no answer: {getattr(reason, 'strerror', None) or reason}"
    except (http.client.HTTPException, OSError, ValueError) as exc:
        return None, f"no answer: {type(exc).__name__}: {exc}"


class Deliveries:
    """The background task of one served mailbox. `waits`: its ServedWaits (None where it has none: it polls);
    `db(action)`: `await`s action(store) on a store of the server's, in a thread."""

    def __init__(self, waits, db, instance: str, log):
        self.waits, self.db, self.log = waits, db, log
        self.holder = f"{instance}.{os.urandom(3).hex()}"
        self.in_flight: set[asyncio.Task] = set()
        self.limiter = anyio.CapacityLimiter(POSTS_AT_ONCE)
        self.deaf_at = 0.0  # when (loop time) to look for deaf identities next
        self.stopped = anyio.Event()

    async def run(self) -> None:
        """Until the server stops (cancelled, or its waits' Stopping)."""
        from agent_mail.server.waits import Stopping

        never = anyio.Event()
        failing = False
        try:
            while True:
                try:
                    if self.waits is not None:
                        claimed = await self.waits.until_changed("", IDLE_SECONDS, self._look, never)
                    else:
                        claimed, _ = await self._look()
                        if not claimed:
                            await asyncio.sleep(POLL_SECONDS)
                    failing = False
                except Stopping:
                    return
                except errors.AgentMailError as exc:
                    if not failing:  # once a run: not each retry
                        self.log(level="warning", webhooks=f"cannot look at the outbox: {exc}")
                    failing = True
                    await asyncio.sleep(POLL_SECONDS)
                    continue
                for delivery in claimed or ():
                    task = asyncio.get_running_loop().create_task(self._deliver(delivery))
                    self.in_flight.add(task)
                    task.add_done_callback(self.in_flight.discard)
        finally:
            for task in list(self.in_flight):
                task.cancel()

    async def _look(self):
        """(the deliveries claimed now, or None; the seconds until the next is due or deaf is looked for)."""
        loop = asyncio.get_running_loop()
        look_deaf = loop.time() >= self.deaf_at
        room = max(0, 2 * POSTS_AT_ONCE - len(self.in_flight))

        def step(store):
            from agent_mail.operations.mail import Mailbox

            shortest = None
            if look_deaf:
                with store.transaction():
                    minutes = [h["after_minutes"] for h in store.webhooks() if "deaf" in h["events"]]
                if minutes:
                    webhooks.queue_deaf(Mailbox(store, host=""))
                    shortest = min(minutes)
            with store.transaction():
                due = store.next_webhook_due()
            now = model.now()
            claimed = []
            if room and due is not None and model.parse_iso(due) <= now:  # a write only when something is due
                with store.transaction(write=True):
                    claimed = store.claim_webhook_deliveries(
                        self.holder, model.iso(now), model.iso(now + model.timedelta(seconds=LEASE_SECONDS)), room)
                    due = store.next_webhook_due()
            return claimed, shortest, due, now

        claimed, shortest, due, now = await self.db(step)
        if look_deaf:  # a deaf webhook added meanwhile is noticed at the next look, DEAF_LOOK_MAX_SECONDS at most
            self.deaf_at = loop.time() + (DEAF_LOOK_MAX_SECONDS if shortest is None else
                                          min(max(shortest * 6, DEAF_LOOK_MIN_SECONDS), DEAF_LOOK_MAX_SECONDS))
        pauses = [self.deaf_at - loop.time()]
        if due is not None:
            pauses.append((model.parse_iso(due) - now).total_seconds())
        if not room:
            pauses.append(0.5)  # busy: look again once some POSTs are done
        return (claimed or None), max(min(pauses), 0.05)

    async def _deliver(self, delivery: dict) -> None:
        payload = delivery["payload"]
        body = webhooks.body_of(payload, delivery["format"])
        headers = {"Content-Type": "application/json", "User-Agent": f"agent-mail/{__version__}",
                   webhooks.DELIVERY_HEADER: delivery["id"], "X-Agent-Mail-Event": delivery["kind"],
                   webhooks.SIGNATURE_HEADER: webhooks.signature(delivery["secret"], body)}
        loop = asyncio.get_running_loop()
        started = loop.time()
        status, error = await anyio.to_thread.run_sync(post, delivery["url"], body, headers,
                                                       webhooks.POST_TIMEOUT_SECONDS, limiter=self.limiter)
        took = round((loop.time() - started) * 1000, 1)

        def settle(store):
            now = model.now()
            state, due_at = webhooks.outcome(status, error, delivery["attempts"], delivery["created"], now)
            with store.transaction(write=True):
                kept = store.settle_webhook_delivery(delivery["id"], self.holder, state, status,
                                                     error or (f"HTTP {status}" if state != "delivered" else None),
                                                     due_at, model.iso(now))
            return state, kept

        try:
            with anyio.CancelScope(shield=True):
                state, kept = await self.db(settle)
        except errors.AgentMailError as exc:
            self.log(level="warning", webhook=delivery["webhook_id"], delivery=delivery["id"],
                     webhooks=f"could not record the attempt ({exc}); it is tried again when its lease ends")
            return
        self.log(webhook=delivery["webhook_id"], delivery=delivery["id"], kind=delivery["kind"],
                 url=webhooks.shown_url(delivery["url"]), status=status, error=error, outcome=state,
                 attempt=delivery["attempts"] + 1, ms=took, **({} if kept else {"lease": "lost"}))
