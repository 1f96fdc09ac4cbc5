"""The HTTP API `agent-mail serve` offers, declared once: which commands it carries out, the arguments that stay
on the client's machine, the values only a client sends, and the OpenAPI 3.1 document describing it all
(served at GET /openapi.json), made from the spec through agent_mail.protocols.schemas as the MCP tools are. The
API's names (paths, headers, media types) are agent_mail.protocols.http_api's, which the client shares.

The server's alone: the client never loads these tables (nor the schemas they are made with).
"""

from __future__ import annotations

from agent_mail import errors, model, spec
from agent_mail.protocols import schemas
from agent_mail.protocols.http_api import (CALL_PATH, DASHBOARD_PATH, DELIVERED_PATH, DELIVERY_HEADER, EXIT_HEADER,
                                           EXPORT_PATH, FOLLOW_PATH, HEALTH_LIVE_PATH, HEALTH_PATH, HOST_HEADER,
                                           HEALTH_READY_PATH, IMPORT_PATH, JSON, JSON_LINES, LOOK_WAIT_MAX, MBOX,
                                           METRICS_PATH, NAMES_HEADER, OCTETS, RESULT_HEADER, STOP_PATH, VERSION_HEADER,
                                           call_path, served_pattern)

# The commands a client may call; the rest work on a mailbox itself, or are not served yet (the client says so).
SERVED = ("send", "read", "ack", "watch", "heartbeat", "dismiss", "archive", "delete", "cancel", "attachments",
          "profile", "notifications", "status", "search", "cleanup", "doctor", "reserve", "release", "reservations",
          "hook", "webhook")
# The calls that may block: a hanging-up client, a stopping server or a revoked token ends them (hook: its waiter).
WAITS = ("watch", "hook")
# Arguments that name a file on the server's machine: what the client reads or writes on its own machine instead.
LOCAL_TO_CLIENT = {"send": ("body_file", "attach", "ref"), "attachments": ("save_to", "overwrite"),
                   "profile": ("mirror_dir",), "notifications": ("follow",), "doctor": ("repair",),
                   "webhook": ("secret_file",)}
_LOCATED = {"type": "object", "required": ["key"], "additionalProperties": False,
            "description": "The repository as the client located it on its own machine (its key, and whether its "
                           "core.ignorecase folds case); patterns and paths are then said from its root. The server "
                           "never looks at files of its own for it: without `located`, `repo` names the key.",
            "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 1000, "pattern": "^[^\\u0000]*$"},
                           "fold": {"type": "boolean"}}}
_SESSION = {"type": "object", "required": ["session_id"],
            "description": "The harness session as the client's machine knows it: its session_id and "
                           "hook_event_name (from the hook's input), stop_hook_active, the harness's process id and "
                           "the machine's name (so status counts it live while it shows signs of life), a "
                           "waiter's process token, and `again` when that waiter was armed before (a turn that "
                           "started since then keeps it from arming).",
            "properties": {"session_id": {"type": "string", "minLength": 1, "maxLength": 200},
                           "hook_event_name": {"type": ["string", "null"], "maxLength": 200},
                           "stop_hook_active": {"type": "boolean"},
                           "pid": {"type": ["integer", "null"], "minimum": 1},
                           "host": {"type": ["string", "null"], "maxLength": 300},
                           "waiter": {"type": ["string", "null"], "maxLength": 400},
                           "again": {"type": "boolean"}}}
# What a hook step answers through a server: the harness's output as the hook prints it, and a waiter's note.
HOOK_RESULT = {"type": "object", "required": ["output", "wake", "note"], "properties": {
    "output": {"type": ["object", "null"], "description": "What the hook prints for the harness (null: nothing)."},
    "wake": {"type": "boolean", "description": "wait: mail arrived; the hook exits 2 with `note` on stderr."},
    "note": {"type": ["string", "null"], "description": "wait: the envelopes that wake the session."},
    "waiter": {"type": ["string", "null"], "description": "A waiter of the session this step replaced or stood "
                                                            "down (a turn started, a stop held): its process token, "
                                                            "for the client to end on its machine."},
    "idle": {"type": "boolean", "description": "wait: false when the session is not idle (its stop was held, or a "
                                               "turn started since): the waiter does not arm."}}}
