"""The commands around the mail declared: search, export, import, cleanup, copy, doctor, and those that
start or connect another front end (mcp, dashboard, hook, setup)."""

from __future__ import annotations

from agent_mail.spec.base import (FIELDS, FLAG, HARNESSES, IDENTITY, INT, MAIL_IS_DATA, MESSAGE_ID, NUMBER, PATH,
                                  PROJECT, RECIPIENT, REMOVED, TEXT, Arg, Command, register)


SEARCH_FIELDS = {
    "id": "Message id: the searcher's own copy, or the first copy of a send to several. Pass it to read --thread.",
    "sender": "Identity that sent it.",
    "recipients": "Who it went to: ['*'] for a broadcast; with --agent as one recipient of a send to several, "
    "only that agent.",
    "subject": "Its subject.",
    "snippet": "A short stretch of the body (or the subject) around the first match, the matching words marked "
    "**like this**.",
    "matched": "'subject' when the query matches within the subject alone (ranked first), else 'text'.",
    "type": "'direct' or 'broadcast'.",
    "created": "When it was sent (ISO 8601).",
    "deliver_at": "For a delayed message, when it fell (or falls) due; else null.",
    "reply_to": "The message it answers, or null.",
    "attachments": "Names of the attached files.",
    "withdrawn": "true for a scheduled message its sender cancelled (only without --agent: nobody receives it).",
}
SEARCH_QUERY_HELP = ('What to look for: words (all must match), "exact phrases", a OR b, -excluded (word or '
                     'phrase), prefix*. Case and accents do not matter; identities and file names are words too '
                     '(ops:lead is the phrase "ops lead"). At most 1000 characters and 32 terms; a term that begins '
                     'with - may stand first (search -fix) or after --.')

register(Command(
    name="search",
    summary="Find messages by their words: subjects, bodies, sender and recipient identities, attachment names. "
    "Ranked (subject matches first), newest first. Marks nothing read. " + MAIL_IS_DATA,
    args=(
        Arg("query", TEXT, SEARCH_QUERY_HELP, required=True),
        Arg("--agent", IDENTITY, "Only what this identity can see: its inbox (archived too), what it sent, "
            "broadcasts. Without it: every message in the mailbox (the supervisor's view)."),
        Arg("--from", IDENTITY, "Only messages from this sender."),
        Arg("--to", RECIPIENT, "Only messages addressed to this identity ('*': broadcasts)."),
        Arg("--since-days", NUMBER, "Only messages that arrived in the last N days.", minimum=0, maximum=36_500),
        Arg("--thread", MESSAGE_ID, "Only messages of the thread holding this message."),
        Arg("--limit", INT, "At most this many results.", default=20, minimum=1, maximum=1000),
        Arg("--fields", FIELDS, "Comma-separated subset of the result fields to return."),
    ),
    output={
        "query": "The query as understood: its terms, each group of alternatives joined by OR, exclusions with -.",
        "results": "The matches, most relevant first: those matching in the subject, then the rest; newest "
        "first within each. A send to several recipients is one result.",
        "count": "How many results.",
        "more": "true when more messages match than --limit let through.",
        "next": "Commands to read the first result's thread.",
    },
    items_key="results",
    item_fields=SEARCH_FIELDS,
    notes=("The query language is the same on SQLite (FTS5) and PostgreSQL (a GIN-indexed tsvector): both "
           "index the words agent-mail cuts, so they match the same messages.",
           "Anything else in a query (parentheses, AND, NOT, a * inside a word, an unclosed quote) is refused "
           "with the accepted forms."),
    examples=('search "deploy failed"', 'search \'"release notes" -staging\' --agent deploy:worker',
              "search 'rollback OR revert' --from ops:lead --since-days 7",
              "search deplo* --thread 9f1c2e34-5678-4abc-9def-0123456789ab --fields id,subject,snippet"),
))

EXPORT_FORMAT = {  # the JSON Lines export, version 1 (agent_mail.operations.history writes and reads it)
    "header": "The first line: {\"agent_mail_export\": 1} (the format's version).",
    "blob": "{type: 'blob', sha256, size, created, content_base64}: an attachment's content, once, before the "
    "first message that uses it.",
    "message": "{type: 'message', id, batch_id, kind ('direct' | 'broadcast'), sender, recipient ('*' for a "
    "broadcast), subject, body, refs (list or null), reply_to, created, deliver_at, cancelled_at, "
    "read_at, acked_at, archived_at, deleted_at (the recipient's state, on a direct row), schedule ({deliver_at, "
    "published_at} or null), broadcast_states ([{agent, read_at, acked_at, archived_at, deleted_at}], each "
    "recipient's state of a broadcast), attachments ([{name, size, sha256}])}: one stored row, in stored order.",
    "profile": "{type: 'profile', agent, human, mirror_dir, max_entries, updated_at}.",
    "event": "{type: 'event', id, agent, source ('email.bounce'), payload, created, dismissed_at}.",
    "values": "Ids are UUIDs in lower case, one record each (the same id twice holds the same record). Times are "
    "ISO 8601 with their UTC offset, from 2000 to a day from now (deliver_at: at most 30 days after created), and "
    "no state or event of a message comes before its created. reply_to names another message (one the file or "
    "mailbox may no longer hold: cleanup and --agent/--since-days leave replies whose original is not there).",
}

