"""`python -m agent_mail` is the same program as `agent-mail`."""

from agent_mail.cli.main import run

if __name__ == "__main__":
    run()
