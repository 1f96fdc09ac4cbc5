"""File reservations (issue 22): overlap both ways, all or nothing, held while the holder lives, --force on a
dead holder only, --check, racing reservers; on SQLite and PostgreSQL, with real processes and real git."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys

import pytest
from tests.lib.cli import am_process, process_env
from tests.lib.mailbox import raw_db
from tests.lib.waiting import armed, disarmed
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_mail import model
from agent_mail.parts import repos, wildmatch

pytestmark = pytest.mark.backends


def git(*args: str, cwd) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "src" / "deep").mkdir(parents=True)
    git("init", "-q", cwd=root)
    git("remote", "add", "origin", "git@github.com:acme/widget.git", cwd=root)
    monkeypatch.chdir(root)
    return root


# -- overlap: a table, both directions ------------------------------------------------------------------------
OVERLAP = [
    ("src/**", "src/lib.rs", True),
    ("*.py", "src/a.py", True),
    ("docs/", "docs/x.md", True),
    ("docs", "docs/x.md", True),
    ("src/*.rs", "src/lib.rs", True),
    ("src/*.rs", "src/a/lib.rs", False),
    ("src/*", "src/a/b.rs", False),  # src/* covers the files right in src, as .gitattributes reads it
    ("src/*", "src/a", True),
    ("/[a-c].txt", "/b.txt", True),
    ("/[a-c].txt", "/d.txt", False),
    ("/[!a-c].txt", "/d.txt", True),
    ("/[!a-c].txt", "/a.txt", False),
    ("src/[0-9]*.rs", "src/7up.rs", True),
    ("src/[0-9]*.rs", "src/up.rs", False),
    ("**/test_*.py", "tests/test_x.py", True),
    ("**/test_*.py", "tests/*.txt", False),
    ("a/**/b", "a/b", True),
    ("a/**/b", "a/x/y/b", True),
    ("a/**/b", "c/**", False),
    ("a/**/*.md", "a/x/*.rs", False),
    ("*.py", "*.rs", False),
    ("src/", "lib/", False),
    ("docs/", "lib/docs/x", False),  # a / anywhere anchors at the root
    ("**/docs/", "lib/docs/x", True),
    ("/src", "x/src", False),
    ("src/**/*.rs", "lib/**", False),
    ("src/**", "src/**/*.rs", True),
    ("src/a?.rs", "src/ab.rs", True),
    ("src/a?.rs", "src/a/.rs", False),
    ("src/lib.rs", "src/lib.rs", True),
    ("src/lib.rs", "src/lib.rsx", False),
]


@pytest.mark.fast
@pytest.mark.sqlite_only  # pure: once is enough
@pytest.mark.parametrize("first,second,expected", OVERLAP)
def test_overlap_is_decided_both_ways(first, second, expected):
    assert wildmatch.overlap(first, second) is expected
    assert wildmatch.overlap(second, first) is expected


@pytest.mark.fast
@pytest.mark.sqlite_only
def test_case_is_folded_only_where_the_repository_says_so():
    assert not wildmatch.overlap("/SRC/Lib.rs", "/src/lib.rs")
    assert wildmatch.overlap("/SRC/Lib.rs", "/src/lib.rs", fold=True)
    assert wildmatch.Matcher("/SRC/*.RS", fold=True).covers("src/lib.rs")


_PART = st.sampled_from(["src", "lib", "a", "b.py", "x.rs", "*", "**", "*.py", "[a-c]*", "?", "docs", "t[0-9]"])


@pytest.mark.fast
@pytest.mark.sqlite_only
@settings(max_examples=300, deadline=None)
@given(st.lists(_PART, min_size=1, max_size=3), st.booleans(), st.lists(_PART, min_size=1, max_size=3),
       st.booleans(), st.lists(st.sampled_from(["src", "lib", "a", "b.py", "x.rs", "docs", "t5", "c1", "zz"]),
                                min_size=1, max_size=4))
def test_overlap_never_misses_a_path_pathspec_says_both_cover(first, slash1, second, slash2, path):
    """Held to pathspec (the matching library): a path both patterns cover is a witness that they overlap."""
    a = "/".join(first) + ("/" if slash1 and first[-1] != "**" else "")
    b = "/".join(second) + ("/" if slash2 and second[-1] != "**" else "")
    p = "/".join(path)
    if wildmatch.Matcher(a).covers(p) and wildmatch.Matcher(b).covers(p):
        assert wildmatch.overlap(a, b) and wildmatch.overlap(b, a), (a, b, p)


@pytest.mark.fast
@pytest.mark.sqlite_only
def test_bad_patterns_are_refused_together_with_a_clear_error(am, repo):
    err = am("reserve", "a:x", "!src/**", "#notes", "src/../../x").error
    assert err["problems"][0]["message"].startswith("'!src/**': negation (!) is not a reservation")
    assert "comment" in err["problems"][1]["message"]
    assert "'..' part" in err["problems"][2]["message"]


@pytest.mark.fast
@pytest.mark.sqlite_only
def test_origin_urls_spelt_every_way_are_one_repository():
    forms = ["git@github.com:acme/widget.git", "ssh://git@github.com/acme/widget.git", "https://github.com/acme/widget",
             "https://user@GitHub.com:443/acme/widget.git/", "git://github.com/acme/widget.git"]
    assert {repos.normalise_url(f) for f in forms} == {"github.com/acme/widget"}


# -- the commands ---------------------------------------------------------------------------------------------
@pytest.mark.fast
def test_reserve_all_or_nothing_with_the_conflicts(am, repo):
    mine = am("reserve", "a:x", "src/**", "--reason", "parser rewrite").json
    assert mine["granted"] == ["/src/**"] and mine["repo"] == "github.com/acme/widget" and mine["conflicts"] == []
    refused = am("reserve", "b:y", "docs/", "src/lib.rs")
    assert refused.code == 3
    doc = json.loads(refused.out)
    assert doc["granted"] == [] and doc["expires_at"] is None
    (clash,) = doc["conflicts"]
    assert clash["pattern"] == "/src/lib.rs" and clash["holder"] == "a:x" and clash["holder_pattern"] == "/src/**"
    assert clash["mode"] == "exclusive" and clash["reason"] == "parser rewrite" and clash["holder_live"] is True
    assert clash["since"] and clash["holder_liveness"]["reached_by"]
    assert doc["next"][0].startswith("agent-mail send --from b:y --to a:x --subject 'May I have /src/**?'")
    # nothing of b:y's was reserved, docs/ included
    assert am("reservations", "--agent", "b:y").json["count"] == 0
    # own never conflict; reserving again renews
    again = am("reserve", "a:x", "src/lib.rs", "src/**", "--minutes", "5").json
    assert again["granted"] == ["/src/lib.rs", "/src/**"]
    listed = am("reservations", "--agent", "a:x").json["reservations"]
    assert [r["pattern"] for r in listed] == ["/src/**", "/src/lib.rs"]
    assert all(r["held"] and r["holder_live"] for r in listed)


@pytest.mark.fast
def test_shared_against_shared_allowed_exclusive_against_anything_refused(am, repo):
    am("reserve", "a:x", "docs/", "--shared").assert_ok()
    am("reserve", "b:y", "docs/x.md", "--shared").assert_ok()
    assert am("reserve", "c:z", "docs/x.md").code == 3  # exclusive against shared
    am("reserve", "c:z", "src/lib.rs").assert_ok()
    assert am("reserve", "a:x", "src/*.rs", "--shared").code == 3  # shared against exclusive


@pytest.mark.fast
def test_minutes_default_and_limit(am, repo):
    got = am("reserve", "a:x", "src/lib.rs").json
    lasts = model.parse_iso(got["expires_at"]) - model.now()
    assert dt.timedelta(minutes=59) < lasts <= dt.timedelta(minutes=60)
    err = am("reserve", "a:x", "src/lib.rs", "--minutes", "1441").error
    assert err["problems"][0]["field"] == "--minutes"


@pytest.mark.fast
def test_paths_from_anywhere_inside_the_repository(am, repo, monkeypatch):
    os.symlink(repo / "src", repo / "link")
    monkeypatch.chdir(repo / "src" / "deep")
    got = am("reserve", "a:x", "../lib.rs", "./", str(repo / "link" / "x.rs")).json
    assert got["granted"] == ["/src/lib.rs", "/src/deep/", "/src/x.rs"]
    paths = am("reservations", "--path", "../lib.rs", "--path", "../../link/x.rs").json["paths"]
    assert [(p["path"], p["held_by"][0]["pattern"]) for p in paths] == [("src/lib.rs", "/src/lib.rs"),
                                                                          ("src/x.rs", "/src/x.rs")]


@pytest.mark.fast
def test_outside_a_repository_an_error_unless_repo_is_given(am, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    err = am("reserve", "a:x", "src/**").error
    assert "not inside a git repository" in err["error"] and "--repo" in err["error"]
    assert am("reserve", "a:x", "src/**", "--repo", "team/widget").json["repo"] == "team/widget"
    assert am("reservations", "--check", "--agent", "b:y", "src/a.rs", "--repo", "team/widget").code == 3


@pytest.mark.fast
def test_release_by_pattern_case_folded_where_the_repo_says_so(am, repo):
    git("config", "core.ignorecase", "true", cwd=repo)
    am("reserve", "a:x", "Src/Lib.rs", "docs/").assert_ok()
    got = am("release", "a:x", "src/lib.rs", "nothing/here").json
    assert got["released"] == [{"agent": "a:x", "pattern": "/src/lib.rs", "mode": "exclusive"}]
    assert got["not_held"] == ["/nothing/here"]
    assert am("release", "a:x", "--all").json["count"] == 1


@pytest.mark.fast
def test_check_exit_0_or_3_with_the_conflicts(am, repo):
    am("reserve", "a:x", "src/**").assert_ok()
    am("reserve", "b:y", "docs/", "--shared").assert_ok()
    ok = am("reservations", "--check", "--agent", "a:x", "src/lib.rs", "docs/x.md").json
    assert ok["ok"] is True and ok["conflicts"] == []
    refused = am("reservations", "--check", "--agent", "b:y", "src/lib.rs", "README.md")
    assert refused.code == 3
    doc = json.loads(refused.out)
    assert doc["ok"] is False and [(c["pattern"], c["holder"]) for c in doc["conflicts"]] == [("src/lib.rs", "a:x")]


def _age(mailbox, agent: str, seconds: float) -> None:
    """Move `agent`'s signs of life (sessions, heartbeat, its reservations' renewal) `seconds` into the past."""
    then = model.iso(model.now() - dt.timedelta(seconds=seconds))
    with raw_db(mailbox) as db:
        db.execute("UPDATE heartbeats SET last_seen = ? WHERE agent = ?", (then, agent))
        db.execute("UPDATE watch_sessions SET last_seen = ?, started_at = ? WHERE agent = ?", (then, then, agent))
        db.execute("UPDATE reservations SET renewed_at = ?, created = ? WHERE agent = ?", (then, then, agent))
    if not isinstance(mailbox, str):
        db.close()


def test_a_killed_watch_stops_blocking_within_the_grace(am, repo, mailbox_path):
    watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x", "--timeout-minutes", "5"],
                             env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        armed("a:x", timeout=20, procs=[watch])
        am("reserve", "a:x", "src/**").assert_ok()
        _age(mailbox_path, "a:x", model.STALE_SECONDS + 1)  # the reserve's own heartbeat is past
        clash = json.loads(am("reserve", "b:y", "src/lib.rs").out)["conflicts"][0]
        assert clash["holder_live"] and clash["holder_liveness"]["watch_state"] == "armed"
        assert "live" in am("release", "b:y", "src/lib.rs", "--force").error["error"]  # refused on a live holder
        os.kill(watch.pid, signal.SIGKILL)
        watch.wait(10)
        # what the watch held is freed as it dies (its wake-up lock here; through a server, the server abandons
        # the session as it sees the connection close, a moment later): looked at until it is no longer armed
        disarmed("a:x", timeout=10)  # the killed watch no longer reads as armed
        # dead once its last refresh and the reserve's heartbeat are past counting, but within the grace: held
        _age(mailbox_path, "a:x", model.LIVENESS_SECONDS + 1)
        clash = json.loads(am("reserve", "b:y", "src/lib.rs").out)["conflicts"][0]
        assert clash["holder_live"] is False, clash
        # the grace passes (its signs of life moved into the past rather than waited out)
        _age(mailbox_path, "a:x", model.RESERVATION_GRACE_SECONDS + model.REFRESH_SECONDS)
        listed = am("reservations").json["reservations"]
        assert listed[0]["held"] is False and listed[0]["holder_live"] is False
        assert am("reserve", "b:y", "src/lib.rs").json["granted"] == ["/src/lib.rs"]
    finally:
        watch.kill()
        watch.wait(10)
        watch.stdout.close()
        watch.stderr.close()


@pytest.mark.fast
def test_force_on_a_dead_holder_tells_it(am, repo, mailbox_path):
    am("reserve", "a:x", "src/lib.rs", "docs/").assert_ok()
    _age(mailbox_path, "a:x", model.LIVENESS_SECONDS + 1)  # not live, still within the grace
    assert am("reserve", "b:y", "src/lib.rs").code == 3
    got = am("release", "b:y", "src/**", "--force").json
    assert got["released"] == [{"agent": "a:x", "pattern": "/src/lib.rs", "mode": "exclusive"}]
    events = am("notifications", "a:x").json["system"]["events"]
    assert events[-1]["source"] == "reservation.forced" and events[-1]["by"] == "b:y"
    assert events[-1]["patterns"] == ["/src/lib.rs"]
    (told,) = am("read", "a:x").json["messages"]
    assert told["sender"] == "b:y" and "/src/lib.rs" in told["subject"]
    assert am("reserve", "b:y", "src/lib.rs").json["granted"] == ["/src/lib.rs"]
    assert [r["pattern"] for r in am("reservations", "--agent", "a:x").json["reservations"]] == ["/docs/"]


def test_ten_identities_racing_for_one_pattern_exactly_one_wins(repo):
    am_process("status").check_returncode()  # the mailbox exists before the race
    racers = [subprocess.Popen([sys.executable, "-m", "agent_mail", "reserve", f"race:r{i}", "src/lib.rs"],
                               env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
              for i in range(10)]
    codes = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        codes.append(racer.returncode)
        assert racer.returncode in (0, 3), err
    assert sorted(codes) == [0] + [3] * 9
    listed = json.loads(am_process("reservations").stdout)["reservations"]
    assert len(listed) == 1 and listed[0]["pattern"] == "/src/lib.rs"


@pytest.mark.fast
def test_documented_output_fields_match_what_the_commands_print(am, repo):
    from agent_mail import spec

    got = am("reserve", "a:x", "src/**").json
    assert set(got) == set(spec.COMMANDS["reserve"].output)
    clash = json.loads(am("reserve", "b:y", "src/a.rs").out)
    assert set(clash["conflicts"][0]) == set(spec.COMMANDS["reserve"].item_fields)
    listed = am("reservations", "--path", "src/a.rs").json
    assert set(listed) == set(spec.COMMANDS["reservations"].output) - {"ok", "conflicts"}
    assert set(listed["reservations"][0]) == set(spec.COMMANDS["reservations"].item_fields)
    checked = json.loads(am("reservations", "--check", "--agent", "b:y", "src/a.rs").out)
    assert set(checked) == set(spec.COMMANDS["reservations"].output) - {"paths"}
    assert set(am("release", "a:x", "--all").json) == set(spec.COMMANDS["release"].output)


@pytest.mark.fast
@pytest.mark.sqlite_only
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_PART, min_size=1, max_size=3), min_size=1, max_size=8), st.booleans(),
       st.lists(st.sampled_from(["src", "lib", "a", "b.py", "x.rs", "docs", "t5", "c1"]), min_size=1, max_size=4))
def test_the_fast_lookup_finds_what_trying_every_pattern_finds(patterns, anchored, path):
    """--check files patterns by their literal directory and sieves the rest by their plain text: it must find
    exactly the reservations that matching every pattern one by one finds."""
    from agent_mail.operations.reservations import Covering

    rows = [{"id": str(i), "pattern": ("/" if anchored else "") + "/".join(p)} for i, p in enumerate(patterns)]
    p = "/".join(path)
    fast = sorted(r["id"] for r in Covering(rows, False).rows(p))
    assert fast == sorted(r["id"] for r in rows if wildmatch.Matcher(r["pattern"]).covers(p))


@pytest.mark.local_only("copy and token work on mailboxes themselves, not through a server")
def test_a_copied_mailbox_keeps_its_reservations_and_tokens(am, repo, backend, tmp_path):
    """copy moves a whole mailbox (SQLite to PostgreSQL, or back): the holders' claims still block, and a token
    made before the move still authenticates after it (its hash travels, never the secret)."""
    from tests.lib.postgres import drop_schema, new_schema_name, pg_url
    from tests.lib.tools import require

    from agent_mail.operations import tokens
    from agent_mail.store import open_store

    require("postgresql")
    am("reserve", "proj:holder", "src/**", "--reason", "parser rewrite").assert_ok()
    secret = am("token", "create", "--agent", "proj:holder", "--note", "moved").json["token"]
    schema = new_schema_name()
    target = pg_url(schema) if backend == "sqlite" else str(tmp_path / "copy.db")
    try:
        copied = am("copy", "--from", os.environ["AGENT_MAIL_DB"], "--to", target).json
        assert copied["verified"] is True
        moved = am_process("reservations", "--agent", "proj:other", "--check", "src/lib.rs",
                           env=process_env(AGENT_MAIL_DB=target))
        assert moved.returncode == 3, moved.stdout + moved.stderr
        conflict = json.loads(moved.stdout)["conflicts"][0]
        assert conflict["holder"] == "proj:holder" and conflict["reason"] == "parser rewrite"
        store = open_store(target)
        try:
            assert tokens.authenticate(store, secret)["agents"] == ["proj:holder"]
        finally:
            store.close()
        listed = am_process("token", "list", env=process_env(AGENT_MAIL_DB=target))
        assert secret not in listed.stdout.decode() and "moved" in listed.stdout.decode()
    finally:
        drop_schema(schema)
