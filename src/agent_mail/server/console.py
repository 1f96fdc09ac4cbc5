"""The supervisor's web console that `agent-mail serve` serves at /ui/ (issue 34): server-rendered pages (Jinja2,
autoescaped: the `server` extra), a little JavaScript of its own, every asset in the package (console_files/).

- Login: a token typed into /ui/login, checked as a bearer token is (the app's authenticate: one look-up, the
  wrong-token back-off of the Gate's Penalties). The session is a cookie, HttpOnly, SameSite=Strict, Secure over
  TLS, signed with the token's stored key (its secret's hash) and holding no secret: any replica over the same
  mailbox checks it, and it ends with its token (revoked, expired, rotated past its grace: tokens.session_grant,
  asked on every page, action and live update), at SESSION_HOURS, or at logout.
- What a token may see: the grants of /v1. A supervisor's or an operator's token sees the fleet; an identity's
  token its own identities only. Every action (send, reply, ack, dismiss, archive) and the mail an identity's page,
  search and attachments show go through the app's call layer (`call`: calls.check, grants.check, calls.run, as
  POST /v1/call/NAME does), so their checks and errors are the command line's, shown in the page.
- Live: /ui/events is a server-sent event stream woken by the server's waits (ServedWaits.until_changed on the ""
  channel: every message, and what Store.tell_supervisors announces), no polling; the page's script fetches its
  own URL again on an event and swaps the live part in.
- Safe: autoescaping (no mail is marked safe), a Content-Security-Policy without inline script or style, a
  same-origin check and a per-session token on every POST, Cache-Control: no-store.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from urllib.parse import parse_qs, quote, urlsplit

import anyio
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from agent_mail import errors, model
from agent_mail.server import grants
from agent_mail.server.edge import log

COOKIE = "agent_mail_console"
SESSION_HOURS = 12.0  # a session ends this long after its login, whatever its token's life
FORM_MAX_BYTES = model.BODY_MAX_CHARS * 4 + 64 * 1024  # a compose form: the longest body, percent-encoded
LIVE_SECONDS = 55.0  # an idle stream's comment (so a proxy keeps it open), and nothing else, this often
FILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "console_files")
STATIC = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-store, private", "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "same-origin", "X-Frame-Options": "DENY"}


class _Refused(Exception):
    """A page the session may not see (403), or that does not exist (404): said in the page."""

    def __init__(self, status: int, text: str):
        super().__init__(text)
        self.status, self.text = status, text


def _environment():
    import jinja2

    return jinja2.Environment(loader=jinja2.FileSystemLoader(FILES), autoescape=True,
                              trim_blocks=True, lstrip_blocks=True)


# -- the session cookie -----------------------------------------------------------------------------------------

def _mac(key: str, text: str) -> str:
    return hmac.new(key.encode("utf-8"), b"agent-mail console\0" + text.encode("utf-8"), hashlib.sha256).hexdigest()


def new_session(grant: dict, key: str) -> str:
    """A session cookie's value for the token of `grant` whose stored key is `key`: ID.UNTIL.NONCE.MAC."""
    text = f"{grant['id']}.{int(time.time() + SESSION_HOURS * 3600)}.{secrets.token_hex(8)}"
    return f"{text}.{_mac(key, text)}"


def _parts(value: str | None) -> tuple[str, str, str] | None:
    """(token id, the signed text, its MAC) of a cookie's value still within its time, or None."""
    if not value or value.count(".") != 3:
        return None
    token_id, until, nonce, mac = value.split(".")
    if not until.isdigit() or int(until) < time.time():
        return None
    return token_id, f"{token_id}.{until}.{nonce}", mac


def csrf_token(value: str) -> str:
    """The form token of a session: derived from its cookie (which a page of another site can neither read nor
    send along: SameSite=Strict)."""
    return hashlib.sha256(b"agent-mail console csrf\0" + value.encode("utf-8")).hexdigest()[:32]


