"""MCP over streamable HTTP at `/mcp` on `agent-mail serve`: the mailbox's tools (agent_mail.protocols.mcp_tools, as
`agent-mail mcp` offers them over stdio), on the official MCP SDK's transport, the identity taken from the
bearer token. Part of the server front end: only server.py imports it (the `mcp` extra, which `server` brings).

- Every request carries `Authorization: Bearer TOKEN`, read and looked up by the server's edge (edge.Gate) as on
  every route: a missing, unknown or revoked token is answered 401 with {error, problems} before anything else is
  read (the body, the mailbox), the token itself never repeated; a request admitted reaches this endpoint with
  the grant in its scope (edge.admitted), the only way it learns who calls.
- Stateless: each POST is a whole exchange (the SDK's stateless mode: no session to keep, so any replica behind
  a proxy can answer any request); GET and DELETE are answered 405, as the transport allows (no stream for the
  server to speak first on, no session to end). A tool result comes back as a server-sent event stream, which
  the SDK pings every 15 s: a long watch stays alive behind a proxy that cuts idle connections.
- Each tool call is checked by the call layer (agent_mail.calls) and then by the token's grant
  (agent_mail.server.grants) exactly as POST /v1/call does, on a store of its own in a worker thread: a token for
  team:alice cannot read, ack or watch team:bob's mail or send as bob (a tool error naming the identity and the
  token's scope, exit 4's refusal, nothing changed).
- The identity a tool acts as, when the call leaves it out: the token's, when it names exactly one identity
  (`--agent P:N`); a token for a project (`P:*`), several identities or any ('*') names none, so the call must
  give `agent` / `from`.
- Nothing names a file on the server's machine: the arguments that would (send's attach, ref and body_file,
  attachments' save_to and overwrite) are left out of the tools and refused if given anyway; run those through
  the command line with AGENT_MAIL_DB naming the server. The tools are those of `agent-mail mcp` that the
  server carries out (agent_mail.server.openapi.SERVED), less the reservation tools (the repository is on the
  caller's machine).
- A blocked watch waits on the event loop, carried by the server's waits (agent_mail.server.waits: on PostgreSQL
  the one LISTEN connection, on SQLite the wake-up pipes), holding neither a thread nor a database connection, and
  ends when mail comes, its client hangs up, its token is revoked (at once: the revocation wakes it), or the server
  stops (SIGTERM). Where the server has no such waits (a SQLite mailbox with AGENT_MAIL_POLL set) it blocks in a
  worker thread, as a watch on the command line does. One JSON log line per request, with the token's id only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, Tool

from agent_mail import __version__, calls, errors, jsonout, model, spec
from agent_mail.protocols import http_api, mcp_tools
from agent_mail.parts import checks
from agent_mail.server import grants, openapi
from agent_mail.server.edge import CUT_KEY, admitted
from agent_mail.server.shape import Shape
from agent_mail.operations import tokens

# A tool call carries no attachments (files stay on the client's machine): a body at its longest, escaped.
MAX_REQUEST_BYTES = model.BODY_MAX_CHARS * 6 + 1_000_000
# The reservation tools work on a repository of the caller's machine, which only the command line can locate there
# (it sends the server the repository's key): a model calling over HTTP could only guess it.
ON_THE_CALLERS_REPOSITORY = ("reserve", "release", "reservations")
TOOLS = tuple(name for name in mcp_tools.TOOLS if name in openapi.SERVED and name not in ON_THE_CALLERS_REPOSITORY)
# What a tool call over HTTP cannot pass: the arguments naming a file on the server's machine.
LOCAL = {name: tuple(openapi.LOCAL_TO_CLIENT.get(name, ())) for name in TOOLS}
_LOCAL_WHY = ("names a file on the server's machine, which an MCP call over HTTP cannot use; run the command "
              "line (agent-mail {name}, with AGENT_MAIL_DB naming this server) for files on your machine.")
DEFAULT_NOTE = "Default: the identity your token names, when it names exactly one."
_STATE = "agent_mail"  # the key of the request's state in its ASGI scope


def default_identity(grant: dict) -> str | None:
    """The identity a call acts as when it names none: the token's, if it names exactly one."""
    agents = grant["agents"]
    if len(agents) == 1 and agents[0] != "*" and not agents[0].endswith(":*"):
        return agents[0]
    return None


