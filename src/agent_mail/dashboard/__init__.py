"""`agent-mail dashboard`: the supervisor's live view (Textual, the `tui` extra).

Everything that can fail before a screen is drawn fails here, as the CLI's JSON error: the extra
missing, a bad --as identity, a mailbox that cannot be opened. Only then is Textual imported and the
application started (or, with --web, served to a browser on 127.0.0.1 by textual-serve).
"""

from __future__ import annotations

import os
import shlex
import sys

from agent_mail import errors

DEFAULT_PORT = 8000


def _require_extra(web: bool) -> None:
    try:
        import textual  # noqa: F401
        import textual_plotext  # noqa: F401

        if web:
            import textual_serve  # noqa: F401
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
    run(human=values["as"], project=values["project"], overdue_minutes=values["overdue_minutes"], web=values["web"],
        port=values["port"], served=served)
    return errors.EXIT_OK


def run(*, human: str | None = None, project: str | None = None, overdue_minutes: float | None = None,
        web: bool = False, port: int | None = None, served: tuple[str, str] | None = None) -> None:
    """`served`: (URL, token) when AGENT_MAIL_DB names an agent-mail server (the command line starts the dashboard so);
    it then reads and acts through that server (agent_mail.dashboard.served)."""
    from agent_mail import calls

    calls.check("dashboard", {"as": human, "project": project, "overdue_minutes": overdue_minutes, "web": web,
                              "port": port}, with_inputs=False)
    _require_extra(web)
    overdue = overdue_minutes if overdue_minutes is not None else 30
    first = first_look(human, overdue, served)
    if web:
        serve(human=human, project=project, overdue_minutes=overdue_minutes, port=port or DEFAULT_PORT,
              served=served is not None)
        return
    show(human=human, project=project, first=first, overdue_minutes=overdue, served=served)


def show(*, human: str | None, project: str | None, first: dict, overdue_minutes: float,
         served: tuple[str, str] | None = None) -> None:
    """Run the application in this terminal until the user quits."""
    # Under textual-serve the application talks to the browser through its web driver, not a terminal.
    if not os.environ.get("TEXTUAL_DRIVER") and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise errors.AgentMailError("agent-mail dashboard draws in a terminal, and its input or output is not one "
                                    "(a pipe or a file). Run it in a terminal, or serve it to a browser with --web.")
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


def serve(*, human: str | None, project: str | None, overdue_minutes: float | None, port: int,
          served: bool = False) -> None:
    """Serve the dashboard on 127.0.0.1:`port`: textual-serve runs `agent-mail dashboard` (this same mailbox,
    these same options) for each browser tab that connects (`served`: the mailbox is an agent-mail server, which
    each tab's dashboard reaches with this environment's AGENT_MAIL_DB and token)."""
    import socket

    from textual_serve.server import Server

    with socket.socket() as probe:  # a clear error now, not a traceback from the server later
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise errors.InvalidInput([("port", f"127.0.0.1:{port} cannot be used ({exc.strerror}); pick another "
                                                  "port with --port N.")]) from None
    from agent_mail.operations import mail

    words = [sys.executable, "-m", "agent_mail", "dashboard"]
    for flag, value in (("--as", human), ("--project", project), ("--overdue-minutes", overdue_minutes)):
        if value is not None:
            words += [flag, str(value)]
    # The tab's dashboard opens the mailbox this command resolved, whatever the server's environment becomes.
    if not served:
        os.environ["AGENT_MAIL_DB"] = mail.resolve_location()[0]
    server = Server(shlex.join(words), host="127.0.0.1", port=port, title="agent-mail dashboard")
    print(f"agent-mail dashboard: serving on http://127.0.0.1:{port} (ctrl+c to stop)", file=sys.stderr)
    server.serve()