def _same_origin(request: Request) -> bool:
    """Whether a POST comes from a page of this console: its Origin (when the browser sends one) names this host,
    and Fetch Metadata (when sent) does not say another site."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True  # an older browser: the form token decides
    return origin != "null" and urlsplit(origin).netloc.lower() == request.headers.get("host", "").lower()


# -- what a grant sees --------------------------------------------------------------------------------------------

def sees_all(grant: dict) -> bool:
    return bool(grant["supervisor"]) or "*" in grant["agents"]


def sees(grant: dict, identity: str) -> bool:
    return sees_all(grant) or grants.covers(grant, identity)


def _acts_as(grant: dict, known: list[str]) -> list[str]:
    """The identities a compose form offers as From: those the grant names exactly, and the known ones it covers."""
    named = [a for a in grant["agents"] if "*" not in a]
    return sorted(set(named) | {a for a in known if a != "*" and grants.covers(grant, a)})


def _involves(grant: dict, send: dict) -> bool:
    """Whether an identity's token may see a send: from or to one of its identities, or a broadcast."""
    return sees_all(grant) or grants.covers(grant, send["sender"]) or \
        any(r == "*" or grants.covers(grant, r) for r in send["recipients"])


def _ago(moment: str | None, at) -> str:
    from agent_mail.operations.supervision import age_seconds, short_age

    return short_age(age_seconds(moment, at))


def chart(hourly: dict, width: int = 720, height: int = 200) -> dict:
    """Sends per hour as bars of an SVG (stacked by series, the busiest at the bottom): rectangles and labels as
    numbers and text for the template to draw."""
    hours, series = hourly["hours"], hourly["series"]
    totals = [sum(values[n] for values in series.values()) for n in range(len(hours))]
    top = max(totals + [1])
    left, bottom, step = 36, height - 24, (width - 40) / max(1, len(hours))
    colours = ["#2a6fdb", "#d9822b", "#2e9e5b", "#b03a8a", "#7a5bd6", "#c23b3b", "#2aa1b3", "#8a8a2a"]
    bars, legend = [], []
    for index, (name, values) in enumerate(series.items()):
        colour = colours[index % len(colours)] if index < 8 else "#888888"
        legend.append({"name": name if index < 8 else "others", "colour": colour, "total": sum(values)})
    below = [0] * len(hours)
    for index, (name, values) in enumerate(series.items()):
        colour = legend[min(index, 8)]["colour"] if index < 8 else "#888888"
        for n, count in enumerate(values):
            if not count:
                continue
            h = (bottom - 10) * count / top
            y = bottom - (bottom - 10) * below[n] / top - h
            bars.append({"x": round(left + n * step + 1, 1), "y": round(y, 1), "w": round(max(1.0, step - 2), 1),
                         "h": round(h, 1), "colour": colour, "title": f"{hours[n]}:00 {name}: {count}"})
            below[n] += count
    labels = [{"x": round(left + n * step + step / 2, 1), "text": hours[n][-2:]} for n in range(0, len(hours), 3)]
    return {"width": width, "height": height, "bars": bars, "labels": labels, "legend": legend[:9], "top": top,
            "left": left, "bottom": bottom, "total": sum(totals)}


# -- the pages' data, read in a worker thread on one store -------------------------------------------------------

