"""Every command, argument, default, output field and example, declared once.

The argument parser (cli.py) and `describe` are both built from these
definitions, so the manual cannot disagree with what the parser accepts.
"""

from __future__ import annotations

from agent_mail import model

# Argument kinds. The parser converts and checks each value by its kind.
IDENTITY = "identity"  # project:name
RECIPIENT = "recipient"  # project:name or '*'
MESSAGE_ID = "message_id"  # a UUID as printed by send/read
PROJECT = "project"  # the part of an identity before ':'
TEXT = "text"
PATH = "path"
JSON = "json"
INT = "int"
NUMBER = "number"
FLAG = "flag"
FIELDS = "fields"  # comma-separated subset of a command's fields
COMMAND = "command"  # the name of a command
REMOVED = "removed"  # accepted only to be rejected with a message naming the replacement


class Arg:
    """One positional argument or flag of a command.

    A plain class rather than a dataclass: building dataclasses costs ~10 ms of
    imports and code generation on every invocation of a short-lived CLI.
    """

    __slots__ = ("name", "kind", "help", "required", "default", "repeat", "minimum", "maximum", "removed_because",
                 "choices")

    def __init__(self, name: str, kind: str, help: str, *, required: bool = False, default: object = None,
                 repeat: bool = False, minimum: float | None = None, maximum: float | None = None,
                 removed_because: str = "", choices: tuple[str, ...] = ()):
        self.name = name  # positional name, or the flag itself ("--to")
        self.kind = kind
        self.help = help
        self.required = required
        self.default = default
        self.repeat = repeat  # flag may be given many times / positional takes many values
        self.minimum = minimum
        self.maximum = maximum
        self.removed_because = removed_because  # for REMOVED flags: the replacement and why
        self.choices = choices  # the only values a TEXT argument takes, if it names them

    @property
    def positional(self) -> bool:
        return not self.name.startswith("-")

    @property
    def dest(self) -> str:
        dest = self.name.lstrip("-").replace("-", "_")
        return "from_" if dest == "from" else dest  # `from` is a Python keyword

    def describe(self) -> dict:
        doc: dict = {"type": self.kind, "required": self.required, "description": self.help}
        if self.positional:
            doc["positional"] = True
        if self.repeat:
            doc["repeatable"] = True
        if self.default is not None:
            doc["default"] = self.default
        if self.minimum is not None or self.maximum is not None:
            doc["range"] = [self.minimum, self.maximum]
        if self.choices:
            doc["choices"] = list(self.choices)
        if self.kind == REMOVED:
            doc["removed"] = self.removed_because
        return doc


class Command:
    """A command: its arguments, rules between them, and what it prints."""

    def __init__(self, name: str, summary: str, args: tuple, output: dict, examples: tuple, *,
                 mutating: bool = False, item_fields: dict | None = None, items_key: str = "",
                 exclusive: tuple = (), one_of: tuple = (), requires: tuple = (), modes: dict | None = None,
                 notes: tuple = (), needs_mailbox: bool = True, documents: dict | None = None,
                 front_end: str = "", extra: str = ""):
        self.name = name
        self.summary = summary
        self.args: tuple[Arg, ...] = args
        self.output = output  # top-level field -> meaning
        self.examples = examples
        self.mutating = mutating
        self.item_fields = item_fields or {}  # fields of each listed item
        self.items_key = items_key  # which output field holds the list of items
        self.exclusive = exclusive  # at most one of each group
        self.one_of = one_of  # exactly one of each group
        self.requires = requires  # (flag, flag it only applies with)
        self.modes = modes or {}  # how output differs per mode
        self.notes = notes
        self.needs_mailbox = needs_mailbox
        self.documents = documents or {}  # fields of nested documents the output carries
        # A command that starts another front end names its module, whose main(values, emit) runs it and
        # returns the exit status; the command line starts it by name and so imports no other front end.
        self.front_end = front_end
        self.extra = extra  # the optional extra that module needs (pip install 'agent-mail[EXTRA]')

    def arg(self, name: str) -> Arg:
        for candidate in self.args:
            if candidate.name == name:
                return candidate
        raise KeyError(name)

    def describe(self) -> dict:
        doc: dict = {
            "description": self.summary,
            "mutating": self.mutating,
            "args": {a.name: a.describe() for a in self.args},
            "output_fields": dict(self.output),
        }
        if self.items_key:
            doc["item_fields"] = {"in": self.items_key, "fields": dict(self.item_fields)}
        if self.exclusive:
            doc["mutually_exclusive"] = [list(g) for g in self.exclusive]
        if self.one_of:
            doc["exactly_one_of"] = [list(g) for g in self.one_of]
        if self.requires:
            doc["requires"] = {flag: needed for flag, needed in self.requires}
        if self.modes:
            doc["modes"] = dict(self.modes)
        if self.notes:
            doc["notes"] = list(self.notes)
        if self.documents:
            doc["documents"] = {k: dict(v) for k, v in self.documents.items()}
        doc["examples"] = [f"agent-mail {e}" for e in self.examples]
        return doc


