"""`agent-mail serve`: the mailbox its own AGENT_MAIL_DB resolves, served over HTTP (Starlette on uvicorn, the
`server` extra), so agents on other machines reach it with AGENT_MAIL_DB=http(s)://HOST:PORT and a token.

API: `POST /v1/call/COMMAND`, a JSON object of the command's values by argument name, `Authorization: Bearer
TOKEN`. Each call is checked by the call layer (agent_mail.calls) exactly as the command line's are, then by the
token's grant (agent_mail.server.grants), then carried out on the mailbox; the answer is the command's own result
document (its `next` steps as the command line's strings) with the exit code the command would have in the
X-Agent-Mail-Exit header, or {error, problems} with an HTTP status matching it. Files never come from or go to
this machine on a client's behalf: a send's attachments and refs arrive as content and text, saved attachments
leave as content, and the arguments that name a file here are refused.

Each call runs in a worker thread. On PostgreSQL it borrows a store from a pool of POOL_SIZE connected ones
(store/pool.py); on SQLite it opens the file for itself. A blocked wait (a watch, a follow or dashboard look, an MCP
watch, a hook's waiter) holds neither a thread nor a connection while it waits: it awaits, on the event loop, the
wake-up of the server's one watcher of the mailbox's changes (agent_mail.server.waits: on PostgreSQL its LISTEN
connection, store/postgres_hub.py, so the server's connections number POOL_SIZE + 1 whatever the number of waits;
on SQLite its wake-up pipes, store/sqlite_bells.BellHub). SIGTERM ends the waits at once (each answers 503) and
then the server. See docs/design.md.

Beside the commands, two looks (agent_mail.server.looks): POST /v1/follow, an identity's notification documents
for a client that writes its mirror on its own machine, and POST /v1/dashboard, the supervisor's views; each may
wait for a change (`after`, `wait_seconds`) as a watch waits.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import threading
import time

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_mail import __version__, calls, errors, jsonout, model, spec
from agent_mail.protocols import http_api, wire
from agent_mail.parts import checks
from agent_mail.server import certs, console, grants, metrics, openapi, stops
from agent_mail.operations import tokens
from agent_mail.server.edge import (BEARER_CHALLENGE, CUT_KEY, MAX_HEAD_BYTES, Admitted, Dated, EdgeProtocol, Gate,
                                    Penalties, admitted, forwarded_from, is_loopback, listen_address, log, read_body,
                                    spool_upload)
from agent_mail.server.versions import Versioned
from agent_mail.server.waits import ServedWaits, Stopping
from agent_mail.parts.waits import HungUp, Released, asked_when_woken

EXIT_HEADER, NAMES_HEADER = http_api.EXIT_HEADER, http_api.NAMES_HEADER
SERVED, LOCAL_TO_CLIENT, EXTRAS = openapi.SERVED, openapi.LOCAL_TO_CLIENT, openapi.EXTRAS
DEFAULT_LISTEN = "127.0.0.1:8025"
# Calls carried out at once on SQLite (and MCP tool calls): a call holds a worker thread only while it runs (no wait
# holds one), and SQLite takes one writer at a time, so more would only queue in threads; a burst of a thousand
# requests (each checked in a thread) would otherwise leave as many idle threads behind (issue 27).
CALL_THREADS = 64
MAX_THREADS = 1000  # waits blocked in threads, apart from the calls', where a SQLite server cannot use pipes
# PostgreSQL connections for calls (and the looks of waits): the server's calls are short and mostly the database's
# work, so a few more than the cores of a typical host keep it busy; more would only queue inside PostgreSQL.
POOL_SIZE = 8
# How often a server looks for tokens that expired (or whose rotation's grace ended), to end the waits made with them.
EXPIRY_LOOK_SECONDS = float(os.environ.get("AGENT_MAIL_SERVE_EXPIRY_SECONDS", "30"))
_STOPPING = threading.Event()
_CARRIERS: list = []  # every app's _Carrier in this process, for SIGTERM


class _Carrier:
    """How the calls of one served mailbox are carried out: on PostgreSQL a pool of stores, at most POOL_SIZE
    calls at once, and the waits on the server's LISTEN connection; on SQLite a store opened per call, and the
    waits on the server's wake-up pipes (a thread each only where pipes cannot be used: _pipes_here)."""

    def __init__(self, location: str):
        from agent_mail.store import backend_name

        self.location = location
        self.pooled = backend_name(location) == "postgresql"
        self.pool = self.limiter = self.waits = self.own_limiter = None
        self.instance = secrets.token_hex(6)  # the holder named in the ids of the sessions of its waits
        _CARRIERS.append(self)

    def ready(self) -> None:
        """Made in the event loop (anyio's limiters belong to it), on the first call."""
        if self.limiter is not None:
            return
        if self.pooled:
            from agent_mail.operations import mail
            from agent_mail.store.pool import StorePool

            self.pool = StorePool(self.location, POOL_SIZE)
            self.limiter = anyio.CapacityLimiter(POOL_SIZE)
            self.waits = ServedWaits(self.location, self.pool, self.limiter, mail.Mailbox, self.instance)
        else:
            self.limiter = anyio.CapacityLimiter(CALL_THREADS)
            if _pipes_here():  # the waits on the event loop, woken by the mailbox's wake-up pipes (issue 27)
                from agent_mail.operations import mail
                from agent_mail.store.pool import StorePool

                self.waits = ServedWaits(self.location, StorePool(self.location, POOL_SIZE),
                                         anyio.CapacityLimiter(POOL_SIZE), mail.Mailbox, self.instance)

    def store(self, own: bool = False):
        """A context manager giving a store for one call (`own`: a connection of its own, outside the pool, for a
        call that may block in its thread)."""
        if self.pool is not None and not own:
            return self.pool.store()
        from contextlib import closing

        from agent_mail.store import open_store

        return closing(open_store(self.location))

    async def run(self, function, *args, own: bool = False):
        """`function(*args)` in a worker thread: within the pool's limit (SQLite: CALL_THREADS), or (`own`: a call
        that may block) within MAX_THREADS of their own, so waits never hold the threads a call needs (a send that
        would wake them, a status: issue 27)."""
        if own:
            if self.own_limiter is None:
                self.own_limiter = anyio.CapacityLimiter(MAX_THREADS)
            return await anyio.to_thread.run_sync(function, *args, limiter=self.own_limiter)
        return await anyio.to_thread.run_sync(function, *args, limiter=self.limiter)

    def stop_waits(self) -> None:
        if self.waits is not None:
            self.waits.stop_all()

    def close(self) -> None:
        if self.waits is not None:
            self.waits.close()
            if self.pool is None:
                self.waits.pool.close()
        if self.pool is not None:
            self.pool.close()


