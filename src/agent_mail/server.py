"""`agent-mail serve`: the mailbox its own AGENT_MAIL_DB resolves, served over HTTP (Starlette on uvicorn, the
`server` extra), so agents on other machines reach it with AGENT_MAIL_DB=http(s)://HOST:PORT and a token.

API: `POST /v1/call/COMMAND`, a JSON object of the command's values by argument name, `Authorization: Bearer
TOKEN`. Each call is checked by the call layer (agent_mail.calls) exactly as the command line's are, then by the
token's grant (agent_mail.grants), then carried out on the mailbox; the answer is the command's own result
document (its `next` steps as the command line's strings) with the exit code the command would have in the
X-Agent-Mail-Exit header, or {error, problems} with an HTTP status matching it. Files never come from or go to
this machine on a client's behalf: a send's attachments and refs arrive as content and text, saved attachments
leave as content, and the arguments that name a file here are refused.

Beside the commands, two looks (agent_mail.served_looks): POST /v1/follow, an identity's notification documents
for a client that writes its mirror on its own machine, and POST /v1/dashboard, the supervisor's views; each may
wait for a change (`after`, `wait_seconds`) as a watch waits.

Each call runs in a worker thread on a store of its own, opened for it and closed after it (a blocked watch holds
one connection while it waits: see docs/design.md). SIGTERM ends the waits at once (each answers 503) and then
the server.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_mail import __version__, api, calls, checks, errors, grants, jsonout, model, spec, tokens

EXIT_HEADER, NAMES_HEADER = api.EXIT_HEADER, api.NAMES_HEADER
SERVED, LOCAL_TO_CLIENT, EXTRAS = api.SERVED, api.LOCAL_TO_CLIENT, api.EXTRAS
DEFAULT_LISTEN = "127.0.0.1:8025"
# What a call may carry: a send's body and attachments (base64: 4/3 of their size), with room for the rest.
MAX_REQUEST_BYTES = model.ATTACHMENTS_MAX_BYTES_PER_SEND * 4 // 3 + model.BODY_MAX_CHARS * 4 + 1_000_000
MAX_IMPORT_BYTES = 8 * 1024**3  # an import's upload, spooled to a temporary file here
MAX_THREADS = 1000  # calls carried out at once (a blocked watch holds one)

_STOPPING = threading.Event()
_LIMITER: list = []


class Stopping(errors.StorageError):
    """The server is stopping: a wait in progress ends (the client reconnects and looks again)."""


def _status(error: errors.AgentMailError) -> int:
    if isinstance(error, errors.Forbidden):
        return 401 if error.unauthenticated else 403
    if error.exit_code == errors.EXIT_INVALID:
        return 400
    return 503 if isinstance(error, errors.StorageError) else 500


def _document(payload: object, status: int, code: int) -> Response:
    return Response(jsonout.dumps(payload, end="\n"), status, media_type="application/json",
                    headers={EXIT_HEADER: str(code)})


def _log(**fields) -> None:
    """One JSON line per request on stderr. Never a token: only its id, which is not secret."""
    fields = {"time": model.now_iso(), **fields}
    try:
        sys.stderr.write(json.dumps(fields) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


async def _body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_REQUEST_BYTES):
        raise errors.InvalidInput([(None, f"the request is larger than {MAX_REQUEST_BYTES} bytes, the most a call "
                                          "carries.")])
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise errors.InvalidInput([(None, f"the request is larger than {MAX_REQUEST_BYTES} bytes.")])
        chunks.append(chunk)
    return b"".join(chunks)


def _given(name: str, body: bytes) -> dict:
    try:
        given = json.loads(body or b"{}")
    except (ValueError, RecursionError) as exc:
        raise errors.InvalidInput([(None, f"the request body is not JSON ({exc}); send a JSON object of the "
                                          f"values of {name} by argument name.")]) from None
    if not isinstance(given, dict):
        raise errors.InvalidInput([(None, f"the request body must be a JSON object of the values of {name} by "
                                          "argument name.")])
    return given


def _uploads(given: dict) -> dict:
    """A send's content read on the client's machine: {refs, attachments: [{name, content}]}."""
    import base64
    import binascii

    files, refs = given.pop("upload_attachments", None) or [], given.pop("client_refs", None) or []
    problems, attachments = [], []
    if not isinstance(files, list) or not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise errors.InvalidInput([(None, "upload_attachments and client_refs must be lists.")])
    for upload in files:
        try:
            content = base64.b64decode(upload["content_base64"], validate=True)
            if not isinstance(upload["name"], str):
                raise TypeError
            attachments.append({"name": upload["name"], "content": content})
        except (KeyError, TypeError, ValueError, binascii.Error):
            problems.append(("attach", "each upload is {name, content_base64} (standard base64)."))
    if problems:
        raise errors.InvalidInput(problems)
    return {"refs": refs, "attachments": attachments}


def _carry_out(location: str, name: str, presented: str | None, body: bytes, info: dict, gone: threading.Event):
    """Authenticate, check, grant and run one call on a store of its own; the result."""
    from agent_mail import service
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        grant = tokens.authenticate(store, presented)  # before anything else is read
        info["token_id"] = grant["id"]
        given = _given(name, body)
        extras = {key: given.pop(key) for key in EXTRAS.get(name, ()) if key in given and key != "upload_attachments"
                  and key != "client_refs"}
        uploaded = _uploads(given) if name == "send" else None
        local = [(key, "names a file on the server's machine; the client reads and writes files on its own machine "
                       "(run the command through agent-mail with AGENT_MAIL_DB naming this server).")
                 for key in LOCAL_TO_CLIENT.get(name, ()) if given.get(key) not in (None, False, [])]
        values = calls.check(name, given, skip=LOCAL_TO_CLIENT.get(name, ()), also=local, with_inputs=False)
        info["as"] = grants.check(grant, name, values)
        mailbox = service.Mailbox(store)
        mailbox.publish_due()
        if uploaded is not None:
            values["uploaded"] = uploaded
        if name == "watch":
            _bound_wait(values, extras, store, grant, gone)
        result = calls.run(name, values, mailbox=mailbox)
        if name == "attachments" and extras.get("with_content") is True:
            result = {**result, "contents": _contents(store, result["attachments"])}
        return result
    finally:
        store.close()


def _bound_wait(values: dict, extras: dict, store, grant: dict, gone: threading.Event) -> None:
    """A watch's wait, ended by a stopping server, a revoked token or a client that hung up."""
    wait = extras.get("wait_seconds")
    if wait is not None and not values["once"]:
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or \
                not 0 < wait <= model.WATCH_MINUTES_MAX * 60:
            raise errors.InvalidInput([("wait_seconds", "must be a number of seconds within the watch's limits.")])
        values["timeout_minutes"] = None
        values["timeout_seconds"] = float(wait)

    def wanted() -> bool:
        if _STOPPING.is_set():
            raise Stopping("the server is stopping; this wait ended with nothing found. Look again (the client "
                           "reconnects by itself).")
        tokens.still_valid(store, grant)
        return not gone.is_set()
    if not values["once"]:
        values["wanted"] = wanted


