"""search: the query language, ranking, visibility, filters and the index's life (send, migration, cleanup,
copy), the same corpus with the same results on SQLite and on PostgreSQL, and fuzzed queries."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent_mail.store import index
from agent_mail import model
from agent_mail.parts import query_language
from tests.lib.fuzz import examples
from tests.lib.mailbox import raw_db
from tests.lib.postgres import pg_url

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL


@pytest.fixture
def corpus(am, tmp_path):
    """A small team's history; returns {name: id} of the messages the tests look for."""
    report = tmp_path / "Release-Notes.pdf"
    report.write_bytes(b"%PDF not really")

    def send(frm, to, subject, body="", *extra):
        targets = [a for t in ([to] if isinstance(to, str) else to) for a in ("--to", t)]
        receipt = am("send", "--from", frm, *targets, "--subject", subject, "--body", body, *extra).json
        return receipt["id"] or receipt["deliveries"][0]["id"]  # a send to several: its first copy

    ids = {}
    ids["deploy"] = send("ops:lead", ["api:worker", "web:worker"], "Deploy the release",
                         "The déploiement failed on staging; logs attached.", "--attach", str(report))
    ids["green"] = send("api:worker", "ops:lead", "tests are green", "ready to deploy now", "--reply-to",
                        ids["deploy"])
    ids["freeze"] = send("ops:lead", "*", "standup", "Deploy freeze at five. Release notes due.")
    ids["private"] = send("web:worker", "web:worker", "note to self", "the banner colour is wrong")
    ids["rollback"] = send("api:worker", "ops:lead", "Rollback plan", "if the deploy breaks, revert the migration")
    return ids


def hits(am, *argv, field="subject"):
    return [r[field] for r in am("search", *argv).json["results"]]


@pytest.mark.fast
def test_words_all_match_phrases_or_exclusions_and_prefixes(am, corpus):
    assert hits(am, "deploy") == ["Deploy the release", "Rollback plan", "standup", "tests are green"]
    assert hits(am, "deploy staging") == ["Deploy the release"]
    assert hits(am, '"release notes"') == ["standup", "Deploy the release"]  # a body; an attachment's name
    assert hits(am, "deploy -freeze -green") == ["Deploy the release", "Rollback plan"]
    assert hits(am, 'deploy -"tests are"') == ["Deploy the release", "Rollback plan", "standup"]
    assert hits(am, "revert OR staging") == ["Rollback plan", "Deploy the release"]
    assert hits(am, "banner OR colour freeze") == []  # (banner OR colour) AND freeze: nothing has both
    assert hits(am, "banner OR freeze colour") == ["note to self"]
    assert hits(am, "roll*") == ["Rollback plan"]
    assert hits(am, "deplo* five") == ["standup"]
    # case and accents do not matter; identities and file names are words
    assert hits(am, "DEPLOIEMENT") == ["Deploy the release"]
    assert hits(am, "web:worker") == ["note to self", "Deploy the release"]
    assert hits(am, "release-notes.pdf") == ["Deploy the release"]


@pytest.mark.fast
def test_subject_matches_rank_first_then_newest_first(am, corpus):
    found = am("search", "deploy").json["results"]
    assert [r["matched"] for r in found] == ["subject", "text", "text", "text"]
    # within the rest, newest first: rollback was sent last, then the broadcast, then the reply
    assert [r["subject"] for r in found[1:]] == ["Rollback plan", "standup", "tests are green"]


@pytest.mark.fast
def test_a_send_to_several_is_one_result_with_its_recipients_and_a_snippet(am, corpus):
    first = am("search", "staging").json
    assert first["count"] == 1 and first["more"] is False
    result = first["results"][0]
    assert result["id"] == corpus["deploy"] and result["recipients"] == ["api:worker", "web:worker"]
    assert result["attachments"] == ["Release-Notes.pdf"] and result["withdrawn"] is False
    assert result["snippet"] == "The déploiement failed on **staging**; logs attached."
    assert first["next"] == [f"agent-mail read ops:lead --thread {corpus['deploy']}"]
    assert first["query"] == "staging"
    by_subject = {r["subject"]: r for r in am("search", '"release notes"').json["results"]}
    assert by_subject["Deploy the release"]["snippet"] == "**Release-Notes**.pdf"  # the match is in a file name
    assert by_subject["standup"]["snippet"] == "Deploy freeze at five. **Release notes** due."


