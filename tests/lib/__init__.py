"""The helpers the tests share (imported as `from tests.lib.cli import am_process`; fixtures and pytest hooks stay
in tests/conftest.py): cli (run the command line), waiting (until, armed, disarmed), tools (require a tool),
postgres, mailbox (the test's mailbox itself), fuzz, serving (a running server), harnesses, fake_model (the
scripted model), twohosts (network namespaces), browser (Chrome's DevTools), run_child (a scripted prompt)."""