class Reader:
    """The pages' reads for one session's grant, on one store (in a worker thread). The mail an identity sees, a
    search and an attachment go through the call layer (`call(name, given)` as /v1's); the fleet, threads,
    reservations and traffic through the supervisor's views (operations.supervision) the dashboard reads,
    narrowed to what the grant sees."""

    def __init__(self, store, grant: dict, call):
        from agent_mail.operations import mail, supervision

        self.grant, self.call = grant, call
        self.mailbox = mail.Mailbox(store)
        self.supervisor = supervision.Supervisor(self.mailbox)

    def fleet(self) -> dict:
        at = model.now()
        rows = [r for r in self.supervisor.fleet() if sees(self.grant, r["agent"])]
        for row in rows:
            row["last_active_ago"] = _ago(row["last_active"], at)
            row["last_seen_ago"] = _ago(row["last_seen"], at)
        counts = {"identities": len(rows), "unread": sum(r["unread"] for r in rows),
                  "unacked": sum(r["unacked"] for r in rows), "problems": sum(bool(r["problems"]) for r in rows)}
        return {"rows": rows, "counts": counts}

    def known(self) -> list[str]:
        with self.mailbox.store.transaction():
            return sorted(self.mailbox.store.agent_counts(model.now_iso()))

    def agent(self, identity: str) -> dict:
        if not model.is_identity(identity):
            raise _Refused(404, f"{identity!r} is not an identity (project:name).")
        if not sees(self.grant, identity):
            raise _Refused(403, f"{identity!r}: {grants.scope(self.grant)}; an identity's page shows only the "
                                "identities the token names (a supervisor's token sees every one).")
        read = self.call("read", {"agent": identity, "all": True, "no_mark_read": True, "limit": 200})
        row = next((r for r in self.supervisor.fleet() if r["agent"] == identity), None)
        at = model.now()
        for message in read["messages"]:
            message["ago"] = _ago(message.get("created"), at)
            message["state"] = "archived" if message.get("archived_at") else "acked" if message.get("acked_at") \
                else "read" if message.get("read_at") else "unread"
        return {"identity": identity, "messages": list(reversed(read["messages"])), "row": row,
                "reservations": self.supervisor.reservations().get(identity, []),
                "acts": grants.covers(self.grant, identity)}

    def thread(self, message_id: str) -> dict:
        sends = [s for s in self.supervisor.thread(message_id) if _involves(self.grant, s)]
        if not sends:
            raise _Refused(404, f"no thread holds a message {message_id!r} that this token may see.")
        at = model.now()
        for send in sends:
            send["ago"] = _ago(send["at"], at)
            looker = next((a for a in [*send["recipients"], send["sender"]] if a != "*" and
                           grants.covers(self.grant, a)), None)
            if looker is None and sees_all(self.grant):
                looker = next((a for a in send["recipients"] if a != "*"), send["sender"])
            send["looker"] = looker
        last = sends[-1]
        subject = last["subject"] if last["subject"].lower().startswith("re:") else f"Re: {last['subject']}"
        mine = next((a for a in [*last["recipients"], last["sender"]] if a != "*" and grants.covers(self.grant, a)),
                    None)  # a reply is sent as one of the thread's own (the call layer refuses a stranger's reply)
        return {"id": message_id, "sends": sends, "reply": {"to": last["sender"], "subject": subject,
                                                             "reply_to": last["id"], "from": mine}}

    def search(self, query: str, agent: str | None) -> dict:
        given = {"query": query, "limit": 100, **({"agent": agent} if agent else {})}
        found = self.call("search", given)
        results = found.get("results", found.get("messages", []))
        at = model.now()
        for result in results:
            result["ago"] = _ago(result.get("created"), at)
        return {"results": results}

    def reservations(self) -> dict:
        held = {agent: rows for agent, rows in self.supervisor.reservations().items() if sees(self.grant, agent)}
        rows = [{"agent": agent, **row} for agent, listed in sorted(held.items()) for row in listed]
        return {"rows": rows}

    def traffic(self) -> dict:
        by = "project" if sees_all(self.grant) else "identity"
        hourly = self.supervisor.hourly(by=by)
        if not sees_all(self.grant):
            hourly["series"] = {name: values for name, values in hourly["series"].items()
                                if grants.covers(self.grant, name)}
        feed = [s for s in self.supervisor.feed(100) if _involves(self.grant, s)]
        at = model.now()
        for send in feed:
            send["ago"] = _ago(send["at"], at)
        return {"chart": chart(hourly), "by": by, "feed": feed}

    def attachment(self, agent: str, message_id: str, sha256: str) -> tuple[str, bytes]:
        listed = self.call("attachments", {"agent": agent, "id": message_id, "with_content": True})
        import base64

        for item in listed["attachments"]:
            if item["sha256"] == sha256:
                return item["name"], base64.b64decode(listed["contents"][sha256])
        raise _Refused(404, "that message has no such attachment.")


# -- the routes ---------------------------------------------------------------------------------------------------

