"""agent-mail: a local-first mailbox for AI coding agents.

The version lives here, as a literal, so that reporting it costs nothing: reading
it through importlib.metadata would add tens of milliseconds to every call.
"""

__version__ = "0.1.0"
