"""The dashboard over a mailbox served by `agent-mail serve` (AGENT_MAIL_DB=http(s)://, with a token).

A `ServedSupervisor` answers what agent_mail.operations.supervision.Supervisor answers (the fleet, the feed, an inbox, a
thread, the charts), read by POST /v1/dashboard, which needs a supervisor's or an operator's token. The human's
actions (send, reply, cancel, ack, ...) are POST /v1/call/NAME with the same token, so they act only as the
identities it names; an attachment saved goes into a directory on this machine, staged as the command line
stages it. `wait_for_wake` stands in for the store's: a thread holds a long look that answers when a message is
stored (the mail marker moved), so the feed is drawn as mail lands, not on a timer.

Standard library only, like the rest of the dashboard's data (Textual is the app's).
"""

from __future__ import annotations

import threading

from agent_mail.protocols import http_api, http_client
from agent_mail import errors

#: How long one waiting look lasts before it is asked again.
WAIT_SECONDS = 30.0
READ_TIMEOUT = 60.0


class ServedSupervisor:
    """The supervisor's views and the human's actions through the server at `url`, with `token`."""

    def __init__(self, url: str, token: str):
        self.url, self.token = url, token
        self.marker: int | None = None  # the mail marker of the last answer
        self._woken = threading.Event()
        self._waiter: threading.Thread | None = None
        self.stopping = threading.Event()

    # -- reads -------------------------------------------------------------------------------------------------
    def read(self, views: dict) -> dict:
        """Several views in one request: {name: its values} -> {name: what was read}."""
        answer = http_client.post(self.url, self.token, http_api.DASHBOARD_PATH, {"views": views}, READ_TIMEOUT)
        self.marker = answer["marker"]
        return answer["views"]

    def fleet(self, overdue_minutes: float = 30) -> list[dict]:
        return self.read({"fleet": {"overdue_minutes": overdue_minutes}})["fleet"]

    def feed(self) -> list[dict]:
        return self.read({"feed": {}})["feed"]

    def inbox(self, agent: str) -> dict:
        return self.read({"inbox": {"agent": agent}})["inbox"]

    def thread(self, message_id: str) -> list[dict]:
        return self.read({"thread": {"id": message_id}})["thread"]

    def message(self, message_id: str) -> dict | None:
        return self.read({"message": {"id": message_id}})["message"]

    def hourly(self, by: str = "project") -> dict:
        return self.read({"hourly": {"by": by}})["hourly"]

    def backlog(self) -> dict:
        return self.read({"backlog": {}})["backlog"]

    def reservations(self) -> dict:
        return self.read({"reservations": {}})["reservations"]

    # -- the human's actions -------------------------------------------------------------------------------------
    def call(self, name: str, values: dict) -> object:
        """One of the human's actions, by argument name, carried out by the server with this token's grant."""
        given = {key: value for key, value in values.items() if value is not None}
        if name == "attachments" and given.get("save_to") is not None:
            return self._save(given)
        return http_client.post(self.url, self.token, http_api.call_path(name), given, READ_TIMEOUT)

    def _save(self, given: dict) -> dict:
        """Attachments saved into a directory on this machine: fetched, then staged and published as the command
        line does (nothing overwritten, nothing half written)."""
        import base64

        from agent_mail import files

        directory, overwrite = given.pop("save_to"), bool(given.pop("overwrite", False))
        document = http_client.post(self.url, self.token, http_api.call_path("attachments"),
                                    {**given, "with_content": True}, READ_TIMEOUT)
        contents = {sha: base64.b64decode(text) for sha, text in document.pop("contents", {}).items()}
        staged = files.stage_attachments(directory, document["attachments"], contents, overwrite)
        staged.publish()
        return {**document, "directory": staged.target, "saved": staged.saved}

    # -- waiting for mail ----------------------------------------------------------------------------------------
    def wait_for_wake(self, timeout: float) -> bool:
        """As Store.wait_for_wake: True when a message was stored since the last answer (a waiting look, held by a
        thread of its own, said so), False when `timeout` passed first."""
        if self._waiter is None or not self._waiter.is_alive():
            self._waiter = threading.Thread(target=self._wait, name="agent-mail dashboard waiter", daemon=True)
            self._waiter.start()
        if self._woken.wait(timeout):
            self._woken.clear()
            return True
        return False

    def _wait(self) -> None:
        while not self.stopping.is_set():
            after = self.marker
            if after is None:
                self.stopping.wait(0.5)  # no read has answered yet
                continue
            try:
                answer = http_client.post(self.url, self.token, http_api.DASHBOARD_PATH,
                                          {"after": after, "wait_seconds": WAIT_SECONDS}, WAIT_SECONDS + 30)
            except errors.AgentMailError:
                self.stopping.wait(1.0)  # the reads show what is wrong, and are retried
                continue
            if answer["marker"] != after:
                self.marker = answer["marker"]
                self._woken.set()

    def close(self) -> None:
        self.stopping.set()
