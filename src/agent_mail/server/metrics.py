"""What an operator's monitors ask `agent-mail serve`: GET /v1/health/ready (readiness) and GET /metrics.

Readiness: whether this process can serve calls now: the database reached within READY_SECONDS, its schema
exactly the one this version knows (a migration pending, or one applied by a newer version, is not ready), and a
store opened as a call's is and read through; the reason when not, which never names where the database is (the
server's log line does). Liveness (GET /v1/health, /v1/health/live) asks nothing of the database: a replica whose
database is away is not restarted for it, only taken out of rotation.

Metrics: the server's counters in the Prometheus text format (version 0.0.4), written
here rather than by prometheus_client: a dozen series need no dependency, nothing is added to the server's start-up,
and the client never imports this module (only agent_mail.server.app does). See docs/deployment.md, "Metrics".

What is counted: requests by route, method and status, and their latency (a histogram by route; a wait's request
lasts as long as its wait); the requests in progress by route (those of the routes that wait are the waits held);
tokens refused (every 401); on PostgreSQL, what the served waits and the pool report when scraped (wake-ups, the
pool's connections in use and idle, the LISTEN connection's reconnections when its hub counts them).

Routes are the API's own (a command's call path, or `other`), so the series are bounded whatever a client asks for.
"""

from __future__ import annotations

import os
import threading
import time

from agent_mail.protocols import http_api

READY_SECONDS = 3  # the longest a readiness check waits for the database (a connection, one query)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Seconds: short calls (a send is a few ms) up to the waits (a watch holds its request up to its timeout).
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# The routes whose requests are waits when held (watch, a hook's waiter, the looks, MCP's watch tool).
WAIT_ROUTES = (http_api.call_path("watch"), http_api.call_path("hook"), http_api.FOLLOW_PATH,
               http_api.DASHBOARD_PATH, http_api.MCP_PATH)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: tuple) -> str:
    return "{" + ",".join(f'{key}="{_escaped(str(value))}"' for key, value in pairs) + "}" if pairs else ""


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if isinstance(value, float) and not value.is_integer() else str(int(value))


class Metrics:
    """The counters of one server process (thread-safe: calls end in worker threads and on the event loop)."""

    def __init__(self, routes: tuple[str, ...]):
        self.routes = frozenset(routes)
        self.started = time.time()
        self._lock = threading.Lock()
        self._requests: dict[tuple, int] = {}  # (route, method, status): count
        self._latency: dict[str, list] = {}  # route: [bucket counts..., sum, count]
        self._in_flight: dict[str, int] = {}
        self.tokens_refused = 0
        self.samplers: list = []  # callables giving [(name, type, help, [(labels, value)])] when scraped

    def route(self, path: str) -> str:
        """The route a path is counted under: one of the API's paths, or `other` (a bounded set of labels)."""
        return path if path in self.routes else "other"

    def started_request(self, route: str) -> None:
        with self._lock:
            self._in_flight[route] = self._in_flight.get(route, 0) + 1

    def ended_request(self, route: str, method: str, status: int, seconds: float) -> None:
        with self._lock:
            self._in_flight[route] = self._in_flight.get(route, 1) - 1
            key = (route, method if method in ("GET", "POST", "DELETE") else "other", status)
            self._requests[key] = self._requests.get(key, 0) + 1
            counts = self._latency.setdefault(route, [0] * len(BUCKETS) + [0.0, 0])
            for index, bound in enumerate(BUCKETS):
                if seconds <= bound:
                    counts[index] += 1
            counts[-2] += seconds
            counts[-1] += 1
            if status == 401:
                self.tokens_refused += 1

    def text(self) -> str:
        """The exposition, every family with its HELP and TYPE."""
        with self._lock:
            requests, latency = dict(self._requests), {k: list(v) for k, v in self._latency.items()}
            in_flight, refused = dict(self._in_flight), self.tokens_refused
        lines: list[str] = []

        def family(name: str, kind: str, text: str, samples) -> None:
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                lines.append(f"{name}{_labels(labels)} {_number(value)}")

        family("agent_mail_http_requests_total", "counter", "HTTP requests answered, by route, method and status.",
               [((("route", r), ("method", m), ("status", s)), n) for (r, m, s), n in sorted(requests.items())])
        lines.append("# HELP agent_mail_http_request_duration_seconds Time from a request's arrival to its answer "
                     "(a wait's request lasts its wait).")
        lines.append("# TYPE agent_mail_http_request_duration_seconds histogram")
        for route, counts in sorted(latency.items()):
            for bound, count in zip((*BUCKETS, float("inf")), (*counts[:len(BUCKETS)], counts[-1]), strict=True):
                lines.append(f"agent_mail_http_request_duration_seconds_bucket"
                             f"{_labels((('route', route), ('le', _number(bound))))} {count}")
            lines.append(f"agent_mail_http_request_duration_seconds_sum{_labels((('route', route),))} "
                         f"{counts[-2]!r}")
            lines.append(f"agent_mail_http_request_duration_seconds_count{_labels((('route', route),))} "
                         f"{counts[-1]}")
        family("agent_mail_http_requests_in_progress", "gauge", "Requests being answered now, by route.",
               [((("route", r),), n) for r, n in sorted(in_flight.items())])
        family("agent_mail_waits_held", "gauge", "Requests of the routes that wait (watch, hook, follow, dashboard, "
               "mcp) in progress now: the waits held.",
               [((("route", r),), in_flight.get(r, 0)) for r in WAIT_ROUTES])
        family("agent_mail_tokens_refused_total", "counter", "Requests refused for a missing, unknown, mistyped or "
               "revoked token (401).", [((), refused)])
        family("agent_mail_process_start_time_seconds", "gauge", "When the server started (Unix time).",
               [((), round(self.started, 3))])
        for sampler in self.samplers:
            try:
                sampled = sampler()
            except Exception:  # a scrape never fails for one sampler
                continue
            for name, kind, text, samples in sampled:
                family(name, kind, text, samples)
        return "\n".join(lines) + "\n"


