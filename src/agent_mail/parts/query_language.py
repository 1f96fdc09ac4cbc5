"""Full-text search: the small query language, and what each backend is asked; snippets.

The words a query looks for are cut by agent_mail.store.index, as the index's own words are, so SQLite and
PostgreSQL match exactly the same messages.

The query language: words (all must match), "exact phrases", OR between two terms, -excluded (a word or
a phrase), prefix* (a word's start). Anything else is refused with the accepted forms.
"""

from __future__ import annotations

from agent_mail import errors
from agent_mail.store.index import SUBJECT_MARK, spans, words

MAX_QUERY = 1000
MAX_TERMS = 32

FORMS = ('words (all must match): deploy failed', 'an exact phrase: "release notes"',
         'either of two terms: deploy OR rollback', 'a word or phrase left out: deploy -staging',
         'a word\'s start: deplo*')


# ---------------------------------------------------------------- the query language


class Term:
    """One word or phrase of a query; `prefix`: its last word is a start. (Plain classes: dataclasses cost a
    send, which indexes every message, milliseconds of import.)"""

    __slots__ = ("words", "prefix", "spelt")

    def __init__(self, words: tuple[str, ...], prefix: bool = False, spelt: str = ""):
        self.words, self.prefix = words, prefix
        self.spelt = spelt  # a word as typed (dup-rcpt), shown as such though it looks for two words

    def fts5(self) -> str:
        return '"' + " ".join(self.words) + '"' + ("*" if self.prefix else "")

    def tsquery(self, subject_only: bool = False) -> str:
        """`subject_only`: asked of the subject's own lexemes (index.SUBJECT_MARK + word), which the GIN index
        finds as such: a weight (:A) is only checked on the rows found, and PostgreSQL, estimating a common
        word by all its rows, would walk the table newest first looking for a subject that has it."""
        mark = SUBJECT_MARK if subject_only else ""

        def lexeme(i: int, word: str) -> str:
            return f"'{mark}{word}'" + (":*" if self.prefix and i == len(self.words) - 1 else "")
        return " <-> ".join(lexeme(i, w) for i, w in enumerate(self.words))

    def shown(self) -> str:
        if self.spelt:
            return self.spelt
        return ('"' + " ".join(self.words) + '"' if len(self.words) > 1 else self.words[0]) + \
            ("*" if self.prefix else "")


class Query:
    """Every group must match (one of its terms), and no excluded term may."""

    __slots__ = ("groups", "excluded")

    def __init__(self, groups: tuple[tuple[Term, ...], ...], excluded: tuple[Term, ...]):
        self.groups, self.excluded = groups, excluded

    def fts5(self, subject_only: bool = False, marks: tuple[tuple[str, ...], ...] = ()) -> str:
        """The FTS5 expression; `marks`: route marks (see routes()) the rows must carry too."""
        wanted = " AND ".join("(" + " OR ".join(t.fts5() for t in group) + ")" for group in self.groups)
        if subject_only:
            wanted = "{subject} : (" + wanted + ")"
        if self.excluded:
            wanted = f"({wanted}) NOT (" + " OR ".join(t.fts5() for t in self.excluded) + ")"
        if marks:
            wanted = f"({wanted}) AND " + " AND ".join(
                "(" + " OR ".join(f'"{m}"' for m in group) + ")" for group in marks)
        return wanted

    def tsquery(self, subject_only: bool = False, marks: tuple[tuple[str, ...], ...] = ()) -> str:
        """The tsquery text (lexemes as written: cast, not parsed); `marks` as for fts5()."""
        wanted = " & ".join("(" + " | ".join(f"({t.tsquery(subject_only)})" for t in group) + ")"
                            for group in self.groups)
        if self.excluded:
            wanted += " & !(" + " | ".join(f"({t.tsquery()})" for t in self.excluded) + ")"
        for group in marks:
            wanted += " & (" + " | ".join(f"'{m}'" for m in group) + ")"
        return wanted

    def looked_for(self) -> list[Term]:
        return [t for group in self.groups for t in group]


def _refuse(problem: str) -> errors.InvalidInput:
    return errors.InvalidInput([("query", f"{problem}. The accepted forms: " + "; ".join(FORMS) + ".")])