def _pipes_here() -> bool:
    """Whether a SQLite mailbox's waits can be woken by its wake-up pipes here (not where AGENT_MAIL_POLL asks for
    polling, nor on a system without named pipes): else each blocks in a thread of its own, as before."""
    return hasattr(os, "mkfifo") and not os.environ.get("AGENT_MAIL_POLL")




class _Wait:
    """A watch (or a hook's waiter: `steps`, operations.telling.ServedWaiter) to wait for on the server's event loop:
    what _carry_out checked for it."""

    def __init__(self, values: dict, grant: dict, key: str | None, steps=None, host: str = ""):
        self.values, self.grant, self.key, self.steps, self.host = values, grant, key, steps, host
        minutes = values.get("timeout_minutes") or model.WATCH_MINUTES_DEFAULT
        self.seconds = values["timeout_seconds"] if values.get("timeout_seconds") is not None else minutes * 60.0


def _status(error: errors.AgentMailError) -> int:
    if isinstance(error, HungUp):
        return 499  # logged only (nginx's "client closed request")
    if getattr(error, "http_status", None):
        return error.http_status
    if isinstance(error, errors.Forbidden):
        return 401 if error.unauthenticated else 403
    if error.exit_code == errors.EXIT_INVALID:
        return 400
    return 503 if isinstance(error, errors.StorageError) else 500


def _document(payload: object, status: int, code: int, delivery: str | None = None) -> Response:
    headers = {EXIT_HEADER: str(code)}
    if delivery is not None:
        headers[http_api.DELIVERY_HEADER] = delivery
    return Response(jsonout.dumps(payload, end="\n"), status, media_type=http_api.JSON, headers=headers)


def _grant(request: Request) -> dict:
    """The grant the Gate admitted the request with (edge.admitted): the only way a route learns who calls."""
    return admitted(request.scope).grant


def _given(name: str, body: bytes) -> dict:
    try:
        given = json.loads(body or b"{}")
    except (ValueError, RecursionError) as exc:
        raise errors.InvalidInput([(None, f"the request body is not JSON ({exc}); send a JSON object of the "
                                          f"values of {name} by argument name.")]) from None
    if not isinstance(given, dict):
        raise errors.InvalidInput([(None, f"the request body must be a JSON object of the values of {name} by "
                                          "argument name.")])
    return given


def _uploads(given: dict) -> dict:
    """A send's content read on the client's machine: {refs, attachments: [{name, content}]}."""
    import base64
    import binascii

    files, refs = given.pop("upload_attachments", None) or [], given.pop("client_refs", None) or []
    problems, attachments = [], []
    if not isinstance(files, list) or not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise errors.InvalidInput([(None, "upload_attachments and client_refs must be lists.")])
    for upload in files:
        try:
            content = base64.b64decode(upload["content_base64"], validate=True)
            if not isinstance(upload["name"], str):
                raise TypeError
            attachments.append({"name": upload["name"], "content": content})
        except (KeyError, TypeError, ValueError, binascii.Error):
            problems.append(("attach", "each upload is {name, content_base64} (standard base64)."))
    if problems:
        raise errors.InvalidInput(problems)
    return {"refs": refs, "attachments": attachments}


def client_host(named: str | None) -> str:
    """The machine a client named in http_api.HOST_HEADER (model.host_shown's form), recorded with what its call
    does for display only; "" when it named none; InvalidInput when what it named is no machine's name."""
    if named is None:
        return ""
    problem = model.host_problem(named)
    if problem:
        raise errors.InvalidInput([(http_api.HOST_HEADER, f"{problem} Nothing was done.")])
    return named


def _carry_out(carrier: _Carrier, name: str, grant: dict, body: bytes, info: dict, gone: threading.Event,
               named_host: str | None = None):
    """Check, grant and run one call (of the token the Gate admitted) on a store of its own; the result (or, for a
    watch that waits on PostgreSQL, the _Wait the event loop carries out). `named_host`: the client's machine as its
    request named it (http_api.HOST_HEADER)."""
    from agent_mail.operations import mail

    with carrier.store() as store:
        host = client_host(named_host)
        given = _given(name, body)
        whole = dict(given)
        extras = {key: given.pop(key) for key in EXTRAS.get(name, ()) if key in given and key != "upload_attachments"
                  and key != "client_refs"}
        uploaded = _uploads(given) if name == "send" else None
        local = [(key, "names a file on the server's machine; the client reads and writes files on its own machine "
                       "(run the command through agent-mail with AGENT_MAIL_DB naming this server).")
                 for key in LOCAL_TO_CLIENT.get(name, ()) if given.get(key) not in (None, False, [])]
        values = calls.check(name, given, skip=LOCAL_TO_CLIENT.get(name, ()), also=local, with_inputs=False)
        info["as"] = grants.check(grant, name, values)
        openapi.refuse_off_schema(http_api.call_path(name), whole)  # what the call layer lets by: a null, "30"
        mailbox = mail.Mailbox(store, host=host)
        mailbox.publish_due()
        if uploaded is not None:
            values["uploaded"] = {**uploaded, "key": extras.get("idempotency_key")}
        values.update(openapi.carried(name, extras))
        delivery = _delivery(values, extras.get("deliver")) if name == "read" else None
        if name in openapi.WAITS:
            key = _bound_wait(carrier, name, values, extras, store, grant, gone)
            if carrier.waits is not None and name == "watch" and not values["once"]:
                values.pop("wanted")
                return _Wait(values, grant, key, host=host)
            if carrier.waits is not None and name == "hook":  # a waiter's wait, armed here, awaited on the loop
                from agent_mail.operations import telling

                checks.guard("hook", {k: v for k, v in values.items() if k != "wanted"})
                steps = telling.served_waiter(mailbox, **values)
                if steps is not None:
                    values.pop("wanted", None)
                    return _Wait(values, grant, None, steps, host=host)
        result = calls.run(name, values, mailbox=mailbox)
        if name == "doctor":  # its health, never where the server keeps the mailbox
            result = grants.without_location(result, carrier.location)
        if delivery is not None and delivery.held:
            info["delivery"] = delivery.id
        if name == "attachments" and extras.get("with_content") is True:
            result = {**result, "contents": _contents(store, result["attachments"])}
        return result


