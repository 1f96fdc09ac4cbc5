"""Mailbox locations as URLs: the scheme that names a backend, and a URL shown without its password."""

from __future__ import annotations


def scheme_of(location: str) -> str | None:
    """The URL scheme of `location`, lower-cased, or None for a file path."""
    head, sep, _ = location.partition("://")
    if not sep or not head or not head.replace("+", "").replace("-", "").isalnum():
        return None
    return head.lower()


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
