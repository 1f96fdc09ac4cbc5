"""The test suite: unit/, contract/, functional/ and harnesses/ hold the tests, lib/ their helpers, conftest.py the
fixtures and pytest hooks (docs/testing.md)."""