# Values only a client sends, beside the command's own: content it read, a watch's remaining wait.
EXTRAS = {
    "send": {
        "upload_attachments": {"type": "array", "description": "Attachments read on the client's machine.",
                               "items": {"type": "object", "required": ["name", "content_base64"],
                                         "properties": {"name": schemas.ATTACHMENT_NAME,
                                                        "content_base64": schemas.BASE64}}},
        "client_refs": {"type": "array", "items": {"type": "string"},
                        "description": "The refs as the client resolved them on its own machine (checked there): "
                                       "KEY//PATH for a file in a git repository (its key and the path from its "
                                       "root), else an absolute path. Stored as given."},
        "idempotency_key": {"type": "string", "format": "uuid",
                            "description": "A UUID the client makes for each send and sends again with it when the "
                                           "answer was lost: the send is stored once (the key is its batch_id), "
                                           "a repeat answered with the receipt of what was stored."}},
    "watch": {"wait_seconds": {"type": "number", "exclusiveMinimum": 0,
                               "maximum": model.WATCH_MINUTES_MAX * 60,
                               "description": "How long this request waits (the client's remaining watch); "
                                              "timeout_minutes is then ignored."},
              "stop_key": {"type": "string", "format": "uuid",
                           "description": f"A UUID the client makes for each blocked request: POST {STOP_PATH} "
                                          "with it (from any replica) releases this wait's session, as a watch "
                                          "stopped by a signal does before it exits. A client that hangs up "
                                          "without that call leaves its session stale (killed)."}},
    "read": {"deliver": {"enum": ["confirm"],
                         "description": "confirm: take delivery in two steps (agent_mail.operations.deliveries). The "
                                        f"marks are held, not made; the answer's {DELIVERY_HEADER} header names the "
                                        f"delivery, which the client confirms at POST {DELIVERED_PATH} once it has "
                                        "printed the result (or cancels if it could not). Unconfirmed, the "
                                        "messages are delivered again after a minute. No header: nothing to "
                                        "confirm."}},
    "attachments": {"with_content": {"type": "boolean", "description": "Add `contents`: sha256 -> base64 of each "
                                                                        "attachment listed."}},
    **{name: {"located": _LOCATED} for name in ("reserve", "release", "reservations")},
    "webhook": {"secret": {"type": "string", "minLength": 16, "maxLength": 1000,
                           "description": "add: the secret the client read from its --secret-file on its own "
                                          "machine (each POST is signed with it; never shown again)."}},
    "hook": {"session": _SESSION,
             "wait_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": model.WATCH_MINUTES_MAX * 60,
                              "description": "wait: how long this request waits (the client's remaining wait)."}},
}
# What only a server asks of a call: the identity a hook acts as (the command line fills it in from
# AGENT_MAIL_AGENT), and a reservation command's repository (`located`, or `repo` naming its key).
_REPOSITORY = {"anyOf": [{"required": ["located"]}, {"required": ["repo"]}]}
_THROUGH_A_SERVER = {"hook": {"required": ["agent", "session"]},
                     **{name: {"allOf": [_REPOSITORY]} for name in ("reserve", "release", "reservations")}}
# What a served call's operation takes from the extras (beside its checked values): a reservation command's
# repository as the client located it ({} when it sent none: the server then needs `repo`, never looking at its own
# files); a hook step's session as the client's machine knows it (a waiter's `once` is False: it blocks).
_TAKEN = {"reserve": ("located",), "release": ("located",), "reservations": ("located",), "hook": ("session",),
          "webhook": ("secret",)}


def carried(name: str, extras: dict) -> dict:
    """The values the operation of served call `name` takes from the client's extras."""
    taken = {key: extras.get(key) or ({} if key != "secret" else None) for key in _TAKEN.get(name, ())}
    if name == "hook":
        taken["once"] = False
    return taken


def exit_code(name: str, result: dict) -> int:
    """The exit code a served call's result has on the command line: 3 for a send with refused recipients, and
    for a reserve or reservations --check with conflicts."""
    if name == "send" and result.get("refused") or name in ("reserve", "reservations") and result.get("conflicts"):
        return errors.EXIT_PARTIAL
    return errors.EXIT_OK

