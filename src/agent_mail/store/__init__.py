"""Backends, chosen from the mailbox location through one small registry.

A location with a URL scheme names its backend (postgresql://..., postgres://...); http(s):// names an
`agent-mail serve`, which commands reach through agent_mail.client.commands and never open as a store; anything else is
the path of a SQLite file. Backends are imported only when chosen, so a command on the default
SQLite mailbox never loads a database driver.
"""

from __future__ import annotations

# scheme -> (backend name, module, class, the extra that installs its driver, the driver's module, the module whose
# report/doctor/locate functions inspect, check and repair its mailboxes)
BACKENDS = {
    "sqlite": ("sqlite", "agent_mail.store.sqlite", "SQLiteStore", None, None, "agent_mail.store.sqlite_checks"),
    "postgresql": ("postgresql", "agent_mail.store.postgres", "PostgresStore", "postgres", "psycopg",
                   "agent_mail.store.maintenance"),
    "postgres": ("postgresql", "agent_mail.store.postgres", "PostgresStore", "postgres", "psycopg",
                 "agent_mail.store.maintenance"),
    # A server: no store here (the client carries the commands to it); describe reports on it, doctor and copy refuse.
    "http": ("server", None, None, None, None, "agent_mail.store.remote"),
    "https": ("server", None, None, None, None, "agent_mail.store.remote"),
}
# Where a location of a scheme not registered is reported on: as a server mailbox that cannot be opened.
_UNKNOWN_SCHEME_CHECKS = "agent_mail.store.maintenance"


def scheme_of(location: str) -> str | None:
    """The URL scheme of `location`, lower-cased, or None for a file path."""
    head, sep, _ = location.partition("://")
    if not sep or not head or not head.replace("+", "").replace("-", "").isalnum():
        return None
    return head.lower()


def backend_name(location: str) -> str:
    scheme = scheme_of(location)
    return "sqlite" if scheme is None else BACKENDS.get(scheme, (scheme,))[0]


def backend_module(location: str):
    """The module of the backend `location` names; errors.InvalidInput for an unknown scheme or a missing driver."""
    import importlib

    from agent_mail import errors

    scheme = scheme_of(location) or "sqlite"
    if scheme not in BACKENDS:
        known = ", ".join(f"{s}://" for s in BACKENDS if s != "sqlite")
        raise errors.InvalidInput([("AGENT_MAIL_DB", f"names a {scheme}:// mailbox, which agent-mail cannot open. "
                                                     f"Give a file path (SQLite) or a {known} URL.")])
    _, module, _, extra, driver, _ = BACKENDS[scheme]
    if module is None:
        raise errors.InvalidInput([("AGENT_MAIL_DB", f"names an agent-mail server ({redact_url(location)}): this "
                                                     "command works on a mailbox itself, not through a server. Run it "
                                                     "where the mailbox is, with AGENT_MAIL_DB naming its file or "
                                                     "postgresql:// URL.")])
    if driver is not None:
        try:
            importlib.import_module(driver)
        except ImportError:
            raise errors.StorageError(
                f"AGENT_MAIL_DB names a {scheme}:// mailbox, but its driver ({driver}) is not installed. Run: "
                f"pip install \"agent-mail[{extra}]\"") from None
    return importlib.import_module(module)


class Backend:
    """The backend a location names, for what is done to a mailbox without opening a store on it: `describe`'s
    report, `doctor`'s check and repair, reading a location given to `copy`. Never creates a mailbox; an
    unknown scheme is a server whose report and doctor say it cannot be opened."""

    def __init__(self, location: str):
        scheme = scheme_of(location) or "sqlite"
        self.name = backend_name(location)
        self.checks = BACKENDS[scheme][5] if scheme in BACKENDS else _UNKNOWN_SCHEME_CHECKS

    def _function(self, what: str):
        import importlib

        return getattr(importlib.import_module(self.checks), what)

    def report(self, location: str, source: str, given: str | None) -> dict:
        """What `describe` says of the mailbox at `location` (chosen by `source`; `given` as written there)."""
        return self._function("report")(location, source, given)

    def doctor(self, location: str, repair: bool, emit) -> dict:
        """Check the mailbox at `location` (and with `repair`, rebuild it if damaged); emit and return the report."""
        return self._function("doctor")(location, repair, emit)

    def locate(self, value: str, field: str) -> str:
        """The location `value` (given as `field` on the command line) names; InvalidInput if it cannot be one."""
        return self._function("locate")(value, field)


def backend_for(location: str) -> Backend:
    """The registered backend `location` names (see Backend)."""
    return Backend(location)


def open_store(location: str):
    """The store `location` names, connected (creating or migrating its schema on first use)."""
    scheme = scheme_of(location) or "sqlite"
    module = backend_module(location)
    return getattr(module, BACKENDS[scheme][2])(location)


def with_query(url: str, pairs: list[tuple[str, str]]) -> str:
    """`url` with its query replaced by `pairs`, the rest kept character for character (urlunsplit would turn
    postgresql://?service=x into postgresql:?service=x, which libpq cannot read)."""
    from urllib.parse import urlencode

    base = url.partition("?")[0]
    return f"{base}?{urlencode(pairs)}" if pairs else base


def redact_url(url: str) -> str:
    """The URL with any password removed (user:secret@ -> user@, password=... dropped)."""
    from urllib.parse import parse_qsl, urlsplit

    try:
        parts = urlsplit(url)
        userinfo, at, hosts = parts.netloc.rpartition("@")
        if at and ":" in userinfo:
            url = url.replace(parts.netloc, f"{userinfo.partition(':')[0]}@{hosts}", 1)
        query = parse_qsl(parts.query, keep_blank_values=True)
        kept = [(k, v) for k, v in query if k != "password"]
        return with_query(url, kept) if len(kept) != len(query) else url
    except ValueError:
        return url.split("://", 1)[0] + "://(unreadable URL)"


def url_secrets(url: str) -> list[str]:
    """The passwords a URL carries, to be scrubbed from any text we show."""
    import os
    from urllib.parse import parse_qsl, unquote, urlsplit

    found = []
    try:
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        if at and ":" in userinfo:
            secret = userinfo.partition(":")[2]
            found += [secret, unquote(secret)]
        found += [v for k, v in parse_qsl(parts.query, keep_blank_values=True) if k == "password"]
    except ValueError:
        pass
    if os.environ.get("PGPASSWORD"):
        found.append(os.environ["PGPASSWORD"])
    return [s for s in found if s]
