"""Backends, chosen from the mailbox location through one small registry.

A location with a URL scheme names its backend (postgresql://..., postgres://...); http(s):// names an
`agent-mail serve`, which commands reach through agent_mail.client.commands and never open as a store; anything else is
the path of a SQLite file. Backends are imported only when chosen, so a command on the default
SQLite mailbox never loads a database driver.
"""

from __future__ import annotations

from agent_mail.urls import redact_url, scheme_of



def _sqlite():
    from agent_mail.store import sqlite

    return sqlite.SQLiteStore


def _postgres():
    from agent_mail.store import postgres

    return postgres.PostgresStore


def _psycopg() -> None:
    import psycopg  # noqa: F401 (only asked whether it is there)


def _sqlite_checks():
    from agent_mail.store import sqlite_checks

    return sqlite_checks


def _maintenance():
    from agent_mail.store import maintenance

    return maintenance


def _remote():
    from agent_mail.store import remote

    return remote


# scheme -> (backend name, its store class (loaded when chosen), the extra that installs its driver, the driver (loaded
# to see it is there), the module whose report/doctor/locate functions inspect, check and repair its mailboxes)
BACKENDS = {
    "sqlite": ("sqlite", _sqlite, None, None, _sqlite_checks),
    "postgresql": ("postgresql", _postgres, "postgres", _psycopg, _maintenance),
    "postgres": ("postgresql", _postgres, "postgres", _psycopg, _maintenance),
    # A server: no store here (the client carries the commands to it); describe reports on it, doctor and copy refuse.
    "http": ("server", None, None, None, _remote),
    "https": ("server", None, None, None, _remote),
}
# Where a location of a scheme not registered is reported on: as a server mailbox that cannot be opened.
_UNKNOWN_SCHEME_CHECKS = _maintenance


def backend_name(location: str) -> str:
    scheme = scheme_of(location)
    return "sqlite" if scheme is None else BACKENDS.get(scheme, (scheme,))[0]


def store_class(location: str):
    """The store class of the backend `location` names; errors.InvalidInput for an unknown scheme or a missing
    driver."""
    from agent_mail import errors

    scheme = scheme_of(location) or "sqlite"
    if scheme not in BACKENDS:
        known = ", ".join(f"{s}://" for s in BACKENDS if s != "sqlite")
        raise errors.InvalidInput([("AGENT_MAIL_DB", f"names a {scheme}:// mailbox, which agent-mail cannot open. "
                                                     f"Give a file path (SQLite) or a {known} URL.")])
    _, store, extra, driver, _ = BACKENDS[scheme]
    if store is None:
        raise errors.InvalidInput([("AGENT_MAIL_DB", f"names an agent-mail server ({redact_url(location)}): this "
                                                     "command works on a mailbox itself, not through a server. Run it "
                                                     "where the mailbox is, with AGENT_MAIL_DB naming its file or "
                                                     "postgresql:// URL.")])
    if driver is not None:
        try:
            driver()
        except ImportError as exc:
            raise errors.StorageError(
                f"AGENT_MAIL_DB names a {scheme}:// mailbox, but its driver ({exc.name}) is not installed. Run: "
                f"pip install \"agent-mail[{extra}]\"") from None
    return store()


class Backend:
    """The backend a location names, for what is done to a mailbox without opening a store on it: `describe`'s
    report, `doctor`'s check and repair, reading a location given to `copy`. Never creates a mailbox; an
    unknown scheme is a server whose report and doctor say it cannot be opened."""

    def __init__(self, location: str):
        scheme = scheme_of(location) or "sqlite"
        self.name = backend_name(location)
        self.checks = BACKENDS[scheme][4] if scheme in BACKENDS else _UNKNOWN_SCHEME_CHECKS

    def _function(self, what: str):
        return getattr(self.checks(), what)

    def report(self, location: str, source: str, given: str | None) -> dict:
        """What `describe` says of the mailbox at `location` (chosen by `source`; `given` as written there). A
        mailbox agent-mail cannot open here (an unknown scheme, a driver not installed) is reported with why."""
        if self.name not in ("sqlite", "server"):
            from agent_mail import errors

            try:
                store_class(location)
            except errors.AgentMailError as exc:
                return {"backend": self.name, "url": redact_url(location), "source": source, "exists": None,
                        "problem": exc.message}
        return self._function("report")(location, source, given)

    def doctor(self, location: str, repair: bool, emit) -> dict:
        """Check the mailbox at `location` (and with `repair`, rebuild it if damaged); emit and return the report."""
        if self.name not in ("sqlite", "server"):
            store_class(location)  # an unknown scheme or a missing driver is the error
        return self._function("doctor")(location, repair, emit)

    def locate(self, value: str, field: str) -> str:
        """The location `value` (given as `field` on the command line) names; InvalidInput if it cannot be one."""
        return self._function("locate")(value, field)


def backend_for(location: str) -> Backend:
    """The registered backend `location` names (see Backend)."""
    return Backend(location)


def open_store(location: str, any_thread: bool = False):
    """The store `location` names, connected (creating or migrating its schema on first use). `any_thread`: a store
    that one thread at a time may use, whichever (a pool's: store/pool.py); a SQLite connection is otherwise kept to
    the thread that opened it."""
    if any_thread and backend_name(location) == "sqlite":
        return store_class(location)(location, any_thread=True)
    return store_class(location)(location)
