"""The web console of `agent-mail serve` (/ui/, issue 34) in a real headless Chromium (Debian's
chromium-headless-shell, driven over the DevTools protocol), on SQLite and on PostgreSQL: the login and a wrong
token, the session cookie's attributes, the headers (CSP, no-store), every page, live updates without a reload,
hostile mail shown as text, compose and reply, an identity's token seeing only its own, a revoked token ending
the session, the webhooks page (an operator's only), and (PostgreSQL) two replicas behind one address."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import urllib.parse

import pytest

from tests.lib.browser import Chromium
from tests.lib.cli import json_of
from tests.lib.replicas import Replica, Replicas, RoundRobin
from tests.lib.serving import Server
from tests.lib.tools import require
from tests.lib.webhook_receiver import Receiver

pytest.importorskip("jinja2", reason="the console needs the server extra: pip install 'agent-mail[server]'")
pytest.importorskip("aiohttp", reason="the DevTools driver needs aiohttp (the test extra)")

pytestmark = [pytest.mark.parametrize("backend", ["sqlite", "postgresql"], indirect=True),
              pytest.mark.timeout(240)]

LIVE_BOUND = 10.0  # a change reaches an open page well within this (the bench measures how soon: ~0.1 s)


@pytest.fixture
def server(mailbox_path):
    running = Server(str(mailbox_path))
    try:
        yield running
    finally:
        running.stop()


def _send(server: Server, *argv: str) -> dict:
    return json_of(server.direct("send", *argv))


def _request(server: Server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


async def _login(tab, server: Server, token: str, then: str = "/ui/") -> None:
    await tab.open(f"{server.url}/ui/login?next={urllib.parse.quote(then)}")
    await tab.evaluate(f"document.getElementById('token').value = {json.dumps(token)}")
    await tab.evaluate("document.querySelector('form button[type=submit]').click()")
    await tab.wait_for(f"location.pathname === {json.dumps(then)} && document.readyState === 'complete'",
                       what=f"the login never led to {then}")


def _field(label: str) -> str:
    """A JavaScript expression: the form control labelled `label`."""
    return f"[...document.querySelectorAll('label')].find(l => l.textContent.trim() === {json.dumps(label)}).control"


def test_login_cookie_headers_and_every_page(server, tmp_path):
    chromium = require("chromium")
    token = server.token("--agent", "ops:human", "--supervisor")
    notes = tmp_path / "notes.txt"
    notes.write_text("the notes\n")
    _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "schema ready", "--body",
          "the schema is in db/schema.sql", "--ref", str(notes), "--attach", str(notes))
    _send(server, "--from", "db:admin", "--to", "web:api", "--subject", "migration 42 applied")
    json_of(server.direct("read", "web:api"))
    json_of(server.direct("reserve", "db:admin", "migrations/*.sql", "--reason", "migration 43"))

    async def drive():
        async with Chromium(chromium, tmp_path / "chromium") as tab:
            await tab.open(f"{server.url}/ui/")
            assert "/ui/login" in await tab.evaluate("location.pathname")
            await tab.evaluate("document.getElementById('token').value = 'amt_000000000000_wrong'")
            await tab.evaluate("document.querySelector('form button[type=submit]').click()")
            await tab.wait_for("document.querySelector('.error') !== null", what="no message for a wrong token")
            assert "not valid here" in await tab.text(".error")
            assert await tab.evaluate("location.pathname") == "/ui/login"
            cookies = (await tab.call("Network.getCookies", urls=[server.url + "/ui/"]))["cookies"]
            assert not cookies, cookies

            await _login(tab, server, token)
            cookies = (await tab.call("Network.getCookies", urls=[server.url + "/ui/"]))["cookies"]
            (cookie,) = cookies
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui", cookie
            assert not cookie["secure"]  # plain HTTP on loopback here; over TLS it is Secure (below)
            assert token not in cookie["value"] and token.split("_")[-1] not in cookie["value"]
            assert await tab.evaluate("document.cookie") == ""  # HttpOnly: no script reads it

            fleet = await tab.text("main")
            assert "web:ui" in fleet and "web:api" in fleet
            rows = await tab.evaluate("[...document.querySelectorAll('tr[data-agent]')].map(r => r.dataset.agent)")
            assert rows.index("web:ui") < rows.index("web:api"), rows  # unread, nobody listening: a problem first
            assert "deaf with mail" in await tab.text("tr[data-agent='web:ui']")
            await tab.call("Emulation.setDeviceMetricsOverride", width=1280, height=700, deviceScaleFactor=1,
                           mobile=False)
            shot = base64.b64decode((await tab.call("Page.captureScreenshot", format="png"))["data"])
            assert shot[:8] == b"\x89PNG\r\n\x1a\n"
            (tmp_path / "console.png").write_bytes(shot)
            if os.environ.get("AGENT_MAIL_CONSOLE_SCREENSHOT"):  # docs/console.md's picture
                with open(os.environ["AGENT_MAIL_CONSOLE_SCREENSHOT"], "wb") as out:
                    out.write(shot)

            await tab.evaluate("document.querySelector(\"a[href='/ui/agents/web%3Aui']\").click()")
            await tab.wait_for("location.pathname === '/ui/agents/web:ui' || "
                               "location.pathname === '/ui/agents/web%3Aui'")
            await tab.wait_for("document.querySelector('table.mail') !== null")
            assert "schema ready" in await tab.text("table.mail")
            await tab.evaluate("document.querySelector('table.mail a').click()")
            await tab.wait_for("location.pathname.startsWith('/ui/threads/') && "
                               "document.querySelector('pre.body') !== null")
            assert "the schema is in db/schema.sql" in await tab.text("pre.body")
            assert "notes.txt" in await tab.text(".refs")
            link = await tab.evaluate("document.querySelector('.attachments a').getAttribute('href')")
            assert "notes.txt" in await tab.text(".attachments")

            await tab.open(f"{server.url}/ui/search?q=schema")
            assert "schema ready" in await tab.text("main")
            await tab.open(f"{server.url}/ui/reservations")
            assert "migrations/*.sql" in await tab.text("main") and "migration 43" in await tab.text("main")
            await tab.open(f"{server.url}/ui/traffic")
            assert await tab.evaluate("document.querySelectorAll('svg.chart rect').length") >= 1
            assert "schema ready" in await tab.text("main")
            await tab.open(f"{server.url}/ui/compose")
            for label in ("From", "To", "Subject", "Body"):
                assert await tab.evaluate(f"{_field(label)} !== null"), label
            return cookie["value"], link

    session, link = asyncio.run(drive())
    # The attachment downloads (the session's cookie, as the browser sends it).
    status, headers, body = _request(server, "GET", link, headers={"Cookie": f"agent_mail_console={session}"})
    assert status == 200 and body == b"the notes\n", (status, body[:200])
    assert "attachment" in headers["content-disposition"]
    # Every page: the CSP (no inline script), never stored by a cache.
    for path in ("/ui/", "/ui/login", "/ui/agents/web:ui", "/ui/search?q=x", "/ui/reservations", "/ui/traffic",
                 "/ui/compose"):
        cookie = {} if path == "/ui/login" else {"Cookie": f"agent_mail_console={session}"}
        status, headers, body = _request(server, "GET", path, headers=cookie)
        assert status == 200, (path, status)
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp, csp
        assert "no-store" in headers["cache-control"] and "private" in headers["cache-control"]
        assert b"<script>" not in body and b" on" not in body.split(b"<body")[1].split(b">")[0]


def test_hostile_mail_is_shown_as_text_and_nothing_runs(server, tmp_path):
    chromium = require("chromium")
    token = server.token("--agent", "ops:human", "--supervisor")
    subject = "<img src=x onerror=\"window.pwned='subject'\">"
    body = "<script>window.pwned='body'</script><b>bold?</b>"
    sent = _send(server, "--from", "evil:one", "--to", "web:ui", "--subject", subject, "--body", body)

    async def drive():
        async with Chromium(chromium, tmp_path / "chromium") as tab:
            await _login(tab, server, token)
            for path in ("/ui/", "/ui/agents/web:ui", f"/ui/threads/{sent['id']}", "/ui/search?q=bold",
                         "/ui/traffic"):
                await tab.open(server.url + path)
                assert await tab.evaluate("window.pwned === undefined"), path
                assert await tab.evaluate("document.querySelector('img') === null"), path
                assert await tab.evaluate("[...document.scripts].every(s => s.src.endsWith('/ui/static/console.js'))")
            assert subject in await tab.text("main")  # the traffic page lists it, as text
            await tab.open(f"{server.url}/ui/threads/{sent['id']}")
            assert await tab.text("pre.body") == body
            assert await tab.text("h1") == subject
            assert await tab.evaluate("document.querySelector('pre.body b') === null")

    asyncio.run(drive())


def test_the_pages_update_live_without_a_reload(server, tmp_path):
    chromium = require("chromium")
    token = server.token("--agent", "ops:human", "--supervisor")
    _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "first")

    async def drive():
        async with Chromium(chromium, tmp_path / "chromium") as tab:
            await _login(tab, server, token)
            await tab.wait_for("document.body.dataset.liveReady === 'yes'", what="the live stream never opened")
            await tab.evaluate("window.sameDocument = 'yes'")  # gone if the page were reloaded
            _send(server, "--from", "web:api", "--to", "live:new", "--subject", "news")
            await tab.wait_for("document.querySelector(\"tr[data-agent='live:new']\") !== null", LIVE_BOUND,
                               "the fleet never showed the new identity")
            await tab.open(f"{server.url}/ui/agents/web:ui")
            await tab.wait_for("document.body.dataset.liveReady === 'yes'")
            await tab.evaluate("window.sameDocument = 'yes'")
            _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "second thoughts")
            await tab.wait_for("document.querySelector('main').innerText.includes('second thoughts')", LIVE_BOUND,
                               "the identity's page never showed the new mail")
            json_of(server.direct("read", "web:ui"))  # a read is not mail: the page shows it all the same
            await tab.wait_for("document.querySelector('main').innerText.includes('0 unread')", LIVE_BOUND,
                               "the identity's page never showed its mail read")
            await tab.open(f"{server.url}/ui/reservations")
            await tab.wait_for("document.body.dataset.liveReady === 'yes'")
            await tab.evaluate("window.sameDocument = 'yes'")
            json_of(server.direct("reserve", "web:api", "src/api/*.py", "--reason", "refactor"))
            await tab.wait_for("document.querySelector('main').innerText.includes('src/api/*.py')", LIVE_BOUND,
                               "the reservations page never showed the new reservation")
            assert await tab.evaluate("window.sameDocument") == "yes"
            assert "refactor" in await tab.text("main")

    asyncio.run(drive())


def test_compose_reply_and_act_as_an_identity(server, tmp_path):
    chromium = require("chromium")
    token = server.token("--agent", "web:ui")
    asked = _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "which port?", "--body", "8080 or 9090")

    async def drive():
        async with Chromium(chromium, tmp_path / "chromium") as tab:
            await _login(tab, server, token, "/ui/compose")
            offered = await tab.evaluate("[...document.querySelectorAll('#from-list option')].map(o => o.value)")
            assert offered == ["web:ui"], offered
            assert await tab.evaluate(f"{_field('From')}.value") == "web:ui"
            # A refused send: the call layer's error, in the page, and what was typed kept.
            await tab.evaluate(f"{_field('To')}.value = 'not an identity'")
            await tab.evaluate(f"{_field('Subject')}.value = 'hello'")
            await tab.evaluate(f"{_field('Body')}.value = 'typed by hand'")
            await tab.evaluate("[...document.querySelectorAll('button')].find(b => b.textContent === 'Send').click()")
            await tab.wait_for("document.querySelector('.error') !== null", what="no error for a bad recipient")
            assert "to" in await tab.text(".error")
            assert await tab.evaluate(f"{_field('Body')}.value") == "typed by hand"
            await tab.evaluate(f"{_field('To')}.value = 'web:api'")
            await tab.evaluate("[...document.querySelectorAll('button')].find(b => b.textContent === 'Send').click()")
            await tab.wait_for("location.pathname.startsWith('/ui/threads/') && "
                               "document.querySelector('pre.body') !== null", what="the send never landed")
            assert await tab.text("pre.body") == "typed by hand"

            await tab.open(f"{server.url}/ui/threads/{asked['id']}")
            assert await tab.evaluate(f"{_field('To')}.value") == "web:api"
            assert await tab.evaluate(f"{_field('Subject')}.value") == "Re: which port?"
            await tab.evaluate(f"{_field('Body')}.value = '9090'")
            await tab.evaluate("[...document.querySelectorAll('button')].find(b => b.textContent === 'Send').click()")
            await tab.wait_for("document.querySelectorAll('article.send').length === 2",
                               what="the reply never showed in the thread")

            await tab.open(f"{server.url}/ui/agents/web:ui")
            await tab.evaluate(f"document.querySelector(\"tr[data-id='{asked['id']}'] button[value=ack]\").click()")
            await tab.wait_for(f"(document.querySelector(\"tr[data-id='{asked['id']}']\") || {{}}).innerText"
                               "?.includes('acked')", what="the ack never showed")

    asyncio.run(drive())
    sent = json_of(server.direct("read", "web:api", "--all", "--no-mark-read"))["messages"]
    by_subject = {m["subject"]: m for m in sent}
    assert by_subject["hello"]["sender"] == "web:ui" and by_subject["hello"]["body"] == "typed by hand"
    assert by_subject["Re: which port?"]["reply_to"] == asked["id"] and by_subject["Re: which port?"]["body"] == "9090"
    mine = json_of(server.direct("read", "web:ui", "--all", "--no-mark-read"))["messages"]
    assert next(m for m in mine if m["id"] == asked["id"])["acked_at"]


def test_state_changing_requests_from_another_origin_are_refused(server):
    token = server.token("--agent", "web:ui")
    status, headers, _ = _request(server, "POST", "/ui/login", f"token={token}".encode(),
                                  {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303
    session = headers["set-cookie"].split(";")[0]
    _, _, page = _request(server, "GET", "/ui/compose", headers={"Cookie": session})
    csrf = page.decode().split('name="csrf" value="')[1].split('"')[0]
    form = urllib.parse.urlencode({"csrf": csrf, "from": "web:ui", "to": "web:api", "subject": "forged"}).encode()
    for extra in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        status, _, body = _request(server, "POST", "/ui/compose", form, {
            "Cookie": session, "Content-Type": "application/x-www-form-urlencoded", **extra})
        assert status == 403 and b"Nothing was done" in body
    without = urllib.parse.urlencode({"from": "web:ui", "to": "web:api", "subject": "forged"}).encode()
    status, _, _ = _request(server, "POST", "/ui/compose", without, {
        "Cookie": session, "Content-Type": "application/x-www-form-urlencoded"})
    assert status == 403
    assert json_of(server.direct("read", "web:api", "--all", "--no-mark-read"))["count"] == 0
    # A session whose cookie was changed (a later end, another token's id) is no session.
    token_id, until, nonce, mac = session.split("=", 1)[1].split(".")
    other = server.token("--agent", "ops:human", "--supervisor").split("_")[1]
    for forged in (f"{token_id}.{int(until) + 3600}.{nonce}.{mac}", f"{other}.{until}.{nonce}.{mac}"):
        status, headers, _ = _request(server, "GET", "/ui/", headers={"Cookie": f"agent_mail_console={forged}"})
        assert status == 303 and headers["location"].startswith("/ui/login"), (forged, status)


def test_the_cookie_is_secure_over_tls(mailbox_path):
    """Behind a TLS proxy the server trusts (--forwarded-allow-ips; X-Forwarded-Proto: https) the session cookie is
    Secure: the browser sends it over TLS only."""
    replica = Replica(str(mailbox_path))
    try:
        token = replica.token("--agent", "web:ui")
        status, headers, _ = _request(replica, "POST", "/ui/login", f"token={token}".encode(), {
            "Content-Type": "application/x-www-form-urlencoded", "X-Forwarded-Proto": "https"})
        assert status == 303
        attributes = [part.strip().lower() for part in headers["set-cookie"].split(";")]
        assert {"secure", "httponly", "samesite=strict", "path=/ui"} <= set(attributes), attributes
    finally:
        replica.stop()


def test_an_identity_token_sees_only_its_own(server, tmp_path):
    chromium = require("chromium")
    token = server.token("--agent", "web:ui")
    _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "for ui")
    other = _send(server, "--from", "web:api", "--to", "db:admin", "--subject", "secret plans")
    json_of(server.direct("reserve", "db:admin", "migrations/*", "--reason", "hidden"))

    async def drive():
        async with Chromium(chromium, tmp_path / "chromium") as tab:
            await _login(tab, server, token)
            rows = await tab.evaluate("[...document.querySelectorAll('tr[data-agent]')].map(r => r.dataset.agent)")
            assert rows == ["web:ui"], rows
            await tab.open(f"{server.url}/ui/agents/db:admin")
            assert "Not allowed" in await tab.text("h1")
            assert "secret plans" not in await tab.text("body")
            await tab.open(f"{server.url}/ui/threads/{other['id']}")
            assert "Not found" in await tab.text("h1")
            await tab.open(f"{server.url}/ui/search?q=secret")
            assert "secret plans" not in await tab.text("body")
            await tab.open(f"{server.url}/ui/reservations")
            assert "migrations" not in await tab.text("body")
            await tab.open(f"{server.url}/ui/traffic")
            assert "secret plans" not in await tab.text("body") and "for ui" in await tab.text("body")

    asyncio.run(drive())


def test_a_revoked_token_ends_the_session(server, tmp_path):
    chromium = require("chromium")
    token = server.token("--agent", "ops:human", "--supervisor")
    token_id = token.split("_")[1]
    _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "hello")

    async def drive():
        async with Chromium(chromium, tmp_path / "chromium") as tab:
            await _login(tab, server, token)
            await tab.wait_for("document.body.dataset.liveReady === 'yes'")
            json_of(server.direct("token", "revoke", token_id))
            # The open page learns it from its live stream, and lands on the login form saying why.
            await tab.wait_for("location.pathname === '/ui/login' && document.readyState === 'complete'",
                               LIVE_BOUND, "the open page stayed signed in")
            assert "revoked" in await tab.text("main")
            await tab.open(f"{server.url}/ui/agents/web:ui")
            assert await tab.evaluate("location.pathname") == "/ui/login"

    asyncio.run(drive())


def _signed_in(server: Server, token: str) -> str:
    """The session cookie a login with `token` sets (name=value)."""
    status, headers, _ = _request(server, "POST", "/ui/login", f"token={urllib.parse.quote(token)}".encode(),
                                  {"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 303, status
    return headers["set-cookie"].split(";")[0]


def _page_for(server: Server, cookie: str) -> tuple[int, str, str]:
    status, headers, body = _request(server, "GET", "/ui/", headers={"Cookie": cookie})
    return status, headers.get("location", ""), body.decode()


def test_an_expired_or_rotated_past_grace_token_ends_the_session(server):
    """A session lasts no longer than its token: one made with a token that expires, or that is rotated with no
    grace, is sent back to the login at its next page, saying why."""
    import time

    short = server.token("--agent", "ops:human", "--supervisor", "--expires-in", "3s")
    cookie = _signed_in(server, short)
    status, _, body = _page_for(server, cookie)
    assert status == 200 and "ops:human" in body
    deadline = time.monotonic() + 30
    while _page_for(server, cookie)[0] == 200:  # the token's three seconds run out
        assert time.monotonic() < deadline, "the session outlived its token's expiry"
        time.sleep(0.2)
    status, location, _ = _page_for(server, cookie)
    assert status in (302, 303) and location.startswith("/ui/login"), (status, location)

    rotated = server.token("--agent", "ops:human", "--supervisor")
    cookie = _signed_in(server, rotated)
    assert _page_for(server, cookie)[0] == 200
    json_of(server.direct("token", "rotate", rotated.split("_")[1], "--grace", "0s"))
    status, location, _ = _page_for(server, cookie)
    assert status in (302, 303) and location.startswith("/ui/login"), (status, location)


def test_the_webhooks_page_shows_deliveries_and_failures_to_an_operator_only(mailbox_path, tmp_path):
    """`webhook list` in the console: a receiver answers the first POST 500, then 200. The retry window is shorter
    than the first retry's pause (AGENT_MAIL_WEBHOOK_RETRY_SECONDS), so the 500 is recorded failed at once and the
    next event is delivered: the open page shows both as they happen, the URL cut as the list cuts it, the secret
    nowhere. A supervisor's or an identity's token gets the refusal and no link to the page."""
    chromium = require("chromium")
    secret = "s3cr3t-for-the-console-" + "5e" * 12
    secret_file = tmp_path / "hook-secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    receiver = Receiver(statuses=[500])
    server = Server(str(mailbox_path), AGENT_MAIL_WEBHOOK_RETRY_SECONDS="1")
    try:
        added = json_of(server.direct("webhook", "add", "--url", receiver.url, "--event", "mail", "--secret-file",
                                      str(secret_file)))
        operator = server.token("--agent", "*")
        supervisor = server.token("--agent", "ops:human", "--supervisor")
        identity = server.token("--agent", "web:ui")

        async def drive():
            async with Chromium(chromium, tmp_path / "chromium") as tab:
                await _login(tab, server, operator)
                await tab.evaluate("document.querySelector(\"nav a[href='/ui/webhooks']\").click()")
                await tab.wait_for("location.pathname === '/ui/webhooks' && document.readyState === 'complete'",
                                   what="the nav's Webhooks link never led to the page")
                assert added["id"] in await tab.text("main") and added["url"] in await tab.text("main")
                assert "No delivery yet" in await tab.text("section.webhook")
                await tab.wait_for("document.body.dataset.liveReady === 'yes'", what="the live stream never opened")
                await tab.evaluate("window.sameDocument = 'yes'")
                _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "answered 500")
                await tab.wait_for("document.querySelector(\"table.deliveries tr[data-state='failed']\") !== null",
                                   LIVE_BOUND, "the page never showed the failed attempt")
                _send(server, "--from", "web:api", "--to", "web:ui", "--subject", "answered 200")
                await tab.wait_for("document.querySelector(\"table.deliveries tr[data-state='delivered']\") "
                                   "!== null", LIVE_BOUND, "the page never showed the delivery")
                assert await tab.evaluate("window.sameDocument") == "yes"
                failed = await tab.text("table.deliveries tr[data-state='failed']")
                delivered = await tab.text("table.deliveries tr[data-state='delivered']")
                assert "HTTP 500" in failed and "mail" in failed, failed
                assert "HTTP 200" in delivered and "HTTP 500" not in delivered, delivered
                assert "1 delivered" in await tab.text("section.webhook")
                assert "1 failed" in await tab.text("section.webhook")
                failures = await tab.text("table.failures")
                assert added["id"] in failures and "HTTP 500" in failures, failures
                page = await tab.evaluate("document.documentElement.outerHTML")
                assert secret not in page and receiver.url not in page

                for token in (supervisor, identity):
                    await tab.call("Network.clearBrowserCookies")
                    await _login(tab, server, token)
                    assert await tab.evaluate("document.querySelector(\"a[href='/ui/webhooks']\") === null")
                    await tab.open(f"{server.url}/ui/webhooks")
                    assert await tab.text("h1") == "Refused"
                    assert "operator" in await tab.text(".error")
                    shown = await tab.evaluate("document.documentElement.outerHTML")
                    assert added["id"] not in shown and secret not in shown
                return (await tab.call("Network.getCookies", urls=[server.url + "/ui/"]))["cookies"][0]["value"]

        session = asyncio.run(drive())
        status, headers, body = _request(server, "GET", "/ui/webhooks",
                                         headers={"Cookie": f"agent_mail_console={session}"})
        assert status == 403 and "no-store" in headers["cache-control"], status
        assert len(receiver.posts) == 2
    finally:
        code, log = server.stop()
        receiver.stop()
    assert code == 0 and secret not in log and "Traceback" not in log


def test_a_session_works_on_two_replicas_behind_one_address(mailbox_path, backend, tmp_path):
    if backend != "postgresql":
        pytest.skip("replicas share a PostgreSQL mailbox")
    chromium = require("chromium")
    replicas = Replicas(str(mailbox_path))
    a, b = replicas
    proxy = RoundRobin([a.port, b.port])
    try:
        token = a.token("--agent", "ops:human", "--supervisor")
        json_of(a.direct("send", "--from", "web:api", "--to", "web:ui", "--subject", "before"))

        async def drive():
            async with Chromium(chromium, tmp_path / "chromium") as tab:
                await tab.open(f"{proxy.url}/ui/login")
                await tab.evaluate(f"document.getElementById('token').value = {json.dumps(token)}")
                await tab.evaluate("document.querySelector('form button[type=submit]').click()")
                await tab.wait_for("location.pathname === '/ui/' && document.readyState === 'complete'")
                await tab.wait_for("document.body.dataset.liveReady === 'yes'")
                # Mail sent through each replica reaches the page, whichever replica carries its stream.
                for replica, subject in ((a, "through a"), (b, "through b")):
                    json_of(replica.direct("send", "--from", "web:api", "--to", f"via:{subject[-1]}",
                                           "--subject", subject))
                    await tab.wait_for(f"document.querySelector(\"tr[data-agent='via:{subject[-1]}']\") !== null",
                                       LIVE_BOUND, f"mail {subject} never reached the page")
                return (await tab.call("Network.getCookies", urls=[proxy.url + "/ui/"]))["cookies"][0]["value"]

        session = asyncio.run(drive())
        for replica in (a, b):  # the session, made by one replica, holds on the other
            status, _, body = _request(replica, "GET", "/ui/agents/web:ui",
                                       headers={"Cookie": f"agent_mail_console={session}"})
            assert status == 200 and b"before" in body, (replica.port, status)
    finally:
        proxy.close()
        replicas.stop()
