"""The output contract, describe, and the parser: one source of truth, JSON always."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from agent_mail.cli import main
from agent_mail import spec
from agent_mail.store import sqlite as sqlite_store
from tests.lib.cli import am_process, process_env
from tests.lib.mailbox import mailbox_exists

pytestmark = pytest.mark.backends  # every test here runs on SQLite and on PostgreSQL


@pytest.mark.fast
@pytest.mark.local_only("describe reports the mailbox's own storage; through a server it reports the server")
def test_describe_lists_every_command_and_never_creates_the_mailbox(am, mailbox_path, backend):
    doc = am("describe").json
    assert set(doc["commands"]) == set(spec.COMMANDS)
    storage = doc["storage"]
    assert storage["backend"] == backend and storage["source"] == "AGENT_MAIL_DB"
    assert storage["exists"] is False and storage["messages"] is None
    if backend == "sqlite":
        assert storage["path"] == str(mailbox_path) and storage["size_bytes"] is None
        assert not mailbox_path.exists() and not mailbox_path.parent.exists()
    else:
        assert storage["url"] == mailbox_path and storage["schema"] == mailbox_path.rpartition("=")[2]
    assert not mailbox_exists(mailbox_path)


@pytest.mark.fast
def test_no_arguments_prints_the_same_manual(am):
    assert am().json == am("describe").json


@pytest.mark.fast
@pytest.mark.local_only("describe reports the mailbox's own storage; through a server it reports the server")
def test_describe_reports_count_and_size(am, send, mailbox_path, backend):
    send("a:x", "b:y", "one")
    storage = am("describe").json["storage"]
    assert storage["exists"] is True and storage["messages"] == 1
    if backend == "sqlite":
        assert storage["size_bytes"] == os.path.getsize(mailbox_path)
    else:
        from agent_mail.store import postgres  # psycopg: only where PostgreSQL is tested

        assert storage["migrations"] == [m.__name__ for m in postgres.MIGRATIONS]
        assert storage["server_version"] >= 120000


@pytest.mark.fast
def test_describe_default_path_when_not_overridden(am, monkeypatch, tmp_path):
    monkeypatch.delenv("AGENT_MAIL_DB")
    storage = am("describe").json["storage"]
    assert storage["source"] == "default"
    assert storage["path"] == os.path.join(str(tmp_path / "home"), ".agent-mail", "mail.db")


@pytest.mark.fast
def test_describe_one_command_and_help_flag(am):
    one = am("describe", "send").json
    assert one["name"] == "send" and one["command"] == spec.COMMANDS["send"].describe()
    assert am("send", "--help").json == one
    assert am("describe", "sned").error["error"].count("send") >= 1


@pytest.mark.fast
def test_version(am):
    from agent_mail import __version__

    assert am("--version").json["version"] == __version__


@pytest.mark.fast
def test_every_example_parses(am):
    for name, command in spec.COMMANDS.items():
        assert command.examples, f"{name} has no example"
        for example in command.examples:
            argv = shlex.split(example)
            parsed_name, _ = main.parse(argv)
            assert parsed_name == name, example


@pytest.mark.fast
def test_parser_accepts_exactly_the_documented_flags(am):
    """describe and the parser cannot disagree: both come from spec.COMMANDS."""
    for name, command in spec.COMMANDS.items():
        documented = am("describe", name).json["command"]["args"]
        assert list(documented) == [a.name for a in command.args]
        for arg in command.args:
            if arg.positional or arg.kind == spec.REMOVED:
                continue
            with pytest.raises(Exception) as caught:
                main.parse([name, arg.name + "x-undocumented"])
            assert "is not a flag" in str(caught.value)


@pytest.mark.fast
def test_all_problems_are_reported_together_with_their_fields(am):
    error = am("send", "--from", "Bad", "--to", "also bad", "--subject", "x" * 300, "--bogus").error
    fields = [p["field"] for p in error["problems"]]
    assert fields == ["--bogus", "--from", "--to", "--subject"]


@pytest.mark.fast
@pytest.mark.parametrize("argv, needle", [
    (["send", "--from"], "needs a value"),
    (["send", "--from", "a:b", "--to", "c:d"], "--subject"),
    (["read"], "agent"),
    (["read", "a:b", "extra"], "unexpected"),
    (["read", "a:b", "--all=yes"], "takes no value"),
    (["read", "a:b", "--limit", "5", "--limit", "6"], "more than once"),
    (["read", "a:b", "--limit", "many"], "whole number"),
    (["frobnicate"], "unknown command"),
    (["read", "a:b", "--thread", "x", "--all"], "--thread"),
    (["send", "--from", "--to", "c:d", "--subject", "s"], "needs a value"),
])
def test_usage_errors_are_json(am, argv, needle):
    error = am(*argv).error
    assert needle in error["error"]


@pytest.mark.fast
def test_values_that_look_like_flags_or_numbers_are_accepted(am):
    am("send", "--from", "a:b", "--to", "c:d", "--subject", "-1", "--body", "--- yaml").assert_ok()
    am("send", "--from=a:b", "--to=c:d", "--subject=x=y").assert_ok()
    message = am("read", "c:d").json["messages"]
    assert [m["subject"] for m in message] == ["-1", "x=y"] and message[0]["body"] == "--- yaml"


@pytest.mark.fast
@pytest.mark.local_only("an in-process failure planted in the library (monkeypatched)")
def test_internal_errors_are_json_not_tracebacks(am, monkeypatch):
    from agent_mail.operations import mail

    def boom(self, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(mail.Mailbox, "status", boom)
    error = am("status").error
    assert "internal error" in error["error"] and "kaboom" in error["error"]


@pytest.mark.fast
def test_documented_output_fields_match_what_commands_print(am, send, tmp_path, mailbox_path, monkeypatch):
    """Every top-level and item field a command prints is documented, and vice versa."""
    receipt = send("a:x", "b:y", "one")
    assert set(receipt) == set(spec.COMMANDS["send"].output)
    read = am("read", "b:y", "--no-mark-read").json
    assert set(read) == set(spec.COMMANDS["read"].output)
    assert set(read["messages"][0]) == set(spec.COMMANDS["read"].item_fields)
    ack = am("ack", "b:y", "--all").json
    assert set(ack) == set(spec.COMMANDS["ack"].output)
    status = am("status").json
    assert set(status) == set(spec.COMMANDS["status"].output)
    assert set(status["agents"][0]) == set(spec.COMMANDS["status"].item_fields)
    cleanup = am("cleanup", "--older-than", "1", "--dry-run").json
    assert set(cleanup) == set(spec.COMMANDS["cleanup"].output)
    describe = am("describe").json
    assert set(describe) == set(spec.COMMANDS["describe"].output)
    send("a:x", "b:y", "to watch")
    watch = am("watch", "b:y", "--once").json
    assert set(watch) == set(spec.COMMANDS["watch"].output)
    assert set(watch["messages"][0]) == set(spec.COMMANDS["watch"].item_fields)
    assert set(am("heartbeat", "b:y").json) == set(spec.COMMANDS["heartbeat"].output)
    message = receipt["id"]
    for name in ("dismiss", "archive", "delete"):
        assert set(am(name, "b:y", message).json) == set(spec.COMMANDS[name].output)
    later = send("a:x", "b:y", "later", "--delay-minutes", "5")["id"]
    assert set(am("cancel", "a:x", later).json) == set(spec.COMMANDS["cancel"].output)
    assert set(am("attachments", "a:x", message).json) == set(spec.COMMANDS["attachments"].output)
    assert set(am("profile", "b:y").json) == set(spec.COMMANDS["profile"].output)
    assert set(am("notifications", "b:y").json) == set(spec.COMMANDS["notifications"].output)
    with monkeypatch.context() as operator:  # token and copy run on the mailbox itself, also beside a server
        operator.setenv("AGENT_MAIL_DB", str(mailbox_path))
        created = am("token", "create", "--agent", "b:y").json
        listed = am("token", "list").json
        rotated = am("token", "rotate", created["id"], "--grace", "0").json
        revoked = am("token", "revoke", rotated["id"]).json
    assert set(created) | set(listed) | set(rotated) | set(revoked) == set(spec.COMMANDS["token"].output)
    secret = tmp_path / "hook-secret"  # webhook: the operator's, as token, and through a server with its token
    secret.write_text("0123456789abcdef0123\n")
    secret.chmod(0o600)
    added = am("webhook", "add", "--url", "http://127.0.0.1:9/hook", "--agent", "b:y", "--secret-file",
               str(secret)).json
    hooks = am("webhook", "list").json
    removed = am("webhook", "remove", added["id"]).json
    assert set(added) | set(hooks) | set(removed) == set(spec.COMMANDS["webhook"].output)
    assert set(spec.COMMANDS) == {"describe", "send", "read", "ack", "watch", "heartbeat", "dismiss", "archive",
                                  "delete", "cancel", "attachments", "profile", "notifications", "status", "cleanup",
                                  "mcp",  # prints only the protocol: its tools are checked in test_mcp.py
                                  "dashboard",  # draws a screen, prints nothing: checked in test_dashboard.py
                                  "hook",  # output per harness event: checked in test_hooks.py
                                  "run",  # a terminal passed through, prints nothing: checked in test_run.py
                                  "setup",
                                  "doctor", "copy", "search", "export", "import",
                                  "token", "webhook",  # checked above
                                  "serve",  # serves HTTP, prints nothing: checked in test_server.py
                                  "reserve", "release", "reservations",  # need a repository: test_reservations.py
                                      "guard"}  # needs a repository: test_guard.py
    exported = am("export", "--output", str(tmp_path / "contract.jsonl")).json
    assert set(exported) == set(spec.COMMANDS["export"].output)
    assert set(am("import", str(tmp_path / "contract.jsonl")).json) == set(spec.COMMANDS["import"].output)
    found = am("search", "watch").json
    assert set(found) == set(spec.COMMANDS["search"].output)
    assert set(found["results"][0]) == set(spec.COMMANDS["search"].item_fields)
    assert set(am("doctor").json) == set(spec.COMMANDS["doctor"].output)
    source = tmp_path / "other.db"
    sqlite_store.SQLiteStore(str(source)).close()
    with monkeypatch.context() as operator:
        operator.setenv("AGENT_MAIL_DB", str(mailbox_path))
        assert set(am("copy", "--from", str(source), "--merge").json) == set(spec.COMMANDS["copy"].output)
    assert set(am("setup", "claude-code", "--agent", "a:x", "--dir", str(tmp_path), "--dry-run").json) == set(
        spec.COMMANDS["setup"].output)


# ---------------------------------------------------------------- real processes


def test_module_and_console_script_are_the_same_program():
    via_module = am_process("describe")
    assert via_module.returncode == 0
    json.loads(via_module.stdout)


@pytest.mark.parametrize("env", [{"LANG": "C", "LC_ALL": "C"}, {"PYTHONIOENCODING": "ascii"},
                                 {"PYTHONIOENCODING": "latin-1", "PYTHONUTF8": "0"}])
def test_output_is_utf8_whatever_the_locale(env):
    environment = process_env(**env)
    sent = am_process("send", "--from", "a:x", "--to", "b:y", "--subject", "日本語 ✓", env=environment)
    assert sent.returncode == 0, sent.stderr
    assert "日本語 ✓".encode() in sent.stdout
    read = am_process("read", "b:y", env=environment)
    assert json.loads(read.stdout.decode("utf-8"))["messages"][0]["subject"] == "日本語 ✓"
    failed = am_process("read", "b:y", "--fields", "ü", env=environment)
    assert failed.returncode == 2 and "ü".encode() in failed.stderr


def test_closed_stdout_changes_nothing(send, am):
    message = send("a:x", "b:y", "precious")["id"]
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=process_env(),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, close_fds=True,
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 1
    assert "nothing was changed" in json.loads(proc.stderr)["error"]
    assert [m["id"] for m in am("read", "b:y", "--no-mark-read").json["messages"]] == [message]


def test_full_disk_on_stdout_changes_nothing(send, am):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    send("a:x", "b:y", "precious")
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=process_env(),
                              stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert am("read", "b:y", "--no-mark-read").json["count"] == 1
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "b:y",
                               "--subject", "lost?"], env=process_env(), stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert am("read", "b:y", "--all", "--no-mark-read").json["count"] == 1


def test_closed_pipe_reader_changes_nothing(send, am):
    """The reader of our stdout is gone (EPIPE): an error on stderr, nothing marked read."""
    send("a:x", "b:y", "precious")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "read", "b:y"], env=process_env(),
                              stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert proc.returncode == 1 and b"Traceback" not in proc.stderr
    assert "nothing was changed" in json.loads(proc.stderr)["error"]
    assert am("read", "b:y", "--no-mark-read").json["count"] == 1


@pytest.mark.local_only("describe through a server reports the server; the pipe is the same")
def test_describe_into_a_pipe_closed_early_ends_quietly_as_a_unix_tool_does():
    """`agent-mail describe | head` took what it wanted: describe ends with the closed pipe's status (141) and
    says nothing on stderr; the manual says so."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "agent_mail", "describe"], env=process_env(),
                              stdout=write_end, stderr=subprocess.PIPE)
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == b""
    assert "141" in spec.EXIT_CODES and "describe" in spec.EXIT_CODES["141"]