class Counting:
    """ASGI middleware: each HTTP request counted (route, method, status, latency) in `metrics`."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        # Counted as answered: 499 (nginx's "client closed request") when nothing was (the client went, or the
        # edge cut the request off at its deadline and answered it), 500 when the application raised.
        route, started, status = self.metrics.route(scope.get("path", "")), time.monotonic(), [499]

        async def counted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)
        self.metrics.started_request(route)
        try:
            await self.app(scope, receive, counted)
        except BaseException:
            status[0] = 500 if status[0] == 499 else status[0]
            raise
        finally:
            self.metrics.ended_request(route, scope.get("method", ""), status[0], time.monotonic() - started)


def readiness(location: str) -> tuple[str, str] | None:
    """None when the mailbox at `location` can serve calls now; else why not: (what anyone who asks is told, which
    never names where the database is; the same with it, for the server's log). Never a password."""
    from agent_mail.store import backend_name

    backend = backend_name(location)
    if backend == "postgresql":
        return _postgres_readiness(location)
    if backend == "sqlite":
        return _sqlite_readiness(location.removeprefix("sqlite://"))
    return None


def store_readiness(store_of) -> tuple[str, str] | None:
    """None when a store (`store_of()`: a context manager, as calls get theirs) answers a read as a call's would; else
    (told, detail) as readiness gives them. The schema can be right and every call still fail: a store refused (a
    damage record), or a connection that cannot read any more."""
    from agent_mail import errors

    try:
        with store_of() as store, store.transaction():
            store.last_seq()
    except errors.StorageError as exc:
        return exc.for_callers().message, exc.message
    except errors.AgentMailError as exc:
        return errors.CANNOT_USE, exc.message
    return None


def _postgres_readiness(url: str) -> tuple[str, str] | None:
    import psycopg
    from psycopg.conninfo import make_conninfo

    from agent_mail import errors
    from agent_mail.store import postgres, postgres_schema
    from agent_mail.urls import redact_url, url_secrets

    conninfo, schema = postgres.split_url(url)
    try:
        with psycopg.connect(make_conninfo(conninfo, connect_timeout=str(READY_SECONDS)), autocommit=True) as db:
            db.execute(f"SET statement_timeout = {READY_SECONDS * 1000}")
            table = db.execute("SELECT to_regclass(%s)", (f'"{schema}".schema_migrations',)).fetchone()[0]
            applied = {r[0] for r in db.execute(f'SELECT name FROM "{schema}".schema_migrations')} if table else set()
    except psycopg.Error as exc:
        return errors.CANNOT_REACH, (f"the database cannot be reached ({redact_url(url)}: "
                                     f"{postgres.error_text(exc, url_secrets(url))}).")
    known = {m.__name__ for m in postgres_schema.MIGRATIONS}
    if known - applied:
        told = f"a migration is pending: {len(known - applied)} of {len(known)} not applied"
        return f"{told}.", f"{told} to schema {schema}."
    if applied - known:
        told = (f"the mailbox has migrations this version does not know ({', '.join(sorted(applied - known))}): a "
                "newer agent-mail migrated it; upgrade this replica.")
        return told, f"schema {schema}: {told}"
    return None


def _sqlite_readiness(path: str) -> tuple[str, str] | None:
    import sqlite3
    from urllib.parse import quote

    from agent_mail.store import sqlite

    if not os.path.isfile(path):
        return "the mailbox file is not there.", f"the mailbox file {path} is not there."
    try:
        db = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=READY_SECONDS)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            application = db.execute("PRAGMA application_id").fetchone()[0]
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            db.close()
    except sqlite3.Error as exc:
        return f"the mailbox file cannot be read ({exc}).", f"the mailbox file {path} cannot be read ({exc})."
    if application != sqlite.APPLICATION_ID:
        told = f"the mailbox file is not an agent-mail mailbox (its application id is {application})."
        return told, f"{path}: {told}"
    if version < sqlite.SCHEMA_VERSION:
        told = (f"a migration is pending: the mailbox's schema is version {version}, this server's "
                f"{sqlite.SCHEMA_VERSION}.")
        return told, told
    if version > sqlite.SCHEMA_VERSION:
        told = (f"the mailbox's schema is version {version}, newer than this server's {sqlite.SCHEMA_VERSION}: a "
                "newer agent-mail migrated it; upgrade this replica.")
        return told, told
    return None
