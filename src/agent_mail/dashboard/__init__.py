"""`agent-mail dashboard`: the supervisor's live view (Textual, the `tui` extra).

Everything that can fail before a screen is drawn fails here, as the CLI's JSON error: the extra
missing, a bad --as identity, a mailbox that cannot be opened. Only then is Textual imported and the
application started. (A browser has the web console of `agent-mail serve` at /ui/, behind a token's login: the
`--web` that served this app to a browser without one is gone.)
"""

from __future__ import annotations

import sys

from agent_mail import errors


def _require_extra() -> None:
    try:
        import textual  # noqa: F401
        import textual_plotext  # noqa: F401
    except ImportError as exc:
        raise errors.AgentMailError(
            f"agent-mail dashboard needs Textual, which is not installed ({exc}). Install the extra: "
            "pip install 'agent-mail[tui]'.") from None


def first_look(human: str | None, overdue_minutes: float, served: tuple[str, str] | None = None) -> dict:
    """Open the mailbox and read the first screenful (raising the CLI's errors), marking `human` as human.
    Through a server (`served`: its URL and the token), the token must name `human` to mark it, and be a
    supervisor's or an operator's to read the views: refused (exit 4) before anything is drawn."""
    from agent_mail.operations import mail
    from agent_mail.dashboard import data

    if served is not None:
        from agent_mail.dashboard.served import ServedSupervisor

        remote = ServedSupervisor(*served)
        if human is not None and not remote.call("profile", {"agent": human})["human"]:
            remote.call("profile", {"agent": human, "human": True})
        return remote.read({"fleet": {"overdue_minutes": overdue_minutes}, "feed": {}})

    with mail.open_mailbox() as mailbox:
        if human is not None:
            profile = mailbox.store.profile(human)
            if not (profile and profile.get("human")):
                mailbox.profile(agent=human, human=True)
        supervisor = data.Supervisor(mailbox)
        return {"fleet": supervisor.fleet(overdue_minutes), "feed": supervisor.feed()}


def main(values: dict, emit, served: tuple[str, str] | None = None) -> int:
    """`agent-mail dashboard [...]`, as the command line starts it (`served`: see run)."""
    run(human=values["as"], project=values["project"], overdue_minutes=values["overdue_minutes"], served=served)
    return errors.EXIT_OK


def run(*, human: str | None = None, project: str | None = None, overdue_minutes: float | None = None,
        served: tuple[str, str] | None = None) -> None:
    """`served`: (URL, token) when AGENT_MAIL_DB names an agent-mail server (the command line starts the dashboard so);
    it then reads and acts through that server (agent_mail.dashboard.served)."""
    from agent_mail import calls

    calls.check("dashboard", {"as": human, "project": project, "overdue_minutes": overdue_minutes},
                with_inputs=False)
    _require_extra()
    overdue = overdue_minutes if overdue_minutes is not None else 30
    first = first_look(human, overdue, served)
    show(human=human, project=project, first=first, overdue_minutes=overdue, served=served)


def show(*, human: str | None, project: str | None, first: dict, overdue_minutes: float,
         served: tuple[str, str] | None = None) -> None:
    """Run the application in this terminal until the user quits."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise errors.AgentMailError("agent-mail dashboard draws in a terminal, and its input or output is not one "
                                    "(a pipe or a file). Run it in a terminal; in a browser, use the web console "
                                    "of agent-mail serve at /ui/.")
    from agent_mail.dashboard.app import Dashboard

    app = Dashboard(human=human, project=project, first=first, served=served)
    app.overdue_minutes = overdue_minutes
    app.run()
    if app.stopped_by is not None:
        import signal

        name = signal.Signals(app.stopped_by).name
        raise errors.Interrupted(f"the dashboard was stopped by {name}; nothing was changed.", 128 + app.stopped_by)
    if app.return_code:
        raise errors.AgentMailError(f"the dashboard stopped with an error (exit {app.return_code}).")

