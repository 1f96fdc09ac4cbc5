"""Identities, message ids, limits and text rules: pure checks that return problems.

Every check returns an error message (a string) or None, so callers can collect
all the problems of one call and report them together.
"""

from __future__ import annotations

import os

try:  # the C implementation: `import datetime` runs its pure-Python twin first (Python 3.11), ~1 ms of every start
    import _datetime as _dt
except ImportError:  # an interpreter without it
    import datetime as _dt

BROADCAST = "*"
# Checked with sets rather than regular expressions: no pattern compiles on every start.
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyz0123456789")
_NAME_CHARS = _NAME_START | {"-"}
_HEX = frozenset("0123456789abcdef")

NAME_MAX_CHARS = 64  # each half of an identity: long enough for any real name, short enough to show
SUBJECT_MAX_CHARS = 200
BODY_MAX_CHARS = 50_000
# Limits of a send and of a mirror: the manual quotes them, the checks and the stores enforce them.
DELAY_MINUTES_MAX = 43_200.0  # 30 days
ATTACHMENT_MAX_BYTES = 10 * 1024 * 1024
ATTACHMENTS_MAX_BYTES_PER_SEND = 25 * 1024 * 1024
ATTACHMENTS_MAX_COUNT = 20
RECIPIENTS_MAX = 500
MAX_ENTRIES_LIMIT = 1000
MAX_ENTRIES_DEFAULT = 10  # newest unread messages listed in the mirror

# Liveness, fixed on purpose: nothing legitimate tunes these, and every knob is a wrong choice waiting.
WATCH_MINUTES_DEFAULT = 55.0  # the longest wait that still wakes inside a one-hour prompt-cache window
WATCH_MINUTES_MIN = 5.0
WATCH_MINUTES_MAX = 240.0
REFRESH_SECONDS = 5.0  # a blocked watch refreshes its session this often (where nothing else says it is alive)
LIVENESS_SECONDS = 60.0  # seen this recently = watching; spans the gap between a wake and the re-arm
STALE_SECONDS = 15.0  # an armed session not refreshed for this long was killed
# A watch whose presence something it holds tells (SQLite: a lock on its wake-up pipe; PostgreSQL: its open
# connection) is known dead the moment it dies, so it wakes only this often: to show it is not hung, and to
# look for lost wake-ups. Held, but not refreshed for HUNG_SECONDS, it is hung: stale.
HELD_REFRESH_SECONDS = 300.0
HUNG_SECONDS = 3 * HELD_REFRESH_SECONDS
POSTGRES_IDLE_SCALE = 6  # on PostgreSQL `notifications --follow` looks for lost wake-ups 6 times less often
# File reservations. One held by an identity that is not live (no armed watch, heartbeat, live harness session or
# human profile) stops blocking once it has shown no sign of life for the grace: twice the time a heartbeat counts,
# so one late heartbeat does not drop it, and a SIGKILLed watch (stale at once, last seen at most a refresh before
# the kill) frees its reservations within the grace.
RESERVE_MINUTES_DEFAULT = 60
RESERVE_MINUTES_MAX = 1440  # a day
RESERVATION_GRACE_SECONDS = 2 * LIVENESS_SECONDS

# Control characters other than tab, newline and carriage return; DEL and the C1 range too.
# `re` (and the `enum` it imports, ~2.5 ms) is imported only when a str method finds text that is not
# plain (a control character, a bidi control) and a pattern must say where: a send of ordinary text,
# like read, status and watch, never pays for it.
BODY_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
LINE_CONTROL = r"[\x00-\x1f\x7f-\x9f]"
# Bidirectional embedding, override and isolate controls: they make text display as something it is not.
BIDI = r"[\u202a-\u202e\u2066-\u2069]"
_BIDI_CHARS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def is_name(value: str) -> bool:
    """One half of an identity, or a project: [a-z0-9][a-z0-9-]*."""
    return (bool(value) and len(value) <= NAME_MAX_CHARS and value[0] in _NAME_START
            and all(c in _NAME_CHARS for c in value))


def is_identity(value: str) -> bool:
    project, colon, name = value.partition(":")
    return bool(colon) and is_name(project) and is_name(name)


def identity_problem(value: str, *, allow_broadcast: bool = False) -> str | None:
    """Why `value` is not a usable identity, or None."""
    if allow_broadcast and value == BROADCAST:
        return None
    if is_identity(value):
        return None
    hint = " or '*' for every agent" if allow_broadcast else ""
    project, _, name = value.partition(":")
    if max(len(project), len(name)) > NAME_MAX_CHARS:
        shown = value if len(value) <= 80 else value[:60] + "..."
        return (f"{shown!r} ({len(value)} characters) is too long: each half of an identity is at most "
                f"{NAME_MAX_CHARS} characters.")
    lowered = value.strip().lower()
    if lowered != value and is_identity(lowered):
        return f"{value!r} is not a valid identity; did you mean {lowered!r}? Identities are lowercase."
    return (
        f"{value!r} is not a valid identity.{_foreign_letter(value)} Use project:name{hint}, each half lowercase "
        "letters, digits and hyphens, starting with a letter or digit (e.g. deploy:worker)."
    )


