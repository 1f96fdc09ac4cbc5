"""The mail commands declared: describe, send, read, ack, watch, heartbeat, dismiss, archive, delete, cancel,
attachments, profile, notifications, status."""

from __future__ import annotations

from agent_mail import model
from agent_mail.spec.base import (COMMAND, ENVELOPE_FIELDS, FIELDS, FIELDS_HELP, FLAG, IDENTITY, INT, JSON,
                                  MAIL_IS_DATA, MESSAGE_FIELDS, MESSAGE_ID, MIRROR_ENTRY_FIELDS, NEXT_HELP, NUMBER,
                                  PATH, PROJECT, REACHABLE_HELP, RECIPIENT, REMOVED, STATUS_FIELDS, TEXT, Arg, Command,
                                  register)


register(Command(
    name="describe",
    summary="Print this manual as JSON: every command, argument, output field and example, plus the "
    "mailbox this invocation resolves. Never creates the mailbox.",
    args=(
        Arg("command", COMMAND, "Describe only this command."),
    ),
    output={
        "name": "Program name.",
        "version": "Program version.",
        "description": "What agent-mail is.",
        "identity": "The identity format.",
        "invariants": "Rules that hold for every command.",
        "exit_codes": "What each exit status means.",
        "limits": "Limits enforced on input.",
        "liveness": "The fixed timings behind watching, watch_state and reachable.",
        "environment": "The environment variables agent-mail reads.",
        "global_flags": "Flags that stand instead of a command: --version, --help.",
        "storage": "The mailbox this invocation resolves, with its backend. SQLite: path, source, exists, messages, "
        "size_bytes, and permissions {directory, file, private, warning}: a mailbox other users can read is "
        "reported here; one they can write is refused by every other command. PostgreSQL: url (never with its "
        "password), source, schema, exists, messages, server_version, migrations, or problem when it cannot be "
        "reached. source says how it was chosen: AGENT_MAIL_DB (set in the environment), the path of the "
        ".agent-mail-db file that named it (the working directory's, or the nearest one above it: agent-mail "
        "setup writes it), or default.",
        "commands": "Every command's manual, keyed by name.",
    },
    modes={"describe COMMAND": "Prints {name, storage, command: <that command's manual>} instead."},
    examples=("describe", "describe send"),
    needs_mailbox=False,
))

