"""export and import: exact round trips (and across backends), idempotence, validation that imports nothing
from a bad file, filters, mbox read back by Python's mailbox/email and by a real mail client (mutt, in tmux)."""

from __future__ import annotations

import email
import email.policy
import json
import mailbox
import os
import pty
import subprocess
import sys
import time

import pytest

from tests.lib.cli import process_env
from tests.lib.mailbox import mailbox_exists
from tests.lib.postgres import drop_schema, new_schema_name, pg_url, postgres_problem
from tests.lib.tools import require
from tests.lib.waiting import armed, until

pytestmark = pytest.mark.backends


@pytest.fixture
def history(am, tmp_path):
    """A mailbox with one of everything an export must carry; returns the ids worth naming."""
    report = tmp_path / "Report Q4.pdf"
    report.write_bytes(bytes(range(256)) * 4)
    notes = tmp_path / "notes.txt"
    notes.write_text("plain notes\nFrom the start\n")

    def send(frm, to, subject, *extra):
        targets = [a for t in ([to] if isinstance(to, str) else to) for a in ("--to", t)]
        receipt = am("send", "--from", frm, *targets, "--subject", subject, *extra).json
        return receipt["id"] or receipt["deliveries"][0]["id"]

    ids = {}
    ids["task"] = send("ops:lead", ["api:worker", "web:worker"], "Deploy the release", "--body",
                       "Please deploy.\nFrom here on, watch the logs.", "--attach", str(report), "--attach",
                       str(notes), "--ref", str(tmp_path))
    ids["reply"] = send("api:worker", "ops:lead", "done", "--body", "deployed", "--reply-to", ids["task"])
    ids["broadcast"] = send("ops:lead", "*", "standup in 5", "--body", "everyone")
    am("read", "api:worker").assert_ok()  # states: read, acked, archived
    am("ack", "api:worker", "--all").assert_ok()
    am("archive", "web:worker", ids["broadcast"]).assert_ok()
    ids["later"] = send("ops:lead", "web:worker", "tomorrow", "--delay-minutes", "600")
    ids["withdrawn"] = send("ops:lead", "web:worker", "never mind", "--delay-minutes", "600")
    am("cancel", "ops:lead", ids["withdrawn"]).assert_ok()
    am("profile", "ops:human", "--human").assert_ok()
    refused = am("send", "--from", "ops:lead", "--to", "ghost:nobody", "--subject", "are you there",
                 "--require-reachable")
    assert refused.code == 3, refused.err
    ids["unicode"] = send("web:worker", "ops:lead", "café ☕ — ok", "--body", "naïve\tbody with\r\nCRLF")
    return ids


def export(am, *argv) -> bytes:
    result = am("export", *argv)
    assert result.code == 0 and result.err == "", result.err
    return result.out.encode("utf-8")


def _elsewhere(backend: str, tmp_path) -> tuple[str, str | None]:
    """An empty mailbox on the other backend (or a second file when PostgreSQL is out of reach)."""
    if backend == "sqlite" and not postgres_problem():
        schema = new_schema_name()
        return pg_url(schema), schema
    return str(tmp_path / "other.db"), None


def _using(location: str):
    class Using:
        def __enter__(self):
            self.saved = os.environ["AGENT_MAIL_DB"]
            os.environ["AGENT_MAIL_DB"] = location

        def __exit__(self, *exc):
            os.environ["AGENT_MAIL_DB"] = self.saved
    return Using()