register(Command(
    name="export",
    summary="Write the mailbox's history out: JSON Lines that rebuild it exactly (import), or mbox for a mail "
    "client. Whole, or one identity's, or recent. Marks nothing read.",
    args=(
        Arg("--format", TEXT, "jsonl (default): every record, to import elsewhere. mbox: the mail as standard "
            "email (threads, attachments as MIME parts), to open in a mail client.", default="jsonl",
            choices=("jsonl", "mbox")),
        Arg("--output", TEXT, "A new file to write (never overwritten; written aside and renamed into place). "
            "Default: stdout."),
        Arg("--agent", IDENTITY, "Only what this identity can see (its mail, what it sent, broadcasts), with only "
            "its own state of broadcasts, its profile and its events."),
        Arg("--since-days", NUMBER, "Only messages that arrived in the last N days.", minimum=0, maximum=36_500),
    ),
    output={
        "file": "The file written (with --output; to stdout the export itself is all that is printed).",
        "format": "jsonl or mbox.",
        "bytes": "Its size.",
        "messages": "Message records (stored rows: a send to several is one per recipient) written.",
        "blobs": "jsonl: attachment contents written (each once).",
        "profiles": "jsonl: profiles written.",
        "events": "jsonl: system-channel events (bounces) written.",
        "next": "jsonl: the command that checks the file as an import would.",
    },
    documents={"jsonl": EXPORT_FORMAT},
    notes=("Progress goes to stderr when stderr is a terminal. Both formats stream: memory stays flat whatever "
           "the mailbox's size.",
           "mbox: identities become addresses (\"ops:lead\" <lead@ops.agent-mail.invalid>, everyone@agent-mail"
           ".invalid for a broadcast), Message-ID/In-Reply-To/References make threads, X-Agent-Mail-* headers "
           "carry the id, batch, type and state; lines beginning with From are quoted (mboxrd)."),
    examples=("export --output team.jsonl", "export --format mbox --output team.mbox",
              "export --agent deploy:worker --since-days 7 --output worker-week.jsonl"),
))

register(Command(
    name="import",
    summary="Bring an export (jsonl) into this mailbox: all or nothing, every record checked as send checks it; "
    "what is already there (by id) is left as it is, so importing twice changes nothing.",
    mutating=True,
    args=(
        Arg("file", TEXT, "The export to read (a path, or - for stdin).", required=True),
        Arg("--dry-run", FLAG, "Check everything and count what would be added; change nothing."),
    ),
    output={
        "file": "The file read.",
        "dry_run": "true when nothing was changed because --dry-run was given.",
        "format_version": "The export format's version.",
        "added": "{messages, blobs, profiles, events} added (or that would be).",
        "already_there": "{messages, blobs, profiles, events} whose id the mailbox already had: left as they are.",
        "next": "After a dry run that would add something: the command that imports it.",
    },
    notes=("A bad file is a JSON error listing each bad line (up to 50) and what is wrong with it; nothing is "
           "imported. Watches waiting for imported unread mail are woken.",
           "Reads JSON Lines only (describe export documents every record); an mbox export is refused as one. "
           "Exports written by earlier versions still import: a field the format has since dropped is checked "
           "and left out.",
           "This is also how a mailbox moves between backends record by record; `copy` moves a whole mailbox in "
           "one step."),
    examples=("import team.jsonl --dry-run", "import team.jsonl", "import -"),
))

register(Command(
    name="cleanup",
    summary="Delete messages older than an age you choose. The only bulk deletion; there is no default "
    "age, and nothing else ever deletes a message.",
    mutating=True,
    args=(
        Arg("--older-than", INT, "Age in DAYS. Required: a default would be a retention policy nobody "
            "chose. 0 means everything sent before now.", required=True, minimum=0, maximum=36_500),
        Arg("--dry-run", FLAG, "Report what would be deleted, delete nothing."),
    ),
    output={
        "dry_run": "true when nothing was deleted because --dry-run was given.",
        "cutoff": "Messages that arrived before this time are (or would be) deleted. A delayed message arrives "
        "at its delivery time, so one not yet delivered is never deleted.",
        "deleted_count": "Messages deleted (or that would be).",
        "oldest_deleted": "Arrival time of the oldest of them, or null.",
        "newest_deleted": "Arrival time of the newest of them, or null.",
        "sessions_deleted": "Liveness records (watch sessions, heartbeats, harness sessions, and each identity's "
        "activity per machine) last seen before the cutoff, deleted (or that would be).",
        "events_deleted": "System-channel events older than the cutoff deleted (or that would be).",
        "attachments_deleted": "Stored attachment contents no remaining message refers to, deleted (or that "
        "would be).",
        "temporary_files_deleted": "Files left beside the mailbox by a mailbox creation that was killed, "
        "removed (or that would be).",
    },
    modes={"--dry-run": "Same fields, counting what would be deleted; dry_run is true."},
    examples=("cleanup --older-than 30 --dry-run", "cleanup --older-than 30"),
))

