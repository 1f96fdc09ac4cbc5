"""`agent-mail setup opencode` and `setup kilo`: what OpenCode (the npm package opencode-ai) and Kilo Code CLI
(@kilocode/cli, a fork of OpenCode with its plugin API and config format) are given. Each is a Fork: its names, its
plugin's path and its project config; everything else here is the same for both.

OpenCode has no command hooks: it runs a project's JavaScript plugins (DIR/.opencode/plugin/*.js; Kilo:
DIR/.kilo/plugin/*.js) in its own process. Setup writes one, DIR/.opencode/plugin/agent-mail.js, which runs
`agent-mail hook opencode EVENT --agent P:N` (the JSON input on stdin, as every harness's hooks) at the points
OpenCode offers, and adds the MCP server to DIR/opencode.json (the project's config, which OpenCode reads from the
directory it starts in; Kilo: DIR/kilo.json, or a kilo.jsonc already there), merged into what is there:

- chat.message (each prompt, the first of a session as its SessionStart): the context note, a synthetic text part of
  the prompt (in the history from then on, as a hook's additionalContext is);
- tool.execute.after: the context note appended to the tool's result;
- tool.execute.before on write, edit, multiedit, patch and apply_patch: `hook opencode pretool`; a deny is thrown,
  which OpenCode reports to the model as the tool's error, and the file is not written;
- the session gone idle (its status busy, then idle): `hook opencode stop`; a held stop is sent back as the next
  prompt (client.session.promptAsync), once; otherwise the waiter `hook opencode wait` is started (the one Claude Code
  runs as its asyncRewake hook), which exits 2 with the note when mail the session was not told of arrives: the plugin
  starts a turn with it (promptAsync). A newer waiter ends the older; a prompt ends the session's waiter (the hooks
  tell what comes during a turn); the waiter ends when OpenCode does (it watches its parent). Not under `opencode
  run`, which exits when the session goes idle.
- OpenCode's exit: `hook opencode end` for each session it told (the session stops counting as live). Kilo's TUI
  runs plugins in a worker thread, which sees no exit: there the session ends with Kilo's process (a session whose
  harness process is gone is not live, and its waiter watches that process).

Everything here is this person's (interpreter, identity, mailbox): OpenCode reads no personal project file.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

from agent_mail import errors

SERVER = "agent-mail"
EDIT_TOOLS = ("write", "edit", "multiedit", "patch", "apply_patch")


class Fork(NamedTuple):
    """What differs between OpenCode and a harness built on it."""

    harness: str  # the name setup and hook take
    name: str  # what people call it
    plugin: str  # our plugin, from the project's root
    configs: tuple[str, ...]  # the project configs it reads; setup merges into the first one there, else the first
    # Whether a project's config may read the environment ({env:VAR}): how a remote MCP entry reads the token.
    # Kilo refuses it ("environment references are not allowed in project config") and drops the entry; its user
    # config (`user_config`) may.
    env_in_project: bool = True
    user_config: str = ""

    @property
    def mark(self) -> str:
        """In the plugin's first line: how ours is told from another's."""
        return f"written by `agent-mail setup {self.harness}"


FORKS = {
    "opencode": Fork("opencode", "OpenCode", os.path.join(".opencode", "plugin", "agent-mail.js"), ("opencode.json",)),
    # Kilo also reads opencode.json(c), and plugins from .kilocode/: setup writes only Kilo's own files.
    "kilo": Fork("kilo", "Kilo Code", os.path.join(".kilo", "plugin", "agent-mail.js"), ("kilo.json", "kilo.jsonc"),
                 env_in_project=False, user_config="~/.config/kilo/kilo.json"),
}

_PLUGIN_TEXT = """\
// agent-mail for {name}: {mark} --agent {agent}`; `agent-mail setup {harness} --remove` takes it out.
// Mail in the model's context (each prompt, after each tool), the held stop, the idle wake and the pre-edit guard,
// each by running `agent-mail hook {harness} EVENT` with the session's JSON on stdin. It holds this person's
// interpreter, identity and mailbox: keep it out of version control unless the mailbox is shared.
import {{ spawn, spawnSync }} from "node:child_process";

const AGENT = {agent_json};
const COMMAND = {command_json};
const ENV = {env_json};
const WAKE = {wake_json};
const EDITS = new Set({edits_json});
// `{harness} run` exits once its session is idle: nobody is there to be woken or held.
const HEADLESS = process.argv.slice(2).find((word) => !word.startsWith("-")) === "run";

function parsed(text) {{
  try {{
    const found = JSON.parse(text);
    return found && typeof found === "object" ? found : null;
  }} catch {{
    return null;
  }}
}}