@pytest.mark.fast
def test_export_import_export_gives_the_same_bytes_on_any_backend(am, history, tmp_path, backend):
    first = export(am)
    assert first.startswith(b'{"agent_mail_export":1}\n')
    records = [json.loads(line) for line in first.splitlines()[1:]]
    assert {r["type"] for r in records} == {"blob", "message", "profile", "event"}
    target, schema = _elsewhere(backend, tmp_path)
    (tmp_path / "first.jsonl").write_bytes(first)
    try:
        with _using(target):
            added = am("import", str(tmp_path / "first.jsonl")).json["added"]
            assert added == {"messages": 7, "blobs": 2, "profiles": 1, "events": 1}
            again = export(am)
            # and it is the same mailbox to use: threads, attachments, states, search
            assert am("read", "ops:lead", "--thread", history["reply"]).json["count"] == 2
            assert am("attachments", "api:worker", history["task"]).json
            assert am("status", "--agent", "web:worker").json["agents"][0]["unread"] == 1
            assert am("search", "deploy*", "--fields", "subject").json["count"] == 2
            # back again, from there
            (tmp_path / "again.jsonl").write_bytes(again)
        assert again == first
        with _using(str(tmp_path / "third.db")):  # and once more, into a file
            am("import", str(tmp_path / "again.jsonl")).assert_ok()
            assert export(am) == first
    finally:
        if schema:
            drop_schema(schema)


@pytest.mark.fast
def test_importing_twice_changes_nothing_and_a_dry_run_changes_nothing(am, history, tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(export(am))
    with _using(str(tmp_path / "fresh.db")):
        dry = am("import", str(path), "--dry-run").json
        assert dry["dry_run"] is True and dry["added"]["messages"] == 7 and dry["next"] == [f"agent-mail import {path}"]
        assert am("status").json["count"] == 0
        am("import", str(path)).assert_ok()
        before = export(am)
        twice = am("import", str(path)).json
        assert twice["added"] == {"messages": 0, "blobs": 0, "profiles": 0, "events": 0}
        assert twice["already_there"] == {"messages": 7, "blobs": 2, "profiles": 1, "events": 1}
        assert export(am) == before
    # into the mailbox it came from: everything is there already
    assert am("import", str(path)).json["added"]["messages"] == 0


@pytest.mark.fast
def test_a_bad_file_lists_every_bad_line_and_imports_nothing(am, history, tmp_path):
    lines = export(am).decode().splitlines()
    message = json.loads(next(line for line in lines if '"type":"message"' in line and '"attachments":[]' in line))
    bad = [lines[0],
           json.dumps({**message, "id": "not-an-id"}),
           json.dumps({**message, "id": "11111111-1111-4111-8111-111111111111", "sender": "Nope"}),
           json.dumps({**message, "id": "22222222-2222-4222-8222-222222222222", "subject": ""}),
           json.dumps({**message, "id": "33333333-3333-4333-8333-333333333333", "created": "yesterday"}),
           json.dumps({**message, "id": "44444444-4444-4444-8444-444444444444",
                       "attachments": [{"name": "x", "size": 1, "sha256": "0" * 64}]}),
           "{not json",
           json.dumps({"type": "mystery"}),
           json.dumps({**message, "id": "55555555-5555-4555-8555-555555555555", "surprise": 1}),
           json.dumps({**message, "id": "66666666-6666-4666-8666-666666666666"})]  # a good one: not imported either
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(bad) + "\n")
    with _using(str(tmp_path / "fresh.db")):
        error = am("import", str(path)).error
        fields = [p["field"] for p in error["problems"]]
        assert fields[:8] == ["line 2: id", "line 3: sender", "line 4: subject", "line 5: created",
                              "line 6: attachments.sha256", "line 7", "line 8: type", "line 9"]
        assert error["problems"][-1]["message"] == "nothing was imported"
        assert am("status").json["count"] == 0 and export(am) == b'{"agent_mail_export":1}\n'
    for content, says in ((b"", "empty"), (b'{"something": "else"}\n', "header"),
                          (b'{"agent_mail_export": 2}\n', "header")):
        path.write_bytes(content)
        assert says in am("import", str(path)).error["error"]
    assert am("import", str(tmp_path / "missing.jsonl")).error["problems"][0]["field"] == "file"
    # a blob whose content is not what its sha256 says
    blob = json.loads(next(line for line in lines if '"type":"blob"' in line))
    path.write_text(lines[0] + "\n" + json.dumps({**blob, "content_base64": "aGVsbG8="}) + "\n")
    assert {"line 2: sha256", "line 2: size"} <= {p["field"] for p in am("import", str(path)).error["problems"]}