register(Command(
    name="send",
    summary="Send a message to an agent, or to every agent with --to '*'. Recipients need no registration.",
    mutating=True,
    args=(
        Arg("--from", IDENTITY, "Your identity (project:name).", required=True),
        Arg("--to", RECIPIENT, "Recipient identity (project:name); repeat it for several (each gets its own copy "
            "and id), or give '*' alone to broadcast to everyone but you.", required=True, repeat=True),
        Arg("--subject", TEXT, f"One line, at most {model.SUBJECT_MAX_CHARS} characters: what this is about.",
            required=True),
        Arg("--body", TEXT, f"Body text, at most {model.BODY_MAX_CHARS} characters. Say what happened and "
            "what the recipient should do; put documents in files and --ref them."),
        Arg("--body-file", PATH, "Read the body from this UTF-8 file ('-' for standard input). For text that "
            "is awkward to quote, not for length: the same cap applies."),
        Arg("--ref", PATH, "A path this message points at; repeat for several. It must exist. Stored so that it "
            "names the same file to every reader: inside a git repository as the repository's key and the path from "
            "its root (github.com/acme/widget//src/lib.rs: open src/lib.rs in your clone), else as the absolute "
            "path (on the sender's machine).", repeat=True),
        Arg("--refs", JSON, "A JSON array of paths, same rules as --ref (prefer --ref: no quoting)."),
        Arg("--reply-to", MESSAGE_ID, "Id of the message you are answering. Threads the reply and marks that "
            "message read and acknowledged for you: a reply is proof it was handled."),
        Arg("--no-ack", FLAG, "With --reply-to: do not acknowledge the message you answer (it is still marked read)."),
        Arg("--delay-minutes", NUMBER, "Deliver this many MINUTES from now. Stored in the mailbox: invisible to the "
            "recipient until due, survives restarts, needs no daemon; withdraw it before then with `cancel`.",
            minimum=0, maximum=model.DELAY_MINUTES_MAX),
        Arg("--attach", PATH, f"A file to attach; repeat for several (at most {model.ATTACHMENTS_MAX_COUNT}). Read "
            f"and stored in the mailbox when you send, so it travels with the message. At most "
            f"{model.ATTACHMENT_MAX_BYTES // (1024 * 1024)} MiB a file, "
            f"{model.ATTACHMENTS_MAX_BYTES_PER_SEND // (1024 * 1024)} MiB a send.", repeat=True),
        Arg("--require-reachable", FLAG, "Refuse recipients that cannot be reached now (no live harness session, no "
            "armed watch, no heartbeat in the last 60 s, not a human). The others still get it; exit code 3 says some "
            "were refused, and "
            "each refusal is recorded in your system channel."),
    ),
    exclusive=(("--body", "--body-file"),),
    requires=(("--no-ack", "--reply-to"),),
    output={
        "id": "With exactly one recipient: the new message's id (else null; see deliveries).",
        "recipient": "With exactly one recipient: who it was addressed to (else null; see deliveries).",
        "sender": "Your identity.",
        "subject": "The subject as stored.",
        "type": "'direct' or 'broadcast'.",
        "created": "When it was stored (ISO 8601).",
        "refs": "The refs stored with it: KEY//PATH inside a git repository, else absolute paths (see --ref).",
        "attachments": "The attached files: [{name, size, sha256}].",
        "reply_to": "The message it answers, or null.",
        "acknowledged": "With --reply-to: the id marked read and acknowledged for you, else null.",
        "batch_id": "One id shared by every copy of this send.",
        "deliveries": "One entry per recipient: {recipient, id, status, reachable} plus reached_by (how it will "
        "hear of it, as status says) when reachable, deliver_at when status is 'scheduled' and reason when it is "
        "'refused' (no message was stored for it; id is null). A broadcast's one entry ('*') also has identities: how "
        "many identities it is for now (every one seen in traffic, watches or profiles, but the sender; each has "
        "its own read and ack state).",
        "delivered": "How many recipients got it now (a broadcast is one recipient, '*': see identities).",
        "scheduled": "How many will get it at deliver_at.",
        "refused": "How many were refused (non-zero means exit code 3).",
        "mirrors": "Notification files rewritten because of this send: [{agent, path, status}]; a failed "
        "render is listed with status 'failed' and never fails the send.",
        "sender_reachable": ("Whether you, the sender, can be reached for the answer: a live harness session of "
                             "yours, a watch of yours armed, or a heartbeat of yours in the last "
                             f"{model.LIVENESS_SECONDS:.0f} s."),
        "next": "When your own watch has lapsed: the command that re-arms it. Otherwise empty.",
    },
    examples=(
        'send --from research:lead --to deploy:worker --subject "Fix the deploy bug" --body "Logs attached." '
        "--ref logs/deploy-error.txt",
        'send --from research:lead --to "*" --subject "Status check" --body "Report your current status."',
        'send --from deploy:worker --to research:lead --subject "Deploy fixed" --reply-to '
        "9f1c2e34-5678-4abc-9def-0123456789ab",
        'send --from a:b --to c:d --subject "Notes" --body-file notes.md',
        'send --from lead:main --to team:one --to team:two --subject "Review" --attach report.pdf',
        'send --from lead:main --to team:one --subject "Standup" --delay-minutes 30',
        'send --from lead:main --to team:one --subject "Urgent" --require-reachable',
    ),
))

register(Command(
    name="read",
    summary="Take delivery: return this agent's unread messages (oldest first) and mark them read, "
    "after they have been printed. " + MAIL_IS_DATA,
    args=(
        Arg("agent", IDENTITY, "Whose inbox (project:name).", required=True),
        Arg("--all", FLAG, "Include messages already read: the newest --limit messages, oldest first."),
        Arg("--from", IDENTITY, "Only messages from this sender."),
        Arg("--limit", INT, "At most this many messages.", default=50, minimum=1, maximum=10_000),
        Arg("--thread", MESSAGE_ID, "Return the thread containing this message, oldest first: the messages of it "
            "this agent sent or received. Marks nothing."),
        Arg("--archived", FLAG, "List the messages you archived, oldest first. Marks nothing."),
        Arg("--no-mark-read", FLAG, "Return unread messages without marking them read."),
        Arg("--ack", FLAG, "Also acknowledge what this returns. Only when reading IS acting on it."),
        Arg("--fields", FIELDS, FIELDS_HELP),
    ),
    exclusive=(("--all", "--thread", "--archived"), ("--thread", "--ack"), ("--archived", "--ack"),
               ("--no-mark-read", "--ack")),
    output={
        "agent": "The identity read.",
        "messages": "The messages, oldest first.",
        "count": "How many are in messages.",
        "remaining": "Unread messages still waiting after this call (more than --limit were waiting).",
        "reachable": REACHABLE_HELP,
        "next": NEXT_HELP,
    },
    items_key="messages",
    item_fields=MESSAGE_FIELDS,
    modes={
        "default": "Unread messages: direct ones to you (including notes to yourself) and broadcasts from "
        "others. Marks them read once printed.",
        "--all": "The newest --limit messages, read and unread, oldest first. Marks the unread ones read.",
        "--thread ID": "The messages of that thread this agent sent or received, from its root, oldest first. "
        "Marks nothing. A thread this agent is party to none of is refused like an unknown id.",
        "--archived": "Archived messages only, oldest first. Marks nothing.",
    },
    notes=("Deleted messages never appear; archived ones only with --archived; a scheduled message only once "
           "it is due.",),
    examples=(
        "read deploy:worker",
        "read deploy:worker --all --limit 100",
        "read deploy:worker --from research:lead --fields id,subject,body",
        "read deploy:worker --thread 9f1c2e34-5678-4abc-9def-0123456789ab",
    ),
))