def _look(location: str, look: str, presented: str | None, body: bytes, info: dict, gone: threading.Event) -> dict:
    """POST /v1/follow or /v1/dashboard (agent_mail.served_looks): authenticate, check, grant, wait if asked, read."""
    from agent_mail import served_looks, service
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        grant = tokens.authenticate(store, presented)  # before anything else is read
        info["token_id"] = grant["id"]
        given = _given(look, body)
        values = served_looks.check_follow(given) if look == "follow" else served_looks.check_dashboard(given)
        info["as"] = served_looks.grant(grant, look, values)

        def wanted() -> bool:
            if _STOPPING.is_set():
                raise Stopping("the server is stopping; this wait ended. Look again (the client reconnects by "
                               "itself).")
            tokens.still_valid(store, grant)
            return not gone.is_set()
        mailbox = service.Mailbox(store)
        return served_looks.follow(mailbox, values, wanted) if look == "follow" else \
            served_looks.dashboard(mailbox, values, wanted)
    finally:
        store.close()


def _contents(store, listed: list[dict]) -> dict:
    import base64

    with store.transaction():
        return {a["sha256"]: base64.b64encode(store.attachment_content(a["sha256"]) or b"").decode("ascii")
                for a in listed}


def _export_file(location: str, presented: str | None, body: bytes, info: dict, directory: str) -> dict:
    """An export written whole into `directory` on this machine (then streamed to the client, who writes it on
    its own); its summary."""
    from agent_mail import service
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        grant = tokens.authenticate(store, presented)
        info["token_id"] = grant["id"]
        given = _given("export", body)
        local = [("output", "the client writes the export on its own machine (--output there, or stdout).")] \
            if given.get("output") is not None else []
        values = calls.check("export", given, skip=("output",), also=local, with_inputs=False)
        info["as"] = grants.check(grant, "export", values)
        values["output"] = os.path.join(directory, "export")
        return calls.run("export", values, mailbox=service.Mailbox(store))
    finally:
        store.close()