@pytest.mark.fast
def test_an_identitys_export_holds_what_it_may_see_only(am, history, tmp_path):
    records = [json.loads(line) for line in export(am, "--agent", "api:worker").splitlines()[1:]]
    messages = [r for r in records if r["type"] == "message"]
    assert {m["subject"] for m in messages} == {"Deploy the release", "done", "standup in 5"}
    broadcast = next(m for m in messages if m["kind"] == "broadcast")
    assert [s["agent"] for s in broadcast["broadcast_states"]] == ["api:worker"]  # its own state only
    assert [r for r in records if r["type"] in ("profile", "event")] == []
    recent = [json.loads(line) for line in export(am, "--since-days", "1").splitlines()[1:]]
    assert len([r for r in recent if r["type"] == "message"]) == 7


@pytest.mark.fast
def test_export_to_a_file_never_overwrites_and_bad_options_are_errors(am, history, tmp_path):
    target = tmp_path / "out.jsonl"
    summary = am("export", "--output", str(target)).json
    assert summary["file"] == str(target) and summary["messages"] == 7 and summary["bytes"] == target.stat().st_size
    assert target.read_bytes() == export(am)
    assert target.stat().st_mode & 0o777 == 0o600  # the mail itself: its owner's only, as the mailbox is
    assert am("export", "--output", str(target)).error["problems"][0]["field"] == "--output"
    assert am("export", "--output", str(tmp_path / "no" / "dir.jsonl")).error["problems"][0]["field"] == "--output"
    assert am("export", "--format", "csv").error["problems"][0]["field"] == "--format"
    assert am("export", "--agent", "Nope").error["problems"][0]["field"] == "--agent"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # nothing left aside


@pytest.mark.fast
def test_a_bad_format_is_refused(am):
    refused = am("export", "--format", "xml").error["problems"]
    assert refused[0]["field"] == "--format" and "jsonl" in refused[0]["message"] and "mbox" in refused[0]["message"]


@pytest.mark.fast
@pytest.mark.local_only("whether the mailbox file or schema gets made (a server's mailbox exists before it serves)")
def test_a_bad_format_is_refused_before_any_mailbox_is_made(am, mailbox_path):
    assert am("export", "--format", "xml").error["problems"][0]["field"] == "--format"
    assert not mailbox_exists(mailbox_path)


def test_progress_shows_on_a_terminal_and_nowhere_else(history, tmp_path):
    quiet = subprocess.run([sys.executable, "-m", "agent_mail", "export", "--output", str(tmp_path / "q.jsonl")],
                           env=process_env(), capture_output=True, timeout=60)
    assert quiet.returncode == 0 and quiet.stderr == b""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "agent_mail", "export", "--output", str(tmp_path / "t.jsonl")],
                              env=process_env(), stdout=subprocess.PIPE, stderr=follower, timeout=60)
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0 and b"exported" in shown and b"7 messages" in shown


