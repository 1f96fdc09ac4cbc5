"""The call layer every front end enters: a command's name and its values -> checked values -> the
operation -> data.

The command line (cli/main.py), the MCP server, the harness hooks and the dashboard each turn their own input
into values by argument name, hand them to `call` (or `check`, then `run`), and render what comes back
in their own way: the result's `next` steps are `spec.Step`s (data), a refusal is an InvalidInput whose
problems are keyed by argument name and renamed by the front end (`errors.AgentMailError.renamed`).
Front ends never import each other, and none checks a value of its own.
"""

from __future__ import annotations

from agent_mail.parts import checks

check = checks.check


def _no_emit(document: object) -> None:
    pass


def run(name: str, values: dict, *, emit=_no_emit, mailbox=None) -> object:
    """Carry out a checked call (values by the operation's keywords, as `check` returns them) and return
    its result. `emit` is called with the result inside the transaction (the CLI prints there, so a
    result that could not be written is never committed). `mailbox`: an open Mailbox to use (the
    dashboard's and a long-lived server's); otherwise the one this process resolves is opened."""
    from agent_mail.operations import location, mail

    if name == "doctor":
        return location.doctor(**values, emit=emit)
    if name == "copy":
        return location.copy_mailbox(**values, emit=emit)
    if mailbox is not None:
        return _operate(mailbox, name, values, emit)
    with mail.open_mailbox() as opened:
        return _operate(opened, name, values, emit)


def _operate(mailbox, name: str, values: dict, emit) -> object:
    if name in ("export", "import"):
        from agent_mail.operations import history

        if name == "import":
            result = history.import_file(mailbox.store, values["file"], values["dry_run"])
            emit(result)
            return result
        summary = history.export(mailbox.store, format=values["format"], output=values["output"],
                                 agent=values["agent"], since_days=values["since_days"])
        if summary is not None:  # to stdout, the export itself is the output
            emit(summary)
        return summary
    if name == "token":
        from agent_mail.operations import tokens

        return tokens.token_command(mailbox.store, **values, emit=emit)
    if name == "webhook":
        from agent_mail.operations import webhooks

        return webhooks.webhook_command(mailbox, **values, emit=emit)
    return getattr(mailbox, name)(**values, emit=emit)


def call(name: str, given: dict, *, skip: tuple[str, ...] = (), emit=_no_emit, mailbox=None) -> object:
    """`check` then `run`: the whole call for a front end that has its values by argument name."""
    return run(name, check(name, given, skip=skip), emit=emit, mailbox=mailbox)