@pytest.mark.sqlite_only  # -S: no site-packages, so no driver; the PostgreSQL path is checked below
@pytest.mark.local_only("what the local command path imports (the client's: tests/functional/test_server.py)")
@pytest.mark.parametrize("argv", [["read", "a:b"], ["status"], ["watch", "a:b", "--once"], ["ack", "a:b", "--all"],
                                  ["heartbeat", "a:b"],
                                  ["send", "--from", "a:x", "--to", "b:y", "--subject", "Deploy, now: v2.1",
                                   "--body", "Line one.\n\tLine two (indented)."]])
def test_everyday_commands_import_nothing_they_do_not_need(argv, mailbox_path):
    """What a command imports is start-up time on every call: the ones an agent runs all day need no
    regular expressions, enum, json, signal, hashlib or ctypes (send checks and indexes plain text with
    str methods; a regex only for text that is not plain), nor the pure-Python `datetime` (its C module
    serves), the `sqlite3` package (its C driver serves) or contextlib (~3 ms between them), nor functools
    and the collections it brings (the driver's statement cache is functools' C one: ~2 ms), nor the file helpers,
    notification files and errno that only attachments, mirrors, waits and wake-ups need."""
    code = ("import sys; from agent_mail.cli.main import main; code = main(sys.argv[1:]); "
            "heavy = {'re', 'enum', 'json', 'signal', 'hashlib', 'ctypes', 'select', 'typing', 'dataclasses', "
            "'uuid', 'urllib.parse', 'importlib.metadata', 'mcp', 'anyio', 'pydantic', 'psycopg', 'datetime', "
            "'sqlite3', 'contextlib', 'math', 'functools', 'collections', 'types', 'operator', "
            "'textual', 'rich', 'textual_serve', 'plotext', 'aiohttp', 'pathspec', 'agent_mail.parts.wildmatch', "
            "'agent_mail.operations.reservations', 'agent_mail.parts.repos', 'subprocess', 'errno', "
            "'agent_mail.files', 'agent_mail.parts.notifications'}; "
            "print(code, sorted(heavy & set(sys.modules)), file=sys.stderr)")
    first = subprocess.run([sys.executable, "-S", "-c", code, *argv], env=process_env(), capture_output=True,
                           text=True)
    # making the mailbox (its folder, its file) takes the file helpers: a first run's, not every run's
    assert first.stderr.strip().splitlines()[-1] in ("0 []", "0 ['agent_mail.files']"), first.stderr
    proc = subprocess.run([sys.executable, "-S", "-c", code, *argv], env=process_env(), capture_output=True, text=True)
    assert proc.stderr.strip().splitlines()[-1] == "0 []", proc.stderr