register(Command(
    name="ack",
    summary="Acknowledge messages: 'I acted on this'. Distinct from read; implies read. Per agent for "
    "broadcasts.",
    mutating=True,
    args=(
        Arg("agent", IDENTITY, "Who is acknowledging (project:name).", required=True),
        Arg("ids", MESSAGE_ID, "One or more message ids addressed to this agent.", repeat=True),
        Arg("--all", FLAG, "Acknowledge every message this agent has read and not yet acknowledged. Never "
            "touches unread mail (nobody was shown it): read it first, or name its ids."),
    ),
    one_of=(("ids", "--all"),),
    output={
        "agent": "The identity acknowledging.",
        "acked_at": "The time recorded for the newly acknowledged messages.",
        "acked": "Ids acknowledged by this call.",
        "already_acked": "Ids that were acknowledged before (left unchanged).",
        "count": "How many this call acknowledged.",
        "unread_left": "With --all: unread messages left alone because they were never shown (0 otherwise).",
        "reachable": REACHABLE_HELP,
        "next": NEXT_HELP,
    },
    examples=(
        "ack deploy:worker 9f1c2e34-5678-4abc-9def-0123456789ab",
        "ack deploy:worker --all",
    ),
))

register(Command(
    name="watch",
    summary="Block until this agent has unread mail, then return the envelopes (no bodies). Marks nothing "
    "read: follow it with `read`. Waiting costs nothing, and a message wakes it within milliseconds. " + MAIL_IS_DATA,
    args=(
        Arg("agent", IDENTITY, "Whose inbox to watch (project:name).", required=True),
        Arg("--timeout-minutes", NUMBER, "MINUTES to wait before returning an empty result (exit 0). Leave it "
            "alone unless you must: the default is the longest wait that still wakes inside a one-hour "
            "prompt-cache window. A timeout is the nudge to resume outstanding work, then re-arm.",
            default=model.WATCH_MINUTES_DEFAULT, minimum=model.WATCH_MINUTES_MIN, maximum=model.WATCH_MINUTES_MAX),
        Arg("--once", FLAG, "Check once and return at once, never block. Counts as a heartbeat."),
        Arg("--timeout", REMOVED, "Removed.", removed_because="was removed: it took seconds, and agents passed 30, "
            "waking every half minute to learn nothing. Use --timeout-minutes M (5 to 240, default 55), or "
            "--once for a single check."),
        Arg("--poll", REMOVED, "Removed.", removed_because="was removed: the wait is woken by the commit "
            "itself, so there is no interval to tune. Drop it; use --once for a single check."),
    ),
    exclusive=(("--once", "--timeout-minutes"),),
    output={
        "agent": "The identity watched.",
        "messages": "Envelopes of every unread message, oldest first: the set `read` delivers, page by page "
        "(read returns up to --limit, 50 by default, and says how many remain).",
        "count": "How many envelopes.",
        "timeout": "true when the wait ended with nothing to deliver (an ordinary result, exit 0).",
        "reachable": "Whether another watch of this identity is still armed now that this one has returned "
        "(normally false: re-arm).",
        "next": NEXT_HELP,
    },
    items_key="messages",
    item_fields=ENVELOPE_FIELDS,
    modes={
        "--once": "One check, no waiting; timeout is true when nothing is waiting.",
        "signals": "SIGINT, SIGTERM or SIGHUP end the wait: the session is released and a JSON error says so.",
    },
    notes=(
        "While blocked, the watch holds no transaction and no lock on the mailbox; its presence is a lock on its "
        "own wake-up pipe (SQLite) or its open connection (PostgreSQL), freed the moment it dies, so it writes "
        f"nothing while idle but a refresh every {model.HELD_REFRESH_SECONDS:.0f} s that shows it is not hung. It "
        "wakes when mail for it, or a broadcast, is committed, within milliseconds; nothing else wakes it (other "
        f"watches, heartbeats, reads, mail for others). Every {model.HELD_REFRESH_SECONDS:.0f} s it also looks at "
        "the mailbox itself, in case a wake-up was lost.",
        "The loop: watch (blocks) -> read (take delivery) -> act -> ack -> watch again. Never end a turn "
        "without a watch armed.",
        "A message sent with --delay-minutes wakes the watch when it falls due.",
    ),
    examples=("watch deploy:worker", "watch deploy:worker --timeout-minutes 120", "watch deploy:worker --once"),
))