def parse(text: str) -> Query:
    """The query `text`, or an InvalidInput naming what is wrong and showing the accepted forms."""
    if not text or not text.strip():
        raise _refuse("is empty")
    if len(text) > MAX_QUERY:
        raise _refuse(f"is {len(text)} characters long; at most {MAX_QUERY}")
    pieces = _pieces(text)
    groups: list[list[Term]] = []
    excluded: list[Term] = []
    joining = False  # the previous piece was OR
    for index, (kind, raw) in enumerate(pieces):
        if kind == "or":
            if joining or not groups or index == len(pieces) - 1 or pieces[index + 1][0] == "exclude":
                raise _refuse("has OR without a term to look for on each side")
            joining = True
            continue
        term = _term(kind, raw)
        if kind == "exclude":
            excluded.append(term)
        elif joining:
            groups[-1].append(term)
        else:
            groups.append([term])
        joining = False
    if not groups:
        raise _refuse("has nothing to look for, only words to leave out")
    if sum(len(g) for g in groups) + len(excluded) > MAX_TERMS:
        raise _refuse(f"has more than {MAX_TERMS} terms")
    return Query(tuple(tuple(g) for g in groups), tuple(excluded))


def _pieces(text: str) -> list[tuple[str, str]]:
    """Cut the query into (kind, text): 'word', 'phrase', 'prefix', 'exclude' (its text still marked) and 'or'."""
    pieces = []
    at, end = 0, len(text)
    while at < end:
        if text[at].isspace():
            at += 1
            continue
        excluded = text[at] == "-" and at + 1 < end and not text[at + 1].isspace()
        start = at + 1 if excluded else at
        if text[start] == '"':
            close = text.find('"', start + 1)
            if close < 0:
                raise _refuse('has a " without its closing "')
            raw, at = text[start:close + 1], close + 1
            if at < end and not text[at].isspace():
                raise _refuse(f"has {text[start:at + 1]!r}: a phrase ends at its closing quote")
        else:
            stop = at
            while stop < end and not text[stop].isspace():
                stop += 1
            raw, at = text[start:stop], stop
        if raw == "-" or (not raw and excluded):
            raise _refuse("has a lone '-'; write -word to leave a word out")
        if excluded:
            pieces.append(("exclude", raw))
        elif raw == "OR":
            pieces.append(("or", raw))
        else:
            pieces.append(("phrase" if raw.startswith('"') else "word", raw))
    return pieces


def _term(kind: str, raw: str) -> Term:
    if raw in ("AND", "NOT"):
        raise _refuse(f"uses {raw}, which is not an operator here (words all match already; -word leaves one out)")
    if raw.startswith('"'):
        found = words(raw[1:-1])
        if not found:
            raise _refuse(f"has the phrase {raw}, which has no letters or digits")
        return Term(tuple(found))
    if "(" in raw or ")" in raw:
        raise _refuse(f"has {raw!r}: grouping with ( ) is not supported")
    prefix = raw.endswith("*")
    body = raw[:-1] if prefix else raw
    if "*" in body:
        raise _refuse(f"has {raw!r}: * may only end a word (prefix*)")
    found = words(body)
    if not found:
        raise _refuse(f"has {raw!r}, which has no letters or digits")
    if prefix and not body[-1:].isalnum():
        raise _refuse(f"has {raw!r}: * must follow a letter or digit")
    return Term(tuple(found), prefix, raw if len(found) > 1 else "")


# ---------------------------------------------------------------- snippets

SNIPPET = 160


def snippet(subject: str, body: str, query: Query, attachment_names=()) -> str:
    """A short stretch of the body (or the subject, or the attachments' names: the first with a match) around
    the first match, the matching words marked **like this**."""
    for text in (body, subject, ", ".join(attachment_names)):
        marked = _matches(text or "", query)
        if marked:
            break
    else:
        text, marked = (body or subject or ""), []
    first = marked[0][0] if marked else 0
    start = max(0, first - 40)
    if start:  # begin at a word
        space = text.rfind(" ", 0, start)
        start = space + 1 if space >= first - 60 else start
    stop = min(len(text), start + SNIPPET)
    out, at = [], start
    for a, b in marked:
        if a < start or b > stop:
            continue
        out += [text[at:a], "**", text[a:b], "**"]
        at = b
    out.append(text[at:stop])
    shown = " ".join("".join(out).split())
    return ("…" if start else "") + shown + ("…" if stop < len(text) else "")


def _matches(text: str, query: Query) -> list[tuple[int, int]]:
    """The spans of `text` holding the words (and phrases) looked for."""
    flat = spans(text)
    hits = []
    for term in query.looked_for():
        n = len(term.words)
        for i in range(len(flat) - n + 1):
            if all(flat[i + k][2] == term.words[k] for k in range(n - 1)) and (
                    flat[i + n - 1][2].startswith(term.words[-1]) if term.prefix
                    else flat[i + n - 1][2] == term.words[-1]):
                hits.append((flat[i][0], flat[i + n - 1][1]))
    merged: list[tuple[int, int]] = []
    for a, b in sorted(hits):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(b, merged[-1][1]))
        else:
            merged.append((a, b))
    return merged
