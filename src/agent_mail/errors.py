"""The exceptions agent-mail raises; the CLI turns them into JSON in one place."""

from __future__ import annotations

# Exit codes, documented by `describe`.
EXIT_OK = 0
EXIT_FAILED = 1  # the call was well formed but could not be carried out here
EXIT_INVALID = 2  # the call itself was wrong: fix the arguments and retry
EXIT_PARTIAL = 3  # some recipients were refused; the receipt says which


class AgentMailError(Exception):
    """Base class: a failure that becomes {"error": ...} and a non-zero exit."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.field = field

    def problems(self) -> list[dict]:
        return [{"field": self.field, "message": self.message}]

    def payload(self) -> dict:
        text = f"{self.field}: {self.message}" if self.field else self.message
        return {"error": text, "problems": self.problems()}


class InvalidInput(AgentMailError):
    """One or more arguments are wrong; every problem of the call is listed."""

    exit_code = EXIT_INVALID

    def __init__(self, problems: list[tuple[str | None, str]]):
        self._problems = [{"field": f, "message": m} for f, m in problems]
        lines = [f"{f}: {m}" if f else m for f, m in problems]
        if len(lines) == 1:
            text = lines[0]
        else:
            text = f"{len(lines)} problems: " + " | ".join(lines)
        super().__init__(text)

    def problems(self) -> list[dict]:
        return self._problems

    def payload(self) -> dict:
        return {"error": self.message, "problems": self._problems}


class NotFound(InvalidInput):
    """A message or identity the call names does not exist (for this agent)."""


class Interrupted(AgentMailError):
    """A signal stopped a blocked command; the exit code is 128 + the signal number."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class StorageError(AgentMailError):
    """The mailbox file cannot be opened, read or written."""


class OutputError(AgentMailError):
    """The result could not be written to stdout; nothing was committed."""