@pytest.mark.fast
def test_mbox_reads_back_as_standard_email(am, history, tmp_path):
    plain = am("send", "--from", "web:worker", "--to", "ops:lead", "--subject", "plan ✓ für morgen", "--body",
               "Grüße\nFrom me, not a separator\n>From quoted").json["id"]  # laid out directly: no email package
    long_line = " ".join(["wörd"] * 600)  # over 998 bytes: quoted-printable, soft line breaks
    wide = am("send", "--from", "web:worker", "--to", "ops:lead", "--subject", "wide", "--body", long_line).json["id"]
    path = tmp_path / "team.mbox"
    am("export", "--format", "mbox", "--output", str(path)).assert_ok()
    assert max(len(line) for line in path.read_bytes().splitlines()) <= 998
    box = mailbox.mbox(str(path), factory=lambda f: email.message_from_binary_file(f, policy=email.policy.default))
    mails = list(box)
    assert len(mails) == 9
    assert next(m for m in mails if m["X-Agent-Mail-Id"] == wide).get_content() == long_line + "\n"
    direct = next(m for m in mails if m["X-Agent-Mail-Id"] == plain)
    assert direct["Subject"] == "plan ✓ für morgen" and direct["To"].addresses[0].display_name == "ops:lead"
    assert direct.get_content() == "Grüße\n>From me, not a separator\n>>From quoted\n"  # mboxrd quoting
    by_id = {m["X-Agent-Mail-Id"]: m for m in mails}
    task = by_id[history["task"]]
    assert task["From"].addresses[0].display_name == "ops:lead"
    assert task["From"].addresses[0].addr_spec == "lead@ops.agent-mail.invalid"
    assert task["Message-ID"] == f"<{history['task']}@agent-mail.invalid>"
    parts = {p.get_filename(): p.get_content() for p in task.iter_attachments()}
    assert parts["Report Q4.pdf"] == bytes(range(256)) * 4 and parts["notes.txt"] == "plain notes\nFrom the start\n"
    assert task.get_body(("plain",)).get_content().splitlines() == ["Please deploy.", ">From here on, watch the logs."]
    reply = by_id[history["reply"]]
    assert reply["In-Reply-To"] == task["Message-ID"] and reply["References"] == task["Message-ID"]
    unicode = by_id[history["unicode"]]
    assert unicode["Subject"] == "café ☕ — ok" and "naïve\tbody" in unicode.get_content()
    broadcast = by_id[history["broadcast"]]
    assert broadcast["To"].addresses[0].addr_spec == "everyone@agent-mail.invalid"
    assert {m["X-Agent-Mail-State"] for m in mails if m["X-Agent-Mail-Type"] == "direct"} >= {"acked", "unread"}


def test_mbox_opens_in_a_real_mail_client(am, history, tmp_path, backend):
    if backend != "sqlite":
        pytest.skip("the file is the same from either backend")
    mutt = require("mutt")
    require("tmux")
    path = tmp_path / "team.mbox"
    am("export", "--format", "mbox", "--output", str(path)).assert_ok()
    muttrc = tmp_path / "muttrc"
    muttrc.write_text(f"set folder={tmp_path}\nset spoolfile={path}\nset sort=threads\nset move=no\n"
                      "set mbox_type=mbox\nset charset=utf-8\nset ascii_chars=yes\n"
                      "set index_format='%4C %-18.18L %s'\n")
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]
    subprocess.run([*tmux, "new-session", "-d", "-x", "120", "-y", "30",
                    f"env TERM=xterm-256color LANG=C.UTF-8 {mutt} -n -R -F {muttrc} -f {path}; sleep 30"], check=True)

    def pane():
        return subprocess.run([*tmux, "capture-pane", "-p"], capture_output=True, text=True).stdout

    def shown(seen, what):
        until(lambda: seen in pane(), 20, lambda: f"{what}:\n{pane()}")

    try:
        shown("Deploy the release", "mutt never listed the mail")
        screen = pane()
        assert "7 msgs" in screen or "Msgs:7" in screen, screen
        assert "done" in screen and "standup in 5" in screen
        assert "->" in screen  # the reply threaded under what it answers
        # open the first message of the thread and list its attachments
        subprocess.run([*tmux, "send-keys", "/", "Deploy the release", "Enter"], check=True)
        time.sleep(0.5)  # mutt moves its cursor to the match, which no text on the screen shows
        subprocess.run([*tmux, "send-keys", "v"], check=True)
        shown("Report Q4.pdf", "mutt did not list the attachments")
        assert "notes.txt" in pane()
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)