def _flags(name: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    by_key = checks.by_key(spec.COMMANDS[name])
    return tuple(by_key[key].name for key in keys if key in by_key)


class _Tools(MCPServer):
    """The tools, each call run for the token of the HTTP request that carried it."""

    def __init__(self, endpoint: Endpoint):
        super().__init__(name="agent-mail", version=__version__, instructions=mcp_tools.INSTRUCTIONS)
        self.endpoint = endpoint
        self._tools = mcp_tools.tool_definitions(None, names=TOOLS, default_note=DEFAULT_NOTE,
                                                 leave_out={name: _flags(name, keys) for name, keys in LOCAL.items()})

    async def list_tools(self) -> list[Tool]:
        return self._tools

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> CallToolResult:
        try:
            state = context.request_context.request.scope[_STATE]
        except (AttributeError, ValueError, KeyError, TypeError):  # not a request this endpoint let through
            return mcp_tools.error(errors.Forbidden("no token: send Authorization: Bearer TOKEN.").payload())
        state["info"]["command"] = name
        if name not in TOOLS:
            return mcp_tools.error(errors.InvalidInput([(None, f"unknown tool {name!r}; the tools over HTTP: "
                                                               f"{', '.join(TOOLS)}.")]).payload())
        return await mcp_tools.answer(
            name, lambda cancelled: self.endpoint.prepare(name, dict(arguments or {}), state, cancelled),
            default_identity(state["grant"]), limiter=self.endpoint.limiter)


class Endpoint:
    """The ASGI application at /mcp and the lifespan that runs the SDK's session manager."""

    def __init__(self, location: str, stopping: threading.Event, log, threads: int, waits=None):
        self.location, self.stopping, self.log, self.threads = location, stopping, log, threads
        self.waits = waits  # waits(): the server's ServedWaits (made on the event loop), or None: blocks in threads
        _log_as_json(log)  # before the SDK's server, which would otherwise set up its own (rich) log lines
        self.tools = _Tools(self)
        # The bearer token authenticates every request; a page in a browser (DNS rebinding) has none, so the
        # Host/Origin checks would only refuse the names a proxy in front of the server gives it.
        self.tools.streamable_http_app(stateless_http=True, max_request_body_size=MAX_REQUEST_BYTES,
                                       transport_security=TransportSecuritySettings(
                                           enable_dns_rebinding_protection=False))
        self.manager = self.tools.session_manager
        self.limiter: anyio.CapacityLimiter | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.limiter = anyio.CapacityLimiter(self.threads)  # calls carried out at once (a blocked watch holds one)
        async with self.manager.run():
            yield

    # ---- one HTTP request

    async def __call__(self, scope, receive, send) -> None:
        started = time.monotonic()
        info: dict = {"token_id": None, "as": None, "command": None, "exit": None, "status": None}
        method = scope.get("method", "")

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                info["status"] = message["status"]
            await send(message)

        served = self.waits() if self.waits is not None else None
        try:
            try:
                admission = admitted(scope)  # the server's Gate looked the token up, before any of the body came
                grant, since, info["token_id"] = admission.grant, admission.since, admission.grant["id"]
                body = await _body(scope, receive)
            except errors.AgentMailError as exc:
                await _refusal(exc, sending)
                info["exit"] = exc.exit_code
                if isinstance(exc, errors.StorageError):
                    info["error"] = exc.message  # where the database is, for the log only
                return
            if method != "POST":  # stateless: no stream for the server to speak first on, no session to end
                await _send_json(sending, 405, {"error": f"{method} {http_api.MCP_PATH}: this server keeps no MCP "
                                                         "session and opens no stream of its own; send each message "
                                                         "with POST.",
                                                "problems": []}, errors.EXIT_INVALID, [(b"allow", b"POST")])
                info["exit"] = errors.EXIT_INVALID
                return
            info["command"] = _rpc_method(body)
            gone, hung_up = threading.Event(), anyio.Event()
            state = {"grant": grant, "gone": gone, "info": info, "waits": served, "since": since, "hung_up": hung_up}
            replayed = []

            async def replay():
                if not replayed:
                    replayed.append(True)
                    return {"type": "http.request", "body": body, "more_body": False}
                message = await receive()  # blocks until the client hangs up: http.disconnect
                if message["type"] == "http.disconnect":
                    gone.set()
                    hung_up.set()  # a watch awaited on the server's waits ends at once
                return message

            try:
                await self.manager.handle_request({**scope, _STATE: state}, replay, sending)
            finally:
                gone.set()  # a watch still blocked for this request ends at its next look
                hung_up.set()
        except Exception as exc:  # a bug: still JSON, never a traceback
            # The log line names the error (as /v1's 5xx lines do; never a token: the grant holds its id only).
            info["error"] = f"internal error ({type(exc).__name__}: {exc})"[:2000]
            if info["status"] is None:
                await _send_json(sending, 500, {"error": f"internal error ({type(exc).__name__}). Nothing was "
                                                         "changed. Please report this.", "problems": []},
                                 errors.EXIT_FAILED)
        finally:
            cut = scope.get(CUT_KEY)  # the protocol answered 408 at the request's deadline: this is its only line
            self.log(method=method, path=http_api.MCP_PATH, command=info["command"], token_id=info["token_id"],
                     **{"as": info["as"]}, status=408 if cut else info["status"],
                     exit=errors.EXIT_INVALID if cut else info["exit"],
                     ms=round((time.monotonic() - started) * 1000, 1),
                     **({"refused": cut} if cut else {"error": info["error"]} if "error" in info else {}))

    # ---- one tool call

    def prepare(self, name: str, arguments: dict, state: dict, cancelled: threading.Event):
        """Check the call (as the call layer and this endpoint's rules say); the work that carries it out. Its
        exit code (what the command would exit with) goes to the log line."""
        try:
            work = self._checked(name, arguments, state, cancelled)
        except errors.AgentMailError as exc:
            state["info"]["exit"] = exc.exit_code
            raise _told(exc, state) from None

        def logged():
            try:
                return work()
            except errors.AgentMailError as exc:
                state["info"]["exit"] = exc.exit_code
                raise _told(exc, state) from None
            except Exception as exc:  # a bug: its text (a driver's may name the database's host) to the log only
                state["info"]["exit"] = errors.EXIT_FAILED
                state["info"]["error"] = f"internal error ({type(exc).__name__}: {exc})"[:2000]
                raise errors.AgentMailError(f"internal error ({type(exc).__name__}). Nothing was changed. Please "
                                            "report this (the server's log has its text).") from None
        return logged

    def _checked(self, name: str, arguments: dict, state: dict, cancelled: threading.Event):
        grant, info = state["grant"], state["info"]
        command = spec.COMMANDS[name]
        problems: list[tuple[str | None, str]] = [
            (key, _LOCAL_WHY.format(name=name)) for key in LOCAL[name] if arguments.get(key) not in (None, False, [])]
        identity, missing = mcp_tools.identity_arg(command), None
        if identity is not None and arguments.get(checks.key(identity)) is None:
            agent = default_identity(grant)
            if agent is not None:
                arguments[checks.key(identity)] = agent
            elif identity.required:
                missing = checks.key(identity)
        wait = mcp_tools.take_wait(arguments, problems) if name == "watch" else None
        skip = mcp_tools.not_tool_args(name) + LOCAL[name]
        try:
            values = calls.check(name, {k: v for k, v in arguments.items() if k not in LOCAL[name]}, skip=skip,
                                 also=problems, with_inputs=False)
        except errors.InvalidInput as exc:
            if missing is None:
                raise
            raise errors.InvalidInput([p for p in exc.pairs() if p[0] != missing] + [
                (missing, f"is required: the identity this call acts as. {grants.scope(grant)}, which is no single "
                          "identity to act as by default.")]) from None
        if name == "send":
            values["uploaded"] = {"refs": [], "attachments": []}
        if name == "watch":
            mcp_tools.set_wait(values, wait, None)
        return lambda: self._carry_out(name, values, grant, info, state, cancelled)

    def _carry_out(self, name: str, values: dict, grant: dict, info: dict, state: dict,
                   cancelled: threading.Event) -> object:
        from agent_mail.operations import mail
        from agent_mail.store import open_store

        if self.stopping.is_set():
            said = "the server is stopping; nothing was done. Call again in a moment."
            raise errors.StorageError(said, told=said)
        gone = state["gone"]
        store = open_store(self.location)  # the token was authenticated by this same request, moments ago
        try:
            info["as"] = grants.check(grant, name, values)
            mailbox = mail.Mailbox(store, host="")  # an MCP client names no machine: its activity has none
            mailbox.publish_due()
            if name == "watch" and not values.get("once") and state["waits"] is not None:
                return mcp_tools.OnTheLoop(lambda: self._served_watch(values, grant, info, state))
            if name == "watch" and not values.get("once"):  # a blocked watch: asked at each refresh and wake-up

                def wanted() -> bool:
                    if self.stopping.is_set():
                        said = "the server is stopping; this wait ended with nothing found. Call watch again in a " \
                               "moment."
                        raise errors.StorageError(said, told=said)
                    tokens.still_valid(store, grant)
                    return not (gone.is_set() or cancelled.is_set())
                values["wanted"] = wanted
            result = calls.run(name, values, mailbox=mailbox)
            info["exit"] = errors.EXIT_PARTIAL if name == "send" and result.get("refused") else errors.EXIT_OK
            return result
        finally:
            store.close()


    async def _served_watch(self, values: dict, grant: dict, info: dict, state: dict) -> dict:
        """A blocked watch on the server's waits (agent_mail.server.waits.ServedWaits.wait): its result, HungUp when
        its client hung up (nobody to answer), Stopping when the server stops."""
        from agent_mail.parts.waits import HungUp

        result = await state["waits"].wait(values["agent"], values["timeout_seconds"], grant, state["since"],
                                           state["hung_up"])
        if result is None:
            raise HungUp()
        info["exit"] = errors.EXIT_OK
        return result


class _JsonLines(logging.Handler):
    """The libraries' warnings and errors as the server's own JSON log lines (the SDK's are about requests,
    never their headers)."""

    def __init__(self, log):
        super().__init__(logging.WARNING)
        self.write = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write(level=record.levelname.lower(), logger=record.name, message=record.getMessage()[:2000])
        except Exception:  # a log line must never break a request
            pass


def _log_as_json(log) -> None:
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(_JsonLines(log))


async def _body(scope, receive) -> bytes:
    for key, value in scope.get("headers", ()):
        if key == b"content-length" and (not value.isdigit() or int(value) > MAX_REQUEST_BYTES):
            raise errors.InvalidInput([(None, f"the request is larger than {MAX_REQUEST_BYTES} bytes, the most an "
                                              "MCP call carries.")])
    if scope.get("method") != "POST":
        return b""
    shape, chunks, size = Shape(), [], 0  # a message that holds more values than any call is refused as it comes
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise errors.InvalidInput([(None, "the client hung up before its request was whole.")])
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise errors.InvalidInput([(None, f"the request is larger than {MAX_REQUEST_BYTES} bytes.")])
        shape.feed(chunk)
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


def _rpc_method(body: bytes) -> str | None:
    """The JSON-RPC method a request carries (for the log line), if it is readable."""
    try:
        message = json.loads(body) if body else None
    except (ValueError, RecursionError):
        return None
    return message.get("method") if isinstance(message, dict) and isinstance(message.get("method"), str) else None


def _told(exc: errors.AgentMailError, state: dict) -> errors.AgentMailError:
    """A tool call's error as its caller sees it: a storage failure without where the database is (but to an
    operator's token), the whole text in the request's log line."""
    if not isinstance(exc, errors.StorageError) or "*" in state["grant"]["agents"]:
        return exc
    state["info"]["error"] = exc.message
    return exc.for_callers()


async def _refusal(exc: errors.AgentMailError, send) -> None:
    if isinstance(exc, errors.Forbidden):
        status = 401 if exc.unauthenticated else 403
    elif exc.exit_code == errors.EXIT_INVALID:
        status = 413 if "larger" in exc.message else 400
    else:
        status = 503 if isinstance(exc, errors.StorageError) else 500
    extra = [(b"www-authenticate", b'Bearer realm="agent-mail"')] if status == 401 else []
    told = exc.for_callers() if isinstance(exc, errors.StorageError) else exc  # before any grant: never the database
    await _send_json(send, status, told.payload(), exc.exit_code, extra)


async def _send_json(send, status: int, payload: dict, code: int, extra: list | None = None) -> None:
    data = jsonout.dumps(payload, end="\n").encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", http_api.JSON.encode()), (b"content-length", str(len(data)).encode()),
                            (http_api.EXIT_HEADER.lower().encode(), str(code).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": data})