@pytest.mark.sqlite_only
def test_the_driver_loads_without_functools_and_works_all_the_same(tmp_path):
    """The C driver takes functools.lru_cache for its statement cache when it loads; the store hands it the same
    C cache without importing functools (and the collections, types and operator it brings). In a fresh
    interpreter: functools stays unimported, statements run again and again through the cache, the stand-in
    caches as lru_cache does, and a later `import functools` gets the real module."""
    code = ("import sys\n"
            "from agent_mail.store import sqlite as store\n"
            "assert 'functools' not in sys.modules and 'collections' not in sys.modules, sorted(sys.modules)\n"
            "db = store.sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "db.execute('CREATE TABLE t (x)')\n"
            "for i in range(3):\n"
            "    db.execute('INSERT INTO t VALUES (?)', (i,))\n"
            "assert db.execute('SELECT SUM(x) FROM t').fetchone()[0] == 3\n"
            "assert store.sqlite3.sqlite_version\n"
            "import functools\n"
            "assert functools.lru_cache is not store._lru_cache and functools.reduce(int.__add__, [1, 2]) == 3\n"
            "cached = store._lru_cache(2)(lambda x: object())\n"
            "assert cached(1) is cached(1) and cached.cache_info() == (1, 1, 2, 1)\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(tmp_path / "t.db")], env=process_env(),
                          capture_output=True, text=True)
    assert proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.sqlite_only  # the collector of the command's own process: the same on either backend
