"""One JSON call to an agent-mail server over HTTP (standard library only: http.client, ssl), for the front ends
other than the command line's client that reach a served mailbox: the dashboard started with AGENT_MAIL_DB naming
a server. The answer keeps the server's exit code (X-Agent-Mail-Exit); a refusal is raised as the command would
have refused (Refused, with the server's problems), a server out of reach as Unreachable (a StorageError: the
dashboard shows it and tries again).
"""

from __future__ import annotations

import json
import os

from agent_mail import errors

EXIT_HEADER = "X-Agent-Mail-Exit"
CA_VAR = "AGENT_MAIL_CA"


class Unreachable(errors.StorageError):
    """The server could not be reached, or its answer was lost or is not an agent-mail answer."""


class Refused(errors.AgentMailError):
    """The server's refusal: its payload ({error, problems}) and the exit code the command would have."""

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


def post(url: str, token: str, path: str, document: dict, timeout: float) -> dict:
    """POST `document` as JSON to `path` on the server at `url`; its answer when the exit code is 0 (or 3, a send
    with refused recipients, whose receipt says so), else Refused; Unreachable when no answer came."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme == "https":
        import ssl

        context = ssl.create_default_context(cafile=os.environ.get(CA_VAR) or None)
        connection = http.client.HTTPSConnection(parts.hostname, parts.port, context=context, timeout=timeout)
    else:
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    sent = False
    try:
        connection.request("POST", parts.path.rstrip("/") + path, body=json.dumps(document).encode("utf-8"),
                           headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        sent = True
        response = connection.getresponse()
        code, data = response.getheader(EXIT_HEADER), response.read()
    except (OSError, http.client.HTTPException) as exc:
        after = " The call was sent but its answer was lost: look before repeating it." if sent else ""
        raise Unreachable(f"cannot reach the agent-mail server at {url} ({exc or type(exc).__name__}).{after}") \
            from None
    finally:
        connection.close()
    try:
        answer, code = json.loads(data), int(code)
    except (TypeError, ValueError):
        raise Unreachable(f"the server at {url} answered HTTP {response.status} with something that is not an "
                          "agent-mail answer.") from None
    if code not in (errors.EXIT_OK, errors.EXIT_PARTIAL) or not isinstance(answer, dict):
        raise Refused(answer if isinstance(answer, dict) else {"error": str(answer)}, code)
    return answer
