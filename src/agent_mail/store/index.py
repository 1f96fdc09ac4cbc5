"""The search index's entry of a message: its words, and the marks of its route.

One tokenizer for every backend: a message's words are the runs of letters and digits of its subject, body,
sender and recipient identities and attachment names, with accents taken off and case folded
(`Déploy-Plan.PDF` is `deploy plan pdf`). The index stores those words (SQLite: an FTS5 table; PostgreSQL: a
tsvector built here, position by position), and a query is cut into words the same way (parts.query_language),
so both backends match exactly the same messages.

Every send indexes its message, so this module is part of `send`'s start-up: it is kept small, and the query
language, ranking and snippets live in agent_mail.parts.query_language, which only `search` imports.
"""

from __future__ import annotations

#: The fields of the index, in the order their words are numbered (PostgreSQL's positions) and weighted.
FIELDS = ("subject", "people", "files", "body")
_WEIGHTS = {"subject": "A", "people": "B", "files": "C", "body": "D"}
_word = None
#: ASCII text's separators (anything but a letter or a digit) as spaces: its words without a regex, whose
#: import and compiling are milliseconds of a send's start.
_ASCII_GAPS = {code: " " for code in range(128) if not chr(code).isalnum()}
#: Longer runs are cut to this many characters (PostgreSQL refuses to index words over 2 kB).
MAX_WORD = 100
#: PostgreSQL numbers positions up to this (later words share the last position there).
_MAX_POSITION = 16383


def fold(token: str) -> str:
    import unicodedata  # only for text that is not ASCII (every send indexes its message: start-up time)

    decomposed = unicodedata.normalize("NFKD", token)
    return "".join(c for c in decomposed if not unicodedata.combining(c)).casefold()


def word_pattern():
    """The runs of letters and digits (Unicode's), compiled once when first asked for."""
    global _word
    if _word is None:
        import re

        _word = re.compile(r"[^\W_]+")
    return _word


def words(text: str | None) -> list[str]:
    """The searchable words of `text`, in order: the text folded as a whole (accents off, case folded), then
    cut into runs of letters and digits. (ASCII text, most of it, only needs lowering and cutting at what is
    not [a-z0-9]: the same runs the pattern finds.)"""
    if not text:
        return []
    if text.isascii():
        found = text.lower().translate(_ASCII_GAPS).split()
    else:
        found = word_pattern().findall(fold(text))
    return [w[:MAX_WORD] if len(w) > MAX_WORD else w for w in found]


def spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, word) of each word of `text` in order, start and end in `text` itself (a run of letters
    that folds into several words gives each of them its span). ASCII text without a regex: after the
    separators become spaces, each word is the next thing found from where the last one ended."""
    if text.isascii():
        cut, at, found = text.lower().translate(_ASCII_GAPS), 0, []
        for word in cut.split():
            start = cut.find(word, at)  # only spaces lie between `at` and the next word
            at = start + len(word)
            found.append((start, at, word[:MAX_WORD] if len(word) > MAX_WORD else word))
        return found
    return [(m.start(), m.end(), w) for m in word_pattern().finditer(text) for w in words(m.group())]


#: Route marks: each indexed message carries one token for its sender and one for its recipient (or one
#: saying it is a broadcast) at the end of its `people` words. They begin with a private-use character,
#: which no word of a query can hold (words are letters and digits), so only --from, --to and --agent ask
#: for them, and the index itself intersects "deploy" with "from A" instead of reading every deploy to
#: keep A's. (The SQL conditions stay, for exactness: a mark says who, not whether it is visible now.)
_MARK = "\ue000"
BROADCAST_MARK = _MARK + "b"


def mark(kind: str, identity: str) -> str:
    """The route mark of `identity` as sender (`kind` "f") or recipient ("t"): one token whatever it holds."""
    return _MARK + kind + identity.encode().hex()


def routes(*, agent: str | None = None, sender: str | None = None, recipient: str | None = None
           ) -> tuple[tuple[str, ...], ...]:
    """The marks a search's filters require: every group must match, one mark of each."""
    groups = []
    if sender is not None:
        groups.append((mark("f", sender),))
    if recipient is not None:
        groups.append((BROADCAST_MARK,) if recipient == "*" else (mark("t", recipient),))
    if agent is not None:  # what `agent` may see: what it sent, its own mail, broadcasts
        groups.append((mark("f", agent), mark("t", agent), BROADCAST_MARK))
    return tuple(groups)


def document(message: dict, attachment_names=()) -> dict[str, str]:
    """The index entry of one stored row: each field's words, space separated (`people` ends with the
    row's route marks)."""
    recipient = message.get("recipient")
    people = [message["sender"]] + ([recipient] if recipient not in (None, "*") else [])
    marks = [mark("f", message["sender"])]
    if recipient is not None:
        marks.append(BROADCAST_MARK if recipient == "*" else mark("t", recipient))
    return {
        "subject": " ".join(words(message.get("subject"))),
        "people": " ".join([w for person in people for w in words(person)] + marks),
        "files": " ".join(w for name in attachment_names for w in words(name)),
        "body": " ".join(words(message.get("body"))),
    }


#: PostgreSQL: each subject word is also stored behind this mark, at the same positions, so that a search
#: of subjects alone (the first tier of a search) is a lookup of its own lexemes in the GIN index. (SQLite's
#: FTS5 knows its columns.)
SUBJECT_MARK = "\ue001"


def tsvector(entry: dict[str, str]) -> str:
    """A PostgreSQL tsvector literal of an index entry: each word at its position, weighted by field, the
    fields a position apart so that no phrase runs from one field into the next; the subject's words twice,
    as themselves and behind SUBJECT_MARK."""
    positions: dict[str, list[str]] = {}
    at = 0
    for field in FIELDS:
        at += 1  # the gap between fields
        for word in entry[field].split():
            at += 1
            spot = f"{min(at, _MAX_POSITION)}{_WEIGHTS[field]}"
            positions.setdefault(word, []).append(spot)
            if field == "subject":
                positions.setdefault(SUBJECT_MARK + word, []).append(spot)
    # A word can sit at most 256 positions in a tsvector; later ones add nothing a query could tell apart.
    return " ".join(f"'{word}':{','.join(dict.fromkeys(spots[:256]))}" for word, spots in positions.items())