def test_a_filtered_import_into_a_live_mailbox_wakes_its_watch(am, history, tmp_path, mailbox_path):
    records = export(am, "--agent", "web:worker")
    path = tmp_path / "w.jsonl"
    path.write_bytes(records)
    with _using(str(tmp_path / "live.db")):
        watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "web:worker", "--timeout-minutes", "5"],
                                 env=process_env(AGENT_MAIL_DB=str(tmp_path / "live.db")), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        try:
            armed("web:worker", str(tmp_path / "live.db"), procs=[watch])
            started = time.monotonic()
            am("import", str(path)).assert_ok()
            out, _ = watch.communicate(timeout=60)
            assert time.monotonic() - started < 60  # woken by the import, not by its 5-minute timeout
            assert json.loads(out)["count"] >= 1
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.communicate()


# ---------------------------------------------------------------- issue 20, finding 9: what import must refuse


def _a_message(am) -> tuple[str, dict]:
    """The export's header line and a direct message record without attachments, to vary."""
    lines = export(am).decode().splitlines()
    return lines[0], json.loads(next(line for line in lines if '"type":"message"' in line and
                                      '"kind":"direct"' in line and '"attachments":[]' in line))


@pytest.fixture
def fresh(backend, tmp_path):
    """An empty mailbox on the backend under test, to import into."""
    if backend == "sqlite":
        yield str(tmp_path / "fresh.db")
        return
    schema = new_schema_name()
    try:
        yield pg_url(schema)
    finally:
        drop_schema(schema)


def _import(am, fresh, tmp_path, lines: list[str]):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with _using(fresh):
        result = am("import", str(path))
        assert am("status").json["count"] == 0  # a refused import changes nothing
    return result


@pytest.mark.fast
def test_import_refuses_records_no_export_holds_naming_line_and_field(am, history, fresh, tmp_path):
    header, message = _a_message(am)
    broadcast = json.loads(next(line for line in export(am).decode().splitlines() if '"kind":"broadcast"' in line))
    state = {"agent": "api:worker", "read_at": None, "acked_at": None, "archived_at": None, "deleted_at": None}
    upper = "891279D2-FBBB-4ABC-9DEF-0123456789AB"
    same = "77777777-7777-4777-8777-777777777777"

    def one(n, **changes):
        return json.dumps({**message, "id": f"{n}{n}{n}{n}{n}{n}{n}{n}-0000-4000-8000-000000000000", **changes})

    bad = [header,
           json.dumps({**message, "id": upper}),                                         # 2
           one(1, created="2026-12-03T12:00:00"),                                      # 3: no offset
           one(2, created="2026-07-01T10:00:00+00:00", read_at="2026-07-01T09:00:00+00:00"),  # 4
           one(3, created="9999-12-31T23:59:59+00:00"),                                # 5
           one(4, reply_to="44444444-0000-4000-8000-000000000000"),                    # 6: to itself
           json.dumps({**broadcast, "id": "55555555-0000-4000-8000-000000000000",
                       "broadcast_states": [state, {**state, "read_at": broadcast["created"]}]}),  # 7
           json.dumps({**message, "id": same}),                                        # 8
           json.dumps({**message, "id": same, "body": "something else"}),              # 9: same id, other content
           one(6, reply_to=upper),                                                      # 10
           json.dumps({**message, "id": same})]                                         # 11: the same again: fine
    result = _import(am, fresh, tmp_path, bad)
    assert result.code == 2, result.err
    fields = [p["field"] for p in result.error["problems"]]
    assert fields[:-1] == ["line 2: id", "line 3: created", "line 4: read_at", "line 5: created", "line 6: reply_to",
                           "line 7: broadcast_states.agent", "line 9: id", "line 10: reply_to"], fields
    said = {p["field"]: p["message"] for p in result.error["problems"]}
    assert "lower case" in said["line 2: id"] and "offset" in said["line 3: created"]
    assert "before created" in said["line 4: read_at"] and "itself" in said["line 6: reply_to"]
    assert "line 8" in said["line 9: id"]


