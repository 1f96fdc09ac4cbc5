"""File reservations: reserve, release, reservations (and --check, what guards call).

A reservation is an identity's pattern in a repository, exclusive or shared. It is held while its holder
lives: it ends when released, when its minutes run out, or once its holder has shown no sign of life (a live
harness session, an armed watch, a heartbeat, a reserve, or a human profile) for
model.RESERVATION_GRACE_SECONDS. Whether a holder is live is agent_mail.parts.liveness's to say; which patterns
overlap and which paths they cover is agent_mail.parts.wildmatch's; which repository, agent_mail.parts.repos's.
All of a reserve happens in one write transaction, so racing reservers are serialised by the store.
"""

from __future__ import annotations

import datetime as _dt

from agent_mail import errors, model, spec
from agent_mail.parts import liveness, repos, wildmatch
from agent_mail.operations.results import no_emit


def _mode(row: dict) -> str:
    return "exclusive" if row["exclusive"] else "shared"


class Holders:
    """The liveness of every holder of some reservations, read once."""

    def __init__(self, store, agents, at: _dt.datetime):
        self.at = at
        agents = set(agents)
        one = next(iter(agents)) if len(agents) == 1 else None
        facts = store.liveness(one) if agents else {}
        harnesses = liveness.harnesses_of(store, one) if agents else {}
        humans = store.humans() if agents else set()
        self.presence = {a: liveness.describe_liveness(facts.get(a), at, harnesses.get(a, ()), a in humans)
                         for a in agents}

    def live(self, agent: str) -> bool:
        return self.presence[agent]["reachable"]

    def held(self, row: dict) -> bool:
        """Whether `row` blocks others now: its holder is live, or showed a sign of life within the grace."""
        if self.live(row["agent"]):
            return True
        signs = [model.parse_iso(row["renewed_at"]), model.parse_iso(self.presence[row["agent"]]["last_seen"])]
        newest = max(s for s in signs if s is not None)
        return (self.at - newest).total_seconds() <= model.RESERVATION_GRACE_SECONDS

    def summary(self, agent: str) -> dict:
        p = self.presence[agent]
        return {"watch_state": p["watch_state"], "last_seen": p["last_seen"], "reached_by": p["reached_by"]}

    def shown(self, row: dict) -> dict:
        return {"agent": row["agent"], "pattern": row["pattern"], "mode": _mode(row), "reason": row["reason"],
                "since": row["created"], "renewed_at": row["renewed_at"], "expires_at": row["expires_at"],
                "holder_live": self.live(row["agent"]), "holder_last_seen": self.presence[row["agent"]]["last_seen"],
                "held": self.held(row)}

    def conflict(self, mine: str, row: dict) -> dict:
        return {"pattern": mine, "holder": row["agent"], "holder_pattern": row["pattern"], "mode": _mode(row),
                "reason": row["reason"], "since": row["created"], "expires_at": row["expires_at"],
                "holder_live": self.live(row["agent"]), "holder_liveness": self.summary(row["agent"])}


def _stored_patterns(repository: repos.Repository, patterns, reason: str | None = None) -> list[str]:
    problems, stored = [], []
    if reason:  # shown to whoever is refused, as it is: plain text on one line
        problem = model.name_problem(reason)
        if problem:
            problems.append(("reason", problem))
    for given in patterns:
        try:
            pattern = repository.pattern(given)  # ./x, ../x and absolute paths from the working directory
        except errors.InvalidInput as exc:
            problems += [("patterns", m) for _, m in exc.pairs()]
            continue
        problem = wildmatch.pattern_problem(pattern)
        if problem is None:
            pattern = wildmatch.canonical(pattern.lower() if repository.fold else pattern)
            if pattern not in stored:
                stored.append(pattern)
        if problem:
            problems.append(("patterns", problem))
    if problems:
        raise errors.InvalidInput(problems)
    return stored


def _asking(agent: str, conflicts: list[dict]) -> list:
    """A message to each live holder asking for the pattern; release --force for a dead one's."""
    steps, seen = [], set()
    for c in conflicts:
        if c["holder_live"]:
            key = ("send", c["holder"])
            step = spec.Step("send", from_=agent, to=[c["holder"]], subject=f"May I have {c['holder_pattern']}?",
                             body=f"I need to change {c['pattern']}; you hold {c['holder_pattern']}"
                                  + (f" ({c['reason']})" if c["reason"] else "") + ". Please release it when you can.")
        else:
            key = ("release", c["holder_pattern"])
            step = spec.Step("release", agent=agent, patterns=[c["holder_pattern"]], force=True)
        if key not in seen:
            seen.add(key)
            steps.append(step)
    return steps