def _authenticated(location: str, presented: str | None, info: dict) -> dict:
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        grant = tokens.authenticate(store, presented)
        info["token_id"] = grant["id"]
        return grant
    finally:
        store.close()


def _import_file(location: str, grant: dict, path: str, dry_run: bool, info: dict) -> dict:
    """The uploaded export at `path` imported (all or nothing); its result, naming no file of this machine."""
    from agent_mail import service
    from agent_mail.store import open_store

    store = open_store(location)
    try:
        tokens.still_valid(store, grant)
        values = calls.check("import", {"file": path, "dry_run": dry_run}, with_inputs=False)
        info["as"] = grants.check(grant, "import", values)
        result = calls.run("import", values, mailbox=service.Mailbox(store))
        return {**result, "file": None, "next": []}
    finally:
        store.close()


async def _upload(request: Request, path: str) -> None:
    size = 0
    with open(path, "wb") as out:
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_IMPORT_BYTES:
                raise errors.InvalidInput([("file", f"the upload is larger than {MAX_IMPORT_BYTES} bytes, the most "
                                                    "an import through a server takes; nothing was imported. Run "
                                                    "import where the mailbox is.")])
            out.write(chunk)


def _namer(name: str, request: Request):
    command = spec.COMMANDS.get(name)
    if command is not None and request.headers.get(NAMES_HEADER) == "flags":
        return checks.flag_namer(command)
    return lambda key: key


async def _watch_disconnect(request: Request, gone: threading.Event, done: anyio.Event) -> None:
    while not done.is_set():
        if await request.is_disconnected():
            gone.set()
            return
        with anyio.move_on_after(1.0):
            await done.wait()