EXIT_CODES = (errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_INVALID, errors.EXIT_PARTIAL, errors.EXIT_FORBIDDEN)
_ERROR = {"type": "object", "required": ["error", "problems"], "properties": {
    "error": {"type": "string", "description": "What went wrong and how to fix it."},
    "problems": {"type": "array", "items": {"type": "object", "properties": {
        "field": {"type": ["string", "null"], "description": "The argument at fault (by the API's name, or the "
                                                             f"command line's when asked with {NAMES_HEADER})."},
        "message": {"type": "string"}}}}}}


def _exit_header() -> dict:
    return {EXIT_HEADER: {"required": True, "description": "The exit code the command would have on the command "
                                                            "line (0 ok, 1 failed, 2 invalid, 3 partial, 4 forbidden).",
                          "schema": {"type": "integer", "enum": list(EXIT_CODES)}}}


def _error_response(text: str) -> dict:
    return {"description": text, "headers": _exit_header(),
            "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _errors() -> dict:
    return {"400": _error_response("The call is invalid (exit 2): every problem by argument name."),
            "401": {**_error_response("No valid token: missing, unknown or revoked (exit 4); checked before any of "
                                      "the body is read. Wrong tokens from one address are answered ever later."),
                    "headers": {**_exit_header(), "WWW-Authenticate": {"schema": {"type": "string"}, "description":
                                                                       'Bearer realm="agent-mail"'}}},
            "403": _error_response("The token may not act as, or look at, the identity the call names (exit 4)."),
            "408": _error_response("The request did not arrive in time (exit 2): its head within the server's "
                                   "read limit, the whole request within that plus its body at the minimum rate "
                                   "(chunked or not); nothing was done."),
            "413": _error_response("The request is larger than the most a call carries (exit 2); refused from its "
                                   "Content-Length, nothing was done."),
            "431": _error_response("The request's line and headers are larger than 16 KiB (exit 2)."),
            "503": _error_response("The mailbox cannot be reached now, or the server is stopping (exit 1)."),
            "default": _error_response("Any other failure (exit 1): still {error, problems}.")}


def call_schema(name: str) -> dict:
    """The body of POST /v1/call/NAME: the command's values (less those naming files, which stay with the client)
    and the values only a client sends, every spelling and rule the server takes, and nothing else."""
    command = spec.COMMANDS[name]
    local = tuple(arg.name for arg in command.args if arg.name.lstrip("-").replace("-", "_")
                  in LOCAL_TO_CLIENT.get(name, ()))
    body = schemas.arguments_schema(command, leave_out=local, extra=EXTRAS.get(name), exact=True)
    more = _THROUGH_A_SERVER.get(name, {})
    if "required" in more:
        body["required"] = list(dict.fromkeys([*body.get("required", ()), *more["required"]]))
    if "allOf" in more:
        body["allOf"] = [*body.get("allOf", ()), *more["allOf"]]
    return body


def _call_operation(name: str) -> dict:
    command = spec.COMMANDS[name]
    body = call_schema(name)
    ok = {"description": "The command's result document, as the command line prints it (exit 0; send with refused "
                         "recipients: exit 3).", "headers": _exit_header(),
          "content": {JSON: {"schema": HOOK_RESULT if name == "hook" else
                                           schemas.result_schema(command)}}}
    return {"operationId": name, "summary": command.summary, "tags": ["mutating" if command.mutating else "looking"],
            "parameters": [{"name": NAMES_HEADER, "in": "header", "required": False,
                            "description": "`flags`: name arguments in problems as the command line does "
                                           "(`--reply-to`); anything else: as the API does (`reply_to`).",
                            "schema": {"type": "string"}},
                           {"name": HOST_HEADER, "in": "header", "required": False,
                            "description": "The name of the client's machine, recorded with what the call does "
                                           "(status's hosts) and shown, never trusted for anything else. Left out: "
                                           "no machine is recorded. Anything but 1 to 253 ASCII letters, digits, "
                                           "'-', '.' and '_' starting with a letter or digit is refused (400, exit "
                                           "2), nothing done.",
                            "schema": {"type": "string", "minLength": 1, "maxLength": model.HOST_MAX_CHARS,
                                       "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"}}],
            "requestBody": {"required": False, "description": "No body: no values (as {}).",
                            "content": {JSON: {"schema": body}}},
            "responses": {"200": ok, **_errors()}}


def export_schema() -> dict:
    """The body of POST /v1/export: export's values but --output (the client writes the file)."""
    return schemas.arguments_schema(spec.COMMANDS["export"], leave_out=("--output",), exact=True)


def _wait_seconds() -> dict:
    return {"type": "number", "exclusiveMinimum": 0, "maximum": LOOK_WAIT_MAX,
            "description": "With `after`: wait up to this long for a change before answering."}


_IDENTITY_VALUE = {"type": "string", "pattern": f"^{schemas.IDENTITY}$", "description": "The identity (project:name)."}


def _look_operation(operation_id: str, summary: str, body: dict, result: dict) -> dict:
    return {"operationId": operation_id, "summary": summary, "tags": ["looking"],
            "requestBody": {"required": False, "content": {JSON: {"schema": body}}},
            "responses": {"200": {"description": "What was read.", "headers": _exit_header(),
                                  "content": {JSON: {"schema": result}}}, **_errors()}}


def _delivered_operation() -> dict:
    return _look_operation(
        "delivered", "Confirm a delivery a read answered with (read with deliver=confirm, its "
                     f"{DELIVERY_HEADER} header) once its result was printed: its messages are marked read (and "
                     "acknowledged, for read --ack) as of the moment they were handed over. printed=false cancels "
                     "it: they are unread again at once. Settling again, or a delivery that expired and went to "
                     "another reader, settles nothing. Acts as the delivery's identity: the token must name it.",
        {"type": "object", "additionalProperties": False, "required": ["delivery", "printed"], "properties": {
            "delivery": {"type": "string", "pattern": "^dlv_[0-9a-f]{32}$"},
            "printed": {"type": "boolean", "description": "true: the result was written (mark the messages); "
                                                          "false: it was not (make them unread again)."}}},
        {"type": "object", "required": ["delivery", "agent"], "properties": {
            "delivery": {"type": "string"}, "agent": {"type": ["string", "null"]},
            "confirmed": {"type": "integer", "description": "How many messages were marked."},
            "cancelled": {"type": "integer", "description": "How many were made unread again."}}})


def _follow_operation() -> dict:
    document = {"type": ["object", "null"], "description": "The file's document; null: no file."}
    return _look_operation(
        "follow", "An identity's notification mirror as its two files hold it (.notification/email.json and "
                  "system.json), for the client to write on its own machine (profile --mirror-dir, notifications, "
                  "notifications --follow). Acts as the identity: the token must name it.",
        {"type": "object", "additionalProperties": False, "required": ["agent"], "properties": {
            "agent": _IDENTITY_VALUE,
            "after": {"type": "string", "description": "The fingerprint of the documents last written: with "
                                                        "wait_seconds, answer once they differ."},
            "wait_seconds": _wait_seconds()}},
        {"type": "object", "required": ["agent", "unread", "email", "system", "fingerprint", "at"], "properties": {
            "agent": {"type": "string"}, "unread": {"type": "integer"}, "email": document, "system": document,
            "fingerprint": {"type": "string"}, "at": {"type": "string"}}})


def _stop_operation() -> dict:
    return {"operationId": "stop_watch", "tags": ["mutating"],
            "summary": "Release the session of a blocked watch (its request's stop_key), as a watch stopped by "
                       "SIGTERM, SIGINT or SIGHUP does before it exits: status then shows it released, not stale. "
                       "Works on any replica; the server holding the wait ends it. Acts as the identity: the "
                       "token must name it.",
            "requestBody": {"required": True, "content": {JSON: {"schema": {
                "type": "object", "additionalProperties": False, "required": ["agent", "key"], "properties": {
                    "agent": {**_IDENTITY_VALUE, "description": "The identity the watch waits for (project:name)."},
                    "key": {"type": "string", "format": "uuid", "description": "The watch request's stop_key."},
                    "signal": {"type": "integer", "minimum": 1, "maximum": 64,
                               "description": "The signal that stopped the client (the release's reason)."}}}}}},
            "responses": {"200": {"description": "The session is released (`released`: by this call; false: its "
                                                 "wait had ended already).", "headers": _exit_header(),
                                  "content": {JSON: {"schema": {
                                      "type": "object", "required": ["agent", "released", "released_at"],
                                      "properties": {"agent": {"type": "string"}, "released": {"type": "boolean"},
                                                     "released_at": {"type": ["string", "null"]}}}}}},
                          **_errors()}}


def _dashboard_operation() -> dict:
    def view(**properties) -> dict:
        return {"type": "object", "additionalProperties": False, "properties": properties,
                "required": [name for name in properties if name in ("agent", "id")]}
    some_id = {"type": "string", "pattern": "\\S", "description": "A message id (a thread's: any of its messages)."}
    views = {"fleet": view(overdue_minutes={"type": "number", "exclusiveMinimum": 0, "maximum": 10**6}),
             "feed": view(), "inbox": view(agent=_IDENTITY_VALUE), "thread": view(id=some_id),
             "message": view(id=some_id), "hourly": view(by={"enum": ["project", "identity"]}),
             "backlog": view(), "reservations": view()}
    return _look_operation(
        "dashboard", "The supervisor's views (fleet, feed, an inbox, a thread, charts), as the dashboard shows them; "
                     "marks nothing read. Needs a supervisor's or an operator's token.",
        {"type": "object", "additionalProperties": False, "properties": {
            "views": {"type": "object", "additionalProperties": False, "properties": views},
            "after": {"type": "integer", "description": "The marker of an earlier answer: with wait_seconds, answer "
                                                        "once a message was stored since."},
            "wait_seconds": _wait_seconds()}},
        {"type": "object", "required": ["marker", "views"], "properties": {
            "marker": {"type": "integer"}, "views": {"type": "object"}}})


def _versioned(paths: dict, version: str) -> None:
    """The version check (server/versions.py) on every operation: the client's version as an optional request header,
    the server's on every answer (but 408 and 431, which the connection answers before any route), and the 400 that
    refuses a version this server cannot serve."""
    named = {"name": VERSION_HEADER, "in": "header", "required": False, "example": version,
             "description": "The client's agent-mail version (MAJOR.MINOR.PATCH). Left out: served. A version this "
                            "server cannot serve (another major version, or before 1.0 another minor one) is refused "
                            "with 400 naming both versions (exit 2), before anything else is done.",
             "schema": {"type": "string", "pattern": served_pattern(version), "examples": [version]}}
    answered = {"required": True, "description": "The server's agent-mail version.",
                "schema": {"type": "string", "example": version}}
    for operations in paths.values():
        for operation in operations.values():
            operation["parameters"] = [*operation.get("parameters", ()), named]
            responses = operation["responses"]
            responses.setdefault("400", _error_response(
                f"The client's version ({VERSION_HEADER}) cannot be served by this server (exit 2): the error names "
                "both versions."))
            for code, response in responses.items():
                if code not in ("408", "431"):
                    response["headers"] = {**response.get("headers", {}), VERSION_HEADER: answered}


def document(version: str) -> dict:
    """The OpenAPI 3.1 document of the API, every served command's arguments from the spec."""
    paths = {call_path(name): {"post": _call_operation(name)} for name in SERVED}
    export = spec.COMMANDS["export"]
    exported = export_schema()
    paths[EXPORT_PATH] = {"post": {
        "operationId": "export", "summary": export.summary + " The client writes it (--output, or stdout).",
        "requestBody": {"required": False, "content": {JSON: {"schema": exported}}},
        "responses": {"200": {"description": "The export itself (JSON Lines, or mbox); its summary (format, bytes "
                                             f"and counts) as JSON in {RESULT_HEADER}.",
                              "headers": {**_exit_header(), RESULT_HEADER: {"required": True,
                                                                            "schema": {"type": "string"}}},
                              "content": {JSON_LINES: {"schema": {"type": "string"}},
                                          MBOX: {"schema": {"type": "string"}}}},
                      **_errors()}}}
    imported = spec.COMMANDS["import"]
    paths[IMPORT_PATH] = {"post": {
        "operationId": "import", "summary": imported.summary + " Needs an operator's token ('*').",
        "parameters": [{"name": "dry_run", "in": "query", "required": False, "schema": {"type": "string",
                                                                                        "enum": ["true", "false"]},
                        "description": imported.arg("--dry-run").help}],
        # The export file's bytes as they are (JSON Lines); the server reads the body whatever its type says.
        "requestBody": {"required": True, "content": {OCTETS: {"schema": {
            "type": "string", "format": "binary"}}}},
        "responses": {"200": {"description": "import's result document (file: null; the client names its own).",
                              "headers": _exit_header(),
                              "content": {JSON: {"schema": schemas.result_schema(imported)}}},
                      **_errors()}}}
    paths[DELIVERED_PATH] = {"post": _delivered_operation()}
    paths[FOLLOW_PATH] = {"post": _follow_operation()}
    paths[DASHBOARD_PATH] = {"post": _dashboard_operation()}
    paths[STOP_PATH] = {"post": _stop_operation()}
    for path, operation in ((HEALTH_PATH, "health"), (HEALTH_LIVE_PATH, "health_live")):
        paths[path] = {"get": {"operationId": operation, "summary": "Liveness: whether the server process answers "
                                                                    "(no token needed; asks nothing of the database).",
                               "security": [], "responses": {"200": {
                                   "description": "Up.", "headers": _exit_header(),
                                   "content": {JSON: {"schema": {
                                       "type": "object", "required": ["ok", "stopping"],
                                       "properties": {"ok": {"type": "boolean"},
                                                      "stopping": {"type": "boolean"}}}}}}}}}
    ready = {"type": "object", "required": ["ok", "ready", "reason", "stopping"],
             "properties": {"ok": {"type": "boolean"}, "ready": {"type": "boolean"},
                            "reason": {"type": ["string", "null"]}, "stopping": {"type": "boolean"}}}
    paths[HEALTH_READY_PATH] = {"get": {
        "operationId": "health_ready", "security": [],
        "summary": "Readiness: whether calls can be served now (the database reached, its schema this version's, a "
                   "store read through as a call's; no token needed). What a proxy's health check and a monitor "
                   "should ask.",
        "responses": {"200": {"description": "Ready.", "headers": _exit_header(), "content": {JSON: {"schema": ready}}},
                      "503": {"description": "Not ready: the database cannot be reached, a migration is pending or "
                                             "was applied by a newer version, a store cannot read through it, or the "
                                             "server is stopping; the reason in `reason`, which never names where "
                                             "the database is (the server's log does).", "headers": _exit_header(),
                              "content": {JSON: {"schema": ready}}}}}}
    paths[METRICS_PATH] = {"get": {
        "operationId": "metrics", "summary": "The server's counters in the Prometheus text format (0.0.4): a "
                                             "supervisor's or an operator's token.",
        "responses": {"200": {"description": "The exposition.", "headers": _exit_header(),
                              "content": {"text/plain": {"schema": {"type": "string"}}}},
                      **{code: answer for code, answer in _errors().items() if code in ("401", "403", "503",
                                                                                          "default")}}}}
    _versioned(paths, version)
    return {
        "openapi": "3.1.0",
        "info": {"title": "agent-mail", "version": version,
                 "description": "The agent-mail mailbox served by `agent-mail serve`. Each command is POST "
                                f"{CALL_PATH}COMMAND with its values by argument name (the command line's flag "
                                "without dashes); the answer is the command's own result document, with the exit "
                                f"code the command would have in the {EXIT_HEADER} header. A token acts only as "
                                "the identities it names (agent-mail token create). The server takes exactly what "
                                "this document allows: leave a value out to not give it (null is refused)."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "A token from agent-mail token create."}},
                       "schemas": {"Error": _ERROR}},
    }