def _repository(repo: str | None, located: dict | None) -> repos.Repository:
    """The repository this working directory lies in (or `repo`); through a server (`located` given, {} when the
    client sent none), the one the client located on its own machine: a server never looks at its own files."""
    return repos.locate(repo) if located is None else repos.from_client(located, repo)


def reserve(mailbox, *, agent: str, patterns, shared: bool = False, reason: str | None = None,
            minutes: int = model.RESERVE_MINUTES_DEFAULT, repo: str | None = None, located: dict | None = None,
            emit=no_emit) -> dict:
    repository = _repository(repo, located)
    wanted = _stored_patterns(repository, patterns, reason)
    store = mailbox.store
    with store.transaction(write=True):
        at = model.now()
        now = model.iso(at)
        store.note_active(agent, mailbox.host, now)
        store.expire_reservations(repository.key, now)
        rows = store.reservations_in(repository.key, now)
        holders = Holders(store, [r["agent"] for r in rows], at)
        conflicts, lapsed = [], []
        for mine in wanted:
            for row in rows:
                if row["agent"] == agent or (shared and not row["exclusive"]):
                    continue
                if not wildmatch.overlap(mine, row["pattern"], repository.fold):
                    continue
                if holders.held(row):
                    conflicts.append(holders.conflict(mine, row))
                else:
                    lapsed.append(row["id"])  # its holder is dead: it ended, and makes room
        if conflicts:
            result = {"agent": agent, "repo": repository.key, "granted": [], "mode": "shared" if shared else
                      "exclusive", "expires_at": None, "conflicts": conflicts, "next": _asking(agent, conflicts)}
            hooks = store.webhooks()
            if hooks:  # the clash, told to whoever asked to be (a server POSTs it once this commits)
                from agent_mail.operations import webhooks

                webhooks.queue_clash(store, hooks, agent, repository.key, conflicts, now)
            emit(result)
            return result
        expires = model.iso(at + _dt.timedelta(minutes=minutes))
        store.delete_reservations(sorted(set(lapsed)))
        store.save_reservations([{"id": model.new_message_id(), "repo": repository.key, "agent": agent,
                                  "pattern": p, "exclusive": not shared, "reason": reason, "created": now,
                                  "renewed_at": now, "expires_at": expires} for p in wanted])
        store.record_heartbeat(agent, now)  # reserving is a sign of life
        result = {"agent": agent, "repo": repository.key, "granted": wanted,
                  "mode": "shared" if shared else "exclusive", "expires_at": expires, "conflicts": [],
                  "next": [spec.Step("release", agent=agent, patterns=wanted)]}
        emit(result)
    return result


def release(mailbox, *, agent: str, patterns=(), all: bool = False, force: bool = False, repo: str | None = None,
            located: dict | None = None, emit=no_emit) -> dict:
    repository = _repository(repo, located)
    named = _stored_patterns(repository, patterns) if patterns else []
    store = mailbox.store
    with mailbox.mirrors.changing():
        at = model.now()
        now = model.iso(at)
        store.note_active(agent, mailbox.host, now)
        store.expire_reservations(repository.key, now)
        rows = store.reservations_in(repository.key, now)
        own = [r for r in rows if r["agent"] == agent and (all or r["pattern"] in named)]
        taken: list[dict] = []
        if force:
            others = [r for r in rows if r["agent"] != agent
                      and any(wildmatch.overlap(p, r["pattern"], repository.fold) for p in named)]
            holders = Holders(store, [r["agent"] for r in others], at)
            living = sorted({r["agent"] for r in others if holders.live(r["agent"])})
            if living:
                said = "; ".join(f"{a} ({holders.presence[a]['reached_by']})" for a in living)
                raise errors.InvalidInput([("force", f"refused: {said} is live and still holds what you named; "
                                                     "nothing was released. Ask them (agent-mail send) instead.")])
            taken = others
        ended = own + taken
        store.delete_reservations([r["id"] for r in ended])
        for holder in sorted({r["agent"] for r in taken}):
            _tell_forced(mailbox, holder, agent, [r for r in taken if r["agent"] == holder], now)
        found = {r["pattern"] for r in own} | {p for p in named if any(
            wildmatch.overlap(p, r["pattern"], repository.fold) for r in taken)}
        result = {"agent": agent, "repo": repository.key,
                  "released": [{"agent": r["agent"], "pattern": r["pattern"], "mode": _mode(r)} for r in ended],
                  "count": len(ended), "not_held": [p for p in named if p not in found],
                  "next": [spec.Step("reservations", agent=agent)]}
        emit(result)
    return result