register(Command(
    name="copy",
    summary="Copy a whole mailbox into this one (AGENT_MAIL_DB, or --to): how a team moves its SQLite mailbox onto "
    "PostgreSQL, or takes a PostgreSQL one back to a file. Message ids, insertion order, threads, every "
    "recipient's read/ack/archive/delete state, schedules, attachments, profiles, system events, sessions, "
    "access tokens (their hashes) and file reservations, in one transaction, then counted against the source. "
    "Refuses a target that holds anything unless --merge.",
    mutating=True,
    args=(
        Arg("--from", TEXT, "The mailbox to copy: a SQLite file path or a postgresql:// URL.", required=True),
        Arg("--to", TEXT, "The mailbox to copy into (default: the one AGENT_MAIL_DB names, created if new)."),
        Arg("--merge", FLAG, "Copy into a target that already holds mail: records it lacks are added (appended "
            "in insertion order), records it has (same id) are kept as they are."),
        Arg("--dry-run", FLAG, "Open both and count, copy nothing."),
    ),
    output={
        "source": "The mailbox copied from (a URL without its password).",
        "target": "The mailbox copied into.",
        "dry_run": "true when nothing was copied.",
        "merge": "Whether --merge was given.",
        "source_counts": "{table: rows} in the source.",
        "target_counts_before": "{table: rows} in the target before the copy.",
        "target_counts": "{table: rows} in the target after the copy.",
        "copied": "{table: rows added}.",
        "verified": "true when the target now holds at least as many rows of every table as the source (into "
        "an empty target: exactly as many, or the copy is rolled back).",
    },
    examples=("copy --from ~/.agent-mail/mail.db", "copy --from ~/.agent-mail/mail.db --dry-run",
              "copy --from postgresql://agents@db.internal/team --to ./team-backup.db"),
))

register(Command(
    name="doctor",
    summary="Check the mailbox: integrity of the file, schema, counts, leftover temporary files. With --repair, "
    "save every readable record of a damaged mailbox into a fresh one, keep the damaged file aside, and report "
    "what could not be saved; and remove the leftover temporary files.",
    mutating=True,
    args=(
        Arg("--repair", FLAG, "Rebuild the mailbox from what can still be read, and remove the temporary files "
            "killed processes left beside it. Stop other agent-mail processes first; their open handles keep the "
            "damaged file."),
    ),
    output={
        "path": "The mailbox checked.",
        "ok": "true when the file passed SQLite's integrity check and the schema is complete.",
        "integrity": "SQLite's integrity_check findings: [] when clean (at most 100 listed).",
        "schema": "{migrations_applied, migrations_expected, application_id_ok, missing_tables}.",
        "counts": "Rows per table, as far as they could be counted ({table: n or null}).",
        "damage_marker": "The record left when a command met damage ({path, found_at, command, error}), or null.",
        "temporary_files": "Leftover files of killed mailbox creations beside the mailbox (their process is gone); "
        "doctor --repair removes them (so does cleanup).",
        "temporary_files_removed": "With --repair: the leftover files it removed. Without: [].",
        "repair": "With --repair: {complete, summary, saved: {table: n}, lost: {table: {rows_estimated, "
        "more_unknown}} (null when the damaged file's list of tables is lost, so what it held cannot be told), "
        "unsaved: [{table, rowid, id, reason} or {table, after_rowid, up_to_rowid, ids, reason}], unsaved_count, "
        "altered, altered_count, damaged_file: {size_bytes, size_in_header_bytes, cut_short}, damaged_copy, mailbox}. "
        "complete is true only when every row the damaged file held was saved; a file cut short is read as far as "
        "it goes and its lost rows are estimated from the rowids its surviving pages name. Without: null.",
        "next": "What to do about what was found, as literal commands.",
    },
    modes={"--repair": "Rebuilds only a damaged mailbox; a healthy one is left as it is (repair is null). Leftover "
           "temporary files are removed either way."},
    notes=("A command that meets damage refuses to write anything more into the mailbox and leaves a marker beside "
           "it (NAME.damaged); every command but describe and doctor then refuses until doctor finds the file "
           "healthy or --repair has rebuilt it.",),
    examples=("doctor", "doctor --repair"),
))


register(Command(
    name="mcp",
    extra="mcp",
    summary="Serve this mailbox to a model as MCP tools over stdio (for a harness: Claude Code, Codex, Gemini CLI). "
    "One tool per command a model needs (send, read, ack, watch with a bounded wait, status, heartbeat, dismiss, "
    "archive, delete, cancel, notifications, attachments), the same arguments without dashes, the same checks and "
    "the same JSON results, with `next` steps given as tool calls. Needs the mcp extra: pip install "
    "'agent-mail[mcp]'.",
    args=(
        Arg("--agent", IDENTITY, "This session's identity (project:name; default AGENT_MAIL_AGENT): the tools' "
            "agent / from default to it, and the session acts as no other (a call naming another identity is "
            "refused) unless --supervisor. Required without --supervisor."),
        Arg("--supervisor", FLAG, "A supervisor's server: calls may name any identity (read, handle and send as "
            "it). Without --agent every call names its identity. agent-mail setup never writes this."),
        Arg("--root", PATH, "Another directory tree whose files send may attach, reference (ref, refs) or read a "
            "body from (repeatable). The directory the server starts in is always one; paths are resolved, links "
            "included, before they are checked.", repeat=True),
        Arg("--save-root", PATH, "The directory under which the attachments tool may save files (default: the "
            "directory the server starts in); save_to is taken relative to it and may not leave it."),
    ),
    output={},
    notes=("Speaks JSON-RPC on stdin/stdout until the client closes them; prints nothing else on stdout. A setup "
           "that cannot start (the extra missing) is a JSON error on stderr, exit 1.",
           "A session is bound to its identity: a call that names another (send's from, the agent of read, ack, "
           "watch and the others, cancel's sender, search's agent) is refused naming that argument, unless the "
           "server is a supervisor's. Files a send names (attach, ref, refs, body_file) must lie inside the "
           "working directory or a --root; body_file - (standard input) is refused: stdin is the connection.",),
    examples=("mcp --agent deploy:worker", "mcp --agent deploy:worker --root ~/shared-specs",
              "mcp --agent ops:human --supervisor"),
))