def _delivery(values: dict, deliver: object):
    """read with deliver=confirm: the Delivery its marks are held for (agent_mail.operations.deliveries), when it
    marks."""
    if deliver is None:
        return None
    if deliver != "confirm":
        raise errors.InvalidInput([("deliver", f"is 'confirm' (hold the marks until POST {http_api.DELIVERED_PATH}), "
                                               "or left out.")])
    if values["no_mark_read"] and not values["ack"] or values["thread"] is not None or values["archived"]:
        return None  # it marks nothing
    from agent_mail.operations.deliveries import Delivery

    values["delivery"] = Delivery()
    return values["delivery"]


def _settle(carrier: _Carrier, grant: dict, body: bytes, info: dict) -> dict:
    """POST /v1/delivered: a delivery confirmed or cancelled (agent_mail.operations.deliveries.settle)."""
    from agent_mail.operations import deliveries, mail

    with carrier.store() as store:
        given = _given("delivered", body)
        delivery, printed = deliveries.checked(given)
        openapi.refuse_off_schema(http_api.DELIVERED_PATH, given)

        def may_act_as(agent: str) -> None:
            info["as"] = grants.check(grant, "read", {"agent": agent, "no_mark_read": False, "thread": None,
                                                      "archived": False, "ack": False})
        return deliveries.settle(mail.Mailbox(store), delivery, printed, may_act_as)


def _bound_wait(carrier: _Carrier, name: str, values: dict, extras: dict, store, grant: dict,
                gone: threading.Event) -> str | None:
    """A wait, ended by a stopping server, a revoked token or a client that hung up; a watch's also by its client's
    stop call (its session released, from any replica: agent_mail.server.stops). A watch's client that hung up
    leaves its session abandoned (stale at once, as a killed watch's); a hook's waiter's is released as it ends
    (a harness ends its waiter routinely, and that client makes no stop call). The watch's stop_key, checked."""
    key = stops.checked_key(extras.get("stop_key")) if name == "watch" else None
    session = stops.session_id(carrier.instance, key) if name == "watch" and carrier.waits is None else None
    wait = extras.get("wait_seconds")
    if wait is not None and not values["once"]:
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or \
                not 0 < wait <= model.WATCH_MINUTES_MAX * 60:
            raise errors.InvalidInput([("wait_seconds", "must be a number of seconds within the watch's limits.")])
        values["timeout_minutes"] = None
        values["timeout_seconds"] = float(wait)

    def wanted() -> bool:
        if _STOPPING.is_set():
            raise Stopping()
        tokens.still_valid(store, grant)
        if session is None:
            return not gone.is_set()
        if gone.is_set():
            raise HungUp()
        with store.transaction():
            if store.session_state(session) == "released":
                raise Released()
        return True
    if not values["once"]:
        values["wanted"] = asked_when_woken(wanted)  # each thing it asks comes with a wake-up (_hung_up wakes)
        if session is not None:
            values["session"] = session
    return key


def _look(location: str, look: str, grant: dict, body: bytes, info: dict, gone: threading.Event) -> dict:
    """POST /v1/follow or /v1/dashboard (agent_mail.server.looks): check, grant, wait if asked, read.
    SQLite: the wait blocks this thread. (PostgreSQL: _look_checked and _look_once, the wait on the hub.)"""
    from agent_mail.server import looks
    from agent_mail.operations import mail
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        values = _look_checked(look, grant, body, info)

        def wanted() -> bool:
            if _STOPPING.is_set():
                raise Stopping()
            tokens.still_valid(store, grant)
            return not gone.is_set()
        asked_when_woken(wanted)  # each thing it asks comes with a wake-up (_hung_up wakes the waits)
        mailbox = mail.Mailbox(store)
        return looks.follow(mailbox, values, wanted) if look == "follow" else \
            looks.dashboard(mailbox, values, wanted)
    finally:
        store.close()


def _will_wait(body: bytes) -> bool:
    """Whether a look asks to wait (`after` and `wait_seconds`): it then runs among the waits' threads; one that
    answers at once among the calls', never queued behind a thousand waits (a malformed body: refused at once)."""
    try:
        given = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        return False
    return isinstance(given, dict) and given.get("after") is not None and given.get("wait_seconds") is not None


def _look_checked(look: str, grant: dict, body: bytes, info: dict) -> dict:
    """A look's values checked, and granted to the token the Gate admitted."""
    from agent_mail.server import looks

    given = _given(look, body)
    values = looks.check_follow(given) if look == "follow" else looks.check_dashboard(given)
    openapi.refuse_off_schema(http_api.FOLLOW_PATH if look == "follow" else http_api.DASHBOARD_PATH, given)
    info["as"] = looks.grant(grant, look, values)
    return values