def test_brief_commands_run_without_the_garbage_collector_and_long_lived_ones_with_it(tmp_path, mailbox_path):
    """A brief command (a read, a hook) ends before a collection could free anything worth its time: the script
    starts with the collector off (about a millisecond of every start). One that may live for hours (a watch, a
    hook's waiter) turns it back on. Seen at the process's exit, through scripts/agent-mail and `-m agent_mail`."""
    (tmp_path / "sitecustomize.py").write_text(  # imported at start-up: says at the exit whether it was on
        "import gc, os, sys\n"
        "_exit = os._exit\n"
        "def _saying(code):\n"
        "    sys.stderr.write(f'collector on: {gc.isenabled()}\\n')\n"
        "    sys.stderr.flush()\n"
        "    _exit(code)\n"
        "os._exit = _saying\n")
    env = process_env(CLAUDE_CODE_SESSION_ATTENDED="0")  # a run nobody waits on: the waiter returns at once
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env["PYTHONPATH"]
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts",
                          "agent-mail")
    start = json.dumps({"session_id": "s-1", "hook_event_name": "SessionStart"}).encode()
    stop = json.dumps({"session_id": "s-1", "hook_event_name": "Stop"}).encode()
    cases = [(["read", "a:b"], b"", False), (["hook", "claude-code", "context", "--agent", "a:b"], start, False),
             (["watch", "a:b", "--once"], b"", True), (["hook", "claude-code", "wait", "--agent", "a:b"], stop, True)]
    for program in ([sys.executable, script], [sys.executable, "-m", "agent_mail"]):
        for argv, stdin, on in cases:
            done = subprocess.run([*program, *argv], input=stdin, env=env, capture_output=True, timeout=60)
            assert done.returncode == 0, done.stderr
            assert done.stderr.decode().splitlines()[-1] == f"collector on: {on}", (program, argv, done.stderr)