@pytest.mark.fast
def test_an_agent_finds_only_what_it_may_see(am, corpus):
    # its own copy of a send to several, its own note, broadcasts from others; never others' mail
    mine = am("search", "deploy OR banner", "--agent", "web:worker").json["results"]
    assert [(r["subject"], r["recipients"]) for r in mine] == [
        ("Deploy the release", ["web:worker"]), ("note to self", ["web:worker"]), ("standup", ["*"])]
    assert mine[0]["id"] != corpus["deploy"]  # web:worker's copy, not the first copy
    assert hits(am, "banner", "--agent", "api:worker") == []
    assert hits(am, "deploy", "--agent", "ops:lead") == ["Deploy the release", "Rollback plan", "standup",
                                                         "tests are green"]
    assert am("search", "deploy", "--agent", "ops:lead").json["results"][0]["recipients"] == ["api:worker",
                                                                                             "web:worker"]
    assert am("search", "staging", "--agent", "web:worker").json["next"] == [
        f"agent-mail read web:worker --thread {mine[0]['id']}"]


@pytest.mark.fast
def test_filters_limit_more_and_fields(am, corpus):
    assert hits(am, "deploy", "--from", "api:worker") == ["Rollback plan", "tests are green"]
    assert hits(am, "deploy", "--to", "ops:lead") == ["Rollback plan", "tests are green"]
    assert hits(am, "deploy", "--to", "*") == ["standup"]
    assert hits(am, "deploy", "--thread", corpus["green"]) == ["Deploy the release", "tests are green"]
    assert hits(am, "deploy", "--since-days", "1") == hits(am, "deploy")
    limited = am("search", "deploy", "--limit", "2", "--fields", "id,subject").json
    assert limited["count"] == 2 and limited["more"] is True
    assert [set(r) for r in limited["results"]] == [{"id", "subject"}] * 2
    assert am("search", "deploy", "--limit", "4").json["more"] is False


@pytest.mark.fast
def test_since_days_leaves_out_older_mail(am, corpus, mailbox_path):
    old = model.iso(model.now() - dt.timedelta(days=10))
    db = raw_db(mailbox_path)
    db.execute("UPDATE messages SET created = ? WHERE id = ?", (old, corpus["rollback"]))
    db.commit()
    db.close()
    assert "Rollback plan" not in hits(am, "deploy", "--since-days", "3")
    assert "Rollback plan" in hits(am, "deploy", "--since-days", "30")


@pytest.mark.fast
def test_results_are_the_same_whichever_way_the_newest_rows_are_walked(am, corpus, monkeypatch):
    """PostgreSQL walks a window of the newest rows in order, then asks the full-text index for the rest:
    with a window of 2 rows, every page is split across the two, and the order must not change."""
    from agent_mail.store.postgres import PostgresStore

    for n in range(7):
        am("send", "--from", "ops:lead", "--to", "api:worker", "--subject", f"note {n}",
           "--body", f"deploy step {n}").assert_ok()
    everything = hits(am, "deploy", "--limit", "20")
    assert everything[0] == "Deploy the release"  # the subject tier, then the rest newest first
    assert everything[1:8] == [f"note {n}" for n in range(6, -1, -1)] and len(everything) == 11
    monkeypatch.setattr(PostgresStore, "SEARCH_WINDOW", 2)
    assert hits(am, "deploy", "--limit", "20") == everything
    assert hits(am, "deploy", "--limit", "3") == everything[:3]
    assert hits(am, "step", "--limit", "5") == everything[1:6]
    assert hits(am, "deploy", "--from", "api:worker") == ["Rollback plan", "tests are green"]
    assert hits(am, "qqqq") == []


@pytest.mark.fast
def test_searching_marks_nothing_read(am, corpus):
    before = {a["agent"]: (a["unread"], a["unacked"]) for a in am("status").json["agents"]}
    for agent in ("web:worker", "ops:lead", "api:worker"):
        am("search", "deploy OR banner OR standup", "--agent", agent).assert_ok()
    am("search", "deploy").assert_ok()
    assert {a["agent"]: (a["unread"], a["unacked"]) for a in am("status").json["agents"]} == before


@pytest.mark.fast
@pytest.mark.parametrize("query, says", [
    ("", "is empty"), ("   ", "is empty"), ("(deploy)", "grouping"), ("deploy AND staging", "AND"),
    ("NOT deploy", "NOT"), ("OR deploy", "OR without"), ("deploy OR", "OR without"), ("deploy OR -x", "OR without"),
    ("-deploy", "nothing to look for"), ('"deploy', "closing"), ("dep*loy", "only end a word"), ("!!!", "no letters"),
    ("-", "lone"), ('"a"b', "closing quote"), ("x" * 1001, "at most 1000"), (" ".join(["a"] * 33), "more than 32"),
])
def test_a_bad_query_is_an_error_showing_the_accepted_forms(am, corpus, query, says):
    error = am("search", "--", query).error  # (after --: a query may begin with '-')
    assert error["problems"][0]["field"] == "query" and says in error["problems"][0]["message"]
    for form in query_language.FORMS:
        assert form in error["error"]