def _tell_forced(mailbox, holder: str, by: str, rows: list[dict], now: str) -> None:
    """The holder of reservations taken with --force hears of it: a system event, and a message from the taker."""
    store = mailbox.store
    patterns = [r["pattern"] for r in rows]
    store.add_event(model.new_message_id(), holder, "reservation.forced",
                    {"by": by, "repo": rows[0]["repo"], "patterns": patterns}, now)
    store.insert_message({
        "id": model.new_message_id(), "sender": by, "recipient": holder,
        "subject": f"I released your reservation of {', '.join(patterns)}"[:model.SUBJECT_MAX_CHARS],
        "body": f"You were not live, so I released your reservations in {rows[0]['repo']} with release --force: "
                f"{', '.join(patterns)}. Reserve again when you are back; ask me first if we overlap.",
        "refs": [], "reply_to": None, "type": "direct", "created": now, "deliver_at": None,
        "batch_id": model.new_message_id()})
    mailbox.mirrors.render([holder], system=True)


class Covering:
    """Which of many reservations cover a path: each pattern filed under the literal directory it starts with,
    so a path is tried only against those filed under one of its ancestors (and the few that match anywhere)."""

    def __init__(self, rows: list[dict], fold: bool):
        self.fold = fold
        self.anywhere: list = []
        self.under: dict[str, list] = {}
        for row in rows:
            matcher = wildmatch.Matcher(row["pattern"], fold)
            pattern = matcher.pattern
            if not pattern.startswith("/"):
                self.anywhere.append((matcher, row))
                continue
            prefix = []
            for part in pattern.strip("/").split("/"):
                if not wildmatch.is_literal(part):
                    break
                prefix.append(part)
            self.under.setdefault("/".join(prefix), []).append((matcher, row))

        self.everywhere = self.anywhere + self.under.get("", [])
        self._sieve = wildmatch.sieve([m for m, _ in self.everywhere]) if len(self.everywhere) > 4 else None

    def rows(self, path: str) -> list[dict]:
        key = path.lower() if self.fold else path
        if self._sieve is None or self._sieve(key):
            found = [row for matcher, row in self.everywhere if matcher.covers(path)]
        else:
            found = []
        at = -1
        while True:
            at = key.find("/", at + 1)
            ancestor = key if at == -1 else key[:at]
            found += [row for matcher, row in self.under.get(ancestor, ()) if matcher.covers(path)]
            if at == -1:
                return found


def reservations(mailbox, *, agent: str | None = None, paths=(), path=(), check: bool = False,
                 repo: str | None = None, located: dict | None = None, emit=no_emit) -> dict:
    repository = _repository(repo, located)
    asked = [repository.path(p) for p in [*paths, *path]]
    if check and not asked:
        raise errors.InvalidInput([("paths", "give the paths to check (a commit's files).")])
    store = mailbox.store
    with store.transaction():
        at = model.now()
        rows = store.reservations_in(repository.key, model.iso(at))
        holders = Holders(store, [r["agent"] for r in rows], at)
        result: dict = {"repo": repository.key}
        if check:
            blocking = [r for r in rows if r["agent"] != agent and r["exclusive"] and holders.held(r)]
            covering = Covering(blocking, repository.fold)
            conflicts, involved = [], {}
            for p in asked:
                for row in covering.rows(p):
                    conflicts.append(holders.conflict(p, row))
                    involved[row["id"]] = row
            listed = list(involved.values())
            result.update({"reservations": [holders.shown(r) for r in listed], "count": len(listed),
                           "ok": not conflicts, "conflicts": conflicts, "next": _asking(agent, conflicts)})
        else:
            listed = [r for r in rows if agent is None or r["agent"] == agent]
            result.update({"reservations": [holders.shown(r) for r in listed], "count": len(listed)})
            if asked:
                covering = Covering(rows, repository.fold)
                result["paths"] = [{"path": p, "held_by": [
                    {"agent": r["agent"], "pattern": r["pattern"], "mode": _mode(r), "held": holders.held(r)}
                    for r in covering.rows(p)]} for p in asked]
            result["next"] = []
        emit(result)
    return result