register(Command(
    name="dashboard",
    summary="The supervisor's live view of this mailbox in the terminal (a browser has the web console of agent-mail "
    "serve, /ui/): Fleet (one "
    "row per identity: watch state, live sessions, unread, unacked, age of the oldest unacked, last seen; problems "
    "first: deaf with mail, overdue, stale, bounced), Traffic (sends as they land, per-recipient state, threads, "
    "bodies, refs, attachments), each identity's Inbox as it would see it, and Charts (sends per hour, unread and "
    "unacked over the last day). Looking marks nothing read. With --as, step in as that identity (marked human): "
    "send, reply, broadcast, cancel, and ack/dismiss/archive its own mail. Updates ride the same wake-up a watch "
    "uses. Needs the tui extra: pip install 'agent-mail[tui]'. Press ? inside for the keys.",
    args=(
        Arg("--project", PROJECT, "Show only this project's identities and traffic."),
        Arg("--as", IDENTITY, "Step in as this identity (project:name): its profile is marked human, and the "
            "send, reply, broadcast, cancel, ack, dismiss and archive keys act as it. Without it the dashboard "
            "only looks."),
        Arg("--overdue-minutes", NUMBER, "Unacked mail older than this makes its identity overdue (default 30; "
            "+ and - change it on screen).", minimum=1, maximum=10080),
        Arg("--web", REMOVED, "Removed.", removed_because="was removed: it served this terminal app to a browser "
            "without a login. The web console replaces it: run agent-mail serve and open http://127.0.0.1:8025/ui/ "
            "(sign in with a supervisor's token; docs/console.md)."),
        Arg("--port", REMOVED, "Removed.", removed_because="was removed with --web: the web console is served by "
            "agent-mail serve (--listen HOST:PORT) at /ui/."),
    ),
    output={},
    notes=("Draws in the terminal until q (or ctrl+c); prints nothing on stdout. A mailbox that cannot be opened, "
           "or the extra missing, is a JSON error on stderr (exit 1) before anything is drawn. A lost PostgreSQL "
           "connection is shown on screen and retried. Honours NO_COLOR.",),
    examples=("dashboard", "dashboard --as ops:human", "dashboard --project deploy --overdue-minutes 10"),
))

register(Command(
    name="hook",
    summary="Run by a harness's hooks (set up by `agent-mail setup`), never by hand: reads the hook's JSON input "
    "on stdin (Copilot CLI's camelCase input too). context (SessionStart / sessionStart, UserPromptSubmit / "
    "BeforeAgent / userPromptSubmitted, PostToolUse / AfterTool / postToolUse / Mistral Vibe's post_tool): adds the "
    "envelopes of mail new to this session, the unread count, bounces and the next steps to the model's "
    "context, quiet when nothing is new, marking nothing read. stop: holds the stop once when mail the "
    "session was not told of arrived (Mistral Vibe's post_agent: also its first, which has no session start). "
    "wait: the idle waiter (Claude Code's asyncRewake hook; OpenCode's plugin and Pi's extension, which start a turn "
    "with its note), blocking like watch "
    "until such mail arrives, then exit 2 with the envelopes on stderr (wakes an idle session); for Codex and Qwen "
    "Code it starts the session's waker detached and returns at once: the waker waits the same way and hands the "
    "envelopes to the session as a prompt (Codex's queue command; Qwen Code's dual-output input file). end: the "
    "session ended. pretool (Claude Code, Codex and Qwen Code PreToolUse, Gemini CLI BeforeTool, Copilot CLI "
    "preToolUse, OpenCode's plugin and Pi's extension before each tool that edits, Mistral Vibe's pre_tool before "
    "write_file and edit): denies "
    "an edit of a file another live identity holds exclusively, saying who holds it, why, until when and the send "
    "that asks them; silent for any other tool or file.",
    args=(
        Arg("harness", TEXT, f"{', '.join(HARNESSES[:-1])} or {HARNESSES[-1]}.", required=True,
            choices=HARNESSES),
        Arg("event", TEXT, "context, stop, wait, end or pretool.", required=True,
            choices=("context", "stop", "wait", "end", "pretool")),
        Arg("--agent", IDENTITY, "This session's identity (project:name); default AGENT_MAIL_AGENT."),
    ),
    output={"hookSpecificOutput": "context: {hookEventName, additionalContext} for the harness (printed only when "
            "there is something new; Copilot CLI gets a top-level additionalContext instead). pretool (Claude Code, "
            "Codex, Qwen Code, OpenCode, Pi): {hookEventName: PreToolUse, permissionDecision: deny, "
            "permissionDecisionReason} when the edit is refused (OpenCode's plugin throws the reason; Pi's extension "
            "blocks the call).",
            "hook_specific_output": "Mistral Vibe only: context's {additional_context} (printed only when there is "
            "something new).",
            "system_message": "Mistral Vibe only: stop's line for the person, with decision and reason.",
            "additionalContext": "Copilot CLI only: context's note, top-level (printed only when there is something "
            "new).",
            "permissionDecision": "Copilot CLI only: pretool's \"deny\" (with permissionDecisionReason) when the edit "
            "is refused.",
            "decision": "stop: \"block\" (Claude Code, Codex, Qwen Code's Stop, Copilot CLI's agentStop) or "
            "\"deny\" (Gemini CLI's AfterAgent, Mistral Vibe's post_agent) when the stop "
            "is held (printed only then; Gemini CLI gets {} when there is nothing to say). pretool (Gemini CLI's "
            "BeforeTool, Mistral Vibe's pre_tool): \"deny\" when the edit is refused.",
            "reason": "stop: the envelopes and what to do, shown to the model as its next turn. pretool (Gemini CLI, "
            "Mistral Vibe): "
            "who holds the file, why, until when, and the send that asks them."},
    modes={"wait": "Prints nothing on stdout. Claude Code: exit 2 with the note on stderr when mail arrives, 0 when "
                   "the wait ends (55 minutes, a newer waiter, the harness gone, or a run nobody waits on: claude -p, "
                   "the SDK). Codex, Qwen Code: exit 0 at once, the waker detached (none for codex exec or qwen -p)."},
    examples=(f"hook {HARNESSES[0]} context --agent deploy:worker",),
))