MESSAGE_FIELDS = {
    "id": "Message id (UUID). Pass it to ack, --reply-to or --thread.",
    "sender": "Identity that sent it.",
    "recipient": "Identity it was addressed to, or '*' for a broadcast.",
    "subject": "One-line subject.",
    "body": "Body text (may be empty).",
    "refs": "Absolute paths the sender pointed at, as a JSON array.",
    "reply_to": "Id of the message this answers, or null.",
    "type": "'direct' or 'broadcast'.",
    "created": "When it was sent (ISO 8601).",
    "deliver_at": "For a message sent with --delay-minutes: when it fell (or falls) due. Otherwise null.",
    "read_at": "When this agent took delivery, or null. Always this agent's own state: null on a message it "
    "sent to someone else (its recipients' state is theirs).",
    "acked_at": "When this agent acknowledged it, or null (this agent's own state, as read_at).",
    "archived_at": "When this agent archived it, or null (this agent's own state, as read_at).",
    "attachments": "Attached files: [{name, size, sha256}]. Save them with `agent-mail attachments`.",
}

ENVELOPE_FIELDS = {
    "id": "Message id.",
    "sender": "Who sent it.",
    "subject": "Its subject.",
    "type": "'direct' or 'broadcast'.",
    "created": "When it was sent.",
}

# The unread mirror's entries keep the contract's names (from, message); what each is in `read`'s terms:
MIRROR_ENTRY_FIELDS = {
    "id": "Message id (read's id).",
    "from": "Who sent it (read's sender).",
    "subject": "Its subject.",
    "message": "The whole body (read's body).",
    "message_chars": "Length of the body in characters.",
    "message_truncated": "true only for a body longer than the send cap, written by an older tool.",
    "received_at": "When it arrived in the inbox: read's deliver_at for a delayed message, else created.",
    "type": "'direct' or 'broadcast'.",
    "refs": "Paths the sender pointed at (read's refs).",
    "attachments": "Names of the attached files; save them with `agent-mail attachments`.",
}

STATUS_FIELDS = {
    "agent": "The identity.",
    "unread": "Messages waiting for this identity that it has not read.",
    "unacked": "Messages addressed to this identity that it has not acknowledged.",
    "watching": f"true when a watch or heartbeat of this identity was seen in the last {model.LIVENESS_SECONDS:.0f} s.",
    "last_seen": "When a watch or heartbeat of this identity was last seen, or null.",
    "watch_state": "armed: a watch is blocked now. released: the last watch exited and nothing replaced it "
    f"(the agent is deaf until it re-arms). stale: a watch stopped refreshing for {model.STALE_SECONDS:.0f} s without "
    "exiting (killed). never: it has never watched.",
    "released_at": "When the last watch exited cleanly, or null.",
    "sessions": "Live harness sessions (Claude Code, Codex, Gemini CLI, through agent-mail's hooks) holding this "
    "identity. More than 1: they share one inbox and take each other's unread mail.",
}

REACHABLE_HELP = ("Whether this identity can be reached right now: a watch is armed, or a heartbeat was seen "
                  f"in the last {model.LIVENESS_SECONDS:.0f} s.")
NEXT_HELP = "The literal commands that finish the loop from the state just observed, in order. Run them."

HARNESSES = ("claude-code", "codex", "gemini")

FIELDS_HELP = "Comma-separated subset of the item fields to return (e.g. id,sender,subject). Saves context."

COMMANDS: dict[str, Command] = {}