def app_for(location: str) -> Starlette:
    """The ASGI application serving the mailbox at `location`."""

    async def call(request: Request) -> Response:
        started = time.monotonic()
        name = request.path_params["command"]
        info: dict = {"token_id": None, "as": None}
        try:
            if name not in SERVED:
                raise errors.InvalidInput([(None, f"{name!r} is not a command this server carries out; it serves "
                                                  f"{', '.join(SERVED)}.")])
            body = await _body(request)
            if not _LIMITER:
                _LIMITER.append(anyio.CapacityLimiter(MAX_THREADS))
            gone, done, outcome = threading.Event(), anyio.Event(), []
            async with anyio.create_task_group() as group:
                if name == "watch":  # a client that hangs up ends its wait
                    group.start_soon(_watch_disconnect, request, gone, done)
                try:
                    outcome.append(await anyio.to_thread.run_sync(_carry_out, location, name, _bearer(request), body,
                                                                  info, gone, limiter=_LIMITER[0]))
                except Exception as exc:  # raised below, out of the task group (which would wrap it)
                    outcome.append(exc)
                finally:
                    done.set()
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            result = outcome[0]
            code = errors.EXIT_PARTIAL if name == "send" and result["refused"] else errors.EXIT_OK
            response = _document(result, 200, code)
        except errors.AgentMailError as exc:
            shown = exc.renamed(_namer(name, request))
            response = _document(shown.payload(), 404 if name not in SERVED else _status(exc), exc.exit_code)
        except Exception as exc:  # a bug: still JSON, never a traceback
            response = _document({"error": f"internal error ({type(exc).__name__}: {exc}). Nothing was changed. "
                                           "Please report this.", "problems": []}, 500, errors.EXIT_FAILED)
        _log(method=request.method, path=request.url.path, command=name, token_id=info["token_id"],
             **{"as": info["as"]}, status=response.status_code, exit=int(response.headers[EXIT_HEADER]),
             ms=round((time.monotonic() - started) * 1000, 1))
        return response

    async def transfer(request: Request) -> Response:
        """POST /v1/export (JSON values; the export as the body, its summary in a header) and POST /v1/import
        (the export as the body, ?dry_run=true)."""
        import shutil
        import tempfile

        started = time.monotonic()
        name = request.url.path.rsplit("/", 1)[1]
        info: dict = {"token_id": None, "as": None}
        directory = tempfile.mkdtemp(prefix="agent-mail-serve-")
        keep = False
        try:
            if name == "export":
                body = await _body(request)
                summary = await anyio.to_thread.run_sync(_export_file, location, _bearer(request), body, info,
                                                         directory)
                path = os.path.join(directory, "export")
                summary = {key: value for key, value in summary.items() if key not in ("file", "next")}

                async def content():
                    try:
                        with open(path, "rb") as source:
                            while chunk := await anyio.to_thread.run_sync(source.read, 1 << 20):
                                yield chunk
                    finally:
                        shutil.rmtree(directory, ignore_errors=True)
                from starlette.responses import StreamingResponse

                response = StreamingResponse(content(), 200, media_type="application/x-ndjson" if summary["format"]
                                             == "jsonl" else "application/mbox",
                                             headers={EXIT_HEADER: "0", api.RESULT_HEADER: json.dumps(summary),
                                                      "Content-Length": str(summary["bytes"])})
                keep = True
            else:
                grant = await anyio.to_thread.run_sync(_authenticated, location, _bearer(request), info)
                path = os.path.join(directory, "upload.jsonl")
                await _upload(request, path)
                dry_run = request.query_params.get("dry_run", "false").lower()
                if dry_run not in ("true", "false"):
                    raise errors.InvalidInput([("dry_run", "is true or false.")])
                result = await anyio.to_thread.run_sync(_import_file, location, grant, path, dry_run == "true", info)
                response = _document(result, 200, errors.EXIT_OK)
        except errors.AgentMailError as exc:
            response = _document(exc.renamed(_namer(name, request)).payload(), _status(exc), exc.exit_code)
        except Exception as exc:  # a bug: still JSON, never a traceback
            response = _document({"error": f"internal error ({type(exc).__name__}: {exc}). Nothing was changed. "
                                           "Please report this.", "problems": []}, 500, errors.EXIT_FAILED)
        finally:
            if not keep:
                shutil.rmtree(directory, ignore_errors=True)
        _log(method=request.method, path=request.url.path, command=name, token_id=info["token_id"],
             **{"as": info["as"]}, status=response.status_code, exit=int(response.headers[EXIT_HEADER]),
             ms=round((time.monotonic() - started) * 1000, 1))
        return response

    async def looks(request: Request) -> Response:
        """POST /v1/follow and /v1/dashboard: a look that may wait (ended early by a client that hangs up)."""
        started = time.monotonic()
        look = request.url.path.rsplit("/", 1)[1]
        info: dict = {"token_id": None, "as": None}
        try:
            body = await _body(request)
            if not _LIMITER:
                _LIMITER.append(anyio.CapacityLimiter(MAX_THREADS))
            gone, done, outcome = threading.Event(), anyio.Event(), []
            async with anyio.create_task_group() as group:
                group.start_soon(_watch_disconnect, request, gone, done)
                try:
                    outcome.append(await anyio.to_thread.run_sync(_look, location, look, _bearer(request), body, info,
                                                                  gone, limiter=_LIMITER[0]))
                except Exception as exc:  # raised below, out of the task group (which would wrap it)
                    outcome.append(exc)
                finally:
                    done.set()
            if isinstance(outcome[0], Exception):
                raise outcome[0]
            response = _document(outcome[0], 200, errors.EXIT_OK)
        except errors.AgentMailError as exc:
            response = _document(exc.payload(), _status(exc), exc.exit_code)
        except Exception as exc:  # a bug: still JSON, never a traceback
            response = _document({"error": f"internal error ({type(exc).__name__}: {exc}). Nothing was changed. "
                                           "Please report this.", "problems": []}, 500, errors.EXIT_FAILED)
        _log(method=request.method, path=request.url.path, command=look, token_id=info["token_id"],
             **{"as": info["as"]}, status=response.status_code, exit=int(response.headers[EXIT_HEADER]),
             ms=round((time.monotonic() - started) * 1000, 1))
        return response

    async def health(request: Request) -> Response:
        return _document({"ok": True, "stopping": _STOPPING.is_set()}, 200, errors.EXIT_OK)

    async def openapi(request: Request) -> Response:
        return _document(api.openapi(__version__), 200, errors.EXIT_OK)

    return Starlette(routes=[Route("/v1/call/{command}", call, methods=["POST"]),
                             Route("/v1/export", transfer, methods=["POST"]),
                             Route("/v1/import", transfer, methods=["POST"]),
                             Route(api.FOLLOW_PATH, looks, methods=["POST"]),
                             Route(api.DASHBOARD_PATH, looks, methods=["POST"]),
                             Route("/v1/health", health, methods=["GET"]),
                             Route("/openapi.json", openapi, methods=["GET"])])


