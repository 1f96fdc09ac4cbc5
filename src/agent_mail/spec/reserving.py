"""The file reservation commands declared: reserve, release, reservations, and guard (the git hooks)."""

from __future__ import annotations

from agent_mail import model
from agent_mail.spec.base import FLAG, IDENTITY, INT, PATH, TEXT, Arg, Command, register

_GRACE = f"{model.RESERVATION_GRACE_SECONDS:.0f} s"
PATTERN_HELP = ("git wildmatch (gitignore syntax) from the repository's root: src/lib.rs, src/**, docs/, *.py, "
                "tests/test_[a-m]*.py. A pattern with a / anywhere is anchored at the root (docs/ is the top-level "
                "docs; **/docs/ any); one without matches at any depth. ./x, ../x and absolute paths are taken from "
                "the working directory. ! (negation) is refused.")
REPO_HELP = ("The repository the reservations belong to (default: the one the working directory lies in, keyed by "
             "its origin URL normalised, so every clone shares it, else its root directory). Required outside a git "
             "repository.")

RESERVATION_FIELDS = {
    "agent": "The holder.",
    "pattern": "Its pattern, from the repository's root.",
    "mode": "exclusive or shared.",
    "reason": "Why it holds it (--reason), or null.",
    "since": "When it was first reserved.",
    "renewed_at": "When it was last reserved again.",
    "expires_at": "When it ends by itself (--minutes after it was last reserved).",
    "holder_live": "Whether the holder is live now: a live harness session, an armed watch, a heartbeat in the last "
    f"{model.LIVENESS_SECONDS:.0f} s, or a human.",
    "holder_last_seen": "When the holder last showed a sign of life (a watch, heartbeat or reserve), or null.",
    "held": f"true while it blocks others: the holder is live, or was within the last {_GRACE}. false: the holder "
    "is dead and the reservation blocks nobody (release --force clears it).",
}

CONFLICT_FIELDS = {
    "pattern": "Your pattern (reserve) or path (--check) that clashes.",
    "holder": "Who holds what it clashes with.",
    "holder_pattern": "The holder's pattern.",
    "mode": "exclusive or shared: the holder's reservation.",
    "reason": "The holder's reason, or null.",
    "since": "When the holder reserved it.",
    "expires_at": "When it ends by itself.",
    "holder_live": "Whether the holder is live now.",
    "holder_liveness": "{watch_state, last_seen, reached_by}: how the holder is alive (or was).",
}

register(Command(
    name="reserve",
    summary="Reserve files in a repository before changing them: exclusive (nobody else may reserve or change them) "
    "unless --shared (others may share, nobody may take them exclusively). All or nothing: if any pattern clashes "
    "with another identity's reservation, nothing is reserved, the exit status is 3 and `conflicts` says with what "
    "and whose. Your own reservations never clash; reserving a pattern again renews it. A reservation ends when "
    f"released, when its --minutes run out, or once its holder has shown no sign of life for {_GRACE}: a dead "
    "agent blocks nobody. Reserving counts as a heartbeat.",
    mutating=True,
    args=(
        Arg("agent", IDENTITY, "Who reserves (project:name).", required=True),
        Arg("patterns", TEXT, PATTERN_HELP, required=True, repeat=True),
        Arg("--shared", FLAG, "Shared: others may reserve these too with --shared; nobody exclusively."),
        Arg("--reason", TEXT, "Why, in a line (shown to whoever is refused)."),
        Arg("--minutes", INT, "How long it lasts unless renewed or released.", default=model.RESERVE_MINUTES_DEFAULT,
            minimum=1, maximum=model.RESERVE_MINUTES_MAX),
        Arg("--repo", TEXT, REPO_HELP),
    ),
    output={
        "agent": "Who reserved.",
        "repo": "The repository key the reservations are filed under.",
        "granted": "The patterns reserved (or renewed), as stored: [] when refused.",
        "mode": "exclusive or shared.",
        "expires_at": "When they end unless renewed or released (null when refused).",
        "conflicts": "Exit 3: each clash (nothing was reserved). [] on success.",
        "next": "Success: the release to run when done. Refused: a message to each live holder asking for the "
        "paths, or release --force for a dead one.",
    },
    items_key="conflicts",
    item_fields=CONFLICT_FIELDS,
    examples=("reserve deploy:worker src/** --reason 'refactor the parser'",
              "reserve deploy:worker docs/ README.md --shared --minutes 30", "reserve deploy:worker ./lib.rs"),
))

