"""`agent-mail setup kilo`: what Kilo Code CLI (the npm package @kilocode/cli) is given.

Kilo Code CLI is built on OpenCode: the same plugin API and config format. It gets OpenCode's plugin
(agent_mail.harnesses.opencode, by parameter: `hook kilo EVENT`, its first line marked `agent-mail setup kilo`) in
DIR/.kilo/plugin/agent-mail.js, and the MCP server merged into its project config, DIR/kilo.json (or the DIR/kilo.jsonc
already there). Kilo also reads opencode.json(c) and plugins from .kilocode/: setup writes only Kilo's own files.

What differs from OpenCode:
- Kilo refuses {env:...} in a project's config ("environment references are not allowed in project config") and drops
  such an entry, so through an agent-mail server no MCP entry is written in kilo.json (one naming the token itself
  would put it in a file): the notes give the entry for the person's own ~/.config/kilo/kilo.json, which may read
  the environment.
- Kilo's TUI runs plugins in a worker thread, which sees no exit: no `hook kilo end` comes when it quits. The session
  ends with Kilo's process (a session whose harness process is gone is not live, and its waiter watches that process).
"""

from __future__ import annotations

import os

from agent_mail.harnesses import opencode
from agent_mail.harnesses.record import HOOK, Harness

NAME = "kilo"
TITLE = "Kilo Code"
PLUGIN = os.path.join(".kilo", "plugin", "agent-mail.js")
CONFIGS = ("kilo.json", "kilo.jsonc")  # the project configs it reads: setup merges into the first one there
USER_CONFIG = "~/.config/kilo/kilo.json"  # where the person's own settings may read the environment

HARNESS = Harness(
    name=NAME,
    title=TITLE,
    program="kilo",
    tool="agent-mail_{}",
    edit_tools=opencode.EDIT_TOOLS,
    patch_tools=("patch", "apply_patch"),  # as OpenCode's: the files in the patch's headers; the others: filePath
    wake=HOOK,
    woken="woken now (a live Kilo Code session, idle: its agent-mail plugin's waiter starts a turn)",
    told="told at its next prompt or tool call (a live Kilo Code session, at work; woken when idle)",
    plans=opencode.plans_for(NAME, TITLE, PLUGIN, CONFIGS, env_in_project=False),
    marker=(PLUGIN, (opencode.mark(NAME),)),
    remote_note=opencode.remote_note_for(TITLE, USER_CONFIG),
    notes=(
        "Start `kilo` in this directory: the plugin loads from .kilo/plugin/agent-mail.js, the agent-mail MCP server "
        "(tools agent-mail_*) from the project's kilo.json (or the kilo.jsonc it merged into; through an agent-mail "
        "server, see below).",
        "Mail reaches the model's context at each prompt (the first one of a session gets the inbox) and after tool "
        "calls; a session that goes idle with mail that arrived during its turn is sent it as one more prompt, once; "
        "an idle session is woken when mail arrives (the plugin's waiter starts a turn with the envelopes). Before the "
        "first prompt, when the TUI has no session yet, mail opens one with it. Under `kilo run` nothing waits: it "
        "exits when its session is idle.",
        "Kilo's TUI runs plugins in a worker that sees no exit: the session stops counting as live when Kilo's "
        "process ends, and its waiter ends with that process.",
        "The agent-mail entry of kilo.json and .kilo/plugin/agent-mail.js hold this interpreter, identity and "
        "mailbox (Kilo Code reads no personal project settings): keep them out of version control, or commit them "
        "only for a shared mailbox.",
    ),
)
