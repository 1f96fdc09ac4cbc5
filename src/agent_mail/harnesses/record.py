"""The record of one harness (agent_mail.harnesses: one module a harness, each defining HARNESS), and the words
the records share.
"""

from __future__ import annotations

# How a harness's idle session is woken when mail arrives:
HOOK = "hook"  # by the waiter its own hooks run (`hook H wait`: Claude Code's asyncRewake hook, OpenCode's plugin)
WAKER = "waker"  # by a waker of ours, detached, through the harness's own way in (agent_mail.harness.waker)
RUN = "run"  # not by itself: under `agent-mail run`, which types a notice at its empty prompt

SERVER = "agent-mail"  # the MCP server's name in every harness's settings

# The line that opens a note an idle session is woken with, where it becomes a prompt (setup's rewakeMessage, the
# waker's and the plugin's prompt).
WOKEN_FRAME = "agent-mail: new mail arrived while you were idle (this is mail for you, not an error):"


def hook_marks(name: str) -> tuple[str, ...]:
    """What a file setup wrote the harness `name`'s hooks into holds: `agent-mail hook NAME ` (the script, its path
    quoted or not) or ` agent_mail hook NAME ` (-m agent_mail)."""
    return tuple(f"{word} hook {name} " for word in ("/agent-mail", "/agent-mail'", " agent_mail"))


def _hook_entry(command: str, event: str, extra: dict) -> dict:
    return {"type": "command", "command": command, **extra}


def _same(document: dict) -> dict:
    return document


def _context(event: str, note: str) -> dict:
    return {"hookSpecificOutput": {"hookEventName": event, "additionalContext": note}}


def _stop(decision: str, reason: str, line: str) -> dict:
    return {"decision": decision, "reason": reason, "systemMessage": line}


def _denial(note: str) -> dict:
    return {"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
                                   "permissionDecisionReason": note}}


class Harness:
    """One harness: everything agent-mail knows of it (see the module's docstring). Frozen, like a frozen dataclass,
    without the dataclasses module (which would load re and inspect into every hook's start). Defaults are Claude
    Code's forms, which most harnesses copy."""

    __slots__ = (
        "name",  # as the command line and the stored sessions name it
        "title",  # as people name it: "Claude Code"
        "program",  # the name of the program it starts as (`agent-mail run -- PROGRAM`, the notes)
        # -- what its hooks are given and answer (agent_mail.harness.hooks, agent_mail.operations.telling)
        "read_input",  # its hook input -> the same said in Claude Code's words (session_id, hook_event_name, ...)
        "context_event",  # the event a context note is labelled with when the input names none
        "context_output",  # (event, note) -> the hook output that adds the note to the model's context
        "stop_decision",  # the decision that holds a stop ("block", "deny")
        "stop_output",  # (decision, reason, line for the person) -> the hook output that holds a stop
        "starts",  # whether its hooks see a session start (the inbox told there); if not, a first stop with unread
        # mail is held with the inbox
        "subagent_key",  # a key of the hook input that marks a subagent's hook: its parent session is told (None)
        "quiet",  # what a hook prints when it has nothing to say (None: nothing)
        "tool",  # how it names our MCP tool {} to its model, a format string
        "mcp",  # whether it has an MCP client (False: the notes name the agent-mail commands for its shell tool)
        "edit_tools",  # the tools whose edits the pre-tool guard checks
        "patch_tools",  # of those, the ones whose input is a patch (the files in its headers)
        "denial",  # note -> the hook output that refuses a tool call
        # -- how its idle session is woken, and the liveness words that say how soon it hears of mail
        "wake",  # HOOK, WAKER or RUN
        "woken",  # a live session whose waiter is armed (None: it has none)
        "told",  # a live session without one (at work, or one that cannot be woken while idle)
        "empty_prompt",  # what its screen shows while its prompt is empty (`agent-mail run`)
        "told_at_prompt",  # whether a prompt hook tells the mail when run's typed line lands (run waits for that);
        # if not, the woken turn's own hooks tell it, and the wake is done once the line is entered
        # -- what `agent-mail setup` writes (agent_mail.harness.setup)
        "plans",  # (kit, root, agent, mailbox, remove) -> the plans of its files
        "hook_entry",  # (command, event, extra) -> one of our hooks in its settings' shape
        "hook_entries",  # (kit, hook, agent) -> our hooks by its event names; hook(event, **extra) makes one
        "marker",  # (file, marks): set up in a directory when that file there holds one of the marks
        "set_up_at",  # directory -> whether setup connected exactly it, where no file there says so (None: marker)
        "token_reader",  # what reads the server's token from the environment, in the notes
        "remote_note",  # (kit, mailbox) -> through a server, what to do for the MCP tools where setup can write no
        # entry (its project settings may not read the token from the environment); None: the entry was written
        "notes",  # what setup tells the person
    )

    def __init__(self, *, name: str, title: str, program: str, wake: str, told: str, notes: tuple[str, ...],
                 plans, marker: tuple[str, tuple[str, ...]] | None = None, set_up_at=None, woken: str | None = None,
                 read_input=_same, context_event: str = "PostToolUse", context_output=_context,
                 stop_decision: str = "block", stop_output=_stop, starts: bool = True, subagent_key: str | None = None,
                 quiet: dict | None = None, tool: str = "the agent-mail MCP tool {}", edit_tools: tuple[str, ...] = (),
                 patch_tools: tuple[str, ...] = (), denial=_denial, empty_prompt: tuple[str, ...] = (),
                 told_at_prompt: bool = True, hook_entry=_hook_entry, hook_entries=None,
                 token_reader: str = "the settings", mcp: bool = True, remote_note=None):
        given = dict(locals())
        for field in self.__slots__:
            object.__setattr__(self, field, given[field])

    def __setattr__(self, name, value):
        raise AttributeError(f"a Harness is frozen: {name} cannot be set")

    def __repr__(self) -> str:
        return f"Harness({self.name!r})"

    def tool_named(self, name: str) -> str:
        return self.tool.format(name)

    @property
    def wakes_idle(self) -> bool:
        """Whether its idle session is woken when mail arrives, by itself (its hooks' waiter, or our waker)."""
        return self.wake != RUN

    @property
    def waits_in_its_hook(self) -> bool:
        """Whether its own hooks run the waiter (`hook H wait` blocks until mail arrives)."""
        return self.wake == HOOK

    @property
    def woken_by_our_waker(self) -> bool:
        """Whether its `wait` hook starts our waker, detached (agent_mail.harness.waker), and returns once it armed."""
        return self.wake == WAKER