def _wake_waits(location: str) -> None:
    from agent_mail.store import open_store

    try:
        store = open_store(location)
        try:
            with store.transaction(write=True):
                store.wake_waits()
        finally:
            store.close()
    except errors.AgentMailError:
        pass  # each wait still ends at its next refresh


class _Server(uvicorn.Server):
    """uvicorn's server, whose SIGTERM first ends the waits it carries (uvicorn would wait for them)."""

    location = ""

    def handle_exit(self, sig, frame) -> None:
        if not _STOPPING.is_set():
            _STOPPING.set()
            threading.Thread(target=_wake_waits, args=(self.location,), daemon=True).start()
        super().handle_exit(sig, frame)


def _address(listen: str) -> tuple[str, int]:
    host, colon, port = listen.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise errors.InvalidInput([("listen", f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8025).")])
    return host, int(port)


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(listen: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
          insecure_no_tls: bool = False) -> None:
    """Serve until SIGTERM / SIGINT."""
    import socket

    from agent_mail import location as locating
    from agent_mail.store import open_store, redact_url

    host, port = _address(listen or DEFAULT_LISTEN)
    if not _is_loopback(host) and not tls_cert and not insecure_no_tls:
        raise errors.InvalidInput([("listen", f"{host} is not a loopback address: tokens and mail would cross the "
                                              "network in clear. Give --tls-cert FILE --tls-key FILE, or (behind a "
                                              "TLS proxy you trust) --insecure-no-tls.")])
    problems = [(flag, f"{path!r} is not a readable file.") for flag, path in (("tls_cert", tls_cert),
                                                                                ("tls_key", tls_key))
                if path and not os.path.isfile(path)]
    if problems:
        raise errors.InvalidInput(problems)
    location, _ = locating.resolve_location()
    open_store(location).close()  # create or migrate it now, and fail here rather than on the first call
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # connections are queued from the moment "listening" is logged (uvicorn accepts them)
    except OSError as exc:
        sock.close()
        raise errors.AgentMailError(f"cannot listen on {host}:{port} ({exc.strerror or exc}).") from None
    bound = sock.getsockname()[1]
    scheme = "https" if tls_cert else "http"
    shown_host = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(app_for(location), log_level="warning", access_log=False, lifespan="off",
                            ssl_certfile=tls_cert, ssl_keyfile=tls_key, timeout_graceful_shutdown=10)
    server = _Server(config)
    server.location = location
    import signal

    # uvicorn hands the signal that stopped it on to the handler before it once it has stopped: a stop asked for
    # is a clean end here, not the command line's "stopped by SIGTERM" error. Set before "listening" is said, and
    # until uvicorn's own handlers are in place (while it starts) it stops the server as theirs do: a SIGTERM
    # that came right after "listening" was swallowed, and the server ran on.
    previous = {number: signal.signal(number, server.handle_exit) for number in (signal.SIGTERM, signal.SIGINT)}
    _log(listening=f"{scheme}://{shown_host}:{bound}", mailbox=redact_url(location), pid=os.getpid())
    try:
        server.run(sockets=[sock])
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    _log(stopped=True)


def main(values: dict, emit) -> int:
    """`agent-mail serve [--listen HOST:PORT] [--tls-cert FILE --tls-key FILE | --insecure-no-tls]`."""
    serve(**values)
    return errors.EXIT_OK