register(Command(
    name="heartbeat",
    summary="Record that this agent is present, for agents that work without a blocked watch (e.g. from a "
    "harness hook on every tool use). Counts toward watching and last_seen like a watch refresh.",
    mutating=True,
    args=(
        Arg("agent", IDENTITY, "Who is present (project:name).", required=True),
    ),
    output={
        "agent": "The identity.",
        "last_seen": "The time recorded.",
        "unread": "Messages waiting for it.",
        "reachable": REACHABLE_HELP,
        "next": NEXT_HELP,
    },
    examples=("heartbeat deploy:worker",),
))


def _handling(name: str, summary: str, done: str, already: str, already_help: str) -> Command:
    return Command(
        name=name,
        summary=summary,
        mutating=True,
        args=(
            Arg("agent", IDENTITY, "Whose messages (project:name).", required=True),
            Arg("ids", MESSAGE_ID, "One or more message ids addressed to this agent.", required=True, repeat=True),
        ),
        output={
            "agent": "The identity.",
            done: "Ids this call changed.",
            already: already_help,
            "count": "How many this call changed.",
            "reachable": REACHABLE_HELP,
            "next": NEXT_HELP,
        },
        examples=(f"{name} deploy:worker 9f1c2e34-5678-4abc-9def-0123456789ab",),
    )


register(_handling(
    "dismiss", "Mark messages read without fetching them again (after handling them from the unread mirror).",
    "dismissed", "already_read", "Ids that were read before (left unchanged)."))
register(_handling(
    "archive", "Move messages out of the inbox: marked read, gone from `read` and `read --all`, listed by "
    "`read --archived`.", "archived", "already_archived", "Ids archived before (left unchanged)."))
register(_handling(
    "delete", "Remove messages from every view of this agent (marked read). The other parties keep their copy; "
    "only `cleanup` removes the shared record.", "deleted", "already_deleted", "Ids deleted before."))

register(Command(
    name="cancel",
    summary="Withdraw scheduled messages (sent with --delay-minutes) before they fall due.",
    mutating=True,
    args=(
        Arg("sender", IDENTITY, "Who sent them (project:name).", required=True),
        Arg("ids", MESSAGE_ID, "Ids from the send receipt's deliveries.", required=True, repeat=True),
    ),
    output={
        "sender": "The sender.",
        "cancelled": "Ids withdrawn by this call; their recipients will never see them.",
        "count": "How many.",
    },
    notes=("All or nothing: an id that is unknown, not yours, already due or already cancelled is an error and "
           "nothing is withdrawn.",),
    examples=("cancel lead:main 9f1c2e34-5678-4abc-9def-0123456789ab",),
))

register(Command(
    name="attachments",
    summary="List a message's attachments, or save them into a directory (never outside it, never "
    "overwriting unless asked).",
    mutating=False,
    args=(
        Arg("agent", IDENTITY, "Who asks: a recipient or the sender of the message.", required=True),
        Arg("id", MESSAGE_ID, "The message.", required=True),
        Arg("--save-to", PATH, "Write the attachments into this directory (created if missing). Names are made "
            "safe: no directories, no traversal, links are never followed."),
        Arg("--overwrite", FLAG, "With --save-to: replace files of the same name (regular files only)."),
    ),
    requires=(("--overwrite", "--save-to"),),
    notes=("Files are written under temporary names and moved into place only once the result has been "
           "printed: a save that fails or is killed leaves no file under a final name and replaces nothing.",),
    output={
        "agent": "The identity.",
        "id": "The message.",
        "attachments": "[{name, size, sha256}] as stored.",
        "count": "How many attachments.",
        "directory": "With --save-to: the directory written to, else null.",
        "saved": "With --save-to: [{name, path, size, sha256}] for each file written, else [].",
    },
    examples=("attachments deploy:worker 9f1c2e34-5678-4abc-9def-0123456789ab",
              "attachments deploy:worker 9f1c2e34-5678-4abc-9def-0123456789ab --save-to ./inbox-files"),
))