def test_which_commands_are_brief():
    """Every command but those that wait, serve or work through a whole mailbox is brief."""
    long_lived = {name for name in spec.COMMANDS if not main.brief(name, {})}
    assert long_lived == {"watch", "notifications", "export", "import", "cleanup", "copy", "doctor", "mcp",
                          "dashboard", "serve", "run"}
    assert main.brief("hook", {"event": "context"}) and not main.brief("hook", {"event": "wait"})


@pytest.mark.sqlite_only
@pytest.mark.local_only("what the local command path imports (the client's: tests/functional/test_server.py)")
def test_send_indexes_its_message_without_the_search_machinery(mailbox_path):
    """Every send writes its message's search entry: it loads the small agent_mail.store.index, not the query
    language and snippets of agent_mail.parts.query_language, nor unicodedata for ASCII text."""
    code = ("import sys; from agent_mail.cli.main import main; code = main(sys.argv[1:]); "
            "print(code, sorted({'agent_mail.store.index', 'agent_mail.parts.query_language', 'unicodedata'} & "
            "set(sys.modules)), file=sys.stderr)")
    argv = ["send", "--from", "a:x", "--to", "b:y", "--subject", "Plain ASCII", "--body", "deploy at five"]
    proc = subprocess.run([sys.executable, "-S", "-c", code, *argv], env=process_env(), capture_output=True,
                          text=True)
    assert proc.stderr.strip().splitlines()[-1] == "0 ['agent_mail.store.index']", proc.stderr


