"""A read that marks, through a server: delivered, then confirmed (operations.deliveries says why and how). Loaded
by the command line's client for that read only. Standard library only.
"""

from __future__ import annotations

import time

from agent_mail import errors
from agent_mail.protocols import http_api
from agent_mail.protocols.http_client import Unreachable, accepted, request


def read(url: str, token: str, given: dict, emit, retried=lambda ask: ask()) -> int:
    """A read that marks, in two steps (operations.deliveries): the server holds the marks and names the delivery;
    the result is printed here; then the delivery is confirmed and the mail marked read, so a read killed or unable
    to print in between marks nothing, as on the mailbox's machine (its mail is delivered again: at once when it
    could say so, after the hold otherwise). `retried(ask)`: the first answer of `ask()`, asked again while no
    server answers (safe: a delivery whose answer was lost is never confirmed, so it marks nothing)."""
    status, code, document, delivery = retried(lambda: request(url, token, "read", {**given, "deliver": "confirm"},
                                                               header=http_api.DELIVERY_HEADER))
    accepted(code, document)
    try:
        emit(document)
    except errors.OutputError:
        if delivery is not None:
            _settled(url, token, delivery, False, patience=2.0)
        raise
    if delivery is not None and not _settled(url, token, delivery, True, patience=10.0):
        raise errors.StorageError(f"the server at {url} could not be told that the result was printed: its "
                                  "messages were not marked read, and are delivered again within a minute.")
    return code


def _settled(url: str, token: str, delivery: str, printed: bool, patience: float) -> bool:
    """Confirm (or cancel) `delivery`, asking again while no server answers, for up to `patience` seconds (settling
    twice settles once); whether it was settled."""
    deadline = time.monotonic() + patience
    while True:
        try:
            _, code, _ = request(url, token, "delivered", {"delivery": delivery, "printed": printed},
                                 path=http_api.DELIVERED_PATH)
            return code == errors.EXIT_OK
        except Unreachable as exc:
            if not exc.passing() or time.monotonic() >= deadline:
                return False
            time.sleep(0.25)