_CHECKED: dict = {}  # path -> the validator of its request body


def refuse_off_schema(path: str, given: dict) -> None:
    """InvalidInput naming each value of `given` (a request's body, as JSON) that /openapi.json does not allow at
    `path`: the server takes nothing its document refuses. (The call layer's own checks come first, with their own
    words; this holds the rest: a null, a number as text, a value of the wrong type inside a look. A text the
    command refuses itself, in clearer words, is left to it: _refused_in_own_words.)"""
    validator = _CHECKED.get(path)
    if validator is None:
        from jsonschema import Draft202012Validator, FormatChecker  # the server's (the mcp SDK brings it)

        from agent_mail import __version__

        for route, operations in document(__version__)["paths"].items():
            body = operations.get("post", {}).get("requestBody", {}).get("content", {}).get(JSON)
            if body is not None:
                _CHECKED[route] = Draft202012Validator(body["schema"], format_checker=FormatChecker())
        validator = _CHECKED[path]
    found = sorted(validator.iter_errors(given), key=lambda e: list(e.path))
    if found and not all(_refused_in_own_words(path, error) for error in found):
        raise errors.InvalidInput([_problem(error) for error in found[:20]])


def _own_checks() -> dict:
    """(command, argument) -> a function saying whether the command itself refuses one value of that argument
    (before it changes anything), in its own words: the text rules /openapi.json states as patterns and choices."""
    from agent_mail.parts import inputs, query_language, wildmatch

    def query_refused(text: str) -> bool:
        try:
            query_language.parse(text)
        except errors.InvalidInput:
            return True
        return False

    patterns = lambda value: wildmatch.pattern_problem(value) is not None  # noqa: E731
    return {("search", "query"): query_refused, ("reserve", "patterns"): patterns, ("release", "patterns"): patterns,
            ("reserve", "reason"): lambda value: model.name_problem(value) is not None,
            ("send", "subject"): lambda value: model.subject_problem(value) is not None,
            ("send", "body"): lambda value: model.body_problem(value) is not None,
            ("webhook", "url"): lambda value: inputs.url_problem(value) is not None,
            ("profile", "clear"): lambda value: value not in inputs.PROFILE_SETTINGS,
            ("send", "upload_attachments"): lambda value: not value or "/" in value or model.has_surrogates(value)
            or model.name_problem(value) is not None}


