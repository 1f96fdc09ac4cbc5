// agent-mail for Pi: written by `agent-mail setup pi --agent __AGENT__`; `agent-mail setup pi --remove` takes it out.
// Mail in the model's context (at each prompt, after each tool), the held stop, the idle wake, the pre-edit guard and
// the session's start and end, each by running `agent-mail hook pi EVENT` with the session's JSON on stdin. It holds
// this person's interpreter, identity and mailbox: keep it out of version control unless the mailbox is shared.
import { spawn, spawnSync } from "node:child_process";

const SETTINGS: {
  agent: string; command: string[]; env: Record<string, string>; wake: string; edits: string[];
} = __SETTINGS__;
const EDITS = new Set(SETTINGS.edits);

function parsed(text: string): any {
  try {
    const found = JSON.parse(text);
    return found && typeof found === "object" ? found : null;
  } catch {
    return null;
  }
}

export default function (pi: any) {
  let id: string | null = null; // this runtime's session: Pi binds its extensions anew for each session
  let cwd = process.cwd();
  let ui = false; // interactive (or RPC): someone is there to be woken; not under pi -p or --mode json
  let latest: any = null; // the newest context Pi handed a handler: the waiter's wake goes through it
  let pending: string | null = null; // the session start's note, given to the model at its first prompt
  let held = false; // the last stop was held: the next one passes
  let waiter: any = null;

  function start(event: string) {
    return spawn(SETTINGS.command[0], [...SETTINGS.command.slice(1), event, "--agent", SETTINGS.agent],
      { env: { ...process.env, ...SETTINGS.env }, stdio: ["pipe", "pipe", "pipe"] });
  }

  function warn(message: string) {
    if (ui && latest) {
      try {
        latest.ui.notify(message, "warning");
        return;
      } catch {}
    }
    process.stderr.write(message + "\n");
  }

  function hook(event: string, input: object): Promise<any> {
    return new Promise((resolve) => {
      if (!id) return resolve(null);
      let child: any;
      try {
        child = start(event);
      } catch (error) {
        warn(`agent-mail hook ${event}: ${error}`);
        return resolve(null);
      }
      const out: Buffer[] = [], err: Buffer[] = [];
      child.stdout.on("data", (data: Buffer) => out.push(data));
      child.stderr.on("data", (data: Buffer) => err.push(data));
      child.on("error", (error: Error) => { warn(`agent-mail hook ${event}: ${error}`); resolve(null); });
      child.on("close", (code: number) => {
        if (code !== 0) warn(`agent-mail hook ${event} exited ${code}: ${Buffer.concat(err).toString()}`);
        resolve(code === 0 ? parsed(Buffer.concat(out).toString()) : null);
      });
      child.stdin.on("error", () => {});
      child.stdin.end(JSON.stringify({ cwd, session_id: id, ...input }));
    });
  }

  async function context(name: string, more: object = {}): Promise<string | null> {
    const output = await hook("context", { hook_event_name: name, ...more });
    const note = output?.hookSpecificOutput?.additionalContext;
    return typeof note === "string" && note ? note : null;
  }

  function prompt(text: string, line?: string) {
    if (line && latest) {
      try {
        latest.ui.notify(line, "info");
      } catch {}
    }
    try {
      if (!latest || latest.isIdle()) pi.sendUserMessage(text);
      else pi.sendUserMessage(text, { deliverAs: "followUp" }); // a turn is under way: the text follows it
    } catch (error) {
      warn(`agent-mail: could not start a turn: ${error}`);
    }
  }

  function endWaiter() {
    if (waiter) {
      const ended = waiter;
      waiter = null;
      ended.kill("SIGTERM");
    }
  }

  function arm() {
    endWaiter();
    if (!ui || !id) return;
    let started: any;
    try {
      started = start("wait");
    } catch (error) {
      return warn(`agent-mail hook wait: ${error}`);
    }
    waiter = started;
    const err: Buffer[] = [];
    started.stdout.resume();
    started.stderr.on("data", (data: Buffer) => err.push(data));
    started.on("error", (error: Error) => warn(`agent-mail hook wait: ${error}`));
    started.on("close", (code: number) => {
      if (waiter === started) waiter = null;
      const note = Buffer.concat(err).toString().trim();
      if (code !== 2 || !note) return;
      const start = pending ? `${pending}\n\n` : ""; // woken before its first prompt: the start's note first
      pending = null;
      prompt(`${start}${SETTINGS.wake}\n${note}`, note.split("\n")[0]);
    });
    started.stdin.on("error", () => {});
    started.stdin.end(JSON.stringify({ cwd, session_id: id, hook_event_name: "Stop" }));
  }

  pi.on("session_start", async (_event: any, ctx: any) => {
    latest = ctx;
    id = ctx.sessionManager.getSessionId();
    cwd = ctx.cwd ?? cwd;
    ui = Boolean(ctx.hasUI);
    held = false;
    pending = await context("SessionStart");
    arm(); // idle until the first prompt: woken by mail as after any turn
  });

  pi.on("before_agent_start", async (_event: any, ctx: any) => {
    latest = ctx;
    endWaiter();
    const note = await context("UserPromptSubmit");
    const notes = [pending, note].filter((text) => text);
    pending = null;
    if (!notes.length) return;
    return { message: { customType: "agent-mail", content: notes.join("\n\n"), display: true } };
  });

  pi.on("tool_result", async (event: any, ctx: any) => {
    latest = ctx;
    const note = await context("PostToolUse", { tool_name: event.toolName });
    if (!note) return;
    return { content: [...(event.content ?? []), { type: "text", text: `\n\n${note}` }] };
  });

  pi.on("tool_call", async (event: any, ctx: any) => {
    latest = ctx;
    if (!EDITS.has(event.toolName)) return;
    const found = await hook("pretool", {
      hook_event_name: "PreToolUse", tool_name: event.toolName, tool_input: event.input,
    });
    const decision = found?.hookSpecificOutput;
    if (decision?.permissionDecision === "deny") return { block: true, reason: decision.permissionDecisionReason };
  });

  pi.on("agent_end", async (_event: any, ctx: any) => {
    latest = ctx;
    if (!ui) return;
    const active = held;
    held = false;
    const stop = await hook("stop", { hook_event_name: "Stop", stop_hook_active: active });
    if (stop?.decision === "block" && typeof stop.reason === "string") {
      held = true;
      return prompt(stop.reason, stop.systemMessage);
    }
    arm();
  });

  pi.on("session_shutdown", async (_event: any, ctx: any) => {
    latest = ctx;
    endWaiter();
    if (!id) return;
    spawnSync(SETTINGS.command[0], [...SETTINGS.command.slice(1), "end", "--agent", SETTINGS.agent], {
      env: { ...process.env, ...SETTINGS.env }, timeout: 5000, stdio: ["pipe", "ignore", "ignore"],
      input: JSON.stringify({ cwd, session_id: id, hook_event_name: "SessionEnd" }),
    });
    id = null;
  });
}
