"""How many examples the property tests run (AGENT_MAIL_FUZZ_EXAMPLES raises the counts for a long hunt)."""

from __future__ import annotations

import os

FUZZ_EXAMPLES = int(os.environ.get("AGENT_MAIL_FUZZ_EXAMPLES", "0"))


def examples(default: int) -> int:
    """How many examples a property test runs: its default, or more when asked."""
    return max(default, FUZZ_EXAMPLES)