register(Command(
    name="setup",
    summary="Connect a harness to this mailbox in one step: its hooks (mail in the model's context, a stop held "
    "once for mail that arrived, and for Claude Code, OpenCode, Pi, Codex and Qwen Code an idle session woken when "
    "mail "
    "arrives) and the agent-mail "
    "MCP server, already allowed. Merges into existing settings (nothing else touched), idempotent, atomic; --dry-run "
    "shows the diff, --remove takes out only what it added. Records the identity and the mailbox resolved now, "
    "after checking that the mailbox can be opened (it creates nothing there); for Claude Code the personal values "
    "(interpreter, identity, mailbox) go in .claude/settings.local.json, not the .mcp.json a team commits. With an "
    "agent-mail server's URL as the mailbox, the MCP entry is the server's /mcp over HTTP, its token read from "
    "AGENT_MAIL_TOKEN in the environment (written in no file).",
    args=(
        Arg("harness", TEXT, f"The harness: {', '.join(HARNESSES[:-1])} or {HARNESSES[-1]} (the files each one's "
            "setup writes are in its output's files, and in docs/harnesses.md).", required=True,
            choices=HARNESSES),
        Arg("--agent", IDENTITY, "The identity the harness's sessions use (project:name).", required=True),
        Arg("--dir", PATH, "The project directory the harness starts in (default: the current directory)."),
        Arg("--dry-run", FLAG, "Show what would change (a diff per file); write nothing."),
        Arg("--remove", FLAG, "Take out what setup added; leave everything else."),
    ),
    output={
        "harness": "The harness set up.",
        "agent": "The identity recorded.",
        "mailbox": "The mailbox recorded (where AGENT_MAIL_DB points now, or the default): its file, its "
        "PostgreSQL URL without a password, or the agent-mail server's URL.",
        "dir": "The project directory.",
        "removed": "true with --remove.",
        "dry_run": "true when nothing was written.",
        "files": "Per file: path, action (create, update, remove, unchanged) and diff (unified). The last is "
        "DIR/.agent-mail-db, which names the mailbox for any agent-mail command run in DIR or below; --remove takes "
        "it out once no other harness set up there uses it, and removes a harness directory it left empty.",
        "wakes_idle_session": "Whether this harness's idle session is woken when mail arrives.",
        "token": "Through an agent-mail server (AGENT_MAIL_DB an http(s):// URL): where the harness's MCP entry "
        "reads the token, {variable, set, file_variable, file_set} (AGENT_MAIL_TOKEN: no file holds it); never the "
        "token itself. null for a mailbox opened here, and with --remove.",
        "notes": "What the harness now does, and what it does not.",
    },
    examples=(f"setup {HARNESSES[0]} --agent deploy:worker", f"setup {HARNESSES[0]} --agent deploy:worker --dry-run",
              f"setup {HARNESSES[0]} --agent deploy:worker --remove"),
    mutating=True,
    needs_mailbox=False,
))


register(Command(
    name="token",
    summary="Manage the access tokens of `agent-mail serve`, on the mailbox itself (the operator's side, like copy). "
    "create: a token that acts only as the identities it names (P:N exactly, P:* a project, '*' any), printed "
    "once: the mailbox keeps only its hash; --expires-in makes it expire. list: every token, never its secret, with "
    "when each was last used. rotate ID: a new token with the same identities, shown once; the old one works for "
    "the --grace (1h by default) and is refused after. revoke ID: refused from then on, a wait already made with "
    "it included.",
    mutating=True,
    args=(
        Arg("action", TEXT, "create, list, rotate or revoke.", required=True,
            choices=("create", "list", "rotate", "revoke")),
        Arg("id", TEXT, "rotate, revoke: the token's id (from create or list)."),
        Arg("--agent", TEXT, "create: an identity the token acts as: project:name, project:* (every identity of "
            "the project) or '*' (any: an operator's token); repeatable.", repeat=True),
        Arg("--supervisor", FLAG, "create: the token may also look at everything (status, search, read "
            "--no-mark-read, threads) without acting as anyone it does not name."),
        Arg("--note", TEXT, "create: who or what the token is for (shown by list)."),
        Arg("--expires-in", TEXT, "create, rotate: refused after this long: a number with s, m, h, d or w (30d, "
            "12h), or of seconds. rotate without it: the new token expires when the old one would have."),
        Arg("--grace", TEXT, "rotate: how long the old token still works (0: not at all; 10m, 1h, 2d). Default "
            "1h: long enough to hand the new one out; never past the old token's own expiry."),
    ),
    output={
        "id": "create, rotate, revoke: the token's id (not secret); rotate: the new token's.",
        "token": "create, rotate: the secret to give the agent (AGENT_MAIL_TOKEN, or a 0600 file named by "
        "AGENT_MAIL_TOKEN_FILE). Shown this once; the mailbox keeps only its hash.",
        "agents": "create, rotate: the identities it acts as.",
        "supervisor": "create, rotate: whether it may look at everything.",
        "note": "create, rotate: its note.",
        "created": "create, rotate: when.",
        "expires_at": "create, rotate: when it will be refused, or null (never).",
        "replaces": "rotate: the old token's id.",
        "old_valid_until": "rotate: when the old token is refused (now plus the grace, or its own expiry if sooner).",
        "tokens": "list: [{id, agents, supervisor, note, created, expires_at, expired, last_used, rotated_to, "
        "revoked_at}], oldest first; never a secret. last_used: when the server last took it (to the minute), or "
        "null; rotated_to: the token that replaced it.",
        "count": "list: how many.",
        "revoked": "revoke: true (revoking a token already revoked is refused).",
        "revoked_at": "revoke: when.",
    },
    notes=("A token protects against an agent acting as another identity through the server. It does not protect "
           "against a process that can read the agent's token (its environment or its token file): that process "
           "can act as that agent.",),
    examples=("token create --agent deploy:worker --note 'build box'", "token create --agent 'ops:*' --supervisor",
              "token create --agent '*' --note operator", "token create --agent ci:bot --expires-in 30d",
              "token list", "token rotate 3f9c2a7d41b0 --grace 10m", "token revoke 3f9c2a7d41b0"),
))