def _foreign_letter(value: str) -> str:
    """Where an identity holds a character that is not ASCII (a Cyrillic 'а' looks like 'a'), say which."""
    for position, char in enumerate(value, 1):
        if ord(char) > 127:
            import unicodedata  # only on the error path

            name = unicodedata.name(char, "unnamed")
            return (f" Character {position}, {char!r} (U+{ord(char):04X} {name}), is not ASCII: identities are "
                    "ASCII only, so a look-alike letter from another script is refused.")
    return ""


def message_id_problem(value: str) -> str | None:
    """Why `value` is not a message id, or None. Ids are lowercase UUIDs."""
    lowered = value.lower()
    if len(lowered) == 36 and all(
        (c == "-") if i in (8, 13, 18, 23) else (c in _HEX) for i, c in enumerate(lowered)
    ):
        return None
    return (
        f"{value!r} is not a message id. Ids are UUIDs like "
        "9f1c2e34-5678-4abc-9def-0123456789ab, exactly as read or send printed them."
    )


# A machine's name as the supervisor sees it (`status`'s hosts): shown, never trusted for anything else. The
# letters of a DNS name (RFC 1123: letters, digits, hyphens, dots) and the underscore some systems allow, at most
# HOST_MAX_CHARS: nothing a terminal could take for a command, and short enough to show in a table.
HOST_MAX_CHARS = 253
_HOST_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_HOST_CHARS = _HOST_START | {"-", ".", "_"}
#: How long a machine stays among an identity's hosts after the last thing it did there (its armed watches and
#: live harness sessions count however old).
HOSTS_SECONDS = 86400.0


def host_problem(value: object) -> str | None:
    """Why `value` is not a machine's name as agent-mail records one, or None."""
    if isinstance(value, str) and 0 < len(value) <= HOST_MAX_CHARS and value[0] in _HOST_START \
            and all(c in _HOST_CHARS for c in value):
        return None
    return (f"is a machine's name: 1 to {HOST_MAX_CHARS} ASCII letters, digits, '-', '.' and '_', starting with a "
            "letter or digit (the client sends its own host name).")


def host_shown(raw: str | None) -> str | None:
    """`raw` (a host name as the system gives it) as agent-mail records it: itself when host_problem has nothing
    to say; a name with letters from other scripts in its IDNA form (xn--...); anything else with each character
    that does not belong replaced by '-', cut to HOST_MAX_CHARS; None for nothing at all."""
    if not raw or not raw.strip(".-_ "):
        return None
    if host_problem(raw) is None:
        return raw
    try:
        raw = raw.encode("idna").decode("ascii")
    except UnicodeError:
        pass
    cleaned = "".join(c if c in _HOST_CHARS else "-" for c in raw)[:HOST_MAX_CHARS].lstrip("-._")
    return cleaned or None


def machine_name() -> str | None:
    """This machine's name, as host_shown gives it: what a command records as its host (and a client sends)."""
    try:
        raw = os.uname().nodename
    except AttributeError:  # no uname (Windows)
        import socket

        raw = socket.gethostname()
    return host_shown(raw)


def has_surrogates(value: str) -> bool:
    """Whether `value` holds bytes that were not UTF-8 (Python decodes them to lone surrogates).

    (The text checks of a send answer the common case with str methods: importing and compiling regular
    expressions is milliseconds of every send's start. A regex only says where a problem is.)"""
    if value.isascii():
        return False
    try:
        value.encode("utf-8")  # strict UTF-8 refuses exactly the lone surrogates
    except UnicodeEncodeError:
        return True
    return False


def _encoding_problem(value: str) -> str | None:
    if has_surrogates(value):
        return "is not valid UTF-8 text. Pass UTF-8 (or use --body-file with a UTF-8 file)."
    return bidi_problem(value)


def bidi_problem(value: str) -> str | None:
    """Why `value` must not be shown to a person or model as it is, or None."""
    if value.isascii() or not any(c in value for c in _BIDI_CHARS):
        return None
    import re

    match = re.search(BIDI, value)
    if match:
        return (f"contains the bidirectional control U+{ord(match.group()):04X} at position {match.start()}, which "
                "makes text display as something it is not. Remove it (plain right-to-left text needs none).")
    return None


