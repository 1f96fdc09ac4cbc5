"""The names of the HTTP API `agent-mail serve` offers, written once: its paths, its headers and the media types of
its bodies. The server routes and answers by them (agent_mail.server), the command line's client
(agent_mail.client, through agent_mail.protocols.http_client) and the dashboard (agent_mail.dashboard.served)
call by them. What the API carries, and its OpenAPI document, are the server's: agent_mail.server.openapi.

Imports nothing: the client loads it on every command it carries to a server, where start-up time counts.
"""

# -- paths ---------------------------------------------------------------------------------------------------------
CALL_PATH = "/v1/call/"  # + a command's name: POST its values by argument name, get its result document
EXPORT_PATH = "/v1/export"  # POST export's values: the export as the body, its summary in RESULT_HEADER
IMPORT_PATH = "/v1/import"  # POST an export as the body (?dry_run=true): import's result document
DELIVERED_PATH = "/v1/delivered"  # where a read's delivery (DELIVERY_HEADER) is confirmed, or cancelled
STOP_PATH = "/v1/watch/stop"  # a watch's client stopped by a signal releases its wait's session (server.stops)
# The looks beside the commands (agent_mail.server.looks): an identity's mirror documents, the supervisor's views.
FOLLOW_PATH = "/v1/follow"
DASHBOARD_PATH = "/v1/dashboard"
HEALTH_PATH = "/v1/health"  # GET: liveness, whether the process answers (no token needed); also at HEALTH_LIVE_PATH
HEALTH_LIVE_PATH = "/v1/health/live"
HEALTH_READY_PATH = "/v1/health/ready"  # GET: readiness, 503 with the reason while the database cannot serve calls
METRICS_PATH = "/metrics"  # GET: the Prometheus text format (a supervisor's or an operator's token)
OPENAPI_PATH = "/openapi.json"  # GET: the OpenAPI 3.1 document describing it all
MCP_PATH = "/mcp"  # MCP over streamable HTTP (agent_mail.server.mcp_http)

# -- headers -------------------------------------------------------------------------------------------------------
EXIT_HEADER = "X-Agent-Mail-Exit"  # every answer: the exit code the command would have on the command line
RESULT_HEADER = "X-Agent-Mail-Result"  # export: its summary (JSON), the export itself being the body
DELIVERY_HEADER = "X-Agent-Mail-Delivery"  # read with deliver=confirm: the delivery to confirm once printed
NAMES_HEADER = "X-Agent-Mail-Names"  # "flags": name arguments in problems as the command line does (--reply-to)
VERSION_HEADER = "X-Agent-Mail-Version"  # a client's request: its version; every answer: the server's
# A client's request: the name of the machine it runs on (model.host_shown's form), recorded with what the call
# does for the supervisor to read (status's hosts); shown, never trusted for anything else.
HOST_HEADER = "X-Agent-Mail-Host"


_TAIL_CHARACTERS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz.+-")


def release_of(version: str) -> tuple[int, int] | None:
    """(major, minor) of `version`: MAJOR.MINOR in ASCII digits, then nothing, or a patch, pre-release or build
    tail (".0", ".3rc1", "+local", "-dev") that starts with ".", "+", "-" or a letter and holds ASCII letters,
    digits, ".", "+" and "-"; None for anything else. The same form as served_pattern's."""
    major, dot, rest = version.partition(".")
    cut = next((i for i, c in enumerate(rest) if not ("0" <= c <= "9")), len(rest))
    minor, tail = rest[:cut], rest[cut:]
    if not dot or not (major.isascii() and major.isdigit()) or not minor or not set(tail) <= _TAIL_CHARACTERS:
        return None
    return int(major), int(minor)


def served_pattern(server: str) -> str:
    """The versions a server of version `server` serves, as a regular expression (its OpenAPI document's pattern
    for VERSION_HEADER): version_problem finds no fault in exactly these."""
    major, minor = release_of(server) or (0, 0)
    release = f"0*{major}\\.[0-9]+" if major > 0 else f"0*0\\.0*{minor}"
    return f"^{release}([-+.A-Za-z][-+.0-9A-Za-z]*)?$"


def version_problem(client: str, server: str) -> str | None:
    """Why a client of version `client` cannot be served by a server of version `server`, or None. The rule: the
    same major version, and before 1.0 the same minor one too (0.1.x with 0.1.y; 1.2 with 1.7; never 0.1 with
    0.2, nor 1.x with 2.x): within it the API only grows (new commands, arguments and fields, never one taken away
    or changed in meaning), so either side may be the newer."""
    mine, theirs = release_of(server), release_of(client)
    if theirs is None:
        return f"the client sent {VERSION_HEADER}: {client!r}, which is no version (MAJOR.MINOR.PATCH)."
    if mine is None or (theirs[0] == mine[0] and (mine[0] > 0 or theirs[1] == mine[1])):
        return None
    older = "client" if theirs < mine else "server"
    return (f"this agent-mail client is version {client} and the server is version {server}: they do not work "
            "together (a client needs a server of the same major version, and before 1.0 of the same minor one). "
            f"Upgrade the {older}, or install the same release on both sides.")


# -- media types ---------------------------------------------------------------------------------------------------
JSON = "application/json"  # a call's values, every answer but an export's
JSON_LINES = "application/x-ndjson"  # an export in JSON Lines (what import takes)
MBOX = "application/mbox"  # an export in mbox
OCTETS = "application/octet-stream"  # an import's body as the OpenAPI document declares it (read whatever its type)

# The longest a look (FOLLOW_PATH, DASHBOARD_PATH) waits in one request (its `wait_seconds`); the client asks again.
LOOK_WAIT_MAX = 300


def call_path(name: str) -> str:
    """The path of command `name`'s call."""
    return CALL_PATH + name
