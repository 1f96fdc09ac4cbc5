"""`agent-mail setup opencode`: what OpenCode (the npm package opencode-ai) is given; and, by parameter, what a harness
built on OpenCode (its plugin API and config format) is given: Kilo Code CLI (agent_mail.harnesses.kilo) differs in
its names, its plugin's path, its project configs and whether those may read the environment (`plans_for`).

OpenCode has no command hooks: it runs a project's JavaScript plugins (DIR/.opencode/plugin/*.js) in its own process.
Setup writes one, DIR/.opencode/plugin/agent-mail.js, which runs `agent-mail hook opencode EVENT --agent P:N` (the JSON
input on stdin, as every harness's hooks) at the points OpenCode offers, and adds the MCP server to DIR/opencode.json
(the project's config, which OpenCode reads from the directory it starts in), merged into what is there:

- chat.message (each prompt, the first of a session as its SessionStart): the context note, a synthetic text part of
  the prompt (in the history from then on, as a hook's additionalContext is);
- tool.execute.after: the context note appended to the tool's result;
- tool.execute.before on write, edit, multiedit, patch and apply_patch: `hook opencode pretool`; a deny is thrown,
  which OpenCode reports to the model as the tool's error, and the file is not written;
- the session gone idle (its status busy, then idle): `hook opencode stop`; a held stop is sent back as the next
  prompt (client.session.promptAsync), once; otherwise the waiter `hook opencode wait` is started (the one Claude Code
  runs as its asyncRewake hook), which exits 2 with the note when mail the session was not told of arrives: the plugin
  starts a turn with it (promptAsync). A newer waiter ends the older; a prompt ends the session's waiter (the hooks
  tell what comes during a turn); the waiter ends when OpenCode does (it watches the harness's process). Not under
  `opencode run`, which exits when the session goes idle.
- before the first prompt: the TUI opens a session only with its first prompt (1.18.33: no session.created, no
  session, until then), so the plugin, loaded at the start, arms a waiter of the process's own (session id
  `start-PID-...`): the identity is listening from the start. Mail it finds opens a session (client.session.create),
  shown in the TUI (the tui.session.select event; text the person typed stays in the prompt), and prompts it with
  the wake's frame alone: that first prompt's context is the inbox, which holds the mail, so it is told once. The
  first session to begin (that one, or the person's first prompt) ends the process's waiter and its session.
- OpenCode's exit: `hook opencode end` for each session it told (the session stops counting as live).

Everything here is this person's (interpreter, identity, mailbox): OpenCode reads no personal project file.
"""

from __future__ import annotations

import json
import os

from agent_mail import errors
from agent_mail.harnesses.record import HOOK, SERVER, Harness

NAME = "opencode"
PLUGIN = os.path.join(".opencode", "plugin", "agent-mail.js")
CONFIG = "opencode.json"
MARK = "written by `agent-mail setup opencode"  # in the plugin's first line: how ours is told from another's


def mark(name: str) -> str:
    """In the plugin's first line: how ours is told from another's (MARK for OpenCode)."""
    return f"written by `agent-mail setup {name}"


EDIT_TOOLS = ("write", "edit", "multiedit", "patch", "apply_patch")

