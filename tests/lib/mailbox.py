"""The running test's mailbox itself (its file or PostgreSQL schema, also under AGENT_MAIL_TEST_THROUGH=server):
raw_db to its tables, mailbox_exists, mailbox_itself (the library's Mailbox on it)."""

from __future__ import annotations

import contextlib

THE_MAILBOX: dict = {}  # the running test's mailbox itself (its file or URL), set by conftest's mailbox_path


class _RawPostgres:
    """A psycopg connection to a test mailbox's schema, spoken to like sqlite3 (? placeholders, commit)."""

    def __init__(self, url: str):
        import psycopg

        from agent_mail.store.postgres import split_url

        conninfo, schema = split_url(url)
        self.db = psycopg.connect(conninfo)
        self.db.execute(f'SET search_path TO "{schema}"')

    def execute(self, sql: str, params=()):
        return self.db.execute(sql.replace("%", "%%").replace("?", "%s"), params)

    def commit(self):
        self.db.commit()

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            self.db.commit()
        else:
            self.db.rollback()

    def close(self):
        self.db.close()


def raw_db(mailbox):
    """A connection straight to the test mailbox's tables (SQLite file or PostgreSQL schema), for tests that
    plant or inspect rows the commands would not write."""
    if isinstance(mailbox, str) and mailbox.startswith("postgresql://"):
        return _RawPostgres(mailbox)
    import sqlite3

    return sqlite3.connect(mailbox)


def mailbox_exists(mailbox) -> bool:
    """Whether the test mailbox has been created (the file, or the schema's tables)."""
    if isinstance(mailbox, str) and mailbox.startswith("postgresql://"):
        import psycopg

        from agent_mail.store.postgres import split_url

        conninfo, schema = split_url(mailbox)
        with psycopg.connect(conninfo) as db:
            return db.execute("SELECT to_regclass(%s)", (f'"{schema}".messages',)).fetchone()[0] is not None
    return mailbox.exists()


@contextlib.contextmanager
def mailbox_itself(mailbox):
    """The test mailbox opened in this process (the library's Mailbox on the file or schema itself, whatever
    AGENT_MAIL_DB names: also under AGENT_MAIL_TEST_THROUGH=server), for tests that set up with the library
    what the commands would not (a watch that ran out, a row to move)."""
    from agent_mail.operations.mail import Mailbox
    from agent_mail.store import open_store

    store = open_store(str(mailbox))
    try:
        mailbox_ = Mailbox(store)
        mailbox_.publish_due()
        yield mailbox_
    finally:
        store.close()