def _look_once(carrier: _Carrier, look: str, grant: dict, values: dict, first: bool) -> tuple[dict | None, object]:
    """One look of a wait on the hub (PostgreSQL), on a pooled store: (the answer, or None while nothing changed
    since `after`; the seconds until a delayed message for the identity falls due, or None). The token is asked
    about again at each look but the first (a look runs when woken: a revocation wakes every wait)."""
    from agent_mail.server import looks
    from agent_mail.operations import mail
    from agent_mail.parts.waits import Waits

    with carrier.store() as store:
        if not first:
            tokens.still_valid(store, grant)
        mailbox = mail.Mailbox(store)
        mailbox.publish_due()
        waiting = values["wait_seconds"] is not None and values["after"] is not None
        if look == "follow":
            if waiting and looks.documents(mailbox, values["agent"])["fingerprint"] == values["after"]:
                return None, Waits(mailbox).next_due(values["agent"])
            return looks.follow(mailbox, {**values, "wait_seconds": None}, None), None
        if waiting and (store.mail_marker() or 0) == values["after"]:
            return None, None
        return looks.dashboard(mailbox, {**values, "wait_seconds": None}, None), None


def _stop_wait(carrier: _Carrier, grant: dict, body: bytes, info: dict) -> dict:
    """POST /v1/watch/stop (agent_mail.server.stops): check, grant, release the wait's session."""
    with carrier.store() as store:
        given = _given("the stop call", body)
        values = stops.check(given)
        openapi.refuse_off_schema(http_api.STOP_PATH, given)
        info["as"] = stops.grant(grant, values)
        return stops.stop(store, values)


def _contents(store, listed: list[dict]) -> dict:
    import base64

    with store.transaction():
        return {a["sha256"]: base64.b64encode(store.attachment_content(a["sha256"]) or b"").decode("ascii")
                for a in listed}


def _export_file(carrier: _Carrier, grant: dict, body: bytes, info: dict, directory: str) -> dict:
    """An export written whole into `directory` on this machine (then streamed to the client, who writes it on
    its own); its summary."""
    from agent_mail.operations import mail

    with carrier.store() as store:
        given = _given("export", body)
        local = [("output", "the client writes the export on its own machine (--output there, or stdout).")] \
            if given.get("output") is not None else []
        values = calls.check("export", given, skip=("output",), also=local, with_inputs=False)
        openapi.refuse_off_schema(http_api.EXPORT_PATH, given)
        info["as"] = grants.check(grant, "export", values)
        values["output"] = os.path.join(directory, "export")
        return calls.run("export", values, mailbox=mail.Mailbox(store))


def _authenticated(carrier: _Carrier, token: str) -> dict:
    """The grant of a presented token (tokens.authenticate): the Gate's one look-up for a request."""
    with carrier.store() as store:
        return tokens.authenticate(store, token)


def _import_file(carrier: _Carrier, grant: dict, path: str, dry_run: bool, info: dict) -> dict:
    """The uploaded export at `path` imported (all or nothing); its result, naming no file of this machine."""
    from agent_mail.operations import mail

    with carrier.store() as store:
        tokens.still_valid(store, grant)
        values = calls.check("import", {"file": path, "dry_run": dry_run}, with_inputs=False)
        info["as"] = grants.check(grant, "import", values)
        result = calls.run("import", values, mailbox=mail.Mailbox(store))
        return {**result, "file": None, "next": []}


def _namer(name: str, request: Request):
    command = spec.COMMANDS.get(name)
    if command is not None and request.headers.get(NAMES_HEADER) == "flags":
        return checks.flag_namer(command)
    return lambda key: key


