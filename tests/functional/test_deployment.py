"""docs/deployment.md run as written (issue 27): its backup and restore commands for SQLite and PostgreSQL, taken
from the page itself with a running server, and what a restore brings back (tokens, mail, deliveries); and a
certificate renewed under a server serving TLS, by SIGHUP, without a restart; a key the server's user cannot read
refused before it listens (issue 32)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading

import pytest

from tests.lib.cli import as_a_user, json_of, process_env
from tests.lib.postgres import TEST_PG_URL
from tests.lib.serving import Server
from tests.lib.tools import ROOT, require
from tests.lib.waiting import armed, until

pytestmark = [pytest.mark.timeout(180), pytest.mark.local_only("runs the operator's commands on the mailbox itself")]

DOCS = os.path.join(ROOT, "docs", "deployment.md")


def _documented(step: str, kind: str) -> str:
    """The ```sh block after `<!-- STEP: KIND -->` in docs/deployment.md."""
    with open(DOCS, encoding="utf-8") as handle:
        found = re.findall(rf"<!-- {step}: {kind} -->\n```sh\n(.*?)```", handle.read(), re.S)
    assert len(found) == 1, f"docs/deployment.md has no single {step} block for {kind}"
    return found[0]


def _run(text: str, swaps: dict[str, str]) -> str:
    for example, here in swaps.items():
        assert example in text, f"the documented commands no longer name {example}"
        text = text.replace(example, here)
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", text], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (text, proc.stdout, proc.stderr)
    return proc.stdout


def _before_and_after(server: Server, backup) -> dict:
    """Mail, tokens and a delivery before the backup; more after it (the backup taken by `backup()` while the server
    serves); what the test expects the restore to undo."""
    kept = json.loads(server.direct("token", "create", "--agent", "deploy:worker").stdout)
    worker = kept["token"]
    lead = server.token("--agent", "ops:lead")
    first = json_of(server.client(lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "first"))
    json_of(server.client(lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "second"))
    assert json_of(server.client(worker, "read", "deploy:worker", "--limit", "1"))["count"] == 1  # "first": read
    backup()
    later = server.token("--agent", "deploy:worker")
    json_of(server.direct("token", "revoke", kept["id"]))
    assert server.client(worker, "heartbeat", "deploy:worker").returncode == 4
    json_of(server.client(lead, "send", "--from", "ops:lead", "--to", "deploy:worker", "--subject", "third"))
    assert json_of(server.client(later, "read", "deploy:worker"))["count"] == 2  # "second" and "third": read
    return {"worker": worker, "later": later, "first": first["id"]}


def _restored(server: Server, seen: dict) -> None:
    # The token revoked since the backup works again; the one made since is unknown.
    assert server.client(seen["worker"], "heartbeat", "deploy:worker").returncode == 0
    assert server.client(seen["later"], "heartbeat", "deploy:worker").returncode == 4
    # "third" is gone; "second", read since, is unread and delivered again; "first" stays read.
    everything = json_of(server.direct("read", "deploy:worker", "--all", "--no-mark-read"))["messages"]
    assert sorted(m["subject"] for m in everything) == ["first", "second"]
    again = json_of(server.client(seen["worker"], "read", "deploy:worker"))
    assert [m["subject"] for m in again["messages"]] == ["second"]


@pytest.mark.requires("sqlite3")
def test_the_documented_sqlite_backup_and_restore(tmp_path):
    box = tmp_path / "lib" / "mailbox.db"
    backups = tmp_path / "backups"
    swaps = {"/var/lib/agent-mail": str(box.parent), "/var/backups/agent-mail": str(backups)}
    server = Server(str(box))
    try:
        checked = []
        seen = _before_and_after(server, lambda: checked.append(_run(_documented("backup", "sqlite"), swaps)))
        assert checked[0].strip() == "ok"
        server.stop()
        _run(_documented("restore", "sqlite"), swaps)
        server.restart()
        _restored(server, seen)
    finally:
        server.stop()


@pytest.fixture
def database():
    """A fresh PostgreSQL database of the test's own (the documented commands name a database, not a schema)."""
    require("postgresql")
    import psycopg

    name = f"am_backup_{os.getpid()}_{os.urandom(3).hex()}"
    with psycopg.connect(TEST_PG_URL, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    try:
        yield TEST_PG_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(TEST_PG_URL, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.requires("pg_dump")
def test_the_documented_postgresql_backup_and_restore(tmp_path, database):
    backups = tmp_path / "backups"
    swaps = {"postgresql://agent_mail@db.internal/team": database, "/var/backups/agent-mail": str(backups)}
    server = Server(database)  # the schema agent_mail, as the page's URL has it
    try:
        seen = _before_and_after(server, lambda: _run(_documented("backup", "postgresql"), swaps))
        assert (backups / "team.dump").stat().st_size > 0
        server.stop()
        _run(_documented("restore", "postgresql"), swaps)
        server.restart()
        _restored(server, seen)
    finally:
        server.stop()


# ---------------------------------------------------------------- certificates renewed without a restart


def _certificate(cert: str, key: str, name: str) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "1", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)


def _served_certificate(port: int) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        return tls.getpeercert(binary_form=True)


def _der(cert: str) -> bytes:
    with open(cert, encoding="ascii") as handle:
        return ssl.PEM_cert_to_DER_cert(handle.read())


def test_sighup_renews_the_certificate_without_a_restart(tmp_path, mailbox_path):
    cert, key = str(tmp_path / "fullchain.pem"), str(tmp_path / "privkey.pem")
    _certificate(cert, key, "first")
    first = _der(cert)
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0", "--tls-cert",
                             cert, "--tls-key", key], env=process_env(AGENT_MAIL_DB=str(mailbox_path)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    log: list[dict] = []
    try:
        url = json.loads(proc.stderr.readline())["listening"]
        port = int(url.rsplit(":", 1)[1])
        reader = threading.Thread(target=lambda: log.extend(json.loads(line) for line in
                                                            iter(proc.stderr.readline, b"")), daemon=True)
        reader.start()
        token = json.loads(subprocess.run([sys.executable, "-m", "agent_mail", "token", "create", "--agent", "a:x"],
                                          env=process_env(AGENT_MAIL_DB=str(mailbox_path)), capture_output=True,
                                          check=True).stdout)["token"]
        assert _served_certificate(port) == first
        # A watch waiting through the old certificate's connection is not cut by the renewal.
        watch = subprocess.Popen([sys.executable, "-m", "agent_mail", "watch", "a:x"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, AGENT_MAIL_CA=cert))
        try:
            armed("a:x", procs=[watch])
            # Renewed: a new pair written in place, then SIGHUP.
            _certificate(cert, key, "second")
            second = _der(cert)
            proc.send_signal(signal.SIGHUP)
            until(lambda: any(line.get("tls_reloaded") is True for line in log), timeout=10, what="the reload")
            assert _served_certificate(port) == second
            # The client trusting only the new certificate is served; the watch is still waiting, then woken.
            sent = subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "a:x", "--to", "a:x",
                                   "--subject", "renewed"], capture_output=True, timeout=60,
                                  env=process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, AGENT_MAIL_CA=cert))
            assert sent.returncode == 0, sent.stderr
            out, err = watch.communicate(timeout=30)
            assert watch.returncode == 0 and [m["subject"] for m in json.loads(out)["messages"]] == ["renewed"], err
        finally:
            if watch.poll() is None:
                watch.kill()
                watch.communicate()
        # A pair that does not match is refused, and the server goes on with the one it had.
        _certificate(str(tmp_path / "other.pem"), str(tmp_path / "otherkey.pem"), "other")
        os.replace(tmp_path / "otherkey.pem", key)
        proc.send_signal(signal.SIGHUP)
        until(lambda: any(line.get("tls_reloaded") is False for line in log), timeout=10, what="the refusal")
        refused = next(line for line in log if line.get("tls_reloaded") is False)
        assert "previous certificate is still served" in refused["reason"]
        assert _served_certificate(port) == second
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


# ---------------------------------------------------------------- a TLS pair the server cannot use


def _only_its_owner_reads(path: str) -> None:
    """Make `path` a file the server about to run cannot read, as a key only root reads is to a service's user: as
    root (CI), owned by nobody with mode 0600, read by a child without root's power over file modes (as_a_user);
    as anyone else, mode 0000 (its owner may not read it either)."""
    if os.geteuid() == 0:
        os.chown(path, 65534, 65534)
        os.chmod(path, 0o600)
    else:
        os.chmod(path, 0)


def _serve_refused(tmp_path, cert: str, key: str, **kwargs) -> dict:
    """`agent-mail serve --tls-cert CERT --tls-key KEY`, which must refuse to start: exit 2, one JSON error on
    stderr and nothing else (no "listening" line), no mailbox made. The error's document."""
    box = tmp_path / "refused" / "mail.db"
    proc = subprocess.run([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0", "--tls-cert", cert,
                           "--tls-key", key], env=process_env(AGENT_MAIL_DB=str(box)), capture_output=True, text=True,
                          timeout=60, start_new_session=True, **kwargs)  # no terminal to ask a password on
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert proc.stdout == "" and "listening" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not box.exists()
    return json.loads(proc.stderr)


def test_a_key_the_server_cannot_read_is_refused_before_it_listens(tmp_path):
    cert, key = str(tmp_path / "fullchain.pem"), str(tmp_path / "privkey.pem")
    _certificate(cert, key, "unreadable")
    _only_its_owner_reads(key)
    error = _serve_refused(tmp_path, cert, key, **as_a_user())
    assert [p["field"] for p in error["problems"]] == ["--tls-key"], error
    assert error["error"].startswith(f"--tls-key: {key!r} cannot be read by the user this server runs as"), error
    assert "LoadCredential=" in error["error"] and "internal error" not in error["error"]


def test_a_pair_that_is_no_pair_is_refused_naming_the_file(tmp_path):
    cert, key = str(tmp_path / "fullchain.pem"), str(tmp_path / "privkey.pem")
    _certificate(cert, key, "first")
    _certificate(str(tmp_path / "other.pem"), str(tmp_path / "otherkey.pem"), "other")
    mismatched = _serve_refused(tmp_path, cert, str(tmp_path / "otherkey.pem"))
    assert mismatched["error"] == (f"--tls-key: {str(tmp_path / 'otherkey.pem')!r} is not the key of the "
                                   f"certificate in {cert!r}."), mismatched
    swapped = _serve_refused(tmp_path, key, cert)  # the two files given the wrong way round
    assert [p["field"] for p in swapped["problems"]] == ["--tls-cert"], swapped
    assert "holds no PEM certificate" in swapped["error"]
    missing = _serve_refused(tmp_path, cert, str(tmp_path / "nowhere.pem"))
    assert missing["error"] == f"--tls-key: {str(tmp_path / 'nowhere.pem')!r} does not exist.", missing
    encrypted = str(tmp_path / "encrypted.pem")
    subprocess.run(["openssl", "pkey", "-in", key, "-aes256", "-passout", "pass:secret", "-out", encrypted],
                   check=True, capture_output=True)
    asked = _serve_refused(tmp_path, cert, encrypted, stdin=subprocess.DEVNULL)
    assert asked["error"].startswith(f"--tls-key: {encrypted!r} is encrypted"), asked


# ---------------------------------------------------------------- the systemd unit, as shipped in deploy/

DEPLOY = os.path.join(os.path.dirname(DOCS), os.pardir, "deploy")
UNIT, TLS_DROP_IN = os.path.join(DEPLOY, "agent-mail@.service"), os.path.join(DEPLOY, "tls.conf")
PROGRAM = "/opt/agent-mail/bin/agent-mail"  # where section 0 of the page installs it


def _units_here(tmp_path, drop_in: bool) -> str:
    """The unit (and its TLS drop-in beside it, as /etc/systemd/system holds them) copied into a folder, with
    ExecStart's program swapped for this Python (`systemd-analyze verify` checks that it exists); the unit's path."""
    folder = tmp_path / "system"
    (folder / "agent-mail@.service.d").mkdir(parents=True)
    for source, target in ((UNIT, folder / "agent-mail@.service"),
                           (TLS_DROP_IN, folder / "agent-mail@.service.d" / "tls.conf")):
        if target.name == "tls.conf" and not drop_in:
            continue
        with open(source, encoding="utf-8") as handle:
            text = handle.read()
        assert PROGRAM in text
        target.write_text(text.replace(PROGRAM, sys.executable))
    return str(folder / "agent-mail@.service")


@pytest.mark.requires("systemd-analyze")
@pytest.mark.parametrize("drop_in", [False, True], ids=["behind_a_proxy", "serving_tls"])
def test_the_unit_passes_systemd_analyze(tmp_path, drop_in):
    unit = _units_here(tmp_path, drop_in)
    instance = unit.replace("agent-mail@.service", "agent-mail@8025.service")
    for name in (unit, instance):  # the template (instance "i") and an instance, with the drop-in if there is one
        proc = subprocess.run(["systemd-analyze", "verify", name], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", (name, proc.stderr)
    rated = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=20", instance],
                           capture_output=True, text=True, timeout=60)
    assert rated.returncode == 0, rated.stdout[-400:]  # an exposure of 2.0 or better


def _unit_settings(*paths: str) -> dict[str, list[str]]:
    """The [Service] settings of a unit and its drop-ins, read as systemd reads them: a list per key, in order,
    an empty assignment (`ExecStart=`) emptying the list."""
    settings: dict[str, list[str]] = {}
    for path in paths:
        section = None
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                line = line.strip()
                if not line or line.startswith(("#", ";")):
                    continue
                if line.startswith("["):
                    section = line
                    continue
                key, _, value = line.partition("=")
                if section == "[Service]":
                    settings[key] = settings.get(key, []) + [value] if value else []
    return settings


def _environment_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines, as systemd's EnvironmentFile= reads them (comments and blank lines skipped)."""
    with open(path, encoding="utf-8") as handle:
        return dict(line.strip().split("=", 1) for line in handle if line.strip() and not line.lstrip().startswith("#"))


@pytest.mark.backends
def test_the_units_command_serves_its_mailbox_and_tls_from_credentials(tmp_path, backend, mailbox_path):
    """What systemd gives the service, made by hand: the state directory (%S/agent-mail, the service's own, 0700),
    the environment file written by the page's install block, the certificate and key copied into
    $CREDENTIALS_DIRECTORY (0400, the service's) while the originals stay unreadable to it. Then the unit's
    ExecStart, with its TLS drop-in, run as systemd would (its specifiers and ${...} expanded, UMask applied,
    working directory /) by a user bound by file modes: the mailbox is made where the unit says, and a client
    sends and reads through its TLS."""
    etc, state, credentials = tmp_path / "etc", tmp_path / "lib", tmp_path / "credentials" / "agent-mail@0.service"
    original_cert, original_key = etc / "tls" / "fullchain.pem", etc / "tls" / "privkey.pem"
    (etc / "tls").mkdir(parents=True)
    _certificate(str(original_cert), str(original_key), "replica")
    # The environment file, by the page's own commands (its PostgreSQL line left out for SQLite: the unit's own).
    database_line = "AGENT_MAIL_DB=postgresql://agent_mail@db.internal/team?sslmode=verify-full"
    swaps = {"/usr/local/src/agent-mail/deploy/agent-mail@.service": UNIT,
             "/etc/systemd/system/agent-mail@.service": str(tmp_path / "installed.service"),
             "/etc/agent-mail": str(etc),
             database_line: f"AGENT_MAIL_DB={mailbox_path}" if backend == "postgresql" else ""}
    _run(_documented("install", "unit"), swaps)
    assert oct(os.stat(etc / "env").st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "installed.service").st_mode & 0o777) == "0o644"
    # What systemd makes at start: the state directory, the credentials (copies the service's user can read).
    (state / "agent-mail").mkdir(parents=True, mode=0o700)
    credentials.mkdir(parents=True)
    for name, source in (("tls-cert", original_cert), ("tls-key", original_key)):
        (credentials / name).write_bytes(source.read_bytes())
        os.chmod(credentials / name, 0o400)
    os.chmod(credentials, 0o500)
    _only_its_owner_reads(str(original_key))
    settings = _unit_settings(UNIT, TLS_DROP_IN)
    assert settings["StateDirectory"] == ["agent-mail"] and settings["DynamicUser"] == ["yes"]
    assert settings["EnvironmentFile"] == ["/etc/agent-mail/env"]
    assert sorted(settings["LoadCredential"]) == ["tls-cert:/etc/agent-mail/tls/fullchain.pem",
                                                   "tls-key:/etc/agent-mail/tls/privkey.pem"]
    specifiers = {"%i": "0", "%S": str(state), "%%": "%"}  # instance "0": a free port, named on stderr

    def specified(text: str) -> str:
        return re.sub(r"%[iS%]", lambda m: specifiers[m.group(0)], text)

    environment = dict(specified(value).split("=", 1) for value in settings["Environment"])
    environment.update(_environment_file(str(etc / "env")))  # the file's settings win over Environment=
    environment.update(CREDENTIALS_DIRECTORY=str(credentials), STATE_DIRECTORY=str(state / "agent-mail"))
    [command] = settings["ExecStart"]
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: environment[m.group(1)], specified(word))
            for word in command.split()]
    assert argv[0] == PROGRAM
    umask = int(settings["UMask"][0], 8)

    def as_the_service() -> None:
        os.umask(umask)
        if os.geteuid() == 0:
            as_a_user()["preexec_fn"]()

    env = process_env(**environment)
    proc = subprocess.Popen([sys.executable, "-m", "agent_mail", *argv[1:]], env=env, cwd="/",
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_the_service)
    try:
        started = json.loads(proc.stderr.readline() or b"{}")
        assert "listening" in started, proc.communicate(timeout=30)
        assert started["listening"].startswith("https://0.0.0.0:")
        url = "https://127.0.0.1:" + started["listening"].rsplit(":", 1)[1]
        if backend == "sqlite":
            box = state / "agent-mail" / "mailbox.db"
            assert started["mailbox"] == str(box) and oct(box.stat().st_mode & 0o777) == "0o600"
        made = subprocess.run([sys.executable, "-m", "agent_mail", "token", "create", "--agent", "deploy:worker"],
                              env=process_env(**environment), capture_output=True, timeout=60, cwd="/",
                              preexec_fn=as_the_service)
        token = json_of(made)["token"]
        client = process_env(AGENT_MAIL_DB=url, AGENT_MAIL_TOKEN=token, AGENT_MAIL_CA=str(credentials / "tls-cert"))
        sent = subprocess.run([sys.executable, "-m", "agent_mail", "send", "--from", "deploy:worker", "--to",
                               "deploy:worker", "--subject", "through the unit"], env=client, capture_output=True,
                              timeout=60)
        json_of(sent)
        read = json_of(subprocess.run([sys.executable, "-m", "agent_mail", "read", "deploy:worker"], env=client,
                                      capture_output=True, timeout=60))
        assert [m["subject"] for m in read["messages"]] == ["through the unit"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        proc.stdout.close()
    assert proc.returncode == 0