WEBHOOK_EVENTS = ("mail", "deaf", "bounce", "clash")
WEBHOOK_DELIVERY_FIELDS = "{id, webhook_id, kind, created, due_at, attempts, state, last_status, last_error, done_at}"

register(Command(
    name="webhook",
    summary="Tell people when something happens: signed HTTP POSTs that `agent-mail serve` sends for events of the "
    "mailbox (the operator's side, like token: on the mailbox itself, or through a server with an operator's "
    "token). add: a webhook for --agent identities and/or --event kinds (mail: new mail for an identity; deaf: an "
    "identity with unread mail and nobody listening for --after-minutes; bounce: a send refused for a recipient; "
    "clash: a reserve refused because another identity holds the files). list: every webhook with its recent "
    "deliveries and failures, never its secret. remove ID: no more deliveries. Events are queued in the mailbox "
    "when they happen, whoever commits them; only a running agent-mail serve on the mailbox delivers them.",
    mutating=True,
    args=(
        Arg("action", TEXT, "add, list or remove.", required=True, choices=("add", "list", "remove")),
        Arg("id", TEXT, "remove: the webhook's id (from add or list)."),
        Arg("--url", TEXT, "add: where to POST: an http:// or https:// URL (a Slack incoming webhook's with "
            "--format slack). Shown afterwards with its path cut after the first part (a Slack URL's path is "
            "its secret)."),
        Arg("--agent", IDENTITY, "add: an identity the webhook is about (mail for it; it deaf; a bounce of its "
            "send or for it; a clash it asked or holds); repeatable. It must be known to the mailbox (in its "
            "traffic, watches or profiles). Without --event: new mail for these identities. Without --agent: "
            "the --event kinds for every identity.", repeat=True),
        Arg("--event", TEXT, "add: an event kind to POST: mail, deaf, bounce or clash; repeatable.", repeat=True,
            choices=WEBHOOK_EVENTS),
        Arg("--secret-file", PATH, "add: a file (only its owner may read it) whose first line is the secret each "
            "POST is signed with (X-Agent-Mail-Signature: sha256=HMAC-SHA256 of the raw body); 16 to 1000 "
            "characters. Read on this machine; the mailbox keeps it so the server can sign; never shown again."),
        Arg("--format", TEXT, "add: json (the event as JSON, the default) or slack ({\"text\": ...}, what a "
            "Slack-compatible incoming webhook takes).", choices=("json", "slack")),
        Arg("--after-minutes", NUMBER, "add, with --event deaf: how long an identity must have unread mail with "
            "nobody listening before the event (default 10; fractions allowed: 0.05 is 3 s).", minimum=0.01,
            maximum=10080),
        Arg("--with-body", FLAG, "add: put the message's body in mail events (left out unless asked)."),
    ),
    output={
        "id": "add, remove: the webhook's id.",
        "url": "add: where it POSTs, the path cut after its first part.",
        "agents": "add: the identities it is about ([]: every identity).",
        "events": "add: the event kinds it POSTs.",
        "format": "add: json or slack.",
        "after_minutes": "add: deaf's minutes, or null.",
        "with_body": "add: whether mail events carry the body.",
        "created": "add: when.",
        "delivered_by": "add: who delivers: 'agent-mail serve' (events are queued in the mailbox from now on; a "
        "mailbox no server serves keeps them queued, and they fail once an hour has passed undelivered).",
        "webhooks": "list: [{id, url, agents, events, format, after_minutes, with_body, created, deliveries: {pending, "
        "delivered, failed}, recent: the newest five " + WEBHOOK_DELIVERY_FIELDS + "}], oldest first; never a secret.",
        "failures": "list: the newest 20 failed deliveries of every webhook, " + WEBHOOK_DELIVERY_FIELDS + ".",
        "count": "list: how many webhooks.",
        "removed": "remove: true.",
        "dropped": "remove: how many of its deliveries were still pending (never sent now).",
    },
    notes=("Each POST carries X-Agent-Mail-Delivery: the delivery's id (also the body's `id`), the same on every "
           "retry, so a receiver drops repeats (delivery is at least once); and X-Agent-Mail-Signature: "
           "sha256=HEX, the HMAC-SHA256 of the raw body under the secret. The JSON body: {id, kind, time, "
           "webhook, agent, message: {id, sender, recipient, subject (, body with --with-body)}} for mail, with "
           "kind-specific fields for deaf (unread, since, after_minutes), bounce (reason) and clash (repo, "
           "patterns, holders).",
           "A POST answered 2xx is delivered. No answer, a timeout (5 s), 408, 429 or a 5xx is retried after 2 s, "
           "then doubling up to 5 minutes, for an hour after the event, then recorded failed; any other answer "
           "(a 4xx, a redirect) is recorded failed at once. Each event is delivered by one server of several "
           "replicas, within seconds of its commit."),
    examples=("webhook add --url https://hooks.example.com/agent-mail --agent ops:alice --secret-file ~/.am-hook",
              "webhook add --url https://hooks.slack.com/services/T0/B0/XXXX --event deaf --after-minutes 15 "
              "--event bounce --secret-file ~/.am-hook --format slack",
              "webhook list", "webhook remove 3f9c2a7d41b0"),
))