export default async ({{ client, directory }}) => {{
  const told = new Set(); // sessions told their start in this process
  const children = new Set(); // subagents' sessions: their parent is the one told
  const busy = new Set();
  const held = new Set(); // sessions whose stop was held once: their next stop passes
  const waiters = new Map();

  function start(event) {{
    return spawn(COMMAND[0], [...COMMAND.slice(1), event, "--agent", AGENT],
      {{ env: {{ ...process.env, ...ENV }}, stdio: ["pipe", "pipe", "pipe"] }});
  }}

  function warn(message) {{
    client.app.log({{ body: {{ service: "agent-mail", level: "warn", message }} }}).catch(() => {{}});
  }}

  function hook(event, input) {{
    return new Promise((resolve) => {{
      let child;
      try {{
        child = start(event);
      }} catch (error) {{
        warn(`agent-mail hook ${{event}}: ${{error}}`);
        return resolve(null);
      }}
      const out = [], err = [];
      child.stdout.on("data", (data) => out.push(data));
      child.stderr.on("data", (data) => err.push(data));
      child.on("error", (error) => {{ warn(`agent-mail hook ${{event}}: ${{error}}`); resolve(null); }});
      child.on("close", (code) => {{
        if (code !== 0) warn(`agent-mail hook ${{event}} exited ${{code}}: ${{Buffer.concat(err).toString()}}`);
        resolve(code === 0 ? parsed(Buffer.concat(out).toString()) : null);
      }});
      child.stdin.on("error", () => {{}});
      child.stdin.end(JSON.stringify({{ cwd: directory, ...input }}));
    }});
  }}

  async function context(id, name, more) {{
    const output = await hook("context", {{ session_id: id, hook_event_name: name, ...more }});
    const note = output?.hookSpecificOutput?.additionalContext;
    return typeof note === "string" && note ? note : null;
  }}

  async function prompt(id, text, line) {{
    if (line) client.tui.showToast({{ body: {{ message: line, variant: "info" }} }}).catch(() => {{}});
    try {{
      await client.session.promptAsync({{ path: {{ id }}, body: {{ parts: [{{ type: "text", text }}] }} }});
    }} catch (error) {{
      warn(`agent-mail: could not start a turn: ${{error}}`);
    }}
  }}

  function endWaiter(id) {{
    const waiter = waiters.get(id);
    if (waiter) {{
      waiters.delete(id);
      waiter.kill("SIGTERM");
    }}
  }}

  function arm(id) {{
    endWaiter(id);
    let waiter;
    try {{
      waiter = start("wait");
    }} catch (error) {{
      return warn(`agent-mail hook wait: ${{error}}`);
    }}
    waiters.set(id, waiter);
    const err = [];
    waiter.stdout.resume();
    waiter.stderr.on("data", (data) => err.push(data));
    waiter.on("error", (error) => warn(`agent-mail hook wait: ${{error}}`));
    waiter.on("close", (code) => {{
      if (waiters.get(id) === waiter) waiters.delete(id);
      const note = Buffer.concat(err).toString().trim();
      if (code === 2 && note) prompt(id, `${{WAKE}}\\n${{note}}`, note.split("\\n")[0]);
    }});
    waiter.stdin.on("error", () => {{}});
    waiter.stdin.end(JSON.stringify({{ cwd: directory, session_id: id, hook_event_name: "Stop" }}));
  }}

  async function idle(id) {{
    if (HEADLESS || children.has(id) || !told.has(id)) return;
    const active = held.delete(id);
    const stop = await hook("stop", {{ session_id: id, hook_event_name: "Stop", stop_hook_active: active }});
    if (stop?.decision === "block" && typeof stop.reason === "string") {{
      held.add(id);
      return prompt(id, stop.reason, stop.systemMessage);
    }}
    arm(id);
  }}

  process.on("exit", () => {{
    for (const waiter of waiters.values()) waiter.kill("SIGTERM");
    for (const id of told) {{
      spawnSync(COMMAND[0], [...COMMAND.slice(1), "end", "--agent", AGENT], {{
        env: {{ ...process.env, ...ENV }}, timeout: 5000, stdio: ["pipe", "ignore", "ignore"],
        input: JSON.stringify({{ cwd: directory, session_id: id, hook_event_name: "SessionEnd" }}),
      }});
    }}
  }});

  return {{
    "chat.message": async (input, output) => {{
      const id = input.sessionID;
      if (children.has(id)) return;
      endWaiter(id);
      const first = !told.has(id);
      told.add(id);
      const note = await context(id, first ? "SessionStart" : "UserPromptSubmit");
      if (!note) return;
      const part = output.parts[0];
      output.parts.push({{
        id: part?.id ? `${{part.id}}am` : `prt_${{Date.now().toString(16)}}agentmail`,
        sessionID: id, messageID: output.message?.id ?? part?.messageID, type: "text", text: note, synthetic: true,
      }});
    }},
    "tool.execute.after": async (input, output) => {{
      if (children.has(input.sessionID) || !told.has(input.sessionID) || typeof output?.output !== "string") return;
      const note = await context(input.sessionID, "PostToolUse", {{ tool_name: input.tool }});
      if (note) output.output += `\\n\\n${{note}}`;
    }},
    "tool.execute.before": async (input, output) => {{
      if (!EDITS.has(input.tool)) return;
      const found = await hook("pretool", {{
        session_id: input.sessionID, hook_event_name: "PreToolUse", tool_name: input.tool, tool_input: output.args,
      }});
      const decision = found?.hookSpecificOutput;
      if (decision?.permissionDecision === "deny") throw new Error(decision.permissionDecisionReason);
    }},
    event: async ({{ event }}) => {{
      const about = event.properties ?? {{}};
      if (event.type === "session.created" && about.info?.parentID) children.add(about.info.id);
      else if (event.type === "session.status" && about.status?.type === "busy") busy.add(about.sessionID);
      else if ((event.type === "session.idle" || (event.type === "session.status" && about.status?.type === "idle"))
               && busy.delete(about.sessionID)) await idle(about.sessionID);
    }},
  }};
}};
"""


def plugin_text(fork: Fork, agent: str, command: list[str], mailbox: str, wake: str) -> str:
    """The plugin for `agent` (the hook command's words up to the event; the mailbox its hooks use)."""
    def js(value) -> str:
        return json.dumps(value, ensure_ascii=False)

    return _PLUGIN_TEXT.format(name=fork.name, harness=fork.harness, mark=fork.mark, agent=agent,
                               agent_json=js(agent), command_json=js(command + ["hook", fork.harness]),
                               env_json=js({"AGENT_MAIL_DB": mailbox}), wake_json=js(wake),
                               edits_json=js(list(EDIT_TOOLS)))


def is_ours(fork: Fork, text: str | None) -> bool:
    return text is not None and fork.mark in text.split("\n", 1)[0]


def config_path(fork: Fork, root: str) -> str:
    """The project config setup merges into: the first of the fork's config files that is there, else the first."""
    for name in fork.configs:
        if os.path.lexists(os.path.join(root, name)):
            return os.path.join(root, name)
    return os.path.join(root, fork.configs[0])


def plugin_plan(fork: Fork, root: str, text: str | None, planned) -> dict:
    """The plan for the plugin (DIR/.opencode/plugin/agent-mail.js; `text`: what it should hold, None to take it
    out); refused when a file of that name is not ours. `planned(path, action, before, after)` makes the plan."""
    path = os.path.join(root, fork.plugin)
    try:
        with open(path, encoding="utf-8") as handle:
            before: str | None = handle.read()
    except FileNotFoundError:
        before = None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc}. Nothing was written.") from None
    if before is not None and not is_ours(fork, before):
        raise errors.InvalidInput([(path, "exists and was not written by agent-mail setup; move it aside (or rename "
                                          "it), then run setup again. Nothing was written.")])
    if text == before:
        return planned(path, "unchanged", before, before)
    action = "remove" if text is None else ("create" if before is None else "update")
    if before is None and text is None:
        action = "unchanged"
    return planned(path, action, before, text)


