"""The harnesses agent-mail connects to, one module each, chosen by name through one small registry.

Each module here (claude_code, codex, gemini, qwen, copilot, opencode, kilo, pi, vibe) holds everything about its
harness in one record, a Harness: the program it starts as, the words of its hook input and output, the note's tool
names, how its idle session is woken and the liveness words that say so, the tools whose edits the pre-tool guard
checks, and what `agent-mail setup` writes for it (its files, merged, and the notes shown). Every layer asks the record
(agent_mail.operations.telling, agent_mail.parts.liveness, agent_mail.harness.hooks, agent_mail.harness.setup, ...);
no other module names a harness (an architecture test checks).

A module is imported only when its harness is used: a hook of one harness loads that harness's module and no other,
and the command line's choices come from NAMES, which loads none. The modules import only from the layers below
every one of their users (the ground: agent_mail.errors, agent_mail.jsonout, ...). What setup does generically (a
JSON settings file edited in place, our hooks merged into a harness's hooks object, an MCP server entry) a record's
`plans` is handed as `kit` (agent_mail.harness.setup itself), so the record says what goes where and setup how it is
written.

The record's type, Harness, and the words the records share are in agent_mail.harnesses.record (each module
imports it from there, so that none imports this registry, which imports them; and this registry imports nothing, so
the command line's start pays for NAMES alone). A new harness is one module defining HARNESS, its name in NAMES and its
branch in _load below, and one entry in the parametrized harness tests.
"""

from __future__ import annotations

# The harnesses, by name (as `agent-mail setup NAME` and `agent-mail hook NAME` take it, and as harness sessions are
# stored): the command line's choices, without loading a module.
NAMES = ("claude-code", "codex", "gemini", "qwen", "copilot", "opencode", "kilo", "pi", "vibe")


def _load(name: str):
    """The record of the harness `name`, its module imported now (once: Python keeps it); None for another name.
    One branch a harness: a module named in the code, so that a reader of imports sees it."""
    if name == "claude-code":
        from agent_mail.harnesses import claude_code as kind
    elif name == "codex":
        from agent_mail.harnesses import codex as kind
    elif name == "gemini":
        from agent_mail.harnesses import gemini as kind
    elif name == "qwen":
        from agent_mail.harnesses import qwen as kind
    elif name == "copilot":
        from agent_mail.harnesses import copilot as kind
    elif name == "opencode":
        from agent_mail.harnesses import opencode as kind
    elif name == "kilo":
        from agent_mail.harnesses import kilo as kind
    elif name == "pi":
        from agent_mail.harnesses import pi as kind
    elif name == "vibe":
        from agent_mail.harnesses import vibe as kind
    else:
        return None
    return kind.HARNESS


def get(name: str):
    """The record of the harness `name` (a record.Harness), or None for a name not registered (a session stored by
    another version)."""
    return _load(name) if name in NAMES else None


def of(name: str):
    """The record of the harness `name` (one the command line checked); KeyError for any other."""
    found = get(name)
    if found is None:
        raise KeyError(name)
    return found