register(Command(
    name="profile",
    summary="Show or change an identity's optional settings. Nobody needs a profile to send or read.",
    mutating=True,
    args=(
        Arg("agent", IDENTITY, "Whose profile (project:name).", required=True),
        Arg("--human", FLAG, "This identity is a person: always reachable."),
        Arg("--mirror-dir", PATH, "Render the unread mirror to DIR/.notification/email.json (and the system "
            "channel to system.json) on every change. DIR must exist."),
        Arg("--max-entries", INT, "How many of the newest unread messages the mirror lists (count stays the total).",
            minimum=1, maximum=model.MAX_ENTRIES_LIMIT),
        Arg("--clear", TEXT, "Reset a setting: human, mirror-dir or max-entries; repeatable. Clearing mirror-dir "
            "removes the mirror files it wrote.", repeat=True),
    ),
    output={
        "agent": "The identity.",
        "human": "Whether it is a person (always reachable).",
        "mirror_dir": "Where its notification files go, or null.",
        "max_entries": f"Entries in its unread mirror (null: the default, {model.MAX_ENTRIES_DEFAULT}).",
        "updated_at": "When the profile last changed, or null if it has none.",
        "mirrors": "Notification files this call rewrote or removed: [{agent, path, status}].",
        "mirror_problem": "Why the mirror cannot be written now (its directory was removed, or is not writable), "
        "or null. The directory is never recreated: create it again, or clear mirror-dir.",
    },
    examples=("profile deploy:worker", "profile jj:human --human",
              "profile deploy:worker --mirror-dir /path/to/worktree --max-entries 20",
              "profile deploy:worker --clear mirror-dir"),
))

register(Command(
    name="notifications",
    summary="The notification views of an identity: its unread mirror and its system channel (bounces). "
    "Reading them marks nothing read.",
    mutating=True,
    args=(
        Arg("agent", IDENTITY, "Whose notifications (project:name).", required=True),
        Arg("--dismiss", MESSAGE_ID, "Dismiss this system event (id from system.events); repeatable.", repeat=True),
        Arg("--clear-email", FLAG, "Remove the email mirror file without marking anything read (it is rendered "
            "again on the next change)."),
        Arg("--follow", FLAG, "Keep this identity's mirror current until stopped: re-render it whenever mail for "
            "it (or a broadcast) is committed, from any machine, or delayed mail falls due. Run it on the machine "
            "that has the mirror directory when the mailbox is on PostgreSQL. Prints one line of JSON per "
            "update {agent, unread, mirrors, at}; SIGTERM or SIGINT ends it (exit 0, a last line with "
            "stopped_by)."),
    ),
    output={
        "agent": "The identity.",
        "email": "The unread mirror {instructions, data: {count, newest_received_at, email_ids, emails}}, or null "
        "when nothing is unread.",
        "system": "{events: [{id, source, recipient, subject, reason, created}]}: undismissed events, oldest first.",
        "dismissed": "Event ids this call dismissed.",
        "cleared": "Whether this call removed the email mirror file.",
    },
    documents={"email.data.emails[]": MIRROR_ENTRY_FIELDS},
    modes={"--follow": "A stream of one-line JSON documents {agent, unread, mirrors, at} instead of the fields "
           "above, one per update, ending with {agent, updates, stopped_by}."},
    examples=("notifications deploy:worker", "notifications lead:main --dismiss 9f1c2e34-5678-4abc-9def-0123456789ab",
              "notifications deploy:worker --clear-email", "notifications deploy:worker --follow"),
))

register(Command(
    name="status",
    summary="One row per identity seen in traffic, watches, heartbeats, profiles or activity: what is waiting for "
    "it, whether it is listening, when it last did something and on which machines.",
    args=(
        Arg("--agent", IDENTITY, "Only this identity (listed even if it has never been seen)."),
        Arg("--project", PROJECT, "Only identities of this project (the part before ':')."),
        Arg("--fields", FIELDS, "Comma-separated subset of the row fields to return."),
    ),
    exclusive=(("--agent", "--project"),),
    output={
        "agents": "One row per identity, sorted by identity.",
        "count": "How many rows.",
    },
    items_key="agents",
    item_fields=STATUS_FIELDS,
    examples=("status", "status --project deploy", "status --agent deploy:worker --fields agent,unread"),
))