register(Command(
    name="serve",
    extra="server",
    summary="Serve the mailbox AGENT_MAIL_DB names (a file or a postgresql:// URL) over HTTP, so agents on other "
    "machines use it with AGENT_MAIL_DB=http(s)://HOST:PORT and a token (agent-mail token create). Every command "
    "works through it with the same arguments, output and exit codes; each call acts only as the identities its "
    "token names. Logs one JSON line per request on stderr (never a token); stops cleanly on SIGTERM, ending its "
    "waits. Needs the server extra: pip install 'agent-mail[server]'.",
    args=(
        Arg("--listen", TEXT, "HOST:PORT to listen on (default 127.0.0.1:8025; port 0 picks a free one, printed "
            "on stderr). An address other than loopback needs --tls-cert and --tls-key, or --insecure-no-tls."),
        Arg("--tls-cert", PATH, "The certificate (PEM) to serve HTTPS with."),
        Arg("--tls-key", PATH, "Its private key (PEM, unencrypted). Both files are read and loaded as a pair "
            "before the server listens: a file this user cannot read, or a key that is not the certificate's, "
            "is exit 2 naming it."),
        Arg("--insecure-no-tls", FLAG, "Serve plain HTTP on an address other than loopback: tokens and mail cross "
            "the network in clear. Only behind a proxy that terminates TLS on the same host or network you trust."),
        Arg("--forwarded-allow-ips", TEXT, "The proxies whose X-Forwarded-For (and X-Forwarded-Proto) is trusted: "
            "comma-separated addresses or networks (127.0.0.1, 10.0.0.0/8), e.g. the address your nginx or Caddy "
            "connects from. A request from one of them counts as from the client the header names (wrong tokens "
            "are slowed per client address); from anyone else the header is ignored. Default: "
            "AGENT_MAIL_FORWARDED_ALLOW_IPS, else none (the header is never trusted)."),
    ),
    output={},
    requires=(("--tls-cert", "--tls-key"), ("--tls-key", "--tls-cert")),
    exclusive=(("--insecure-no-tls", "--tls-cert"),),
    modes={"serving": "Prints nothing on stdout; on stderr a JSON line {listening: URL} once it listens, then one "
           "line per request: {time, method, path, command, as, token_id, status, exit, ms} (a 5xx's with its "
           "error)."},
    notes=("Webhooks (agent-mail webhook): the server POSTs the events queued in the mailbox's outbox, woken by "
           "their commits, each by one server of several replicas; a POST gets AGENT_MAIL_WEBHOOK_TIMEOUT_SECONDS "
           "(5) to answer, and a failing one is retried for AGENT_MAIL_WEBHOOK_RETRY_SECONDS (3600) after its "
           "event. One JSON line per attempt on stderr: {webhook, delivery, kind, url (its path cut), status, "
           "error, outcome, attempt, ms}.",
           "API: POST /v1/call/COMMAND with a JSON object of the command's values by argument name (reply_to, "
           "from, agent...) and Authorization: Bearer TOKEN. The answer is the command's own result document, "
           "its exit code in the X-Agent-Mail-Exit header; an error is {error, problems} with HTTP 400 (exit 2), "
           "401 or 403 (exit 4), 500 or 503 (exit 1). GET /openapi.json describes it all (OpenAPI 3.1, from this "
           "manual).",
           "export is POST /v1/export (the export as the body, its summary in X-Agent-Mail-Result; the client "
           "writes --output on its own machine); import is POST /v1/import[?dry_run=true] with the export as the "
           "body (an operator's token).",
           "MCP over streamable HTTP at /mcp, the identity taken from the bearer token (setup HARNESS --agent "
           "P:N with AGENT_MAIL_DB naming this server writes that entry). POST /v1/follow and /v1/dashboard carry "
           "the client-side notification mirror and the dashboard. GET /v1/health (and /v1/health/live) is liveness, "
           "{ok, stopping}; GET /v1/health/ready is readiness, 503 with the reason while the database cannot be "
           "reached or a migration is pending; GET /metrics is the Prometheus text format (a supervisor's or an "
           "operator's token).",
           "A watch through it reads as on the mailbox's machine: a client stopped by SIGTERM, SIGINT or SIGHUP "
           "releases its session before it exits (POST /v1/watch/stop with its request's stop_key, on any replica), "
           "and a killed one leaves it stale at once.",
           "On PostgreSQL one LISTEN connection per server process carries every blocked watch, and calls share a "
           "pool of 8 connections. A send carries an idempotency key (stored once when repeated). A read that "
           "marks is delivered, then confirmed: with deliver=confirm the server holds the marks and names the "
           "delivery (X-Agent-Mail-Delivery); the client prints, then POST /v1/delivered {delivery, printed} marks "
           "the mail (or, printed=false, leaves it unread); unconfirmed, it is delivered again after 60 s. A "
           "request's token is checked before any of its body is read (401, WWW-Authenticate: Bearer), and wrong "
           "tokens from one address are answered ever later (AGENT_MAIL_SERVE_PENALTY_SECONDS, 0.05 doubling to "
           "_PENALTY_MAX_SECONDS, 5), a right one never; the address is the connection's, or the one "
           "X-Forwarded-For names when the connection comes from a proxy named by --forwarded-allow-ips. A request's "
           "head must arrive within AGENT_MAIL_SERVE_READ_SECONDS (30), the whole request, chunked or not, within "
           "that plus its body at AGENT_MAIL_SERVE_MIN_BODY_RATE (65536 bytes/s) and at most "
           "AGENT_MAIL_SERVE_REQUEST_SECONDS (900): later is 408; over the size cap 413; headers over 16 KiB 431; a "
           "JSON body holding more than 100000 values or nesting deeper than 32 levels is 400 naming the member that "
           "held them, refused as it arrives (never parsed). Off loopback (a literal address: "
           "localhost is a name, not taken for one), TLS or --insecure-no-tls, which logs a warning line first.",
           "hook, guard and reserve, release, reservations run on the client's machine (the harness's input and "
           "process, the git checkout: the repository is located there and sent as POST /v1/call/... values "
           "`located: {key, fold}` with paths from its root) and carry their mailbox steps to the server: "
           "POST /v1/call/hook with `session` answers {output, wake, note, waiter}. A harness session through a "
           "server counts as live while its hooks show signs of life (10 minutes; Claude Code's waiter keeps it "
           "fresh while idle and ends it when the harness dies)."),
    examples=("serve", "serve --listen 0.0.0.0:8025 --tls-cert cert.pem --tls-key key.pem",
              "serve --listen 127.0.0.1:8025 --forwarded-allow-ips 127.0.0.1"),
))


