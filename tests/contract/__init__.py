"""What the commands promise (the contract), on both backends, mostly in this process: the store contract, the
command-line contract, messaging, delivery, search, history, reservations, reliability, storage, hostile input.
.ci/run runs these again through a server (AGENT_MAIL_TEST_THROUGH=server)."""
