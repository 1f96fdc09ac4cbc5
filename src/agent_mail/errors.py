"""The exceptions agent-mail raises; the CLI turns them into JSON in one place."""

from __future__ import annotations

# Exit codes, documented by `describe`.
EXIT_OK = 0
EXIT_FAILED = 1  # the call was well formed but could not be carried out here
EXIT_INVALID = 2  # the call itself was wrong: fix the arguments and retry
EXIT_PARTIAL = 3  # some recipients were refused; the receipt says which
EXIT_FORBIDDEN = 4  # through a server: no valid token, or the token may not act as the identity the call names


def arg(name: str) -> str:
    """An argument named inside a problem's message, as data: each front end renders it in its own words
    (`--reply-to` on the command line, `reply_to` over MCP) through `AgentMailError.renamed`."""
    return f"\x00{name}\x00"


def render(text: str, namer) -> str:
    """`text` with each `arg(name)` in it written as `namer(name)`."""
    if "\x00" not in text:
        return text
    parts = text.split("\x00")
    parts[1::2] = [namer(part) for part in parts[1::2]]
    return "".join(parts)


def _plain(name: str) -> str:
    return name


class AgentMailError(Exception):
    """Base class: a failure that becomes {"error": ...} and a non-zero exit."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, field: str | None = None):
        self.raw_message = message
        message = render(message, _plain)
        super().__init__(message)
        self.message = message
        self.field = field

    def renamed(self, namer) -> AgentMailError:
        """This error with its field and the arguments its text names written by `namer` (name -> a front
        end's own word for it): the same problem as each front end says it."""
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.field = namer(self.field) if self.field else self.field
        copy.message = render(self.raw_message, namer)
        copy.args = (copy.message,)
        return copy

    def problems(self) -> list[dict]:
        return [{"field": self.field, "message": self.message}]

    def payload(self) -> dict:
        text = f"{self.field}: {self.message}" if self.field else self.message
        return {"error": text, "problems": self.problems()}


class InvalidInput(AgentMailError):
    """One or more arguments are wrong; every problem of the call is listed."""

    exit_code = EXIT_INVALID

    def __init__(self, problems: list[tuple[str | None, str]], namer=_plain):
        self.raw = list(problems)
        shown = [(namer(f) if f else f, render(m, namer)) for f, m in problems]
        self._problems = [{"field": f, "message": m} for f, m in shown]
        lines = [f"{f}: {m}" if f else m for f, m in shown]
        if len(lines) == 1:
            text = lines[0]
        else:
            text = f"{len(lines)} problems: " + " | ".join(lines)
        super().__init__(text)

    def renamed(self, namer) -> InvalidInput:
        copy = type(self).__new__(type(self))
        InvalidInput.__init__(copy, self.raw, namer)
        return copy

    def pairs(self) -> list[tuple[str | None, str]]:
        """The problems as (field, message) with arguments unrendered: to report with others."""
        return list(self.raw)

    def problems(self) -> list[dict]:
        return self._problems

    def payload(self) -> dict:
        return {"error": self.message, "problems": self._problems}


class NotFound(InvalidInput):
    """A message or identity the call names does not exist (for this agent)."""


class Forbidden(AgentMailError):
    """Through `agent-mail serve`: the token is missing, unknown or revoked, or it may not act as (or look at)
    the identity the call names. Nothing was read or changed. Never carries the token itself."""

    exit_code = EXIT_FORBIDDEN

    def __init__(self, message: str, field: str | None = None, *, unauthenticated: bool = False):
        super().__init__(message, field)
        self.unauthenticated = unauthenticated  # no valid token at all (HTTP 401), not a refusal of this call (403)


class Interrupted(AgentMailError):
    """A signal stopped a blocked command; the exit code is 128 + the signal number."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class StorageError(AgentMailError):
    """The mailbox file cannot be opened, read or written.

    Its message is for whoever runs the mailbox (it may name the file, or the database's host, port, user and
    name); `told` is what a server says to its callers instead (for_callers), which never names where the
    database is."""

    def __init__(self, message: str, field: str | None = None, *, told: str | None = None):
        super().__init__(message, field)
        self.told = told

    def for_callers(self) -> StorageError:
        """This error as a server's callers see it: `told`, or CANNOT_USE when the error has none."""
        copy = type(self).__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy.message = copy.raw_message = self.told or CANNOT_USE
        copy.args = (copy.message,)
        return copy


# What a server tells its callers of a database it cannot reach, or cannot use: the details go to its log.
CANNOT_REACH = ("the database cannot be reached; nothing was changed. Retry in a while; if it lasts, tell the "
                "server's operator (the server's log says why).")
CANNOT_USE = ("the server cannot use its database right now; nothing was changed. Retry in a while; if it lasts, "
              "tell the server's operator (the server's log says why).")


class OutputError(AgentMailError):
    """The result could not be written to stdout; nothing was committed."""
