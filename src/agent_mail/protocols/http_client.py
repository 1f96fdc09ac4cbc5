"""A client's calls to an agent-mail server (standard library only): the token it presents, one call and its
answer (plain calls through agent_mail.protocols.wire; a streamed body or answer through http.client), and the errors a
front end shows (Refused: the server's refusal; Unreachable: no answer). Used by the front ends that reach a served
mailbox: the command line's client (agent_mail.client) for every command it carries to a server, and the
dashboard (agent_mail.dashboard.served), by the API's names (agent_mail.protocols.http_api).
"""

from __future__ import annotations

import os

from agent_mail import __version__, errors, jsonout, model
from agent_mail.protocols import http_api, wire

TOKEN_VAR, TOKEN_FILE_VAR = "AGENT_MAIL_TOKEN", "AGENT_MAIL_TOKEN_FILE"
CALL_TIMEOUT_SECONDS = 300.0
# A server that does not accept the connection within this is unreachable (a partitioned network drops the
# packets: without it a connect would wait for the system's two minutes of retries).
CONNECT_SECONDS = 10.0


class Refused(errors.AgentMailError):
    """The server's refusal, as the command would have refused: its payload ({error, problems}, named as the call
    asked: the command line's flags, or the API's names) and the exit code the command would have."""

    def __init__(self, payload: dict, exit_code: int):
        super().__init__(str(payload.get("error", "the server refused the call.")))
        self._payload = payload
        self.exit_code = exit_code

    def renamed(self, namer) -> Refused:
        return self

    def problems(self) -> list[dict]:
        problems = self._payload.get("problems")
        return list(problems) if isinstance(problems, list) and problems else [{"field": None,
                                                                                "message": self.message}]

    def payload(self) -> dict:
        return dict(self._payload)


class Unreachable(errors.StorageError):
    """The server could not be reached, or stopped answering (`sent`: after the whole call had been sent), or
    something else answered (`answered`: its HTTP status). A StorageError: the mailbox is out of reach (the
    dashboard shows it and tries again)."""

    sent = False
    answered: int | None = None
    lasting = False  # asking again cannot help (the server's certificate is not trusted here)

    def passing(self) -> bool:
        """Whether asking again may find the server: no answer came, or a proxy's "no server behind me"."""
        return not self.lasting and self.answered in (None, 502, 503, 504)


def _headers(token: str, content_type: str = http_api.JSON) -> dict:
    """What every request says: its body's type, the token, this client's version and its machine's name."""
    headers = {"Content-Type": content_type, "Authorization": f"Bearer {token}", http_api.VERSION_HEADER: __version__}
    host = model.machine_name()
    if host is not None:
        headers[http_api.HOST_HEADER] = host
    return headers


def _refuse(field: str, why: str) -> errors.InvalidInput:
    return errors.InvalidInput([(field, why + ".")])


