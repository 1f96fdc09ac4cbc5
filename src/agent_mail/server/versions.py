"""Mixed versions through `agent-mail serve`: every answer names the server's version (http_api.VERSION_HEADER),
and a request whose client names a version this server cannot serve (http_api.version_problem: another major
version, or before 1.0 another minor one) is refused before anything else is done, with 400 and an error naming
both versions (exit 2, as the command line would: fix the installation and run it again). A request naming no
version (curl, an MCP client, a client older than the check) is served.
"""

from __future__ import annotations

import json

from agent_mail import __version__, errors
from agent_mail.protocols import http_api
from agent_mail.server.edge import log

_HEADER = http_api.VERSION_HEADER.lower().encode("ascii")


class Versioned:
    """ASGI middleware: the version check, and the server's version on every answer."""

    def __init__(self, app, version: str = __version__):
        self.app, self.version = app, version
        self.answered = (_HEADER, version.encode("ascii"))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        named = next((value for key, value in scope.get("headers", ()) if key == _HEADER), None)
        problem = http_api.version_problem(named.decode("latin-1"), self.version) if named is not None else None
        if problem is not None:
            body = json.dumps({"error": problem, "problems": [{"field": http_api.VERSION_HEADER, "message": problem}],
                               "client_version": named.decode("latin-1"), "server_version": self.version}).encode()
            await send({"type": "http.response.start", "status": 400,
                        "headers": [(b"content-type", http_api.JSON.encode()), (b"content-length", str(len(body))
                                                                                 .encode()),
                                    (http_api.EXIT_HEADER.lower().encode(), str(errors.EXIT_INVALID).encode()),
                                    self.answered]})
            await send({"type": "http.response.body", "body": body})
            log(method=scope.get("method"), path=scope.get("path"), status=400, exit=errors.EXIT_INVALID,
                refused="version", client_version=named.decode("latin-1"))
            return None

        async def versioned(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.answered]}
            await send(message)
        return await self.app(scope, receive, versioned)
