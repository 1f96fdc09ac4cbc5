"""agent_mail.protocols.http_api's version rule: which client versions a server serves, and the pattern its
OpenAPI document gives the version header, which must say exactly the same."""

from __future__ import annotations

import re

import pytest

from agent_mail.protocols import http_api


@pytest.mark.fast
def test_a_client_version_on_the_pattern_is_served():
    """The version header's pattern in /openapi.json is exactly what the server serves (http_api.version_problem)."""
    pattern = re.compile(http_api.served_pattern("0.1.0"))
    for client in ("0.1.0", "0.1.7", "00.01.3", "0.1", "0.1.0rc1", "0.1.0.dev0", "0.1.0+local", "0.1.0-rc.1",
                   "0.2.0", "1.0.0", "0.11.0", "0.", "", "٠.1.0", " 0.1.0", "0.1.0 ", "v0.1.0", "0.1.0/x"):
        assert (http_api.version_problem(client, "0.1.0") is None) == bool(pattern.search(client)), client
    assert http_api.version_problem("1.9.2", "1.2.0") is None and re.search(http_api.served_pattern("1.2.0"), "1.9.2")
    assert "do not work together" in http_api.version_problem("2.0.0", "1.2.0")


