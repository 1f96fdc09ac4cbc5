"""A front end: the command line's calls carried to an agent-mail server (standard library only)."""