@pytest.mark.sqlite_only
@pytest.mark.local_only("what the local command path imports (the client's: tests/functional/test_server.py)")
def test_search_of_plain_text_needs_no_regular_expressions(am, mailbox_path):
    """A search is a whole process (≤ 50 ms at a million messages): for ASCII text, cutting the query and
    marking the snippets take no regex (re and enum are ~4 ms of its start)."""
    am("send", "--from", "a:x", "--to", "b:y", "--subject", "Deploy: v2",
       "--body", "The release-notes are out.").assert_ok()
    code = ("import sys; from agent_mail.cli.main import main; code = main(sys.argv[1:]); "
            "print(code, sorted({'re', 'enum', 'unicodedata', 'json'} & set(sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-S", "-c", code, "search", 'deplo* OR "release notes" -staging'],
                          env=process_env(), capture_output=True, text=True)
    assert proc.stderr.strip().splitlines()[-1] == "0 []", proc.stderr
    assert "The **release-notes** are out." in proc.stdout


def test_cold_import_pulls_in_no_heavy_modules():
    code = ("import sys, agent_mail.cli.main; heavy = {'importlib.metadata', 'argparse', 'difflib', 'asyncio', "
            "'email', 'http', 'urllib.parse', 'agent_mail.operations.mail', 'sqlite3', 'hashlib', 'uuid', 'typing', "
            "'dataclasses', 'ctypes', 're', 'enum', 'json', 'signal', 'mcp', 'anyio', 'pydantic', 'pathspec'}; "
            "print(sorted(heavy & set(sys.modules)))")
    # -S: measure our imports, not what site-packages .pth files load
    proc = subprocess.run([sys.executable, "-S", "-c", code], env=process_env(), capture_output=True, text=True)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@pytest.mark.local_only("what the local command path imports (the client's: tests/functional/test_server.py)")
def test_each_backend_imports_its_own_driver_only(mailbox_path, backend):
    """With site-packages in reach: the SQLite path never loads psycopg; the PostgreSQL path loads it, and
    neither loads the MCP SDK or the dashboard's Textual."""
    code = ("import sys; from agent_mail.cli.main import main; code = main(sys.argv[1:]); "
            "print(code, sorted({'psycopg', 'mcp', 'pydantic', 'anyio', 'textual', 'rich', 'textual_serve', "
            "'textual_plotext', 'plotext', 'aiohttp'} & set(sys.modules)), file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code, "status"], env=process_env(), capture_output=True, text=True)
    expected = "0 []" if backend == "sqlite" else "0 ['psycopg']"
    assert proc.stderr.strip().splitlines()[-1] == expected, proc.stderr


def _strict_json(raw: bytes):
    """Parse as a strict parser would: valid UTF-8, and no lone surrogate, escaped or not."""
    text = raw.decode("utf-8")  # raises on invalid UTF-8
    document = json.loads(text)
    assert not any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(document, ensure_ascii=False)), document
    return document


def test_arguments_that_are_not_utf8_are_echoed_as_valid_json(am):
    error = am("ack", "-\udc80").error  # argv bytes that were not UTF-8 arrive as lone surrogates
    assert "-\\x80" in error["error"]  # shown as the text \x80, never as a lone surrogate
    proc = am_process("read", os.fsdecode(b"\xff:x"))
    assert proc.returncode == 2
    assert _strict_json(proc.stderr)["problems"][0]["field"] == "agent"