async def _hung_up(request: Request, carrier: _Carrier, gone: threading.Event, hung_up: anyio.Event,
                   name: str) -> None:
    """Set `gone` and `hung_up` when the client hangs up (the request's body is read: what comes next is the
    disconnect, and nothing polls for it). A wait in a thread of its own (SQLite) is woken to notice."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    gone.set()
    hung_up.set()
    if carrier.waits is None:
        await anyio.to_thread.run_sync(_wake_waits, carrier.location)


async def _call(carrier: _Carrier, name: str, request: Request, body: bytes, info: dict) -> dict:
    """Carry out one call: in a worker thread, and a watch that waits on PostgreSQL on the event loop."""
    carrier.ready()
    gone, hung_up = threading.Event(), anyio.Event()
    since = admitted(request.scope).since  # read before the token was looked up
    # A client that hangs up ends its wait: watched by a plain task, cancelled at the end (a task group's cancel
    # scope costs ~20 times as much, a thousand times over when a broadcast answers every wait at once).
    watching = asyncio.get_running_loop().create_task(_hung_up(request, carrier, gone, hung_up, name)) \
        if name in openapi.WAITS else None
    try:
        result = await carrier.run(_carry_out, carrier, name, _grant(request), body, info, gone,
                                   request.headers.get(http_api.HOST_HEADER),
                                   own=carrier.waits is None and name in openapi.WAITS)
        if isinstance(result, _Wait):
            result = await carrier.waits.wait(result.values["agent"], result.seconds, result.grant, since, hung_up,
                                              result.key, result.steps, host=result.host)
            if result is None:  # nobody to answer
                raise HungUp()
        return result
    finally:
        if watching is not None:
            watching.cancel()


async def _look_on_the_hub(carrier: _Carrier, request: Request, look: str, body: bytes, info: dict,
                           gone: threading.Event, hung_up: anyio.Event) -> dict:
    """A look (follow, dashboard) on PostgreSQL: checked and read on pooled stores, its wait on the server's LISTEN
    connection (ServedWaits.until_changed: woken by the identity's mail, or by every message for the dashboard)."""
    grant = _grant(request)
    values = await carrier.run(_look_checked, look, grant, body, info)  # the body parsed off the event loop
    answer, until_due = await carrier.run(_look_once, carrier, look, grant, values, True)
    if answer is not None:
        return answer
    watching = asyncio.get_running_loop().create_task(_hung_up(request, carrier, gone, hung_up, look))
    try:
        async def again():
            return await carrier.run(_look_once, carrier, look, grant, values, False)
        key = values["agent"] if look == "follow" else ""  # "": the channel every commit notifies
        answer = await carrier.waits.until_changed(key, values["wait_seconds"], again, hung_up)
        if answer is None and hung_up.is_set():
            raise HungUp()
        if answer is None:  # the wait is over: what there is now
            answer, _ = await carrier.run(_look_once, carrier, look, grant, {**values, "wait_seconds": None}, False)
        return answer
    finally:
        watching.cancel()


async def _answered(request: Request, name: str, work, namer=None, status: int | None = None) -> Response:
    """The answer to a request: `await work(info)` (a Response, or a document answered with exit 0), or its
    error as {error, problems} (named by `namer`, with HTTP `status` rather than the error's when given); logged
    as one line (no secrets)."""
    started = time.monotonic()
    admission = request.scope.get(Gate.GRANT_KEY)  # the token's id, when the Gate admitted one
    info: dict = {"token_id": admission.grant["id"] if isinstance(admission, Admitted) else None, "as": None}
    detail = None  # what the log says beyond what the client was told (where the database is, a bug's text)
    try:
        done = await work(info)
        response = done if isinstance(done, Response) else _document(done, 200, errors.EXIT_OK)
    except errors.AgentMailError as exc:
        shown = exc.renamed(namer) if namer is not None else exc
        if isinstance(shown, errors.StorageError) and not _operator(request):
            detail, shown = shown.message, shown.for_callers()
        response = _document(shown.payload(), status or _status(exc), exc.exit_code)
    except Exception as exc:  # a bug: still JSON, never a traceback; its text (a driver's may name the database's
        # host) to the log only
        detail = f"internal error ({type(exc).__name__}: {exc})"[:2000]
        response = _document({"error": f"internal error ({type(exc).__name__}). Nothing was changed. Please report "
                                       "this (the server's log has its text).", "problems": []}, 500,
                             errors.EXIT_FAILED)
    if response.status_code == 401:
        response.headers["WWW-Authenticate"] = BEARER_CHALLENGE
    failed = {}  # a server error's text (what the client was told: never a token, a URL's password is redacted)
    if response.status_code >= 500 and response.media_type == http_api.JSON:
        try:
            failed = {"error": json.loads(response.body)["error"]}
        except (ValueError, KeyError, TypeError):
            pass
    if detail is not None and detail != failed.get("error"):
        failed["detail"] = detail
    cut = request.scope.get(CUT_KEY)  # the protocol answered 408 at the request's deadline: what the client got
    log(method=request.method, path=request.url.path, command=name, token_id=info["token_id"],
         **{"as": info["as"]}, status=408 if cut else response.status_code,
         exit=errors.EXIT_INVALID if cut else int(response.headers[EXIT_HEADER]),
         ms=round((time.monotonic() - started) * 1000, 1), **({"refused": cut} if cut else failed))
    return response


def _operator(request: Request) -> bool:
    """Whether the request's token, as the Gate admitted it, is an operator's ('*'): told where the database is."""
    admission = request.scope.get(Gate.GRANT_KEY)
    return isinstance(admission, Admitted) and "*" in admission.grant["agents"]


def app_for(location: str) -> Starlette:
    """The ASGI application serving the mailbox at `location`."""
    carrier = _Carrier(location)

    async def call(request: Request) -> Response:
        name = request.path_params["command"]

        async def carry_out(info: dict) -> Response:
            if name not in SERVED:
                raise errors.InvalidInput([(None, f"{name!r} is not a command this server carries out; it serves "
                                                  f"{', '.join(SERVED)}.")])
            body = await read_body(request)
            result = await _call(carrier, name, request, body, info)
            return _document(result, 200, openapi.exit_code(name, result), info.get("delivery"))
        return await _answered(request, name, carry_out, _namer(name, request), None if name in SERVED else 404)

    async def transfer(request: Request) -> Response:
        """POST /v1/export (JSON values; the export as the body, its summary in a header) and POST /v1/import
        (the export as the body, ?dry_run=true)."""
        import shutil
        import tempfile

        name = request.url.path.rsplit("/", 1)[1]
        directory = tempfile.mkdtemp(prefix="agent-mail-serve-")
        kept = []  # the export streamed from the directory, which its stream removes once sent

        async def carry_out(info: dict):
            if name == "export":
                body = await read_body(request)
                carrier.ready()
                summary = await carrier.run(_export_file, carrier, _grant(request), body, info, directory)
                path = os.path.join(directory, "export")
                summary = {key: value for key, value in summary.items() if key not in ("file", "next")}

                async def content():
                    try:
                        with open(path, "rb") as source:
                            while chunk := await anyio.to_thread.run_sync(source.read, 1 << 20):
                                yield chunk
                    finally:
                        shutil.rmtree(directory, ignore_errors=True)
                from starlette.responses import StreamingResponse

                kept.append(True)
                return StreamingResponse(content(), 200, media_type=http_api.JSON_LINES if summary["format"]
                                         == "jsonl" else http_api.MBOX,
                                         headers={EXIT_HEADER: "0", http_api.RESULT_HEADER: json.dumps(summary),
                                                  "Content-Length": str(summary["bytes"])})
            carrier.ready()
            grant = _grant(request)
            grants.check(grant, "import", {})  # an operator's, before a byte of the upload is spooled here
            path = os.path.join(directory, "upload.jsonl")
            await spool_upload(request, path)
            dry_run = request.query_params.get("dry_run", "false").lower()
            if dry_run not in ("true", "false"):
                raise errors.InvalidInput([("dry_run", "is true or false.")])
            return await carrier.run(_import_file, carrier, grant, path, dry_run == "true", info)
        try:
            return await _answered(request, name, carry_out, _namer(name, request))
        finally:
            if not kept:
                shutil.rmtree(directory, ignore_errors=True)

    async def looks(request: Request) -> Response:
        """POST /v1/follow and /v1/dashboard: a look that may wait (ended early by a client that hangs up)."""
        look = request.url.path.rsplit("/", 1)[1]

        async def answer(info: dict) -> dict:
            body = await read_body(request)
            carrier.ready()
            gone, hung_up, outcome = threading.Event(), anyio.Event(), []
            if carrier.waits is not None:  # PostgreSQL: the wait on the hub, no thread nor connection held
                return await _look_on_the_hub(carrier, request, look, body, info, gone, hung_up)
            async with anyio.create_task_group() as group:
                group.start_soon(_hung_up, request, carrier, gone, hung_up, look)
                try:  # a look that waits blocks its thread (among the waits'), on a connection of its own
                    outcome.append(await carrier.run(_look, location, look, _grant(request), body, info, gone,
                                                     own=_will_wait(body)))
                except Exception as exc:  # raised below, out of the task group (which would wrap it)
                    outcome.append(exc)
                finally:
                    group.cancel_scope.cancel()
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            return outcome[0]
        return await _answered(request, look, answer)

    def carried_by(name: str, function):
        """An endpoint whose JSON body `function(carrier, grant, body, info)` answers in a worker thread:
        POST /v1/delivered (a read's delivery confirmed or cancelled) and POST /v1/watch/stop (a watch's client,
        stopped by a signal, releasing its wait's session)."""
        async def endpoint(request: Request) -> Response:
            async def carry_out(info: dict) -> dict:
                body = await read_body(request)
                carrier.ready()
                return await carrier.run(function, carrier, _grant(request), body, info)
            return await _answered(request, name, carry_out)
        return endpoint

    async def health(request: Request) -> Response:
        """Liveness: the process answers (nothing asked of the database)."""
        return _document({"ok": True, "stopping": _STOPPING.is_set()}, 200, errors.EXIT_OK)

    async def ready(request: Request) -> Response:
        """Readiness (agent_mail.server.metrics.readiness): 503 with the reason while calls cannot be served."""
        found = ("the server is stopping.",) * 2 if _STOPPING.is_set() else None
        if found is None:
            carrier.ready()
            try:
                with anyio.fail_after(metrics.READY_SECONDS + 1):
                    found = await anyio.to_thread.run_sync(metrics.readiness, location, abandon_on_cancel=True)
                    if found is None:  # a store as a call's, read through: a schema can be right and calls fail
                        found = await anyio.to_thread.run_sync(metrics.store_readiness,
                                                               lambda: carrier.store(own=True),
                                                               abandon_on_cancel=True)
            except TimeoutError:
                found = (f"the database did not answer within {metrics.READY_SECONDS + 1} s.",) * 2
        if found is not None:
            reason, detail = found
            log(method="GET", path=request.url.path, status=503, exit=errors.EXIT_FAILED, error=reason,
                **({"detail": detail} if detail != reason else {}))
            return _document({"ok": False, "ready": False, "reason": reason, "stopping": _STOPPING.is_set()}, 503,
                             errors.EXIT_FAILED)
        return _document({"ok": True, "ready": True, "reason": None, "stopping": False}, 200, errors.EXIT_OK)

    async def scrape(request: Request) -> Response:
        """GET /metrics: a supervisor's or an operator's token (the counters are of every identity's traffic)."""
        async def carry_out(info: dict) -> Response:
            grant = _grant(request)
            if not grant["supervisor"] and "*" not in grant["agents"]:
                raise errors.Forbidden(f"{grants.scope(grant)}; {http_api.METRICS_PATH} is read with a supervisor's "
                                       "or an operator's token (agent-mail token create --supervisor).")
            return Response(counted.text(), 200, media_type=metrics.CONTENT_TYPE, headers={EXIT_HEADER: "0"})
        return await _answered(request, "metrics", carry_out)

    async def authenticate(token: str) -> Admitted:
        """The Gate's check, once per request (every route takes its grant: edge.admitted), and the waits'
        generation read before it."""
        carrier.ready()
        since = carrier.waits.generation if carrier.waits is not None else 0
        return Admitted(await carrier.run(_authenticated, carrier, token), since)

    counted = metrics.Metrics((*(http_api.call_path(name) for name in SERVED), *_GUARDED, http_api.HEALTH_PATH,
                               http_api.HEALTH_LIVE_PATH, http_api.HEALTH_READY_PATH, http_api.OPENAPI_PATH,
                               http_api.METRICS_PATH))
    counted.samplers.append(lambda: _sampled(carrier))

    async def described(request: Request) -> Response:
        return _document(openapi.document(__version__), 200, errors.EXIT_OK)

    def waits():
        carrier.ready()
        return carrier.waits

    # MCP over streamable HTTP (agent_mail.server.mcp_http), its session manager run by the app's lifespan; its
    # blocked watches on the same waits as the API's.
    mcp = _mcp_endpoint(location, waits)
    # The web console at /ui/ (agent_mail.server.console): its login through the Gate's look-up and back-off, its
    # actions through _carry_out as /v1's calls.
    penalties = Penalties()
    ui = console.Console(carrier, authenticate, penalties, console.call_for(_carry_out))
    return Starlette(routes=[*ui.routes(),
                             Route(http_api.call_path("{command}"), call, methods=["POST"]),
                             Route(http_api.EXPORT_PATH, transfer, methods=["POST"]),
                             Route(http_api.IMPORT_PATH, transfer, methods=["POST"]),
                             Route(http_api.DELIVERED_PATH, carried_by("delivered", _settle), methods=["POST"]),
                             Route(http_api.FOLLOW_PATH, looks, methods=["POST"]),
                             Route(http_api.DASHBOARD_PATH, looks, methods=["POST"]),
                             Route(http_api.STOP_PATH, carried_by("stop_watch", _stop_wait), methods=["POST"]),
                             Route(http_api.HEALTH_PATH, health, methods=["GET"]),
                             Route(http_api.HEALTH_LIVE_PATH, health, methods=["GET"]),
                             Route(http_api.HEALTH_READY_PATH, ready, methods=["GET"]),
                             Route(http_api.METRICS_PATH, scrape, methods=["GET"]),
                             Route(http_api.OPENAPI_PATH, described, methods=["GET"]),
                             Route(http_api.MCP_PATH, mcp, methods=["GET", "POST", "DELETE"])],
                     lifespan=getattr(mcp, "lifespan", None), exception_handlers={HTTPException: _not_routed},
                     middleware=[Middleware(Dated), Middleware(Versioned),
                                 Middleware(metrics.Counting, metrics=counted),
                                 Middleware(Gate, authenticate=authenticate, guarded=_guarded,
                                            penalties=penalties)])


# The paths whose token the Gate checks (before any body is read): every one that takes a token, a command's call
# under CALL_PATH besides.
_GUARDED = (http_api.EXPORT_PATH, http_api.IMPORT_PATH, http_api.DELIVERED_PATH, http_api.FOLLOW_PATH,
            http_api.DASHBOARD_PATH, http_api.STOP_PATH, http_api.MCP_PATH)


def _guarded(path: str, method: str) -> bool:
    """A request that takes a token: a POST to the API (another method is 405 without a look at it), GET /metrics,
    any request to /mcp (which authenticates every method first)."""
    if path == http_api.MCP_PATH:
        return True
    if path == http_api.METRICS_PATH:
        return method == "GET"
    return method == "POST" and (path.startswith(http_api.CALL_PATH) or path in _GUARDED)


def _sampled(carrier: _Carrier) -> list:
    """What the carrier reports when scraped: the pool's use (PostgreSQL), the waits' wake-ups (both backings, unless
    a SQLite server's waits block in threads), the hub's reconnections (PostgreSQL's hub)."""
    if carrier.limiter is None:
        return []
    families = [] if carrier.pool is None else [
                ("agent_mail_db_pool_size", "gauge", "Connections the pool may open for calls.",
                 [((), carrier.pool.size)]),
                ("agent_mail_db_pool_in_use", "gauge", "The pool's connections lent to calls now.",
                 [((), carrier.limiter.borrowed_tokens)]),
                ("agent_mail_db_pool_idle", "gauge", "The pool's connections open and idle now.",
                 [((), carrier.pool.open_count())])]
    if carrier.waits is not None:
        families.append(("agent_mail_wakeups_total", "counter", "Wake-ups of the served waits (a send to a waiting "
                         "identity, a broadcast, a revocation, a reconnection).", [((), carrier.waits.generation)]))
        reconnects = getattr(carrier.waits.hub, "reconnects", None)
        if isinstance(reconnects, int) and carrier.pool is not None:
            families.append(("agent_mail_hub_reconnects_total", "counter", "Reconnections of the LISTEN connection "
                             "that carries the waits.", [((), reconnects)]))
    return families


def _mcp_endpoint(location: str, waits):
    """The /mcp endpoint, or, without the mcp extra, an answer saying how to get it."""
    try:
        from agent_mail.server import mcp_http
    except ImportError as exc:
        why = f"MCP over HTTP needs the 'mcp' extra on the server, which is not installed ({exc}): pip install " \
              "'agent-mail[server]'."

        async def missing(request: Request) -> Response:
            return _document({"error": why, "problems": []}, 501, errors.EXIT_FAILED)
        return missing
    # A blocked MCP watch holds a thread only where a SQLite server cannot use pipes (then MAX_THREADS of them).
    from agent_mail.store import backend_name

    threads = CALL_THREADS if backend_name(location) != "sqlite" or _pipes_here() else MAX_THREADS
    return mcp_http.Endpoint(location, _STOPPING, log, threads, waits)

async def _not_routed(request: Request, exc: HTTPException) -> Response:
    """Starlette's own refusals (a path the API has not: 404; a method it is not called with: 405) in JSON with the
    exit code, like every other answer, and logged."""
    text = {404: f"{request.url.path} is not a path of the agent-mail API; calls are POST "
                 f"{http_api.CALL_PATH}COMMAND (GET {http_api.OPENAPI_PATH} describes them all).",
            405: f"{request.url.path} is not called with {request.method}; see GET {http_api.OPENAPI_PATH}."}.get(
        exc.status_code, str(exc.detail))
    response = _document(errors.InvalidInput([(None, text)]).payload(), exc.status_code, errors.EXIT_INVALID)
    response.headers.update(exc.headers or {})
    log(method=request.method, path=request.url.path, status=exc.status_code, exit=errors.EXIT_INVALID)
    return response


def _wake_waits(location: str) -> None:
    from agent_mail.store import open_store

    try:
        store = open_store(location)
        try:
            with store.transaction(write=True):
                store.wake_waits()
        finally:
            store.close()
    except errors.AgentMailError:
        pass  # each wait still ends at its next refresh


class Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM first ends the waits it carries (uvicorn would wait for them)."""

    location = ""

    def handle_exit(self, sig, frame) -> None:
        if not _STOPPING.is_set():
            _STOPPING.set()
            for carrier in _CARRIERS:
                carrier.stop_waits()  # the waits on the event loop
            threading.Thread(target=_wake_waits, args=(self.location,), daemon=True).start()  # those in threads
        super().handle_exit(sig, frame)
        stop = getattr(self, "_stop_now", None)
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)

    async def main_loop(self) -> None:
        """uvicorn's own loop wakes ten times a second, to see whether it should stop and to refresh its Date header
        (a quarter of a percent of a core: all an idle server would cost); this one sleeps until asked to stop
        (answers are dated as they are sent: edge.Dated), looking once a minute all the same."""
        import asyncio

        self._loop, self._stop_now = asyncio.get_running_loop(), asyncio.Event()
        counter, expiries_since = 0, model.now_iso()
        delivering = [self._loop.create_task(_deliveries(carrier).run()) for carrier in _CARRIERS]
        try:
            while not await self.on_tick(counter):
                counter = (counter + 10) % 864000
                try:
                    await asyncio.wait_for(self._stop_now.wait(), min(60.0, EXPIRY_LOOK_SECONDS))
                except TimeoutError:
                    pass
                if not self._stop_now.is_set() and not _STOPPING.is_set():
                    expiries_since = await anyio.to_thread.run_sync(_woken_by_expiries, self.location,
                                                                    expiries_since)
        finally:
            for task in delivering:
                task.cancel()


def _deliveries(carrier: _Carrier):
    """The webhooks' deliveries of a served mailbox (agent_mail.server.webhooks), on its waits' wake-ups."""
    from agent_mail.server.webhooks import Deliveries

    carrier.ready()
    if carrier.waits is not None:
        return Deliveries(carrier.waits, carrier.waits.db, carrier.instance, log)

    async def db(action):
        def run():
            with carrier.store() as store:
                return action(store)
        return await carrier.run(run)
    return Deliveries(None, db, carrier.instance, log)


def _woken_by_expiries(location: str, since: str) -> str:
    """Wake the waits when a token expired since `since` (tokens.wake_if_expired): a wait made with it then ends
    within EXPIRY_LOOK_SECONDS of its expiry, nothing else waking it. The time looked up to (`since` again when
    the mailbox could not be asked: looked at next time)."""
    from agent_mail.store import open_store

    now = model.now_iso()
    try:
        store = open_store(location)
        try:
            tokens.wake_if_expired(store, since, now)
        finally:
            store.close()
    except errors.AgentMailError:
        return since
    return now


def _more_descriptors() -> None:
    """Raise this process's soft limit of open descriptors to its hard limit (at most 1 << 20): each connection, and
    on SQLite each wait's wake-up pipe, is one, and the usual soft limit (1,024) would refuse the connections of a
    thousand waits. Every wait sleeps in poll or on the event loop, whatever the descriptors' numbers (issue 27)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        wanted = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ImportError, ValueError, OSError):
        pass  # kept as it is


def serve(listen: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
          insecure_no_tls: bool = False, forwarded_allow_ips: str | None = None) -> None:
    """Serve until SIGTERM / SIGINT."""
    import socket

    from agent_mail.operations import location as locating
    from agent_mail.store import open_store, redact_url

    host, port = listen_address(listen or DEFAULT_LISTEN)
    if not is_loopback(host) and not tls_cert and not insecure_no_tls:
        named = " (a name is not taken for loopback: give 127.0.0.1 or ::1)" if not host[:1].isdigit() and \
            ":" not in host else ""
        raise errors.InvalidInput([("listen", f"{host} is not a loopback address{named}: tokens and mail would cross "
                                              "the network in clear. Give --tls-cert FILE --tls-key FILE, or (behind "
                                              "a TLS proxy you trust) --insecure-no-tls.")])
    if tls_cert or tls_key:
        problems = certs.problems(tls_cert, tls_key)  # read as this user now, not once "listening" was said
        if problems:
            raise errors.InvalidInput(problems)
    # X-Forwarded-For only from the proxies the operator names: uvicorn's default trusts it from loopback, where any
    # local client (or one a proxy there passes through) could name a fresh address for each wrong token.
    proxies = forwarded_from(forwarded_allow_ips)
    _more_descriptors()
    location, _ = locating.resolve_location()
    open_store(location).close()  # create or migrate it now, and fail here rather than on the first call
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    wire.keep_probing(sock)  # the connections it accepts inherit it
    try:
        sock.bind((host, port))
        sock.listen(2048)  # connections are queued from the moment "listening" is logged (uvicorn accepts them)
    except OSError as exc:
        sock.close()
        raise errors.AgentMailError(f"cannot listen on {host}:{port} ({exc.strerror or exc}).") from None
    bound = sock.getsockname()[1]
    scheme = "https" if tls_cert else "http"
    shown_host = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app_for(location), log_level="warning", access_log=False, lifespan="on",
                            ssl_certfile=tls_cert, ssl_keyfile=tls_key, timeout_graceful_shutdown=10,
                            http=EdgeProtocol, h11_max_incomplete_event_size=MAX_HEAD_BYTES, date_header=False,
                            proxy_headers=bool(proxies), forwarded_allow_ips=proxies)
    server = Server(config)
    import logging

    # uvicorn's own line for a malformed request (not JSON): EdgeProtocol logs its refusal as every request is logged.
    logging.getLogger("uvicorn.error").addFilter(lambda record: record.getMessage() != "Invalid HTTP request "
                                                                                      "received.")
    server.location = location
    import signal

    # uvicorn hands the signal that stopped it on to the handler before it once it has stopped: a stop asked for
    # is a clean end here, not the command line's "stopped by SIGTERM" error. Set before "listening" is said, and
    # until uvicorn's own handlers are in place (while it starts) it stops the server as theirs do: a SIGTERM
    # that came right after "listening" was swallowed, and the server ran on.
    previous = {number: signal.signal(number, server.handle_exit) for number in (signal.SIGTERM, signal.SIGINT)}
    if tls_cert:
        certs.reload_on_sighup(server, tls_cert, tls_key or tls_cert, log)
    if insecure_no_tls and not is_loopback(host):
        log(level="warning", warning=f"serving plain HTTP on {shown_host}:{bound} (--insecure-no-tls): tokens and mail "
                                     "cross the network in clear; only behind a TLS proxy on a link you trust.")
    log(listening=f"{scheme}://{shown_host}:{bound}", mailbox=redact_url(location), pid=os.getpid(),
        **({"forwarded_allow_ips": proxies} if proxies else {}))
    try:
        server.run(sockets=[sock])
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for carrier in _CARRIERS:
            carrier.close()
    log(stopped=True)


def main(values: dict, emit) -> int:
    """`agent-mail serve [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE | --insecure-no-tls]
    [--forwarded-allow-ips ADDRS]`."""
    serve(**values)
    return errors.EXIT_OK