_PLUGIN_TEXT = """\
// agent-mail for {title}: {mark} --agent {agent}`; `agent-mail setup {name} --remove` takes it out.
// Mail in the model's context (each prompt, after each tool), the held stop, the idle wake and the pre-edit guard,
// each by running `agent-mail hook {name} EVENT` with the session's JSON on stdin. It holds this person's
// interpreter, identity and mailbox: keep it out of version control unless the mailbox is shared.
import {{ spawn, spawnSync }} from "node:child_process";

const AGENT = {agent_json};
const COMMAND = {command_json};
const ENV = {env_json};
const WAKE = {wake_json};
const EDITS = new Set({edits_json});
// `{name} run` exits once its session is idle: nobody is there to be woken or held.
const HEADLESS = process.argv.slice(2).find((word) => !word.startsWith("-")) === "run";
// The TUI runs plugins in its worker; it opens a session only with the first prompt.
const TUI = process.argv.some((word) => word.endsWith("/tui/worker.js"));

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
  // Until the TUI's first session begins, the process itself listens: a waiter of its own (START), and mail it
  // finds opens a session (shown in the TUI) whose first prompt tells the inbox.
  const START = `start-${{process.pid}}-${{Date.now().toString(36)}}`;
  let starting = false; // START's waiter was armed and no session has begun since

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

  function arm(id, event = "Stop", woken = (note) => prompt(id, `${{WAKE}}\\n${{note}}`, note.split("\\n")[0])) {{
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
      if (code === 2 && note) woken(note);
    }});
    waiter.stdin.on("error", () => {{}});
    waiter.stdin.end(JSON.stringify({{ cwd: directory, session_id: id, hook_event_name: event }}));
  }}

  async function endStart() {{
    if (!starting) return;
    starting = false;
    endWaiter(START);
    await hook("end", {{ session_id: START, hook_event_name: "SessionEnd" }});
  }}

  async function open(note) {{
    // Mail before any session: a session opened with it, shown in the TUI. Its prompt is the frame alone: the first
    // prompt's context (the inbox, which holds this mail) tells what came, once.
    if (!starting) return;
    let id;
    try {{
      id = (await client.session.create({{ body: {{}} }})).data?.id;
    }} catch (error) {{
      return warn(`agent-mail: could not open a session: ${{error}}`);
    }}
    if (!id) return warn("agent-mail: could not open a session");
    const shown = {{ type: "tui.session.select", properties: {{ sessionID: id }} }};
    await client.tui.publish({{ body: shown }}).catch(() => {{}});
    prompt(id, WAKE, note.split("\\n")[0]);
  }}

  if (TUI && !HEADLESS) {{
    starting = true;
    arm(START, "SessionStart", open);
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
    for (const id of starting ? [...told, START] : told) {{
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
      await endStart(); // a session began: the process's own waiter is over
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


def plugin_text(agent: str, command: list[str], mailbox: str, wake: str, name: str = NAME,
                title: str = "OpenCode") -> str:
    """The plugin for `agent` (the hook command's words up to the event; the mailbox its hooks use), for the harness
    `name` (OpenCode's, or one built on it) that people call `title`."""
    def js(value) -> str:
        return json.dumps(value, ensure_ascii=False)

    return _PLUGIN_TEXT.format(title=title, name=name, mark=mark(name), agent=agent, agent_json=js(agent),
                               command_json=js(command + ["hook", name]), env_json=js({"AGENT_MAIL_DB": mailbox}),
                               wake_json=js(wake), edits_json=js(list(EDIT_TOOLS)))


def is_ours(text: str | None, name: str = NAME) -> bool:
    return text is not None and mark(name) in text.split("\n", 1)[0]


def plugin_plan(root: str, text: str | None, planned, plugin: str = PLUGIN, name: str = NAME) -> dict:
    """The plan for the plugin DIR/`plugin` (DIR/.opencode/plugin/agent-mail.js; `text`: what it should hold, None to
    take it out); refused when a file of that name is not the harness `name`'s, ours. `planned(path, action, before,
    after)` makes the plan."""
    path = os.path.join(root, plugin)
    try:
        with open(path, encoding="utf-8") as handle:
            before: str | None = handle.read()
    except FileNotFoundError:
        before = None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.AgentMailError(f"cannot read {path}: {exc}. Nothing was written.") from None
    if before is not None and not is_ours(before, name):
        raise errors.InvalidInput([(path, "exists and was not written by agent-mail setup; move it aside (or rename "
                                          "it), then run setup again. Nothing was written.")])
    if text == before:
        return planned(path, "unchanged", before, before)
    action = "remove" if text is None else ("create" if before is None else "update")
    if before is None and text is None:
        action = "unchanged"
    return planned(path, action, before, text)


def config_merged(document: dict, entry: dict | None, config: str = CONFIG) -> dict:
    """DIR/opencode.json (the project config named `config`) with our MCP server (`entry`) put under mcp.agent-mail,
    or taken out (None); every other key left as it was, in its order."""
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
    """OpenCode's MCP entry: a local server (the command and its environment), or the agent-mail server's /mcp over
    HTTP with the token read from the environment ({env:AGENT_MAIL_TOKEN}: OpenCode substitutes it)."""
    if remote_url is not None:
        return {"type": "remote", "url": remote_url, "headers": {"Authorization": bearer}, "enabled": True}
    return {"type": "local", "command": command + ["mcp", "--agent", agent], "environment": {"AGENT_MAIL_DB": mailbox},
            "enabled": True}


BEARER_FROM_ENV = "Bearer {env:AGENT_MAIL_TOKEN}"  # OpenCode's substitution of a variable in its config


def config_path(root: str, configs: tuple[str, ...]) -> str:
    """The project config setup merges into: the first of `configs` (the names the harness reads) that is there in
    DIR, else the first."""
    for config in configs:
        if os.path.lexists(os.path.join(root, config)):
            return os.path.join(root, config)
    return os.path.join(root, configs[0])


def plans_for(name: str, title: str, plugin: str, configs: tuple[str, ...], env_in_project: bool = True):
    """The `plans` of the harness `name` (OpenCode, or one built on it, called `title`): its plugin at DIR/`plugin`
    and our MCP server merged into its project config (the first of `configs` there, else the first). Through an
    agent-mail server the entry reads the token from the environment ({env:...}); where the project config may not
    (`env_in_project` False: Kilo Code drops such an entry) none is written; `remote_note_for` says where it goes."""
    def plans(kit, root: str, agent: str, mailbox: str, remove: bool) -> list[dict]:
        remote = kit.mcp_url(mailbox) if kit.is_server(mailbox) else None
        entry = None if remove else server_entry(kit.base_command(), agent, mailbox, remote, BEARER_FROM_ENV)
        if remote is not None and not env_in_project:
            entry = None  # the token cannot be read there, and is never written in a file
        text = None if remove else plugin_text(agent, kit.hook_base(), mailbox, kit.REWAKE_MESSAGE, name, title)
        config = config_path(root, configs)
        return [kit.json_plan(config, lambda d: config_merged(d, entry, os.path.basename(config)), comments=True),
                plugin_plan(root, text, kit.planned, plugin, name)]

    return plans


def remote_note_for(title: str, user_config: str):
    """The `remote_note` of a harness built on OpenCode whose project config may not read the environment: through
    an agent-mail server no MCP entry is written in the project, and the note gives the one for the person's own
    `user_config`, which may."""
    def remote_note(kit, mailbox: str) -> str:
        entry = {"type": "remote", "url": kit.mcp_url(mailbox), "headers": {"Authorization": BEARER_FROM_ENV}}
        return (f"{title} refuses to read the environment in a project's config, so no MCP entry was written here "
                "(one naming the token itself would put it in a file): for the MCP tools, add "
                f'"mcp": {{"{SERVER}": {json.dumps(entry)}}} to your own {user_config}, which it trusts to read '
                f"{kit.TOKEN_VAR}.")

    return remote_note


plans = plans_for(NAME, "OpenCode", PLUGIN, (CONFIG,))


HARNESS = Harness(
    name=NAME,
    title="OpenCode",
    program="opencode",
    tool="agent-mail_{}",
    edit_tools=EDIT_TOOLS,
    patch_tools=("patch", "apply_patch"),  # the files in the patch's headers (args.patchText); the others: filePath
    wake=HOOK,
    woken="woken now (a live OpenCode session, idle: its agent-mail plugin's waiter starts a turn)",
    told="told at its next prompt or tool call (a live OpenCode session, at work; woken when idle)",
    plans=plans,
    marker=(PLUGIN, (MARK,)),
    notes=(
        "Start `opencode` in this directory (OpenCode reads opencode.json from the directory it starts in): the "
        "agent-mail MCP server (tools agent-mail_*) loads from opencode.json, the plugin from "
        ".opencode/plugin/agent-mail.js.",
        "Mail reaches the model's context at each prompt (the first one of a session gets the inbox) and after tool "
        "calls; a session that goes idle with mail that arrived during its turn is sent it as one more prompt, once; "
        "an idle session is woken when mail arrives (the plugin's waiter starts a turn with the envelopes). Before the "
        "first prompt, when the TUI has no session yet, mail opens one with it. Under `opencode run` nothing waits: "
        "it exits when its session is idle.",
        "At its first start in a directory OpenCode installs @opencode-ai/plugin into .opencode/node_modules with npm "
        "(a few seconds; without a network it retries for about 75 s before the session starts; "
        "npm_config_fetch_retries=0 makes that fail at once). The agent-mail plugin does not use it.",
        "The agent-mail entry of opencode.json and .opencode/plugin/agent-mail.js hold this interpreter, identity and "
        "mailbox (OpenCode reads no personal project settings): keep them out of version control, or commit them only "
        "for a shared mailbox.",
    ),
)