def name_problem(value: str) -> str | None:
    """Why `value`, a one-line text others are shown as it is (a ref, an attachment's name, a reservation's
    pattern or reason), cannot be: a control character (C0, DEL, C1: a terminal takes ESC and U+009B as the
    start of a command) or a bidi control. None when it is plain text."""
    if value.isprintable():  # the common case, one C loop: no control character, no bidi control
        return None
    import re

    match = re.search(LINE_CONTROL, value)
    if match:
        return (f"contains the control character U+{ord(match.group()):04X} at position {match.start()}, which a "
                "terminal would take as a command. Use plain printable text (rename the file if it is a name).")
    return bidi_problem(value)


# What `visible` writes for a character no view shows as it is: C0, DEL and C1 as \xNN, the line and paragraph
# separators and the bidi controls as \uNNNN. Made on first use.
_SHOWN_AS: dict[int, str] = {}


def visible(value: str, keep: str = "") -> str:
    """`value` as a view shows it: every control character (C0 but those in `keep`, DEL, C1), U+2028, U+2029 and
    the bidi controls written out as an escape (ESC as `\\x1b`), so text from mail is never a terminal command
    or made to display as something it is not. Text without them is returned as it is."""
    if value.isprintable():
        return value
    if not _SHOWN_AS:
        _SHOWN_AS.update({c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))})
        _SHOWN_AS.update({ord(c): f"\\u{ord(c):04x}" for c in "\u2028\u2029" + _BIDI_CHARS})
    if not keep:
        return value.translate(_SHOWN_AS)
    return value.translate({**_SHOWN_AS, **{ord(c): c for c in keep}})


def subject_problem(value: str) -> str | None:
    """Why `value` is not a usable subject line, or None."""
    problem = _encoding_problem(value)
    if problem:
        return problem
    if not value.strip():
        return "is empty. Give a short line saying what the message is about."
    if "\n" in value or "\r" in value:
        return "must be one line. Put the detail in --body."
    if not value.isprintable():  # (control characters are not printable; nor are some others, which pass)
        import re

        if re.search(LINE_CONTROL, value):
            return "contains control characters. Use plain printable text."
    if len(value) > SUBJECT_MAX_CHARS:
        return (
            f"is {len(value)} characters; the limit is {SUBJECT_MAX_CHARS}. "
            "Keep it scannable and put the detail in --body."
        )
    return None


def body_problem(value: str) -> str | None:
    """Why `value` is not a usable body, or None."""
    problem = _encoding_problem(value)
    if problem:
        return problem
    if not value.replace("\n", "").replace("\r", "").replace("\t", "").isprintable():
        import re

        match = re.search(BODY_CONTROL, value)
        if match:
            return (
                f"contains the control character U+{ord(match.group()):04X} at position "
                f"{match.start()}. Only newline, carriage return and tab are allowed."
            )
    if len(value) > BODY_MAX_CHARS:
        return (
            f"is {len(value)} characters; the limit is {BODY_MAX_CHARS}. A message is "
            "coordination, not content: write the substance to a file and pass it with --ref PATH "
            "(or --attach PATH to carry it inside the mailbox)."
        )
    return None


def new_message_id() -> str:
    """A random (version 4) UUID. Built here because `import uuid` pulls in `platform`,
    which costs more than the whole of this function on every CLI start."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# The clock every timestamp comes from: this machine's, unless a backend with a clock of its own (a database
# server shared by several machines) set it with follow_clock(): then (that clock's reading, the monotonic
# time it was read at), carried forward by the monotonic clock, which no change of the wall clock moves.
followed: tuple[_dt.datetime, float] | None = None
timedelta = _dt.timedelta  # for arithmetic on the clock's readings, without `import datetime`


def follow_clock(moment: _dt.datetime, monotonic_at: float) -> None:
    """Take `moment` (read at time.monotonic() == monotonic_at) as the time, from now on, in this process."""
    global followed
    followed = (moment.astimezone(_dt.timezone.utc), monotonic_at)


def system_now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


def from_timestamp(seconds: float) -> _dt.datetime:
    """A moment given as seconds since the epoch (a file's mtime), in UTC."""
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc)


def now() -> _dt.datetime:
    if followed is not None:
        import time

        moment, at = followed
        return moment + _dt.timedelta(seconds=time.monotonic() - at)
    return system_now()


def iso(moment: _dt.datetime) -> str:
    """An ISO 8601 timestamp in UTC with microseconds: sortable as text."""
    return moment.astimezone(_dt.timezone.utc).isoformat(timespec="microseconds")


def now_iso() -> str:
    return iso(now())


def parse_iso(value: str | None) -> _dt.datetime | None:
    """Parse a stored timestamp (ours are UTC; older mailboxes wrote local offsets)."""
    if not value:
        return None
    try:
        moment = _dt.datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return moment