class Console:
    """The console's routes over one served mailbox. `carrier`: the app's (its stores, worker threads and waits);
    `authenticate(token)`: the Gate's look-up (-> Admitted; errors.Forbidden); `penalties`: the Gate's back-off for
    wrong tokens; `call(carrier, grant, name, given)`: a call as /v1 carries it out (in a worker thread)."""

    def __init__(self, carrier, authenticate, penalties, call):
        self.carrier, self.authenticate, self.penalties, self.call = carrier, authenticate, penalties, call
        self.templates = None

    def routes(self) -> list[Route]:
        return [Route("/", self.root, methods=["GET"]),
                Route("/ui", self.root, methods=["GET"]),
                Route("/ui/login", self.login, methods=["GET", "POST"]),
                Route("/ui/logout", self.logout, methods=["POST"]),
                Route("/ui/static/{name}", self.static, methods=["GET"]),
                Route("/ui/events", self.events, methods=["GET"]),
                Route("/ui/", self.page("fleet"), methods=["GET"]),
                Route("/ui/agents/{identity}", self.page("agent"), methods=["GET"]),
                Route("/ui/agents/{identity}", self.act, methods=["POST"]),
                Route("/ui/threads/{id}", self.page("thread"), methods=["GET"]),
                Route("/ui/search", self.page("search"), methods=["GET"]),
                Route("/ui/reservations", self.page("reservations"), methods=["GET"]),
                Route("/ui/traffic", self.page("traffic"), methods=["GET"]),
                Route("/ui/compose", self.page("compose"), methods=["GET"]),
                Route("/ui/compose", self.compose, methods=["POST"]),
                Route("/ui/attachments/{id}/{sha256}", self.download, methods=["GET"])]

    # -- answering ---------------------------------------------------------------------------------------------
    def _render(self, name: str, status: int = 200, **context) -> Response:
        if self.templates is None:
            try:
                self.templates = _environment()
            except ImportError as exc:
                return self._answer(Response(f"The web console needs the 'server' extra on the server, which is not "
                                             f"installed ({exc}): pip install 'agent-mail[server]'.\n", 501,
                                             media_type="text/plain; charset=utf-8"))
        text = self.templates.get_template(name).render(**context)
        return self._answer(Response(text, status, media_type="text/html; charset=utf-8"))

    @staticmethod
    def _answer(response: Response) -> Response:
        response.headers.update(HEADERS)
        return response

    @staticmethod
    def _logged(request: Request, status: int, started: float, grant: dict | None, **more) -> None:
        log(method=request.method, path=request.url.path, status=status,
            token_id=grant["id"] if grant else None, ms=round((time.monotonic() - started) * 1000, 1), **more)

    def _secure(self, request: Request) -> bool:
        return request.url.scheme == "https"

    def _to_login(self, request: Request, said: str | None = None) -> Response:
        where = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        target = "/ui/login?next=" + quote(where, safe="")
        if said:
            target += "&ended=" + quote(said, safe="")
        response = self._answer(RedirectResponse(target, 303))
        if request.cookies.get(COOKIE):
            response.delete_cookie(COOKIE, path="/ui", secure=self._secure(request), httponly=True,
                                   samesite="strict")
        return response

    async def _session(self, request: Request) -> tuple[dict | None, str | None]:
        """(the session's grant, None), or (None, why it ended) when there is no valid session."""
        value = request.cookies.get(COOKIE)
        parts = _parts(value)
        if parts is None:
            return None, "your session ended (it timed out); sign in again." if value else None
        token_id, text, mac = parts

        def look():
            from agent_mail.operations import tokens

            with self.carrier.store() as store:
                return tokens.session_grant(store, token_id, lambda key: hmac.compare_digest(_mac(key, text), mac))
        self.carrier.ready()
        try:
            return await self.carrier.run(look), None
        except errors.Forbidden as exc:
            return None, exc.message

    # -- the routes ------------------------------------------------------------------------------------------
    async def root(self, request: Request) -> Response:
        return self._answer(RedirectResponse("/ui/", 307))

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return self._answer(Response("no such file\n", 404, media_type="text/plain"))
        with open(os.path.join(FILES, name), "rb") as source:
            response = self._answer(Response(source.read(), 200, media_type=STATIC[name]))
        response.headers["Cache-Control"] = "private, max-age=300"
        return response

    async def login(self, request: Request) -> Response:
        started = time.monotonic()
        target = request.query_params.get("next") or "/ui/"
        if not target.startswith("/ui/") or target.startswith("//"):
            target = "/ui/"
        if request.method == "GET":
            grant, _ = await self._session(request)
            if grant is not None:
                return self._answer(RedirectResponse(target, 303))
            return self._render("login.html", grant=None, next=target, said=request.query_params.get("ended"),
                                error=None)
        if not _same_origin(request):
            self._logged(request, 403, started, None, refused="cross-origin login")
            return self._render("login.html", 403, grant=None, next=target, said=None,
                                error="refused: the form was not sent from this console's own page.")
        try:
            form = await self._form(request)
        except errors.InvalidInput as exc:
            return self._render("login.html", 413, grant=None, next=target, said=None, error=exc.message)
        token = str(form.get("token") or "").strip()
        try:
            if not token:
                raise errors.Forbidden("no token given: paste a token (agent-mail token create makes one).",
                                       unauthenticated=True)
            admitted = await self.authenticate(token)
        except errors.Forbidden as exc:
            client = str((request.scope.get("client") or ("unknown", 0))[0])
            held = self.penalties.hold(client) if token else 0.0
            await anyio.sleep(held)
            self._logged(request, 401, started, None, client=client, held=round(held, 3))
            return self._render("login.html", 401, grant=None, next=target, said=None, error=exc.message)
        grant = admitted.grant

        def key():
            with self.carrier.store() as store, store.transaction():
                return store.token(grant["id"])["secret_hash"]
        value = new_session(grant, await self.carrier.run(key))
        response = self._answer(RedirectResponse(target, 303))
        response.set_cookie(COOKIE, value, path="/ui", httponly=True, samesite="strict",
                            secure=self._secure(request))
        self._logged(request, 303, started, grant, login=True)
        return response

    async def logout(self, request: Request) -> Response:
        try:
            form = await self._form(request)
        except errors.InvalidInput:
            form = {}
        value = request.cookies.get(COOKIE) or ""
        if not _same_origin(request) or not value or not hmac.compare_digest(form.get("csrf", ""), csrf_token(value)):
            return self._render("error.html", 403, grant=None, csrf="", title="Refused",
                                text="refused: the form was not sent from this console's own page.", nav="")
        response = self._answer(RedirectResponse("/ui/login?ended=" + quote("you signed out."), 303))
        response.delete_cookie(COOKIE, path="/ui", secure=self._secure(request), httponly=True, samesite="strict")
        return response

    async def _form(self, request: Request) -> dict:
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > FORM_MAX_BYTES):
            raise errors.InvalidInput([(None, f"the form is larger than {FORM_MAX_BYTES} bytes.")])
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > FORM_MAX_BYTES:
                raise errors.InvalidInput([(None, f"the form is larger than {FORM_MAX_BYTES} bytes.")])
        parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        return {key: values[-1] if key not in ("ids",) else values for key, values in parsed.items()}

    def page(self, kind: str):
        async def endpoint(request: Request) -> Response:
            started = time.monotonic()
            grant, said = await self._session(request)
            if grant is None:
                return self._to_login(request, said)
            response = await self._page(request, kind, grant)
            self._logged(request, response.status_code, started, grant)
            return response
        return endpoint

    async def _read(self, grant: dict, how):
        """`how(reader)` in a worker thread on a store of its own."""
        def run():
            with self.carrier.store() as store:
                return how(Reader(store, grant, lambda name, given: self.call(self.carrier, grant, name, given)))
        return await self.carrier.run(run)

    def _common(self, request: Request, grant: dict, nav: str) -> dict:
        value = request.cookies.get(COOKIE) or ""
        return {"grant": grant, "csrf": csrf_token(value), "nav": nav, "sees_all": sees_all(grant),
                "scope": grants.scope(grant)}

    async def _page(self, request: Request, kind: str, grant: dict, status: int = 200, **more) -> Response:
        params = request.query_params
        try:
            if kind == "fleet":
                data = await self._read(grant, lambda r: r.fleet())
                return self._render("fleet.html", status, **self._common(request, grant, "fleet"), **data)
            if kind == "agent":
                identity = request.path_params["identity"]
                data = await self._read(grant, lambda r: r.agent(identity))
                return self._render("agent.html", status, **self._common(request, grant, "fleet"), **data,
                                    done=more.get("done"), error=more.get("error"))
            if kind == "thread":
                message_id = request.path_params["id"]
                data = await self._read(grant, lambda r: {**r.thread(message_id), "from": _acts_as(grant, r.known())})
                form = more.get("form") or {**data["reply"], "from": data["reply"]["from"] or (data["from"] or [""])[0],
                                            "body": ""}
                return self._render("thread.html", status, **self._common(request, grant, "threads"), **data,
                                    form=form, error=more.get("error"))
            if kind == "search":
                query, agent = params.get("q", "").strip(), params.get("agent") or None
                mine = [a for a in grant["agents"] if "*" not in a]
                if agent is None and not sees_all(grant) and mine:
                    agent = mine[0]
                data, error = {"results": []}, None
                if query:
                    try:
                        data = await self._read(grant, lambda r: r.search(query, agent))
                    except errors.AgentMailError as exc:
                        error = exc.payload()
                return self._render("search.html", status, **self._common(request, grant, "search"), **data, q=query,
                                    agent=agent or "", error=error)
            if kind == "reservations":
                data = await self._read(grant, lambda r: r.reservations())
                return self._render("reservations.html", status, **self._common(request, grant, "reservations"),
                                    **data)
            if kind == "traffic":
                data = await self._read(grant, lambda r: r.traffic())
                return self._render("traffic.html", status, **self._common(request, grant, "traffic"), **data)
            offered = await self._read(grant, lambda r: _acts_as(grant, r.known()))
            form = more.get("form") or {"from": (offered or [""])[0], "to": params.get("to", ""), "subject": "",
                                        "body": "", "reply_to": ""}
            return self._render("compose.html", status, **self._common(request, grant, "compose"), offered=offered,
                                form=form, error=more.get("error"), sent=more.get("sent"))
        except _Refused as refused:
            return self._render("error.html", refused.status, **self._common(request, grant, ""),
                                title="Not found" if refused.status == 404 else "Not allowed", text=refused.text)
        except errors.AgentMailError as exc:
            status = 403 if isinstance(exc, errors.Forbidden) else 400 if exc.exit_code == errors.EXIT_INVALID else 503
            shown = exc.for_callers() if isinstance(exc, errors.StorageError) else exc
            return self._render("error.html", status, **self._common(request, grant, ""), title="Refused",
                                text=shown.message, problems=shown.payload().get("problems", []))

    async def _posted(self, request: Request) -> tuple[dict | None, dict, Response | None]:
        """A POST's session and form, or the answer refusing it (no session: the login page; another origin or a
        missing form token: 403)."""
        grant, said = await self._session(request)
        if grant is None:
            return None, {}, self._to_login(request, said)
        try:
            form = await self._form(request)
        except errors.InvalidInput as exc:
            return grant, {}, self._render("error.html", 413, **self._common(request, grant, ""), title="Refused",
                                           text=exc.message, problems=exc.payload()["problems"])
        value = request.cookies.get(COOKIE) or ""
        if not _same_origin(request) or not hmac.compare_digest(str(form.get("csrf", "")), csrf_token(value)):
            return grant, form, self._render("error.html", 403, **self._common(request, grant, ""), title="Refused",
                                             text="refused: the form was not sent from this console's own page "
                                                  "(another origin, or no form token). Nothing was done.")
        return grant, form, None

    async def _do(self, grant: dict, name: str, given: dict):
        return await self.carrier.run(self.call, self.carrier, grant, name, given)

    async def compose(self, request: Request) -> Response:
        started = time.monotonic()
        grant, form, refused = await self._posted(request)
        if refused is not None:
            return refused
        kept = {key: str(form.get(key, "")) for key in ("from", "to", "subject", "body", "reply_to")}
        given = {"from": kept["from"].strip() or None,
                 "to": [t for t in kept["to"].replace(",", " ").split() if t],
                 "subject": kept["subject"], "body": kept["body"], "reply_to": kept["reply_to"].strip() or None}
        back = form.get("back") == "thread" and kept["reply_to"]
        try:
            result = await self._do(grant, "send", given)
        except errors.AgentMailError as exc:
            self._logged(request, 400, started, grant, command="send", exit=exc.exit_code)
            error = (exc.for_callers() if isinstance(exc, errors.StorageError) else exc).payload()
            if back:
                request.path_params["id"] = kept["reply_to"]
                return await self._page(request, "thread", grant, 400, form=kept, error=error)
            return await self._page(request, "compose", grant, 400, form=kept, error=error)
        self._logged(request, 303, started, grant, command="send", exit=0)
        sent = result.get("id") or (result.get("ids") or [None])[0]
        return self._answer(RedirectResponse(f"/ui/threads/{quote(str(sent), safe='')}", 303))

    async def act(self, request: Request) -> Response:
        started = time.monotonic()
        grant, form, refused = await self._posted(request)
        if refused is not None:
            return refused
        identity, action = request.path_params["identity"], str(form.get("action", ""))
        ids = form.get("ids") or []
        ids = [ids] if isinstance(ids, str) else ids
        try:
            if action not in ("ack", "dismiss", "archive"):
                raise errors.InvalidInput([("action", "is ack, dismiss or archive.")])
            await self._do(grant, action, {"agent": identity, "ids": ids})
        except errors.AgentMailError as exc:
            self._logged(request, 400, started, grant, command=action, exit=exc.exit_code)
            error = (exc.for_callers() if isinstance(exc, errors.StorageError) else exc).payload()
            return await self._page(request, "agent", grant, 403 if isinstance(exc, errors.Forbidden) else 400,
                                    error=error)
        self._logged(request, 303, started, grant, command=action, exit=0)
        return self._answer(RedirectResponse(f"/ui/agents/{quote(identity, safe=':')}", 303))

    async def download(self, request: Request) -> Response:
        grant, said = await self._session(request)
        if grant is None:
            return self._to_login(request, said)
        agent, message_id = request.query_params.get("as", ""), request.path_params["id"]
        try:
            name, content = await self._read(grant, lambda r: r.attachment(agent, message_id,
                                                                           request.path_params["sha256"]))
        except _Refused as refused:
            return self._render("error.html", refused.status, **self._common(request, grant, ""), title="Not found",
                                text=refused.text)
        except errors.AgentMailError as exc:
            return self._render("error.html", 403 if isinstance(exc, errors.Forbidden) else 400,
                                **self._common(request, grant, ""), title="Refused", text=exc.message,
                                problems=exc.payload().get("problems", []))
        safe = "".join(c if c.isalnum() or c in "._- " else "_" for c in name) or "attachment"
        response = self._answer(Response(content, 200, media_type="application/octet-stream"))
        response.headers["Content-Disposition"] = f"attachment; filename=\"{safe}\"; filename*=UTF-8''{quote(name)}"
        return response

    async def events(self, request: Request) -> Response:
        """The live stream: `event: change` whenever the server's waits are woken for anything a console shows
        (a message stored, read or acked, a watch started or ended, a reservation), `event: ended` when the
        session's token ended; a comment every LIVE_SECONDS otherwise. No thread nor connection is held while it
        waits (ServedWaits.until_changed)."""
        grant, said = await self._session(request)
        if grant is None:
            return self._answer(Response("event: ended\ndata: {}\n\n".format(json.dumps({"said": said or ""})), 200,
                                         media_type="text/event-stream"))
        self.carrier.ready()
        waits = self.carrier.waits
        stream = self._stream(request, grant, waits) if waits is not None else self._unlive()
        return self._answer(StreamingResponse(stream, 200, media_type="text/event-stream",
                                              headers={"X-Accel-Buffering": "no"}))

    async def _unlive(self):
        yield "event: unlive\ndata: {}\n\n"  # this server's waits block in threads (AGENT_MAIL_POLL): reload by hand

    async def _stream(self, request: Request, grant: dict, waits):
        from agent_mail.operations import tokens
        from agent_mail.server.waits import Stopping

        gone = anyio.Event()
        yield "retry: 1000\nevent: ready\ndata: {}\n\n"
        generation = waits.generation
        try:
            async for woken in waits.changes("", LIVE_SECONDS, gone):
                if not woken:
                    yield ": still here\n\n"
                    continue
                if waits.generation != generation:  # a broadcast, a revocation: is the token still good?
                    generation = waits.generation

                    def valid():
                        with self.carrier.store() as store:
                            tokens.still_valid(store, grant)
                    try:
                        await self.carrier.run(valid)
                    except errors.Forbidden as exc:
                        yield f"event: ended\ndata: {json.dumps({'said': exc.message})}\n\n"
                        return
                yield f"event: change\ndata: {json.dumps({'at': model.now_iso()})}\n\n"
                await asyncio.sleep(0.1)  # a burst of commits: one change
        except Stopping:
            yield "event: stopping\ndata: {}\n\n"


def call_for(carry_out):
    """`call(carrier, grant, name, given)` over the app's _carry_out: a call exactly as POST /v1/call/NAME carries it
    out (checked, granted, run), from a worker thread; its result."""
    def call(carrier, grant: dict, name: str, given: dict):
        body = json.dumps({key: value for key, value in given.items() if value is not None}).encode("utf-8")
        return carry_out(carrier, name, grant, body, {}, threading.Event())
    return call