_OWN_CHECKS: dict = {}


def _refused_in_own_words(path: str, error) -> bool:
    """Whether `error` (a value off the schema at `path`) is one the command refuses itself, with clearer words
    (a pattern's negation, an empty query, a URL with no host) and every other problem of the call beside it: then
    the schema leaves it to the command, which refuses the call before it changes anything."""
    if not path.startswith(CALL_PATH) or not error.absolute_path or \
            error.validator not in ("pattern", "enum", "minLength", "maxLength", "anyOf"):
        return False
    if not _OWN_CHECKS:
        _OWN_CHECKS.update(_own_checks())
    check = _OWN_CHECKS.get((path[len(CALL_PATH):], error.absolute_path[0]))
    value = error.instance
    values = value if isinstance(value, list) and len(error.absolute_path) == 1 else [value]
    return check is not None and all(isinstance(v, str) for v in values) and any(check(v) for v in values)


def _problem(error) -> tuple[str | None, str]:
    """One way a body is off the schema, as (the value's name, what is wrong and how to fix it)."""
    where = ".".join(str(part) for part in error.absolute_path) or None
    kind, instance, expected = error.validator, error.instance, error.validator_value
    if instance is None and kind == "type":
        return where, "is null; leave a value out to not give it (null is no value here)."
    if kind == "type":
        wanted = expected if isinstance(expected, str) else " or ".join(expected)
        return where, f"must be of JSON type {wanted}, not {_json_type(instance)} (as /openapi.json says)."
    if kind == "additionalProperties":
        extra = sorted(set(instance) - set(error.schema.get("properties", {})))
        return (where + "." if where else "") + str(extra[0]) if extra else where, \
            f"is not a value this takes; it takes {', '.join(error.schema.get('properties', {})) or 'none'}."
    if kind in ("enum", "const"):
        return where, f"must be one of {expected if kind == 'enum' else [expected]}."
    if kind == "pattern":
        return where, f"does not have the form /openapi.json gives it (pattern {expected})."
    if kind == "required":
        missing = [key for key in expected if key not in instance]
        return (missing[0] if missing and not where else where), f"needs {', '.join(missing)} here."
    if kind in ("not", "oneOf", "anyOf", "if", "allOf"):  # the call layer says these first, in its own words
        import json

        return where, f"breaks a rule between values that /openapi.json states ({kind} {json.dumps(expected)[:300]})."
    return where, f"{kind} is {expected} (as /openapi.json says)."


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "null")