@pytest.mark.fast
def test_a_query_that_begins_with_a_minus(am, corpus):
    assert hits(am, "-freeze deploy") == hits(am, "deploy -freeze")  # spaces: a query, not a flag
    assert hits(am, "--", "-freeze deploy") == hits(am, "deploy -freeze")
    error = am("search", "-freeze").error  # one word: the query (every flag is --long), only a word left out
    assert error["problems"][0]["field"] == "query" and "only words to leave out" in error["error"]
    assert am("search", "--freeze").error["problems"][0]["field"] == "--freeze"  # a --word is a flag


@pytest.mark.fast
def test_bad_options_are_errors_that_name_the_field(am, corpus):
    assert am("search", "x", "--agent", "nope").error["problems"][0]["field"] == "--agent"
    assert am("search", "x", "--limit", "0").error["problems"][0]["field"] == "--limit"
    assert am("search", "x", "--since-days", "-1").error["problems"][0]["field"] == "--since-days"
    assert am("search", "x", "--fields", "subject,nope").error["problems"][0]["field"] == "--fields"
    unknown = "00000000-0000-4000-8000-000000000000"
    assert am("search", "x", "--thread", unknown).error["problems"][0]["field"] == "--thread"
    # a thread the agent is no party to is refused like an unknown one
    refused = am("search", "x", "--thread", corpus["private"], "--agent", "api:worker").error
    assert refused["problems"][0]["field"] == "--thread"


@pytest.mark.fast
def test_cleanup_takes_messages_out_of_the_index(am, corpus, mailbox_path, backend):
    assert hits(am, "deploy")
    am("cleanup", "--older-than", "0").assert_ok()
    assert hits(am, "deploy") == [] and hits(am, "banner") == []
    if backend == "sqlite":
        db = raw_db(mailbox_path)
        assert db.execute("SELECT count(*) FROM message_search").fetchone()[0] == 0
        db.close()
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "deploy again").assert_ok()
    assert hits(am, "deploy") == ["deploy again"]


@pytest.mark.fast
@pytest.mark.local_only("the migration that opening the mailbox runs: a server (its pool) opened it before the test "
                        "rolled its schema back")
def test_a_mailbox_from_before_search_is_indexed_when_it_is_opened(am, corpus, mailbox_path, backend):
    """The migration is additive and indexes what is already stored."""
    db = raw_db(mailbox_path)
    if backend == "sqlite":
        db.execute("DROP TABLE message_search")
        db.execute("DELETE FROM schema_migrations WHERE name = 'm010_search'")
        db.execute("PRAGMA user_version = 9")
    else:
        db.execute("DROP INDEX idx_messages_search")
        db.execute("ALTER TABLE messages DROP COLUMN search")
        db.execute("DELETE FROM schema_migrations WHERE name = 'm005_search'")
    db.commit()
    db.close()
    assert hits(am, "deploy") == ["Deploy the release", "Rollback plan", "standup", "tests are green"]
    assert hits(am, '"release notes"') == ["standup", "Deploy the release"]


@pytest.mark.fast
@pytest.mark.local_only("the migration that opening the mailbox runs: a server (its pool) opened it before the test "
                        "rolled its schema back")
def test_an_index_from_before_route_marks_is_rebuilt_when_the_mailbox_is_opened(am, corpus, mailbox_path, backend):
    """The index as it first shipped had no route marks; --from/--to/--agent would then find nothing in it."""
    db = raw_db(mailbox_path)
    if backend == "sqlite":
        for rowid, people in db.execute("SELECT rowid, people FROM message_search").fetchall():
            db.execute("UPDATE message_search SET people = ? WHERE rowid = ?",
                       (" ".join(w for w in people.split() if not w.startswith("\ue000")), rowid))
        db.execute("DELETE FROM schema_migrations WHERE name = 'm011_route_marks'")
        db.execute("PRAGMA user_version = 10")
    else:
        db.execute("UPDATE messages SET search = ts_delete(search, ARRAY(SELECT lexeme FROM unnest(search) "
                   "WHERE lexeme LIKE '\ue000%' OR lexeme LIKE '\ue001%'))")
        db.execute("DELETE FROM schema_migrations WHERE name = 'm006_search_marks'")
    db.commit()
    db.close()
    assert hits(am, "deploy", "--from", "api:worker") == ["Rollback plan", "tests are green"]
    assert hits(am, "deploy", "--agent", "ops:lead") == ["Deploy the release", "Rollback plan", "standup",
                                                         "tests are green"]
    assert hits(am, "deploy") == ["Deploy the release", "Rollback plan", "standup", "tests are green"]
    assert hits(am, "deploy", field="matched") == ["subject", "text", "text", "text"]