@pytest.mark.fast
@pytest.mark.parametrize("ttl", [-1, 10**30, 2**31, 1.5, True])
def test_a_bad_ttl_hours_of_an_older_export_is_a_clear_problem(am, history, fresh, tmp_path, ttl):
    header, message = _a_message(am)
    result = _import(am, fresh, tmp_path, [header, json.dumps({**message, "ttl_hours": ttl})])
    assert result.code == 2, result.err
    assert [p["field"] for p in result.error["problems"]][0] == "line 2: ttl_hours"


@pytest.mark.fast
def test_a_deeply_nested_line_is_a_clear_problem(am, history, fresh, tmp_path):
    header, message = _a_message(am)
    result = _import(am, fresh, tmp_path, [header, json.dumps(message), "[" * 100_000 + "]" * 100_000])
    assert result.code == 2, result.err
    problem = result.error["problems"][0]
    assert problem["field"] == "line 3" and "nested" in problem["message"], problem
    assert "internal error" not in result.err


@pytest.mark.fast
@pytest.mark.sqlite_only
@pytest.mark.local_only("about the mailbox file of this process")
def test_importing_the_mailbox_file_itself_is_refused_before_it_is_opened(am, history, mailbox_path):
    """A process holding a connection never opens the mailbox outside SQLite (issue 32, finding 5)."""
    result = am("import", str(mailbox_path))
    assert result.code == 2 and "is the mailbox itself" in result.error["error"], result.error
    assert [p["field"] for p in result.error["problems"]] == ["file"]


@pytest.mark.fast
def test_importing_an_mbox_export_says_it_is_one(am, history, fresh, tmp_path):
    path = tmp_path / "team.mbox"
    am("export", "--format", "mbox", "--output", str(path)).assert_ok()
    with _using(fresh):
        result = am("import", str(path))
        assert result.code == 2 and am("status").json["count"] == 0
    assert "import reads JSON Lines; this is an mbox file" in result.error["error"], result.error
    assert len(result.error["problems"]) == 1


@pytest.mark.fast
def test_a_reply_to_a_message_gone_from_the_file_still_imports(am, history, fresh, tmp_path):
    """A reply whose original was cleaned up, or left out by --agent or --since-days, is as the mailbox holds it:
    the thread starts at the reply (as it does in the mailbox the file came from)."""
    header, message = _a_message(am)
    gone = json.dumps({**message, "id": "88888888-0000-4000-8000-000000000000",
                       "reply_to": "99999999-0000-4000-8000-000000000000"}, ensure_ascii=False, separators=(",", ":"))
    path = tmp_path / "partial.jsonl"
    path.write_text(f"{header}\n{gone}\n")
    with _using(fresh):
        assert am("import", str(path)).json["added"]["messages"] == 1
        assert export(am).decode() == path.read_text()


# ---------------------------------------------------------------- issue 20, finding 10: no lifetime in an export


@pytest.mark.fast
def test_an_export_carries_no_lifetime_and_describe_documents_none(am, history, fresh, tmp_path):
    records = [json.loads(line) for line in export(am).splitlines()[1:]]
    assert all("ttl_hours" not in r for r in records)
    assert "ttl" not in json.dumps(am("describe", "export").json)
    assert "ttl" not in json.dumps(am("describe").json)


@pytest.mark.fast
def test_an_older_export_with_ttl_hours_still_imports_and_the_field_is_dropped(am, history, fresh, tmp_path):
    lines = export(am).decode().splitlines()
    older = [json.dumps({**r, "ttl_hours": 24}) if r.get("type") == "message" else json.dumps(r)
             for r in map(json.loads, lines)]
    path = tmp_path / "older.jsonl"
    path.write_text("\n".join(older) + "\n")
    with _using(fresh):
        assert am("import", str(path)).json["added"]["messages"] == 7
        assert export(am).decode().splitlines() == lines