register(Command(
    name="run",
    summary="Run a harness that cannot be woken from outside (Gemini CLI, Copilot CLI) in a pseudo-terminal of its "
    "own, passed through unchanged (keys, resizes, colours, ctrl+z and fg, its exit status), and wake it when mail "
    "arrives: while it sits idle at an empty prompt, type one line (never the mail: `agent-mail: new mail for P:N "
    "...`) and Enter, which its prompt hook (agent-mail setup) answers with the envelopes. Types only into a harness "
    "set up in this directory (or above); any other program (a shell, vim) is told by the terminal's title and bell. "
    "Never types while the person has unsent text at the prompt or typed in the last 3 s, while a dialog, a "
    "full-screen program or a turn under way shows; a flood of mail folds into one wake, at most one every 10 s. "
    "While it can type, the identity has an armed watch (status: woken now); while it cannot, no watch is armed. "
    "Waiting marks nothing read.",
    args=(
        Arg("command", TEXT, "The harness and its arguments, after --: agent-mail run -- gemini --model x.",
            required=True, repeat=True),
        Arg("--agent", IDENTITY, "The identity whose mail wakes it (project:name); default AGENT_MAIL_AGENT, as "
            "setup records it for the harness's hooks."),
    ),
    output={},
    modes={"running": "Prints nothing on stdout of its own: the terminal is the harness's (but for the title and bell "
           "that tell of mail a program that is not a set-up harness). Exits with the harness's exit status (128+N "
           "when a signal N ended it). SIGHUP (the terminal went away), SIGTERM or SIGINT sent to run end the "
           "harness's process group with it (SIGKILL after 3 s), then run exits 128+N. When the harness stops "
           "(ctrl+z), run stops too (SIGTSTP, the terminal's modes given back); continued (fg), it continues the "
           "harness."},
    notes=("Standard input must be a terminal (a person's); otherwise a JSON error, exit 2, before anything starts.",
           "A set-up harness: the command's file name is a harness's (gemini, copilot, claude, codex, qwen, opencode, "
           "pi) "
           "and its hooks file from agent-mail setup is in the current directory or one above. Anything else gets "
           "no keys from run: mail sets the terminal's title to `agent-mail: new mail for P:N` (OSC 0/2) and rings "
           "the bell, at most once every 10 s.",
           "Idle means: the harness has written nothing for 0.4 s; the person has pressed no key for 3 s; the prompt "
           "is empty: for Gemini CLI and Copilot CLI the screen shows their empty prompt (a placeholder, a footer "
           "hidden by typed text and by dialogs); for other harnesses the keys say so (counted as typed; up, down, "
           "tab and other editing keys count as unsent text until Enter or ctrl+u/ctrl+c; Esc, moves and function "
           "keys do not) and no program is on the alternate screen (vim, less); the last lines of the screen (a "
           "small screen model of the harness's output) show no approval dialog and no turn under way (\"esc to "
           "cancel\"). The "
           "trigger is typed, seen on the screen, then Enter 0.1 s later; not seen within 2 s, it is erased and tried "
           "again (3 tries, then 3 more after 10 s, then that wake is given up, said on stderr when run exits). Where "
           "the mailbox knows the harness session under run (its hooks recorded it), an Enter the prompt hook did "
           "not answer within 3 s is pressed once more.",
           "Mail the person's own prompt carried (they pressed Enter after it arrived), or that the harness's hooks "
           "told its session during a turn, wakes nothing. Mail already waiting when run starts is told by the "
           "session-start hook, not typed.",
           "Through an agent-mail server (AGENT_MAIL_DB an http(s):// URL) the wait is the server's watch; while mail "
           "the harness was woken for is still unread, or while run cannot type, it looks again every 3 s (watch "
           "--once, a heartbeat)."),
    examples=("run --agent deploy:worker -- gemini", "run -- copilot", "run --agent ops:bot -- gemini --model flash"),
))