@pytest.mark.fast
@pytest.mark.sqlite_only  # rows written by a tool that does not index (an older agent-mail, the reference CLI)
def test_rows_another_tool_stored_are_indexed_before_a_search(am, corpus, mailbox_path):
    db = raw_db(mailbox_path)
    db.execute("INSERT INTO messages (id, sender, recipient, subject, body, type, created) VALUES "
               "(?, 'old:tool', 'ops:lead', 'written elsewhere', 'deploy from the old tool', 'direct', ?)",
               (model.new_message_id(), model.now_iso()))
    db.commit()
    db.close()
    assert hits(am, "deploy", "--from", "old:tool") == ["written elsewhere"]


@pytest.mark.fast
@pytest.mark.local_only("copy works on mailboxes themselves, not through a server")
def test_a_copied_mailbox_searches_the_same(am, corpus, backend, tmp_path):
    """copy builds the target's own index: SQLite to PostgreSQL, or PostgreSQL to SQLite."""
    from tests.lib.postgres import drop_schema, new_schema_name
    from tests.lib.tools import require

    require("postgresql")
    schema = new_schema_name()
    target = pg_url(schema) if backend == "sqlite" else str(tmp_path / "copy.db")
    try:
        expected = am("search", "deploy OR banner").json["results"]
        am("copy", "--from", _here(), "--to", target).assert_ok()
        copied = _search_in(am, target, "deploy OR banner")
        assert copied == expected
    finally:
        drop_schema(schema)


def _here() -> str:
    import os

    return os.environ["AGENT_MAIL_DB"]


def _search_in(am, location: str, query: str) -> list[dict]:
    import os

    saved = os.environ["AGENT_MAIL_DB"]
    os.environ["AGENT_MAIL_DB"] = location
    try:
        return am("search", query).json["results"]
    finally:
        os.environ["AGENT_MAIL_DB"] = saved


_QUERY_TEXT = st.lists(st.one_of(st.sampled_from(["deploy", "OR", "AND", "NOT", "-", "*", '"', "(", ")", "-x",
                                                   "roll*", '"release notes"', "ops:lead", "é", "_", "\x00", " "]),
                                 st.text(max_size=8)), max_size=8).map(" ".join)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=_QUERY_TEXT)
def test_fuzzed_queries_answer_or_refuse_never_a_traceback(am, corpus, query):
    result = am("search", "--", query)
    assert "Traceback" not in result.out + result.err
    if result.code == 0:
        assert isinstance(result.json["results"], list)
    else:
        assert result.code == 2 and result.error["problems"][0]["field"] == "query", result.err


@pytest.mark.fast
def test_the_tokenizer_and_the_query_agree_on_both_backends():
    """What the index stores and what a query asks are cut by one function (no backend tokenizer involved)."""
    assert index.words("Déploy-Plan.PDF ops:lead ﬁle x_y") == ["deploy", "plan", "pdf", "ops", "lead", "file",
                                                               "x", "y"]
    entry = index.document({"sender": "a:b", "recipient": "c:d", "subject": "Hi there", "body": "one two"},
                            ["r.pdf"])
    # the route marks end `people`: the identities' bytes in hex behind a private-use character
    f, t = "\ue000f" + "a:b".encode().hex(), "\ue000t" + "c:d".encode().hex()
    assert entry == {"subject": "hi there", "people": f"a b c d {f} {t}", "files": "r pdf", "body": "one two"}
    # PostgreSQL positions: fields a position apart, so no phrase runs from one field into the next
    assert index.tsvector(entry) == f"'hi':2A '\ue001hi':2A 'there':3A '\ue001there':3A 'a':5B 'b':6B 'c':7B " \
                                    f"'d':8B '{f}':9B '{t}':10B 'r':12C 'pdf':13C 'one':15D 'two':16D"
    broadcast = index.document({"sender": "a:b", "recipient": "*", "subject": "", "body": ""})
    assert broadcast["people"] == f"a b {f} \ue000b"
    # no query can ask for a mark: its private-use character is not a letter or a digit
    assert index.words("\ue000f613a62 \ue000b") == ["f613a62", "b"]
    assert query_language.parse("deploy").fts5(marks=index.routes(sender="a:b", agent="c:d")) == \
        f'(("deploy")) AND ("{f}") AND ("\ue000f{"c:d".encode().hex()}" OR "{t}" OR "\ue000b")'
    assert query_language.parse("deploy").tsquery(True, index.routes(recipient="c:d")) == \
        f"(('\ue001deploy')) & ('{t}')"
    assert query_language.parse('"release notes" deplo*').tsquery(True) == \
        "(('\ue001release' <-> '\ue001notes')) & (('\ue001deplo':*))"