register(Command(
    name="release",
    summary="Release reservations: the patterns named (as reserved; case folded where the repository's "
    "core.ignorecase says so) or --all of yours in the repository. With --force, another identity's reservations "
    "that overlap the patterns, only when that holder is not live; the holder is told (a system event and a "
    "message) what was taken and by whom.",
    mutating=True,
    args=(
        Arg("agent", IDENTITY, "Who releases (project:name).", required=True),
        Arg("patterns", TEXT, "The patterns to release (as given to reserve).", repeat=True),
        Arg("--all", FLAG, "Every reservation of yours in the repository."),
        Arg("--force", FLAG, "Also release other identities' reservations overlapping the patterns, whose holder is "
            "not live (refused, changing nothing, if any of them is)."),
        Arg("--repo", TEXT, REPO_HELP),
    ),
    one_of=(("patterns", "--all"),),
    exclusive=(("--all", "--force"),),
    output={
        "agent": "Who released.",
        "repo": "The repository key.",
        "released": "[{agent, pattern, mode}] released ([] when nothing matched).",
        "count": "How many.",
        "not_held": "Patterns named that matched nothing of yours (a typo, or already ended).",
        "next": "What is left of yours in the repository: the command that lists it.",
    },
    examples=("release deploy:worker src/**", "release deploy:worker --all",
              "release deploy:worker src/lib.rs --force"),
))

register(Command(
    name="reservations",
    summary="What is reserved in the repository, by whom, and whether each holder is live; with --path, who holds "
    "each path; with --check and --agent, whether that identity may change every path given (exit 0) or not "
    "(exit 3, with the conflicts): what guards call. Changes nothing.",
    args=(
        Arg("--agent", IDENTITY, "Only this identity's reservations; with --check, the identity that wants to "
            "change the paths."),
        Arg("paths", TEXT, "Paths to look up (as --path; what --check checks, e.g. a commit's files).", repeat=True),
        Arg("--path", TEXT, "A path (repeatable; relative to the working directory, or absolute): who holds it.",
            repeat=True),
        Arg("--check", FLAG, "Exit 3 with the conflicts unless --agent may change every --path: no other live "
            "identity holds one exclusively."),
        Arg("--repo", TEXT, REPO_HELP),
    ),
    requires=(("--check", "--agent"),),
    output={
        "repo": "The repository key.",
        "reservations": "Every reservation not released or expired (with --agent: its own), dead holders' marked "
        "held: false.",
        "count": "How many.",
        "paths": "With --path: [{path, held_by: [{agent, pattern, mode, held}]}].",
        "ok": "With --check: true when --agent may change every path.",
        "conflicts": "With --check: each path another live identity holds exclusively (exit 3 when any).",
        "next": "With conflicts: a message to each holder asking for the path.",
    },
    items_key="reservations",
    item_fields=RESERVATION_FIELDS,
    examples=("reservations", "reservations --path src/lib.rs",
              "reservations --check --agent deploy:worker src/lib.rs docs/x.md"),
))

register(Command(
    name="guard",
    summary="Git hooks that refuse a commit or push touching files another live identity holds exclusively (both "
    "sides of a rename), naming the holder and how to ask them. install adds a pre-commit and a pre-push hook to "
    "the hooks directory git runs (core.hooksPath when set); a hook already there is kept (renamed "
    "NAME.agent-mail-original) and run first, its refusal standing. uninstall puts back exactly what was there "
    "(the same file: bytes and mode). The hooks check as AGENT_MAIL_AGENT, else the identity agent-mail setup "
    "recorded in the repository; without one, without a mailbox or with nothing reserved that the change "
    "touches, they say nothing. An unreachable mailbox is said and the change let through, unless strict "
    "(git config agent-mail.guard strict, or AGENT_MAIL_GUARD=strict). Any other failure refuses, saying why. "
    "git commit --no-verify (push --no-verify) is git's bypass.",
    args=(
        Arg("action", TEXT, "install or uninstall; pre-commit and pre-push are what the installed hooks run.",
            required=True, choices=("install", "uninstall", "pre-commit", "pre-push")),
        Arg("--dir", PATH, "The repository (default: the one the current directory lies in)."),
    ),
    output={
        "dir": "The work tree's root.",
        "hooks_dir": "The hooks directory git runs hooks from (core.hooksPath, else .git/hooks).",
        "hooks": "Per hook: hook, path, action (install: installed, chained, updated, unchanged; uninstall: "
        "restored, removed, not installed, left alone (not ours)) and, on install, runs_first: the hook that was "
        "there, kept and run before ours (or null).",
        "strict": "install: whether an unreachable mailbox refuses the change.",
        "notes": "install: what the hooks do, the bypass and the strict setting.",
    },
    modes={"pre-commit": "Run by the hook: prints nothing on stdout; exit 0 lets the commit through, 1 refuses it "
                         "with the reasons on stderr.",
           "pre-push": "Run by the hook, the refs on stdin as git gives them: as pre-commit, for every commit "
                       "pushed."},
    examples=("guard install", "guard install --dir ~/src/widget", "guard uninstall"),
    mutating=True,
    needs_mailbox=False,
))