class Step(str):
    """One `next` step: a command to run, as data (`command`, `arguments` by argument name) that each
    front end renders its own way. As a string it is the CLI's rendering, `agent-mail read p:me`,
    which is what the CLI prints; the MCP server turns it into the tool call instead."""

    __slots__ = ("command", "arguments")

    def __new__(cls, command: str, **arguments: object) -> Step:
        words = ["agent-mail", command]
        for arg in COMMANDS[command].args:
            value = arguments.get(arg.dest)
            if value is None or value is False or value == []:
                continue
            if not arg.positional:
                words.append(arg.name)
                if value is True:
                    continue
            words.extend(str(v) for v in value) if isinstance(value, (list, tuple)) else words.append(str(value))
        step = super().__new__(cls, " ".join(words))
        step.command, step.arguments = command, arguments
        return step


def _register(command: Command) -> None:
    COMMANDS[command.name] = command


_register(Command(
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
        "reached.",
        "commands": "Every command's manual, keyed by name.",
    },
    modes={"describe COMMAND": "Prints {name, storage, command: <that command's manual>} instead."},
    examples=("describe", "describe send"),
    needs_mailbox=False,
))

_register(Command(
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
        Arg("--ref", PATH, "A path this message points at; repeat for several. Resolved to an absolute path "
            "against your working directory; it must exist.", repeat=True),
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
        Arg("--require-reachable", FLAG, "Refuse recipients that cannot be reached now (no armed watch, no heartbeat "
            "in the last 60 s, not a human). The others still get it; exit code 3 says some were refused, and "
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
        "refs": "The absolute paths stored with it.",
        "attachments": "The attached files: [{name, size, sha256}].",
        "reply_to": "The message it answers, or null.",
        "acknowledged": "With --reply-to: the id marked read and acknowledged for you, else null.",
        "batch_id": "One id shared by every copy of this send.",
        "deliveries": "One entry per recipient: {recipient, id, status, reachable} plus deliver_at when "
        "status is 'scheduled' and reason when it is 'refused' (no message was stored for it; id is null).",
        "delivered": "How many recipients got it now.",
        "scheduled": "How many will get it at deliver_at.",
        "refused": "How many were refused (non-zero means exit code 3).",
        "mirrors": "Notification files rewritten because of this send: [{agent, path, status}]; a failed "
        "render is listed with status 'failed' and never fails the send.",
        "sender_reachable": ("Whether you, the sender, can be reached for the answer: a watch of yours is armed, or "
                             f"you sent a heartbeat in the last {model.LIVENESS_SECONDS:.0f} s."),
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

_register(Command(
    name="read",
    summary="Take delivery: return this agent's unread messages (oldest first) and mark them read, "
    "after they have been printed.",
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

_register(Command(
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

_register(Command(
    name="watch",
    summary="Block until this agent has unread mail, then return the envelopes (no bodies). Marks nothing "
    "read: follow it with `read`. Waiting costs nothing, and a message wakes it within milliseconds.",
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
        f"While blocked, the watch refreshes its liveness session every {model.REFRESH_SECONDS:.0f} s and holds no "
        "lock. It wakes when mail for it, or a broadcast, is committed, within milliseconds; nothing else wakes it "
        "(other watches, heartbeats, reads, mail for others). Every 15 s it also looks at the mailbox itself, in case "
        "a wake-up was lost.",
        "The loop: watch (blocks) -> read (take delivery) -> act -> ack -> watch again. Never end a turn "
        "without a watch armed.",
        "A message sent with --delay-minutes wakes the watch when it falls due.",
    ),
    examples=("watch deploy:worker", "watch deploy:worker --timeout-minutes 120", "watch deploy:worker --once"),
))

_register(Command(
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


_register(_handling(
    "dismiss", "Mark messages read without fetching them again (after handling them from the unread mirror).",
    "dismissed", "already_read", "Ids that were read before (left unchanged)."))
_register(_handling(
    "archive", "Move messages out of the inbox: marked read, gone from `read` and `read --all`, listed by "
    "`read --archived`.", "archived", "already_archived", "Ids archived before (left unchanged)."))
_register(_handling(
    "delete", "Remove messages from every view of this agent (marked read). The other parties keep their copy; "
    "only `cleanup` removes the shared record.", "deleted", "already_deleted", "Ids deleted before."))

_register(Command(
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

_register(Command(
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

_register(Command(
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

_register(Command(
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

_register(Command(
    name="status",
    summary="One row per identity seen in traffic, watches, heartbeats or profiles: what is waiting for it "
    "and whether it is listening.",
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

_register(Command(
    name="search",
    summary="Find messages by their words: subjects, bodies, sender and recipient identities, attachment names. "
    "Ranked (subject matches first), newest first. Marks nothing read.",
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

EXPORT_FORMAT = {  # the JSON Lines export, version 1 (agent_mail.history writes and reads it)
    "header": "The first line: {\"agent_mail_export\": 1} (the format's version).",
    "blob": "{type: 'blob', sha256, size, created, content_base64}: an attachment's content, once, before the "
    "first message that uses it.",
    "message": "{type: 'message', id, batch_id, kind ('direct' | 'broadcast'), sender, recipient ('*' for a "
    "broadcast), subject, body, refs (list or null), reply_to, ttl_hours, created, deliver_at, cancelled_at, "
    "read_at, acked_at, archived_at, deleted_at (the recipient's state, on a direct row), schedule ({deliver_at, "
    "published_at} or null), broadcast_states ([{agent, read_at, acked_at, archived_at, deleted_at}], each "
    "recipient's state of a broadcast), attachments ([{name, size, sha256}])}: one stored row, in stored order.",
    "profile": "{type: 'profile', agent, human, mirror_dir, max_entries, updated_at}.",
    "event": "{type: 'event', id, agent, source ('email.bounce'), payload, created, dismissed_at}.",
}

_register(Command(
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

_register(Command(
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
           "This is also how a mailbox moves between backends record by record; `copy` moves a whole mailbox in "
           "one step."),
    examples=("import team.jsonl --dry-run", "import team.jsonl", "import -"),
))

_register(Command(
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
        "sessions_deleted": "Liveness records (watch sessions, heartbeats, harness sessions) last seen before the "
        "cutoff, deleted (or that would be).",
        "events_deleted": "System-channel events older than the cutoff deleted (or that would be).",
        "attachments_deleted": "Stored attachment contents no remaining message refers to, deleted (or that "
        "would be).",
        "temporary_files_deleted": "Files left beside the mailbox by a mailbox creation that was killed, "
        "removed (or that would be).",
    },
    modes={"--dry-run": "Same fields, counting what would be deleted; dry_run is true."},
    examples=("cleanup --older-than 30 --dry-run", "cleanup --older-than 30"),
))

_register(Command(
    name="copy",
    summary="Copy a whole mailbox into this one (AGENT_MAIL_DB, or --to): how a team moves its SQLite mailbox onto "
    "PostgreSQL, or takes a PostgreSQL one back to a file. Message ids, insertion order, threads, every "
    "recipient's read/ack/archive/delete state, schedules, attachments, profiles, system events and sessions, "
    "in one transaction, then counted against the source. Refuses a target that holds anything unless --merge.",
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

_register(Command(
    name="doctor",
    summary="Check the mailbox: integrity of the file, schema, counts. With --repair, save every readable "
    "record of a damaged mailbox into a fresh one, keep the damaged file aside, and report what could not be "
    "saved.",
    mutating=True,
    args=(
        Arg("--repair", FLAG, "Rebuild the mailbox from what can still be read. Stop other agent-mail processes "
            "first; their open handles keep the damaged file."),
    ),
    output={
        "path": "The mailbox checked.",
        "ok": "true when the file passed SQLite's integrity check and the schema is complete.",
        "integrity": "SQLite's integrity_check findings: [] when clean (at most 100 listed).",
        "schema": "{migrations_applied, migrations_expected, application_id_ok, missing_tables}.",
        "counts": "Rows per table, as far as they could be counted ({table: n or null}).",
        "damage_marker": "The record left when a command met damage ({path, found_at, command, error}), or null.",
        "temporary_files": "Leftover files of killed mailbox creations beside the mailbox.",
        "repair": "With --repair: {saved: {table: n}, unsaved: [{table, rowid, id, reason}], unsaved_count, "
        "damaged_copy, mailbox}. Without: null.",
        "next": "What to do about what was found, as literal commands.",
    },
    modes={"--repair": "Only when the mailbox is damaged; a healthy mailbox is left as it is (repair is null)."},
    notes=("A command that meets damage refuses to write anything more into the mailbox and leaves a marker beside "
           "it (NAME.damaged); every command but describe and doctor then refuses until doctor finds the file "
           "healthy or --repair has rebuilt it.",),
    examples=("doctor", "doctor --repair"),
))


_register(Command(
    name="mcp",
    front_end="agent_mail.mcp_server", extra="mcp",
    summary="Serve this mailbox to a model as MCP tools over stdio (for a harness: Claude Code, Codex, Gemini CLI). "
    "One tool per command a model needs (send, read, ack, watch with a bounded wait, status, heartbeat, dismiss, "
    "archive, delete, cancel, notifications, attachments), the same arguments without dashes, the same checks and "
    "the same JSON results, with `next` steps given as tool calls. Needs the mcp extra: pip install "
    "'agent-mail[mcp]'.",
    args=(
        Arg("--agent", IDENTITY, "This session's identity (project:name): the tools' agent / from default to it, "
            "so the model need not repeat it."),
        Arg("--save-root", PATH, "The directory under which the attachments tool may save files (default: the "
            "directory the server starts in); save_to is taken relative to it and may not leave it."),
    ),
    output={},
    notes=("Speaks JSON-RPC on stdin/stdout until the client closes them; prints nothing else on stdout. A setup "
           "that cannot start (the extra missing) is a JSON error on stderr, exit 1.",),
    examples=("mcp --agent deploy:worker",),
))


_register(Command(
    name="dashboard",
    front_end="agent_mail.dashboard",
    summary="The supervisor's live view of this mailbox in the terminal (or a browser tab with --web): Fleet (one "
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
        Arg("--web", FLAG, "Serve the dashboard to a browser on 127.0.0.1 instead of drawing it in this terminal "
            "(textual-serve; each browser tab runs its own dashboard)."),
        Arg("--port", INT, "The port --web listens on (default 8000).", minimum=1, maximum=65535),
    ),
    requires=(("--port", "--web"),),
    output={},
    notes=("Draws in the terminal until q (or ctrl+c); prints nothing on stdout. A mailbox that cannot be opened, "
           "or the extra missing, is a JSON error on stderr (exit 1) before anything is drawn. A lost PostgreSQL "
           "connection is shown on screen and retried. Honours NO_COLOR. --web listens on 127.0.0.1 only.",),
    examples=("dashboard", "dashboard --as ops:human", "dashboard --project deploy --overdue-minutes 10",
              "dashboard --web --port 8080"),
))

_register(Command(
    name="hook",
    front_end="agent_mail.hooks",
    summary="Run by a harness's hooks (set up by `agent-mail setup`), never by hand: reads the hook's JSON input "
    "on stdin. context (SessionStart, UserPromptSubmit / BeforeAgent, PostToolUse / AfterTool): adds the "
    "envelopes of mail new to this session, the unread count, bounces and the next steps to the model's "
    "context, quiet when nothing is new, marking nothing read. stop: holds the stop once when mail the "
    "session was not told of arrived. wait: the asyncRewake waiter (Claude Code only), blocking like watch "
    "until such mail arrives, then exit 2 with the envelopes on stderr (wakes an idle session). end: the "
    "session ended.",
    args=(
        Arg("harness", TEXT, "claude-code, codex or gemini.", required=True, choices=HARNESSES),
        Arg("event", TEXT, "context, stop, wait or end.", required=True, choices=("context", "stop", "wait", "end")),
        Arg("--agent", IDENTITY, "This session's identity (project:name); default AGENT_MAIL_AGENT."),
    ),
    output={"hookSpecificOutput": "context: {hookEventName, additionalContext} for the harness (printed only when "
            "there is something new).",
            "decision": "stop: \"block\" (Claude Code, Codex) or \"deny\" (Gemini CLI's AfterAgent) when the stop "
            "is held (printed only then; Gemini CLI gets {} when there is nothing to say).",
            "reason": "stop: the envelopes and what to do, shown to the model as its next turn."},
    modes={"wait": "Prints nothing on stdout; exit 2 with the note on stderr when mail arrives, 0 when the wait ends "
                   "(55 minutes, a newer waiter, the harness gone, or a run nobody waits on: claude -p, the SDK)."},
    examples=("hook claude-code context --agent deploy:worker",),
))


_register(Command(
    name="setup",
    summary="Connect a harness to this mailbox in one step: its hooks (mail in the model's context, a stop held "
    "once for mail that arrived, and for Claude Code an idle session woken when mail arrives) and the agent-mail "
    "MCP server, already allowed. Merges into existing settings (nothing else touched), idempotent, atomic; --dry-run "
    "shows the diff, --remove takes out only what it added. Records the identity and the mailbox resolved now.",
    args=(
        Arg("harness", TEXT, "The harness: claude-code (.mcp.json, .claude/settings.local.json), codex "
            "(.codex/config.toml, .codex/hooks.json) or gemini (.gemini/settings.json).", required=True,
            choices=HARNESSES),
        Arg("--agent", IDENTITY, "The identity the harness's sessions use (project:name).", required=True),
        Arg("--dir", PATH, "The project directory the harness starts in (default: the current directory)."),
        Arg("--dry-run", FLAG, "Show what would change (a diff per file); write nothing."),
        Arg("--remove", FLAG, "Take out what setup added; leave everything else."),
    ),
    output={
        "harness": "The harness set up.",
        "agent": "The identity recorded.",
        "mailbox": "The mailbox file recorded (where AGENT_MAIL_DB points now, or the default).",
        "dir": "The project directory.",
        "removed": "true with --remove.",
        "dry_run": "true when nothing was written.",
        "files": "Per file: path, action (create, update, remove, unchanged) and diff (unified).",
        "wakes_idle_session": "Whether this harness's idle session is woken when mail arrives.",
        "notes": "What the harness now does, and what it does not.",
    },
    examples=("setup claude-code --agent deploy:worker", "setup claude-code --agent deploy:worker --dry-run",
              "setup claude-code --agent deploy:worker --remove"),
    mutating=True,
    needs_mailbox=False,
))


INVARIANTS = (
    "Every command prints exactly one JSON document on stdout on success, and {\"error\": ...} on stderr "
    "with a non-zero exit on failure. A failed command changed nothing.",
    "Messages never expire. Only `cleanup --older-than DAYS` deletes them, and it has no default age.",
    "A send is all or nothing per recipient and published in one transaction: every recipient gets its own "
    "copy with its own id and state; a refused recipient gets nothing, and the receipt says so.",
    "Reading the unread mirror or the system channel never marks anything read.",
    "A mutating command commits only after its output reached stdout: if printing fails, nothing changed.",
    "read marks read only what it printed; --thread and --no-mark-read mark nothing.",
    "Identities are project:name, lowercase letters, digits and hyphens. No registration is needed.",
    "A direct message to yourself reaches you; your own broadcasts do not.",
    "Replying with --reply-to marks the answered message read and acknowledged for you (--no-ack keeps it "
    "unacknowledged).",
    "All problems of one call are reported together, each naming its field, including those only the mailbox "
    "can tell (an unknown --reply-to beside an empty subject).",
    "The exit status decides. If the result reached stdout but the commit then failed (a full disk), the command "
    "exits non-zero with output_discarded in its error: what was printed did not happen.",
    "A message is visible to its sender and its recipients (everyone but the sender, for a broadcast) and to "
    "nobody else: read --thread, attachments and --reply-to apply the same rule.",
    "Messages are ordered by when they arrived in the inbox: a delayed message sorts at its delivery time.",
    "Text a person or model is shown (subjects, bodies, refs, attachment names) never carries bidirectional "
    "override or isolate characters (U+202A-U+202E, U+2066-U+2069): they are refused.",
    "watch never marks anything read, never returns bodies, never deletes anything; the set it reports is "
    "the set that following `read`s deliver (a page of --limit at a time). Follow every wake with `read`, and "
    "re-arm with `watch`.",
    "Results that leave you something to do carry `reachable` and `next`: literal commands computed from the "
    "current state. Run them.",
)

EXIT_CODES = {
    "0": "Success: the JSON document on stdout is the result.",
    "1": "The call was well formed but could not be carried out (mailbox unreadable or locked, output "
    "could not be written). Nothing changed.",
    "2": "The call was wrong (unknown flag, bad value, unknown message). Nothing changed; fix it as the "
    "error says.",
    "3": "send: some recipients were refused (--require-reachable); the receipt on stdout says which. "
    "The others got the message.",
    "130": "Interrupted by SIGINT (any command); 143: SIGTERM, 129: SIGHUP. Nothing was changed; a stopped watch "
    "released its session.",
}

DESCRIPTION = (
    "agent-mail is a local mailbox for AI coding agents: send a message, take delivery, say you acted on "
    "it, and see what is waiting for whom. One SQLite file, JSON in and out."
)


def describe_document(storage: dict, version: str, command: str | None = None) -> dict:
    """The manual: the whole of it, or one command's part."""
    if command is not None:
        return {"name": command, "storage": storage, "command": COMMANDS[command].describe()}
    return {
        "name": "agent-mail",
        "version": version,
        "description": DESCRIPTION,
        "identity": f"project:name, each half [a-z0-9][a-z0-9-]* of at most {model.NAME_MAX_CHARS} characters; "
        "'*' as a recipient means everyone.",
        "invariants": list(INVARIANTS),
        "exit_codes": dict(EXIT_CODES),
        "limits": {
            "subject_max_chars": model.SUBJECT_MAX_CHARS,
            "body_max_chars": model.BODY_MAX_CHARS,
            "recipients_max": model.RECIPIENTS_MAX,
            "delay_minutes_max": model.DELAY_MINUTES_MAX,
            "attachment_max_bytes": model.ATTACHMENT_MAX_BYTES,
            "attachments_max_bytes_per_send": model.ATTACHMENTS_MAX_BYTES_PER_SEND,
            "attachments_max_count": model.ATTACHMENTS_MAX_COUNT,
            "identity_part_max_chars": model.NAME_MAX_CHARS,
            "watch_minutes": [model.WATCH_MINUTES_MIN, model.WATCH_MINUTES_MAX],
            "watch_minutes_default": model.WATCH_MINUTES_DEFAULT,
        },
        "liveness": {
            "refresh_seconds": model.REFRESH_SECONDS,
            "watching_within_seconds": model.LIVENESS_SECONDS,
            "stale_after_seconds": model.STALE_SECONDS,
            "postgresql": "A watch's open connection is its presence (it names its session); its row is refreshed "
            f"every {model.REFRESH_SECONDS * model.POSTGRES_IDLE_SCALE:.0f} s, and a connected watch whose row is "
            f"older than {model.POSTGRES_PRESENCE_GRACE_SECONDS:.0f} s no longer counts. A killed watch's connection "
            "ends at once, a partitioned one within about 10 s.",
        },
        "global_flags": {
            "--version": "Print {name, version} and exit. Takes no arguments.",
            "--help": "Print this manual as JSON (also -h, help, or no arguments at all); after a command, that "
            "command's manual. At a terminal (stdout a TTY) a short usage text instead, for a person.",
        },
        "environment": {
            "AGENT_MAIL_DB": "Path of the mailbox file (default ~/.agent-mail/mail.db). A symbolic link is followed "
            "to the real file. Empty means unset; a value of only spaces is refused. Or a team mailbox on "
            "PostgreSQL: postgresql://USER@HOST[:PORT]/DATABASE (also postgres://), any libpq parameter allowed, "
            "plus schema=NAME (default agent_mail); needs pip install 'agent-mail[postgres]'. Keep the password "
            "in ~/.pgpass or PGPASSFILE: it is never shown, and setup never writes it.",
            "AGENT_MAIL_PG_SCHEMA": "The PostgreSQL schema of the mailbox when the URL has no schema= parameter "
            "(default agent_mail).",
            "PG*": "libpq's own variables (PGPASSFILE, PGSSLMODE, PGSERVICE, PGCONNECT_TIMEOUT, ...) apply to a "
            "PostgreSQL mailbox as to any libpq client.",
            "AGENT_MAIL_POLL": "Set to any value to make watch poll the mailbox (every 25 ms) instead of sleeping on "
            "its wake-up pipe, for a file system that cannot hold named pipes. Any new message then wakes every watch.",
        },
        "storage": storage,
        "commands": {name: c.describe() for name, c in COMMANDS.items()},
    }