@pytest.mark.fast
@pytest.mark.sqlite_only  # SQLite's planner follows the statistics; PostgreSQL's plans are checked by the benchmark
def test_threads_are_looked_up_by_index_in_a_mailbox_of_unrelated_mail(am, corpus, mailbox_path):
    """`read --thread`, the supervisor's thread and `search --thread` find a thread's rows through indexes, never
    by walking every message: in a mailbox where most mail answers nothing, SQLite's statistics make the
    reply_to index look useless, and a join would scan the table (100-200 ms a thread at 200,000 messages)."""
    import re

    from agent_mail.store import open_store

    db = raw_db(mailbox_path)
    created = model.now_iso()
    db.executemany("INSERT INTO messages (id, sender, recipient, subject, body, type, created) VALUES "
                   "(?, 'ops:lead', 'api:worker', 'chatter', 'unrelated', 'direct', ?)",
                   [(model.new_message_id(), created) for _ in range(3000)])
    db.commit()
    db.execute("ANALYZE")
    db.close()
    store = open_store(str(mailbox_path))
    statements: list[str] = []
    try:
        with store.transaction():
            store.db.set_trace_callback(statements.append)
            assert [r["id"] for r in store.thread(corpus["green"], "ops:lead", model.now_iso())] == \
                [corpus["deploy"], corpus["green"]]
            assert len(store.whole_thread(corpus["green"])) == 3  # the send to two, and the answer
            found = store.search_rows(query_language.parse("deploy"), subject_only=False, now=model.now_iso(), limit=10,
                                      thread_ids=[r["id"] for r in store.whole_thread(corpus["deploy"])])
            assert len(found) == 3
            store.db.set_trace_callback(None)
            plans = {sql: [row[3] for row in store.db.execute("EXPLAIN QUERY PLAN " + sql)]
                     for sql in statements if sql.lstrip().startswith(("WITH", "SELECT"))}
    finally:
        store.close()
    assert len(plans) >= 3
    for sql, plan in plans.items():
        walks = [step for step in plan if re.match(r"(SCAN (m|r|messages)\b|BLOOM FILTER)", step)]
        assert not walks, (sql, plan)


@pytest.mark.fast
@settings(max_examples=examples(300), deadline=None)
@given(text=st.text(alphabet=st.characters(max_codepoint=0x7F)) | st.text())
def test_words_of_ascii_text_are_the_patterns_runs(text):
    """ASCII text is cut without a regex (a send's start-up); it must give exactly the pattern's runs."""
    expected = [w[:index.MAX_WORD] for w in index.word_pattern().findall(
        text.lower() if text.isascii() else index.fold(text))]
    assert index.words(text) == expected
    runs = [(m.start(), m.end(), w) for m in index.word_pattern().finditer(text) for w in index.words(m.group())]
    assert index.spans(text) == runs


@pytest.mark.fast
def test_a_hyphenated_word_is_echoed_as_typed_and_a_leading_minus_needs_no_separator(am, corpus):
    am("send", "--from", "ops:lead", "--to", "dev:one", "--subject", "dup-rcpt fixed").assert_ok()
    found = am("search", "dup-rcpt").json
    assert found["query"] == "dup-rcpt" and found["count"] >= 1
    # Every flag is --long, so -fix is the query (a word left out), not an unknown flag.
    refused = am("search", "-fix").error
    assert "only words to leave out" in refused["error"]
    assert "not a flag" not in refused["error"]


@pytest.mark.fast
def test_an_identity_with_a_look_alike_letter_points_at_it(am):
    problem = am("read", "proj:\u0430lice").error["problems"][0]
    assert problem["field"] == "agent"
    assert "Character 6" in problem["message"] and "U+0430 CYRILLIC SMALL LETTER A" in problem["message"]
