"""The dashboard: what it reads (nothing marked read by looking), the Textual app driven by its own pilot (keys,
filters, live updates from another process, stepping in as a human), snapshots of the main screens, and the
command's errors before anything is drawn."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import subprocess
import sys
import time

import pytest

from agent_mail import model
from agent_mail.operations import mail
from tests.lib.cli import process_env
from tests.lib.mailbox import raw_db

textual = pytest.importorskip("textual", reason="the dashboard needs the tui extra: pip install 'agent-mail[tui]'")

from agent_mail.dashboard import app as dashboard_app  # noqa: E402
from agent_mail.dashboard import data, feeder  # noqa: E402
from agent_mail.dashboard.table import Table  # noqa: E402

pytestmark = pytest.mark.backends  # runs on SQLite and on PostgreSQL


def send(am, sender, to, subject, *extra):
    targets = [a for t in ([to] if isinstance(to, str) else to) for a in ("--to", t)]
    return am("send", "--from", sender, *targets, "--subject", subject, "--body", f"body of {subject}", *extra).json


def supervisor_call(what):
    with mail.open_mailbox() as mailbox:
        return what(data.Supervisor(mailbox))


def unread_of(am, agent):
    return am("status", "--agent", agent).json["agents"][0]["unread"]


# ---------------------------------------------------------------- what it reads


@pytest.mark.fast
def test_fleet_puts_problems_first_and_spells_them(am):
    send(am, "ops:lead", "api:worker", "old work")
    send(am, "ops:lead", "web:worker", "fresh work")
    am("read", "web:worker").assert_ok()
    refused = am("send", "--from", "ops:lead", "--to", "gone:agent", "--subject", "anyone?", "--require-reachable")
    assert refused.code == 3, refused.err
    fleet = supervisor_call(lambda s: s.fleet(overdue_minutes=30))
    by_agent = {r["agent"]: r for r in fleet}
    assert by_agent["api:worker"]["problems"] == [data.DEAF]  # unread, nobody listening
    assert by_agent["web:worker"]["problems"] == []  # read it: not deaf, not yet overdue
    assert by_agent["ops:lead"]["problems"] == [data.BOUNCED] and by_agent["ops:lead"]["bounces"] == 1
    assert [r["agent"] for r in fleet][:2] == ["api:worker", "ops:lead"]  # deaf, then bounced, then the rest
    assert by_agent["web:worker"]["watch_state"] == "never" and by_agent["web:worker"]["unacked"] == 1


@pytest.mark.fast
def test_reservations_are_shown_per_identity_with_dead_holders_marked(am):
    """Issue 22: the Fleet counts them, an identity's Inbox lists them, a dead holder's marked as blocking nobody."""
    import datetime as dt

    from agent_mail import model

    send(am, "ops:lead", "api:worker", "hello")
    am("heartbeat", "api:worker").assert_ok()  # live
    now, old = model.now(), model.now() - dt.timedelta(hours=2)

    def row(agent, pattern, renewed):
        return {"id": model.new_message_id(), "repo": "github.com/acme/widget", "agent": agent, "pattern": pattern,
                "exclusive": True, "reason": None, "created": model.iso(renewed), "renewed_at": model.iso(renewed),
                "expires_at": model.iso(now + dt.timedelta(hours=1))}

    def save(s):
        with s.store.transaction(write=True):
            s.store.save_reservations([row("api:worker", "/src/**", now), row("gone:agent", "/docs/", old)])

    supervisor_call(save)
    held = supervisor_call(lambda s: s.reservations())
    assert [(r["pattern"], r["held"]) for r in held["api:worker"]] == [("/src/**", True)]
    assert [(r["pattern"], r["held"]) for r in held["gone:agent"]] == [("/docs/", False)]
    by_agent = {r["agent"]: r for r in supervisor_call(lambda s: s.fleet())}
    assert (by_agent["api:worker"]["reserved"], by_agent["api:worker"]["reserved_dead"]) == (1, 0)
    inbox = supervisor_call(lambda s: s.inbox("gone:agent"))
    from agent_mail.dashboard.inbox import holding

    assert holding(inbox["reservations"]) == "\nHolds: /docs/ (exclusive, holder dead: blocks nobody)"


@pytest.mark.fast
def test_overdue_follows_the_threshold(am, monkeypatch):
    send(am, "ops:lead", "web:worker", "slow one")
    am("read", "web:worker").assert_ok()
    later = model.now() + dt.timedelta(minutes=45)
    monkeypatch.setattr(model, "now", lambda: later)
    by_agent = {r["agent"]: r for r in supervisor_call(lambda s: s.fleet(overdue_minutes=30))}
    assert by_agent["web:worker"]["problems"] == [data.OVERDUE]
    assert by_agent["web:worker"]["oldest_unacked_age"] >= 45 * 60
    by_agent = {r["agent"]: r for r in supervisor_call(lambda s: s.fleet(overdue_minutes=60))}
    assert by_agent["web:worker"]["problems"] == []


STATE = ("SELECT id, read_at, acked_at, archived_at, deleted_at FROM messages ORDER BY id",
         "SELECT message_id, agent, read_at, acked_at FROM broadcast_acks ORDER BY message_id, agent")


def states(mailbox_path):
    db = raw_db(mailbox_path)
    try:
        return [[tuple(r) for r in db.execute(sql).fetchall()] for sql in STATE]
    finally:
        db.close()


@pytest.mark.fast
def test_looking_marks_nothing_read(am, mailbox_path):
    first = send(am, "ops:lead", ["api:worker", "web:worker"], "look only")
    send(am, "ops:lead", "*", "everyone look")
    am("send", "--from", "api:worker", "--to", "ops:lead", "--subject", "re", "--reply-to",
       first["deliveries"][0]["id"]).assert_ok()
    before, unread = states(mailbox_path), {a: unread_of(am, a) for a in ("api:worker", "web:worker", "ops:lead")}
    feed = supervisor_call(lambda s: s.feed())
    assert [f["subject"] for f in feed] == ["re", "everyone look", "look only"]
    fan_out = feed[2]
    assert fan_out["recipients"] == ["api:worker", "web:worker"]
    assert fan_out["states"] == {"api:worker": "acked", "web:worker": "unread"}  # the reply settled api's copy
    assert feed[1]["broadcast"]["read"] == 0
    thread = supervisor_call(lambda s: s.thread(first["deliveries"][1]["id"]))
    assert [t["subject"] for t in thread] == ["look only", "re"]
    inbox = supervisor_call(lambda s: s.inbox("web:worker"))
    assert {m["subject"] for m in inbox["messages"]} == {"look only", "everyone look"}
    assert supervisor_call(lambda s: s.message(first["deliveries"][0]["id"]))["subject"] == "look only"
    assert states(mailbox_path) == before
    assert {a: unread_of(am, a) for a in unread} == unread


@pytest.mark.fast
def test_charts_count_sends_per_hour_and_the_backlog(am):
    send(am, "ops:lead", ["api:worker", "web:worker"], "one")  # a fan-out is one send
    send(am, "api:worker", "ops:lead", "two")
    am("read", "ops:lead").assert_ok()
    hourly = supervisor_call(lambda s: s.hourly(by="project"))
    assert len(hourly["hours"]) == 24 and hourly["series"] == {
        "api": [0] * 23 + [1], "ops": [0] * 23 + [1]}
    by_identity = supervisor_call(lambda s: s.hourly(by="identity"))
    assert set(by_identity["series"]) == {"api:worker", "ops:lead"}
    backlog = supervisor_call(lambda s: s.backlog(hours=2))
    assert backlog["unread"] == [0, 0, 2] and backlog["unacked"] == [0, 0, 3]


# ---------------------------------------------------------------- the application, through Textual's pilot


def run_app(test, *, size=(80, 24), **options):
    """Run `test(app, pilot)` against a fresh Dashboard inside Textual's test harness."""
    async def main():
        first = supervisor_call(lambda s: {"fleet": s.fleet(), "feed": s.feed()})
        if options.get("human"):
            with mail.open_mailbox() as mailbox:
                mailbox.profile(agent=options["human"], human=True)
        app = dashboard_app.Dashboard(first=first, **options)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await test(app, pilot)
    asyncio.run(main())


