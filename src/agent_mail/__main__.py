"""`python -m agent_mail` is the same program as `agent-mail`."""

if __name__ == "__main__":
    import gc

    gc.disable()  # as scripts/agent-mail does: off while a brief command runs, back on for the others

    from agent_mail.cli.main import run

    run()