def config_merged(document: dict, entry: dict | None, config: str) -> dict:
    """DIR/opencode.json (the config file named `config`) with our MCP server (`entry`) put under mcp.agent-mail, or
    taken out (None); every other key left as it was, in its order."""
    document = dict(document)
    servers = document.get("mcp", {})
    if not isinstance(servers, dict):
        raise errors.InvalidInput([("mcp", f"in {config} is not an object; fix it, then run setup again. Nothing "
                                           "was written.")])
    servers = {name: spec for name, spec in servers.items() if name != SERVER}
    if entry is not None:
        servers[SERVER] = entry
    if servers:
        document["mcp"] = servers
    else:
        document.pop("mcp", None)
    return document


def server_entry(command: list[str], agent: str, mailbox: str, remote_url: str | None, bearer: str) -> dict:
    """OpenCode's (and Kilo's) MCP entry: a local server (the command and its environment), or the agent-mail
    server's /mcp over HTTP with the token read from the environment ({env:AGENT_MAIL_TOKEN}: OpenCode substitutes
    it)."""
    if remote_url is not None:
        return {"type": "remote", "url": remote_url, "headers": {"Authorization": bearer}, "enabled": True}
    return {"type": "local", "command": command + ["mcp", "--agent", agent], "environment": {"AGENT_MAIL_DB": mailbox},
            "enabled": True}
