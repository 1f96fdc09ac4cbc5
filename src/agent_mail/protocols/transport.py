"""One JSON call to an agent-mail server (the command line client's call, standard library only), for the front ends
other than the command line's client that reach a served mailbox: the dashboard started with AGENT_MAIL_DB naming
a server. The answer keeps the server's exit code (X-Agent-Mail-Exit); a refusal is raised as the command would
have refused (Refused, with the server's problems), a server out of reach as Unreachable (a StorageError: the
dashboard shows it and tries again).
"""

from __future__ import annotations

from agent_mail import errors


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
    with refused recipients, whose receipt says so), else Refused; Unreachable when no answer came. The call is
    the command line client's (agent_mail.protocols.http_client: its wire, connect limit and keepalive probes), its
    problems named as the API names arguments."""
    from agent_mail.protocols import http_client

    try:
        _, code, answer = http_client.request(url, token, "", document, timeout, path=path, names="")
    except http_client.Unreachable as exc:
        raise Unreachable(exc.message) from None
    if code not in (errors.EXIT_OK, errors.EXIT_PARTIAL) or not isinstance(answer, dict):
        raise Refused(answer if isinstance(answer, dict) else {"error": str(answer)}, code)
    return answer