def table_text(app, table_id):
    from textual.widgets import DataTable

    table = app.query_one(f"#{table_id}", DataTable)
    return [" ".join(str(c) for c in table.get_row_at(i)) for i in range(table.row_count)]


async def wait_for(pilot, condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if condition():
            return True
    return False


def screen_lines(app) -> list[str]:
    """The text of the screen as drawn now, one string per row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def footer_keys(app) -> set[str]:
    """The keys the footer offers (shown and enabled), as Textual's Footer picks them."""
    return {key for key, active in app.screen.active_bindings.items() if active.binding.show and active.enabled}


def test_keys_switch_screens_filter_sort_and_show_help(am):
    for agent in ("api:worker", "web:worker", "web:tester"):
        send(am, "ops:lead", agent, f"task for {agent}")

    async def test(app, pilot):
        from textual.widgets import TabbedContent

        tabs = app.query_one("#tabs", TabbedContent)
        assert len(table_text(app, "fleet-table")) == 4
        await pilot.press("2")
        assert tabs.active == "traffic" and len(table_text(app, "feed-table")) == 3
        await pilot.press("1", "slash")
        await pilot.press(*"web", "enter")
        assert [r.split()[0] for r in table_text(app, "fleet-table")] == ["web:tester", "web:worker"]
        await pilot.press("slash", "ctrl+u", "enter")  # an empty filter shows everyone again
        assert len(table_text(app, "fleet-table")) == 4
        await pilot.press("s")  # problems -> agent
        assert app.fleet_pane.sort_by == "agent"
        assert [r.split()[0] for r in table_text(app, "fleet-table")] == [
            "api:worker", "ops:lead", "web:tester", "web:worker"]
        await pilot.press("e")  # only watch state "armed": nobody
        assert table_text(app, "fleet-table") == []
        await pilot.press("e", "e", "e", "e")  # back to every state
        assert len(table_text(app, "fleet-table")) == 4
        await pilot.press("p")  # first project: api
        assert [r.split()[0] for r in table_text(app, "fleet-table")] == ["api:worker"]
        await pilot.press("plus")
        assert app.overdue_minutes == 35
        await pilot.press("question_mark")
        assert type(app.screen).__name__ == "Help"
        await pilot.press("escape")
        assert type(app.screen).__name__ != "Help"

    run_app(test, live=False)


@pytest.mark.sqlite_only  # keys and focus: the backend plays no part
def test_each_screen_key_shows_its_screen_from_every_screen_in_every_order(am):
    """The focused table of the screen being left used to hand its focus to its pane's detail view when
    hidden, which made that pane the active one again: from Traffic or Inbox, `4` stayed where it was."""
    send(am, "ops:lead", "web:worker", "something to show")
    names = {"1": "fleet", "2": "traffic", "3": "inbox", "4": "charts"}

    async def test(app, pilot):
        from textual import events
        from textual.widgets import TabbedContent

        tabs = app.query_one("#tabs", TabbedContent)
        app.animation_level = "none"  # the tabs' underline slides otherwise, and each press waits for it
        assert await wait_for(pilot, lambda: app.feeder is not None and app.feeder.is_alive())
        for order in itertools.permutations("1234"):
            for key in order + (order[-1],):  # and the same key again stays put
                await pilot.press(key)  # (which waits until the app is idle)
                assert (tabs.active, app.shown_tab) == (names[key], names[key]), (order, key)
        for order in itertools.permutations("1234"):  # typed ahead, as a busy terminal delivers them
            for key in order:  # as pilot.press does, without waiting for each key to be handled
                event = events.Key(key, key)
                event.set_sender(app)
                app._driver.send_message(event)
            wanted = (names[order[-1]],) * 2
            assert await wait_for(pilot, lambda: (tabs.active, app.shown_tab) == wanted,  # noqa: B023 - awaited here
                                  seconds=5.0), (order, tabs.active, app.shown_tab)
            await pilot.pause(0.1)  # and it stays there
            assert (tabs.active, app.shown_tab) == wanted, order

    run_app(test)


def test_the_footer_offers_only_what_works(am):
    send(am, "ops:lead", "web:worker", "x")
    human_keys = {"c", "r"}

    async def read_only(app, pilot):
        assert footer_keys(app) & human_keys == set(), footer_keys(app)
        assert {"question_mark", "q"} <= footer_keys(app)
        await pilot.press("question_mark")  # and the help says how to step in
        assert any("read-only: start with --as PROJECT:NAME" in line for line in screen_lines(app))

    async def stepping_in(app, pilot):
        assert human_keys <= footer_keys(app)

    run_app(read_only, live=False)
    run_app(stepping_in, human="ops:human", live=False)


def test_a_row_with_several_problems_names_them_all(am, monkeypatch):
    send(am, "ops:lead", "web:worker", "waiting a long time")
    later = model.now() + dt.timedelta(minutes=45)
    monkeypatch.setattr(model, "now", lambda: later)

    async def test(app, pilot):
        row = next(r for r in table_text(app, "fleet-table") if r.startswith("web:worker"))
        # both named (it said "deaf with mail +1"), short to fit; then its last activity and machine: none
        assert row.endswith("deaf, overdue - -"), row

    run_app(test, live=False)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_help_reads_as_a_list_at_every_width(am, size):
    """Each key and what it does on one line, under its screen's name (it used to wrap mid-list and lose
    its indentation)."""
    entries = [("1 2 3 4", "Fleet, Traffic, Inbox, Charts"), ("/", "filter by text"),
               ("p  e  s", "cycle project, watch state, sort"), ("+  -", "overdue threshold"),
               ("enter  i", "that identity's inbox"), ("enter  t", "the selected send's whole thread"),
               ("w", "save its attachments"), ("g", "sends per hour by project or by identity"),
               ("c  b", "send, broadcast to everyone"), ("r", "reply to the selected message"),
               ("k", "cancel a scheduled message you sent"), ("a  d  x", "ack, dismiss, archive"),
               ("?  q", "this help, quit")]

    async def test(app, pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        box = app.screen.query_one("#help").content_region
        lines = [line[box.x:box.right].rstrip() for line in screen_lines(app)[box.y:box.bottom]]
        for keys, what in entries:
            assert any(f" {keys} " in line and what in line.split(f" {keys} ", 1)[1] for line in lines), \
                (keys, what, lines)
        for section in ("Screens", "Fleet", "Traffic", "Inbox", "Charts", "Step in", "Anywhere"):
            assert any(line.startswith(section + " ") for line in lines), (section, lines)
        assert app.screen.query_one("#help").max_scroll_y == 0, lines  # nothing hidden below the box

    run_app(test, size=size, human="ops:human", live=False)


def test_selecting_an_identity_opens_its_inbox_without_marking_it_read(am):
    send(am, "ops:lead", "web:worker", "private to web")

    async def test(app, pilot):
        await pilot.press("s")  # by name: api... none; ops:lead, web:worker
        rows = [r.split()[0] for r in table_text(app, "fleet-table")]
        for _ in range(rows.index("web:worker")):
            await pilot.press("down")
        await pilot.press("enter")
        assert await wait_for(pilot, lambda: table_text(app, "inbox-table"))
        assert "private to web" in table_text(app, "inbox-table")[0]
        assert "unread" in table_text(app, "inbox-table")[0]

    run_app(test, live=False)
    assert unread_of(am, "web:worker") == 1


def test_text_from_mail_is_plain_text_on_every_screen(am, mailbox_path, monkeypatch):
    """Subjects that are markup to Rich are shown as written on the Traffic and Inbox screens (they stopped the app
    with MarkupError), and what an older version could store (ESC and C1 in a subject, body, ref or attachment
    name) is written out, never drawn as a control sequence. Notices quoting mail are plain too."""
    hostile = "x\x1b]0;pwned\x07\x9b2J"
    send(am, "ops:lead", "web:worker", "fix [/bold] now")
    send(am, "ops:lead", "web:worker", "[link=https://evil.example]notes[/link]")
    planted = send(am, "ops:lead", "web:worker", "later")["id"]
    db = raw_db(str(mailbox_path))
    try:
        with db:
            db.execute("UPDATE messages SET subject = ?, body = ?, refs = ? WHERE id = ?",
                       (f"s{hostile}", f"line one\nb{hostile}", json.dumps([f"/srv/{hostile}"]), planted))
    finally:
        db.close()
    shown = "x\\x1b]0;pwned\\x07\\x9b2J"

    async def test(app, pilot):
        await pilot.press("2")
        assert await wait_for(pilot, lambda: len(table_text(app, "feed-table")) == 3)
        rows = "\n".join(table_text(app, "feed-table"))
        assert "fix [/bold] now" in rows and "[link=https://evil.example]notes[/link]" in rows and shown in rows
        detail = str(app.query_one("#detail-text").render())
        assert f"s{shown}" in detail and f"/srv/{shown}" in detail and f"line one\nb{shown}" in detail
        app.open_inbox("web:worker")
        assert await wait_for(pilot, lambda: len(table_text(app, "inbox-table")) == 3)
        rows = "\n".join(table_text(app, "inbox-table"))
        assert "fix [/bold] now" in rows and f"s{shown}" in rows and "\x1b" not in rows and "\x9b" not in rows
        assert f"b{shown}" in str(app.query_one("#inbox-detail-text").render())
        said = []  # a notice quoting mail goes to Textual as plain text, written out
        monkeypatch.setattr(textual.app.App, "notify", lambda self, message, **kw: said.append((message, kw)))
        app.notify("Saved [/bold] x\x1b[2J", severity="warning")
        assert said == [("Saved [/bold] x\\x1b[2J", {"title": "", "severity": "warning", "timeout": None,
                                                       "markup": False})]

    run_app(test, size=(160, 40), live=False)


def test_a_send_from_another_process_appears_through_the_wake_not_the_refresh(am, monkeypatch):
    monkeypatch.setattr(feeder, "REFRESH_SECONDS", 120.0)  # only a wake-up can bring it in time
    send(am, "ops:lead", "web:worker", "before")

    async def test(app, pilot):
        assert await wait_for(pilot, lambda: app.feeder is not None and app.feeder.is_alive())
        await pilot.press("2")  # the screen in view is what the feeder reads
        await pilot.pause(1.0)  # the feeder listens before its first look
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "api:worker", "--to",
                               "web:worker", "--subject", "landed later"], env=process_env(),
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert await wait_for(pilot, lambda: any("landed later" in r for r in table_text(app, "feed-table")),
                              seconds=20.0)
        assert time.monotonic() - started < 60  # far inside the two-minute refresh: it was woken
        # the newest was selected, so the newest stays selected, its body shown (like tail -f) ...
        feed = app.query_one("#feed-table", Table)
        assert feed.cursor_row == 0 and "landed later" in table_text(app, "feed-table")[0]
        assert str(app.query_one("#detail-text").content).startswith("landed later")
        # ... and a send picked further down stays picked while more land above it
        await pilot.press("down")
        picked = feed.selected_key()
        send(am, "api:worker", "web:worker", "third one")
        assert await wait_for(pilot, lambda: "third one" in table_text(app, "feed-table")[0], seconds=20.0)
        assert feed.selected_key() == picked and feed.cursor_row == 2
        await pilot.press("1")  # and the Fleet, read when shown, has the new sender
        assert await wait_for(pilot, lambda: "api:worker" in [r.split()[0] for r in table_text(app, "fleet-table")])

    run_app(test)


def test_stepping_in_as_a_human_sends_replies_and_handles_own_mail(am):
    question = send(am, "api:worker", "ops:human", "may I deploy?")["id"]

    async def test(app, pilot):
        await pilot.press("c")
        await pilot.press(*"web:worker")
        await pilot.press("tab", *"from the human", "tab", *"hello")
        await pilot.press("ctrl+s")
        assert await wait_for(pilot, lambda: any("from the human" in r for r in table_text(app, "feed-table"))
                              or _stored(am, "web:worker", "from the human"))
        await pilot.press("3")  # the human's own inbox
        assert await wait_for(pilot, lambda: any("may I deploy?" in r for r in table_text(app, "inbox-table")))
        await pilot.press("r")
        assert type(app.screen).__name__ == "Compose"
        await pilot.press(*"yes", "ctrl+s")
        assert await wait_for(pilot, lambda: _stored(am, "api:worker", "Re: may I deploy?"))
        await pilot.press("3")
        await pilot.press("x")  # archive the question
        assert await wait_for(pilot, lambda: _state(am, "ops:human", question) == "archived")
        await pilot.press("b")
        await pilot.press(*"all hands", "ctrl+s")  # the subject has the focus: "to" is filled in
        assert await wait_for(pilot, lambda: _stored(am, "web:worker", "all hands"))

    run_app(test, human="ops:human")
    reply = [m for m in am("read", "api:worker", "--all").json["messages"] if m["subject"] == "Re: may I deploy?"][0]
    assert reply["sender"] == "ops:human" and reply["reply_to"] == question
    assert am("profile", "ops:human").json["human"] is True


def test_bad_input_from_the_dashboard_is_shown_and_changes_nothing(am, mailbox_path):
    notes = []

    async def test(app, pilot):
        app.notify = lambda message, **kw: notes.append((message, kw.get("severity")))
        await pilot.press("c", *"not an identity", "ctrl+s")
        assert await wait_for(pilot, lambda: notes)

    run_app(test, human="ops:human")
    assert notes[0][1] == "error" and "to: " in notes[0][0] and "subject: " in notes[0][0]
    db = raw_db(mailbox_path)
    try:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    finally:
        db.close()


def test_without_as_the_dashboard_only_looks(am, mailbox_path):
    notes = []
    send(am, "ops:lead", "web:worker", "x")

    async def test(app, pilot):
        app.notify = lambda message, **kw: notes.append(message)
        for key in ("c", "r", "b", "k", "a", "d", "x"):
            await pilot.press(key)
        assert type(app.screen).__name__ not in ("Compose",)

    run_app(test, live=False)
    assert notes and all("--as" in n for n in notes)
    assert am("status").json["count"] == 2


def test_the_human_saves_attachments_and_withdraws_a_scheduled_send(am, tmp_path):
    report = tmp_path / "report.txt"
    report.write_text("the numbers")
    send(am, "api:worker", "ops:human", "with a file", "--attach", str(report))
    later = send(am, "ops:human", "web:worker", "not yet", "--delay-minutes", "30")["id"]
    into = tmp_path / "saved"
    into.mkdir()
    notes = []

    async def select(app, pilot, subject):
        table = app.query_one("#feed-table", Table)
        table.move_cursor(row=[subject in r for r in table_text(app, "feed-table")].index(True))
        await pilot.pause()

    async def test(app, pilot):
        app.notify = lambda message, **kw: notes.append((message, kw.get("severity")))
        await pilot.press("2")
        await select(app, pilot, "with a file")
        await pilot.press("w", "ctrl+u", *str(into), "enter")
        assert await wait_for(pilot, lambda: (into / "report.txt").exists())
        await select(app, pilot, "not yet")
        await pilot.press("k")
        assert await wait_for(pilot, lambda: len(notes) == 2)

    run_app(test, human="ops:human", live=False)
    assert (into / "report.txt").read_text() == "the numbers"
    assert [severity for _, severity in notes] == ["information", "information"]
    assert notes[0][0] == f"Saved report.txt in {into}" and notes[1][0] == "Cancelled 1 message(s)"
    feed = supervisor_call(lambda s: s.feed())
    assert [f["states"] for f in feed if f["id"] == later] == [{"web:worker": "withdrawn"}]
    withdrawn = next(f for f in feed if f["id"] == later)  # placed when it was sent, never having landed
    assert withdrawn["at"] == withdrawn["created"] and withdrawn["withdrawn_at"] >= withdrawn["created"]


def _stored(am, agent, subject):
    return any(m["subject"] == subject for m in am("read", agent, "--all", "--no-mark-read").json["messages"])


def _state(am, agent, message_id):
    for m in am("read", agent, "--archived").json["messages"]:
        if m["id"] == message_id:
            return "archived"
    return None


# ---------------------------------------------------------------- the command


def test_an_unopenable_mailbox_is_a_json_error_before_anything_is_drawn(tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("one backend is enough for the command's own checks")
    blocker = tmp_path / "file"
    blocker.write_text("")
    for env in (process_env(AGENT_MAIL_DB=str(blocker / "mail.db")),
                process_env(AGENT_MAIL_DB="postgresql://nobody@127.0.0.1:1/x")):
        done = subprocess.run([sys.executable, "-m", "agent_mail", "dashboard"], env=env, capture_output=True,
                              timeout=60)
        assert done.returncode == 1 and done.stdout == b""
        error = json.loads(done.stderr)
        assert "Traceback" not in done.stderr.decode() and error["error"]
    done = subprocess.run([sys.executable, "-m", "agent_mail", "dashboard", "--as", "Nope"], env=process_env(),
                          capture_output=True, timeout=60)
    assert done.returncode == 2 and json.loads(done.stderr)["problems"][0]["field"] == "--as"
    done = subprocess.run([sys.executable, "-m", "agent_mail", "dashboard", "--web"], env=process_env(),
                          capture_output=True, timeout=60)  # gone: the web console (serve, /ui/) replaces it
    assert done.returncode == 2 and json.loads(done.stderr)["problems"][0]["field"] == "--web"
    assert "/ui/" in json.loads(done.stderr)["error"]
    # a good mailbox, but output to a pipe: nothing to draw on, said plainly (no escape codes in the pipe)
    done = subprocess.run([sys.executable, "-m", "agent_mail", "dashboard"], env=process_env(
        AGENT_MAIL_DB=str(tmp_path / "good.db")), stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    assert done.returncode == 1 and done.stdout == b""
    assert "/ui/" in json.loads(done.stderr)["error"]


# ---------------------------------------------------------------- snapshots (80x24 and wide)

FIXED = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.timezone.utc)


@pytest.fixture
def frozen(monkeypatch):
    """A fixed clock and predictable message ids, so the screens are the same on every run."""
    clock = {"now": FIXED}
    counter = itertools.count(1)
    monkeypatch.setattr(model, "now", lambda: clock["now"])
    monkeypatch.setattr(model, "new_message_id", lambda: f"00000000-0000-4000-8000-{next(counter):012d}")
    monkeypatch.setattr(model, "machine_name", lambda: "build-1")  # the machine the team works on, shown
    return clock


def seed_team(am, clock):
    """A small team with one of each problem."""
    steps = [
        ("ops:lead", ["api:worker", "web:worker"], "ship the release"),
        ("api:worker", "ops:lead", "tests are green"),
        ("ops:lead", "*", "standup in 5"),
        ("web:worker", "ops:human", "need a decision on the banner"),
        ("ops:lead", "docs:writer", "update the changelog"),
    ]
    for n, (sender, to, subject) in enumerate(steps):
        clock["now"] = FIXED - dt.timedelta(minutes=50 - 9 * n)
        send(am, sender, to, subject)
    am("read", "api:worker").assert_ok()
    am("read", "ops:lead").assert_ok()
    clock["now"] = FIXED


@pytest.mark.sqlite_only
@pytest.mark.parametrize("size", [(80, 24), (140, 36)], ids=["80x24", "wide"])
@pytest.mark.parametrize("screen", ["1", "2", "3", "4", "question_mark"],
                         ids=["fleet", "traffic", "inbox", "charts", "help"])
def test_snapshots_of_the_main_screens(am, frozen, snap_compare, size, screen, backend):
    seed_team(am, frozen)
    first = supervisor_call(lambda s: {"fleet": s.fleet(), "feed": s.feed()})
    app = dashboard_app.Dashboard(first=first, human="ops:human", live=False)

    async def before(pilot):
        if screen == "4":
            app.apply_snapshot(supervisor_call(lambda s: {"hourly": s.hourly(), "backlog": s.backlog()}))
        if screen == "3":
            app.show_inbox(supervisor_call(lambda s: s.inbox("ops:human")))
        await pilot.pause()

    assert snap_compare(app, press=[screen, "_"], terminal_size=size, run_before=before)


@pytest.mark.sqlite_only  # the clock is moved by hand; a PostgreSQL server stamps mail with its own
def test_a_withdrawn_scheduled_send_is_shown_where_it_was_sent_and_says_so(am, frozen, backend):
    frozen["now"] = FIXED - dt.timedelta(minutes=12)
    send(am, "ops:lead", "web:worker", "due soon", "--delay-minutes", "10")  # landed 2 minutes ago
    frozen["now"] = FIXED - dt.timedelta(minutes=10)
    withdrawn = send(am, "ops:lead", "api:worker", "never mind", "--delay-minutes", "30")["id"]
    frozen["now"] = FIXED - dt.timedelta(minutes=8)
    am("cancel", "ops:lead", withdrawn).assert_ok()
    frozen["now"] = FIXED - dt.timedelta(minutes=5)
    send(am, "ops:lead", "web:worker", "later", "--delay-minutes", "60")  # still scheduled
    frozen["now"] = FIXED

    async def test(app, pilot):
        await pilot.press("2")
        rows = table_text(app, "feed-table")
        # Newest first by the moment each send landed (or, never delivered, was sent): the one delivered 2
        # minutes ago, the one scheduled 5 minutes ago, the one sent 10 minutes ago and withdrawn.
        assert [r.split()[0] for r in rows] == ["2m", "5m", "10m"], rows
        assert rows[0].endswith("due soon unread") and rows[1].endswith("later scheduled")
        assert rows[2].endswith("never mind withdrawn"), rows
        table = app.query_one("#feed-table", Table)
        table.move_cursor(row=2)
        await pilot.pause()
        detail = str(app.query_one("#detail-text").content)
        assert "sent 2026-12-01T09:20" in detail and "withdrawn 2026-12-01T09:22" in detail, detail
        assert "was due 2026-12-01T09:50" in detail, detail
        table.move_cursor(row=1)
        await pilot.pause()
        detail = str(app.query_one("#detail-text").content)
        assert "sent 2026-12-01T09:25" in detail and "due 2026-12-01T10:25" in detail, detail
        table.move_cursor(row=0)
        await pilot.pause()
        detail = str(app.query_one("#detail-text").content)
        assert "sent 2026-12-01T09:18" in detail and "delivered 2026-12-01T09:28" in detail, detail

    run_app(test, live=False)


@pytest.mark.sqlite_only  # the clock is moved by hand
def test_the_charts_count_in_whole_sends(am, frozen, backend):
    seed_team(am, frozen)
    for minutes in (70, 130):  # a few sends an hour: the axis must not step in thirds of a send
        frozen["now"] = FIXED - dt.timedelta(minutes=minutes)
        send(am, "web:worker", "ops:lead", f"{minutes} minutes ago")
    frozen["now"] = FIXED

    async def test(app, pilot):
        await pilot.press("4")
        app.apply_snapshot(supervisor_call(lambda s: {"hourly": s.hourly(), "backlog": s.backlog()}))
        await pilot.pause()
        lines = screen_lines(app)
        import re

        assert any("Sends per hour" in line for line in lines)
        assert not [line for line in lines if re.search(r"\d\.\d", line)], "\n".join(lines)

    run_app(test, live=False)


@pytest.mark.sqlite_only  # no mailbox involved
def test_a_table_given_new_content_shows_exactly_that_content():
    """The diffing table (it changes only what changed) ends where a rebuilt one would, in every case."""
    from rich.text import Text
    from textual.app import App

    class One(App):
        def compose(self):
            yield Table(id="t")

    cases = [
        [("a", ("1", "x")), ("b", ("2", "y")), ("c", ("3", "z"))],
        [("n", ("0", "new")), ("a", ("1", "x")), ("b", ("2", "y!")), ("c", ("3", "z"))],  # one on top, one changed
        [("a", ("1", "x")), ("c", ("3", "z")), ("n", ("0", "new"))],  # one gone, moved
        [("c", ("3", "z")), ("a", ("1", "x"))],
        [("a", ("1", "x")), ("c", ("3", "z"))],  # the same rows in another order: only the order changes
        [("p", ("9", "p")), ("q", ("8", "q")), ("r", ("7", "r")), ("a", ("1", "x"))],  # mostly new: rebuilt
        [],
        [("a", (Text("1", style="bold"), "x"))],
    ]

    async def run():
        app = One()
        async with app.run_test(size=(40, 12)) as pilot:
            table = app.query_one(Table)
            table.add_columns("n", "what")
            for rows in cases:
                table.sync(rows)
                await pilot.pause()
                assert [k.value for k in (table.coordinate_to_cell_key((i, 0)).row_key
                                          for i in range(table.row_count))] == [k for k, _ in rows]
                assert [tuple(table.get_row_at(i)) for i in range(table.row_count)] == [c for _, c in rows]
                assert [row.key.value for row in table.ordered_rows] == [k for k, _ in rows]  # as drawn

    asyncio.run(run())


class Cable:
    """A TCP forwarder on 127.0.0.1 to the PostgreSQL server that the test can unplug (every connection cut and
    new ones refused, as a server restart or a network cut would) and plug back in, on the same port."""

    def __init__(self, upstream: tuple[str, int]):
        import socket
        import threading

        self.upstream, self.socket, self.threading = upstream, socket, threading
        self.port, self.listener, self.open = 0, None, []
        self.plug()

    def plug(self) -> None:
        listener = self.socket.socket()
        listener.setsockopt(self.socket.SOL_SOCKET, self.socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port, self.listener = listener.getsockname()[1], listener
        self.threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # unplugged
            server = self.socket.create_connection(self.upstream)
            self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                self.threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source, sink) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(self.socket.SHUT_RDWR)
            except OSError:
                pass

    def unplug(self) -> None:
        try:
            self.listener.shutdown(self.socket.SHUT_RDWR)  # wakes the blocked accept(); close alone would not
        except OSError:
            pass
        self.listener.close()
        for end in self.open:
            try:
                end.shutdown(self.socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()
        self.open = []


def test_a_lost_postgresql_connection_is_shown_and_recovered_from(am, backend, monkeypatch):
    if backend != "postgresql":
        pytest.skip("about the connection to a PostgreSQL server")
    import os
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    from tests.lib.postgres import TEST_PG_URL

    send(am, "ops:lead", "web:worker", "before")
    direct = os.environ["AGENT_MAIL_DB"]
    parts = urlsplit(direct)
    cable = Cable((parts.hostname, parts.port or 5432))
    netloc = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    through = urlunsplit(parts._replace(netloc=f"{netloc}127.0.0.1:{cable.port}"))
    monkeypatch.setattr(feeder, "REFRESH_SECONDS", 120.0)  # what comes back is the wake-up, not a timer
    monkeypatch.setenv("PGAPPNAME", "agent-mail dashboard under test")  # its connections, told apart
    monkeypatch.setenv("AGENT_MAIL_DB", through)  # the dashboard reaches the server through the cable

    def from_outside(sender, subject):  # the fleet goes on sending, straight to the server
        done = subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", sender, "--to", "web:worker",
                               "--subject", subject], env=process_env(AGENT_MAIL_DB=direct, PGAPPNAME="agent-mail"),
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr

    async def test(app, pilot):
        assert await wait_for(pilot, lambda: app.feeder is not None and app.feeder.is_alive())
        await pilot.press("2")
        await pilot.pause(1.0)
        banner = app.query_one("#problem")
        # 1. The server ends the dashboard's connections (a restart would): re-made at once, nothing to show.
        with psycopg.connect(TEST_PG_URL, autocommit=True, application_name="the cut") as db:
            assert db.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                              "application_name = 'agent-mail dashboard under test'").fetchone()[0] >= 1
        from_outside("api:worker", "after a restart")
        assert await wait_for(pilot, lambda: "after a restart" in table_text(app, "feed-table")[0], seconds=20.0)
        # 2. The server is out of reach: said on screen, in words, while it retries.
        cable.unplug()
        # (well inside the 15 s a command spends re-making a connection before it gives up)
        assert await wait_for(pilot, lambda: "retrying" in str(banner.content), seconds=10.0), "no problem shown"
        assert "PostgreSQL" in str(banner.content) and "Traceback" not in str(banner.content)
        from_outside("api:worker", "while cut off")
        await pilot.pause(1.0)
        assert "while cut off" not in " ".join(table_text(app, "feed-table"))
        # 3. Back in reach: the banner goes and what was sent meanwhile is there, then new mail wakes it again.
        cable.plug()
        assert await wait_for(pilot, lambda: str(banner.content) == "", seconds=30.0), str(banner.content)
        assert await wait_for(pilot, lambda: "while cut off" in table_text(app, "feed-table")[0], seconds=10.0)
        await pilot.pause(0.5)
        from_outside("api:worker", "after the cut")
        assert await wait_for(pilot, lambda: "after the cut" in table_text(app, "feed-table")[0], seconds=20.0)

    try:
        run_app(test)
    finally:
        cable.unplug()
