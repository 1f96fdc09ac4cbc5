"""A front end: `agent-mail serve`, the mailbox over HTTP (the `server` extra)."""