def read_token() -> str:
    """The token: AGENT_MAIL_TOKEN, or the first line of the file AGENT_MAIL_TOKEN_FILE names (which only its
    owner may read)."""
    token = os.environ.get(TOKEN_VAR, "").strip()
    if token:
        return token
    path = os.environ.get(TOKEN_FILE_VAR, "").strip()
    if not path:
        raise errors.Forbidden(f"AGENT_MAIL_DB names an agent-mail server, and no token is set: export {TOKEN_VAR}, "
                               f"or {TOKEN_FILE_VAR} naming a 0600 file that holds it (the mailbox's operator makes "
                               "one with agent-mail token create).", unauthenticated=True)
    try:
        with open(os.path.expanduser(path), "rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            if mode & 0o077:
                raise _refuse(TOKEN_FILE_VAR, f"names {path}, which others can read (mode {mode & 0o777:o}): anyone "
                                              f"who reads it can act as you. chmod 600 {path}")
            text = handle.read(4096).decode("utf-8", "replace")
    except OSError as exc:
        raise _refuse(TOKEN_FILE_VAR, f"names {path}, which cannot be read ({exc.strerror or exc})") from None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not token:
        raise _refuse(TOKEN_FILE_VAR, f"names {path}, which holds no token")
    return token


def _connection(url: str, timeout: float | None):
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "https":
        import ssl

        context = ssl.create_default_context(cafile=os.environ.get(wire.CA_VAR) or None)
        return _probed(http.client.HTTPSConnection(parts.hostname, parts.port, context=context,
                                                   timeout=CONNECT_SECONDS), timeout), parts.path
    return _probed(http.client.HTTPConnection(parts.hostname, parts.port, timeout=CONNECT_SECONDS), timeout), \
        parts.path


def _probed(connection, timeout: float | None):
    """`connection`, connecting within CONNECT_SECONDS, then waiting up to `timeout` (None: as long as it takes)
    for each answer, its socket probed when quiet (wire.keep_probing) so a dead link is an error, not a hang."""
    connect = connection.connect

    def connected() -> None:
        connect()
        raw = connection.sock
        wire.keep_probing(raw)
        raw.settimeout(timeout)
    connection.connect = connected
    return connection


def request(url: str, token: str, name: str, given: dict, timeout: float | None = CALL_TIMEOUT_SECONDS, *,
            path: str = "", body=None, content_type: str = http_api.JSON, into=None, header: str = "",
            names: str = "flags", connect_timeout: float = CONNECT_SECONDS):
    """POST the call; (status, exit code, document). Unreachable when no answer came. `path`, `body`: another
    endpoint than the call's own (http_api.call_path), and a body other than `given` as JSON (bytes, a file, an
    iterable of chunks); `into(response)`: takes a successful answer's body itself (then the document is None).
    `header`: a plain call's answer header to return too, fourth (None when absent). `names`: how problems name
    arguments ("flags": as the command line does; "": as the API does). `connect_timeout`: of a plain call."""
    if body is None and into is None:
        return _call(url, token, name, given, timeout, path, header, names, connect_timeout)
    import http.client

    connection, base = _connection(url, timeout)
    headers = {**_headers(token, content_type), http_api.NAMES_HEADER: "flags"}
    chunked = body is not None and not isinstance(body, bytes) and not hasattr(body, "fileno")
    if body is None:
        body = jsonout.dumps(given).encode("utf-8")
    elif hasattr(body, "fileno"):
        headers["Content-Length"] = str(os.fstat(body.fileno()).st_size)
    sent = False
    try:
        connection.request("POST", base.rstrip("/") + (path or http_api.call_path(name)), body=body, headers=headers,
                           encode_chunked=chunked)
        sent = True
        response = connection.getresponse()
        code = response.getheader(http_api.EXIT_HEADER)
        if into is not None and response.status == 200:
            into(response)
            return response.status, int(code), None
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        after = (" The call was sent but its answer was lost: it may have been carried out; look (read --all, "
                 "status) before repeating it.") if sent else " Nothing was sent."
        lost = Unreachable(f"cannot reach the agent-mail server at {url} ({exc or type(exc).__name__}).{after}")
        lost.sent, lost.lasting = sent, wire.lasting(exc)
        raise lost from None
    finally:
        connection.close()
    return _answered(url, response.status, code, data)


def _call(url: str, token: str, name: str, given: dict, timeout: float | None, path: str, header: str = "",
          names: str = "flags", connect_timeout: float = CONNECT_SECONDS):
    """One plain call (a JSON object, its JSON answer) through agent_mail.protocols.wire: what every command but
    export and import makes, without http.client's import."""
    headers = _headers(token)
    if names:
        headers[http_api.NAMES_HEADER] = names
    try:
        reply = wire.post(url, path or http_api.call_path(name), jsonout.dumps(given).encode("utf-8"), headers,
                          timeout, connect_timeout=connect_timeout, keepalive=True)
    except wire.Lost as exc:
        after = (" The call was sent but its answer was lost: it may have been carried out; look (read --all, "
                 "status) before repeating it.") if exc.sent else " Nothing was sent."
        lost = Unreachable(f"cannot reach the agent-mail server at {url} ({exc.reason}).{after}")
        lost.sent, lost.lasting = exc.sent, exc.lasting
        raise lost from None
    except ValueError as exc:  # not an http(s) URL: location.server_url() said it was one
        raise _refuse("AGENT_MAIL_DB", f"is not a usable server URL ({exc})") from None
    answered = _answered(url, reply.status, reply.header(http_api.EXIT_HEADER), reply.body)
    return (*answered, reply.header(header)) if header else answered


def _answered(url: str, status: int, code, data: bytes):
    """(status, exit code, document) of an answer; Unreachable when it is no agent-mail answer."""
    try:
        document = jsonout.loads(data.decode("utf-8"))
        code = int(code)
    except (TypeError, ValueError):
        # A proxy's own page for a server that went away behind it may follow a call the server carried out.
        gateway = (" A proxy answers so when the server behind it went away: the call may have been carried out; "
                   "look (read --all, status) before repeating it.") if status in (502, 503, 504) else ""
        other = Unreachable(f"the server at {url} answered HTTP {status} with something that is not an "
                            "agent-mail answer (is AGENT_MAIL_DB the agent-mail server, not a proxy's page?)."
                            f"{gateway}")
        other.sent, other.answered = True, status
        raise other from None
    return status, code, document


def accepted(code: int, document) -> dict:
    """A call's answer `document` when its exit code is 0, or 3 (a send with refused recipients, a reserve with
    conflicts: the result says so); else the server's refusal, raised as Refused."""
    if code not in (errors.EXIT_OK, errors.EXIT_PARTIAL) or not isinstance(document, dict):
        raise Refused(document if isinstance(document, dict) else {"error": str(document)}, code)
    return document


def post(url: str, token: str, path: str, document: dict, timeout: float) -> dict:
    """POST `document` as JSON to `path` on the server at `url`, its problems named as the API names arguments (for
    a front end other than the command line's, such as the dashboard); its answer (accepted), else Refused;
    Unreachable when no answer came."""
    _, code, answer = request(url, token, "", document, timeout, path=path, names="")
    return accepted(code, answer)
