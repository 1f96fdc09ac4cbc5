"""`agent-mail run [--agent P:N] -- COMMAND [ARGS...]`: a harness with no wake primitive of its own (Gemini CLI,
Copilot CLI) run in a pseudo-terminal this process owns, and woken when mail arrives.

The person's terminal is passed through unchanged: their keys go to the harness byte for byte, its output comes
back byte for byte, a resize is copied to the pseudo-terminal (the kernel sends the harness SIGWINCH), and `run`
exits with the harness's status (128+N when signal N ended it). The harness runs in a process group of its own
under a small session leader (_lead), as a shell runs a job, so ctrl+z stops it as it would stop the bare program;
run then stops too, and `fg` continues both. When its terminal goes away (SIGHUP) or `run` is stopped (SIGTERM,
SIGINT), the harness's process group is ended and waited for: nothing is left behind.

A helper process (forked before the harness starts) waits for the identity's mail with the mailbox's own wait,
marking nothing read, and writes one byte on a pipe for each arrival. The wait is armed (Mailbox.wait_armed: a
watch session, so `status` says the identity is woken now; through an agent-mail server, the server's watch) only
while run can type the trigger, and holds no session while it cannot (Waker.stuck: _Control). The main loop folds
arrivals into one pending wake, and types the trigger only when the session is idle at an empty prompt:

- the program is a harness set up in this directory (its prompt hook reads the line); anything else is told by
  the terminal's title and bell, never typed into (a shell would run the line as a command);
- the harness has written nothing for QUIET_SECONDS (a turn under way redraws its spinner far more often);
- the person pressed no key for TYPING_PAUSE_SECONDS;
- the prompt is empty: the screen shows the harness's empty prompt (its record's empty_prompt: hidden by typed text
  and by its dialogs) where its words are known, else nothing is unsent since the person's last Enter (KeyTracker)
  and no full-screen program is on the alternate screen;
- the screen's last lines (Screen, a small model of the terminal) show no approval dialog and no turn under way;
- no wake in the last WAKE_INTERVAL_SECONDS.

The trigger is one line (never the mail), typed, seen on the screen, then Enter; the harness's prompt hook (from
`agent-mail setup`) adds the envelopes to that turn (a harness with no prompt hook, its record's
told_at_prompt false: that turn's tool calls or its end tell them, and the wake is over once entered). Mail the
person's own prompt carried, or that the harness's hooks told the session under this process (its harness session,
found by process), wakes nothing.
"""

from __future__ import annotations

import os
import sys
import time

from agent_mail import errors, harnesses, model

QUIET_SECONDS = 0.4  # the harness wrote nothing for this long: not drawing a turn's progress
TYPING_PAUSE_SECONDS = 3.0  # the person pressed no key for this long
WAKE_INTERVAL_SECONDS = 10.0  # at most one wake per this long
ECHO_SECONDS = 2.0  # the typed trigger must show on the screen within this long, else it is erased and retried
ATTEMPTS = 3  # tries of one wake in a row; then again after the wake interval
ROUNDS = 2  # rounds of ATTEMPTS tries before a wake is given up (said on stderr when run exits)
ENTER_DELAY_SECONDS = 0.1  # between the trigger seen on the screen and its Enter
LANDED_SECONDS = 3.0  # after Enter, the prompt hook must have told the session within this long (else Enter again)
LANDED_LOOK_SECONDS = 0.2
STOP_PATIENCE_SECONDS = 3.0  # after SIGHUP/SIGTERM to the harness's group, SIGKILL after this long
SERVED_LOOK_SECONDS = 3.0  # through a server, with woken-for mail still unread: look again this often
WAIT_SECONDS = model.WATCH_MINUTES_DEFAULT * 60.0  # one armed wait of the helper (then re-armed)

# What the screen's last lines show while a harness asks the person something or works on a turn (Gemini CLI,
# Copilot CLI, Claude Code, Codex, Mistral Vibe and common y/n prompts): typing then would answer the dialog or queue
# the trigger.
BUSY_MARKERS = ("esc to cancel", "esc to interrupt", "Esc to cancel", "esc to stop", "Ctrl+C to interrupt")
DIALOG_MARKERS = ("Allow once", "Allow execution", "Allow for this session", "Apply this change", "Do you want to",
                  "Waiting for user confirmation", "Yes, allow", "No, suggest changes", "(y/n)", "[y/N]", "[Y/n]",
                  "Approve", "approve this", "Press enter to confirm", "Press Enter to confirm", "Trust folder",
                  "Do you trust")
SCREEN_LINES_CHECKED = 12
# What the screen's last lines show while a harness's prompt is empty and ready for a line (its placeholder, or a
# footer that is there only while nothing is typed: its record's empty_prompt, agent_mail.harnesses): where a
# harness's words are known, the screen, not the keys, says whether text is unsent, and a dialog or a program over
# the prompt hides them.


def trigger_text(agent: str) -> str:
    """The one line typed into the harness: who has mail and where the envelopes are, never the mail itself."""
    return f"agent-mail: new mail for {agent} (agent-mail read {agent})"


def title_text(agent: str) -> bytes:
    """What run writes to its own terminal when mail comes for a program that is not a set-up harness: the terminal's
    title (OSC 0, and OSC 2 for terminals that keep the two apart) saying whose mail, never the mail, and the bell."""
    said = "".join(ch for ch in f"agent-mail: new mail for {agent}" if ch >= " " and ch != "\x7f")
    return f"\x1b]0;{said}\x07\x1b]2;{said}\x07\x07".encode("utf-8")


# -- the screen ---------------------------------------------------------------------------------------------------
class Screen:
    """A small model of a terminal's screen, enough to know what its last lines say: printable text, carriage
    return, line feed, backspace, tab, the cursor moves and erases of CSI (A B C D E F G H f d J K), scrolling at
    the bottom and the alternate screen (cleared, and `alternate` while a program is on it: DECSET 47, 1047,
    1049). Colours and other sequences are skipped. One cell per character
    (wide characters are counted as one): good enough to find words on a line, not to draw it."""

    def __init__(self, rows: int = 24, cols: int = 80):
        self.rows, self.cols = max(1, rows), max(1, cols)
        self.grid = [[" "] * self.cols for _ in range(self.rows)]
        self.row = self.col = 0
        self.state = "text"  # text, esc, csi, osc, osc_esc, charset
        self.params = ""
        self.alternate = False  # a program (vim, less, a full-screen harness) draws on the alternate screen
        self.pending = b""  # an incomplete UTF-8 sequence

    def resize(self, rows: int, cols: int) -> None:
        rows, cols = max(1, rows), max(1, cols)
        grid = [[" "] * cols for _ in range(rows)]
        keep = self.grid[-rows:] if rows < self.rows else self.grid
        offset = rows - len(keep) if rows >= self.rows else 0
        for r, line in enumerate(keep):
            for c, ch in enumerate(line[:cols]):
                grid[r + offset if rows >= self.rows else r][c] = ch
        self.grid, self.rows, self.cols = grid, rows, cols
        self.row, self.col = min(self.row, rows - 1), min(self.col, cols - 1)

    def lines(self) -> list[str]:
        return ["".join(line).rstrip() for line in self.grid]

    def text(self) -> str:
        return "\n".join(self.lines())

    def last_lines(self, count: int) -> str:
        lines = self.lines()
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines[-count:])

    def count(self, words: str) -> int:
        """How often `words` stand on the screen, on one line or wrapped over several."""
        flat = "".join("".join(line) for line in self.grid)
        return max(self.text().count(words), flat.count(words))

    def feed(self, data: bytes) -> None:
        text = (self.pending + data).decode("utf-8", "replace") if not _incomplete(self.pending + data) else None
        if text is None:
            cut = _complete_prefix(self.pending + data)
            whole = self.pending + data
            text, self.pending = whole[:cut].decode("utf-8", "replace"), whole[cut:]
        else:
            self.pending = b""
        for ch in text:
            self._put(ch)

    def _put(self, ch: str) -> None:
        state = self.state
        if state == "text":
            if ch == "\x1b":
                self.state = "esc"
            elif ch == "\r":
                self.col = 0
            elif ch in "\n\x0b\x0c":
                self._line_feed()
            elif ch == "\b":
                self.col = max(0, self.col - 1)
            elif ch == "\t":
                self.col = min(self.cols - 1, (self.col // 8 + 1) * 8)
            elif ch >= " " and ch != "\x7f":
                if self.col >= self.cols:
                    self.col = 0
                    self._line_feed()
                self.grid[self.row][self.col] = ch
                self.col += 1
        elif state == "esc":
            if ch == "c":  # full reset: back on the main screen
                self.alternate = False
            if ch == "[":
                self.state, self.params = "csi", ""
            elif ch == "]":
                self.state = "osc"
            elif ch in "()*+":
                self.state = "charset"
            else:
                if ch == "M":  # reverse index
                    self.row = max(0, self.row - 1)
                elif ch == "c":  # full reset
                    self._erase_display(2)
                    self.row = self.col = 0
                self.state = "text"
        elif state == "charset":
            self.state = "text"
        elif state == "osc":
            if ch == "\x07":
                self.state = "text"
            elif ch == "\x1b":
                self.state = "osc_esc"
        elif state == "osc_esc":
            self.state = "text" if ch == "\\" else "osc"
        elif state == "csi":
            if "\x40" <= ch <= "\x7e":
                self.state = "text"
                self._csi(self.params, ch)
            else:
                self.params += ch
                if len(self.params) > 64:
                    self.state = "text"

    def _line_feed(self) -> None:
        if self.row == self.rows - 1:
            self.grid.pop(0)
            self.grid.append([" "] * self.cols)
        else:
            self.row += 1

    def _csi(self, params: str, final: str) -> None:
        private = params[:1] in ("?", ">", "<", "=")
        if private:
            if final in "hl" and params[:1] == "?" and any(p in ("47", "1047", "1049") for p in params[1:].split(";")):
                self._erase_display(2)  # into or out of the alternate screen: what was there is not this one
                self.alternate = final == "h"
            return
        numbers = []
        for part in params.split(";"):
            numbers.append(int(part) if part.isdigit() else 0)
        first = numbers[0] if numbers else 0
        n = first or 1
        if final == "A":
            self.row = max(0, self.row - n)
        elif final in "Be":
            self.row = min(self.rows - 1, self.row + n)
        elif final in "Ca":
            self.col = min(self.cols - 1, self.col + n)
        elif final == "D":
            self.col = max(0, min(self.col, self.cols - 1) - n)
        elif final == "E":
            self.row, self.col = min(self.rows - 1, self.row + n), 0
        elif final == "F":
            self.row, self.col = max(0, self.row - n), 0
        elif final in "G`":
            self.col = min(self.cols - 1, n - 1)
        elif final == "d":
            self.row = min(self.rows - 1, n - 1)
        elif final in "Hf":
            column = numbers[1] if len(numbers) > 1 and numbers[1] else 1
            self.row, self.col = min(self.rows - 1, n - 1), min(self.cols - 1, column - 1)
        elif final == "J":
            self._erase_display(first)
        elif final == "K":
            line, col = self.grid[self.row], min(self.col, self.cols)
            start, end = {0: (col, self.cols), 1: (0, col + 1), 2: (0, self.cols)}.get(first, (col, self.cols))
            for c in range(start, min(end, self.cols)):
                line[c] = " "
        elif final == "S":
            for _ in range(min(n, self.rows)):
                self.grid.pop(0)
                self.grid.append([" "] * self.cols)
        elif final == "T":
            for _ in range(min(n, self.rows)):
                self.grid.pop()
                self.grid.insert(0, [" "] * self.cols)

    def _erase_display(self, how: int) -> None:
        if how in (2, 3):
            self.grid = [[" "] * self.cols for _ in range(self.rows)]
            return
        col = min(self.col, self.cols)
        if how == 0:
            for c in range(col, self.cols):
                self.grid[self.row][c] = " "
            for r in range(self.row + 1, self.rows):
                self.grid[r] = [" "] * self.cols
        elif how == 1:
            for r in range(self.row):
                self.grid[r] = [" "] * self.cols
            for c in range(min(col + 1, self.cols)):
                self.grid[self.row][c] = " "


def _incomplete(data: bytes) -> bool:
    return _complete_prefix(data) != len(data)


def _complete_prefix(data: bytes) -> int:
    """How many bytes of `data` end on a whole UTF-8 character (an incomplete last one waits for the next read)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return len(data) - back if need > back else len(data)
    return len(data)


# -- the person's keys --------------------------------------------------------------------------------------------
class KeyTracker:
    """What the person's keys left at the prompt: `unsent` characters typed since their last Enter (backspace takes
    one away; ctrl+u, ctrl+c and Enter clear them), `uncertain` after a key whose effect on the line cannot be
    known from here (up and down recalling history, tab completion, other control keys; delete and alt+key on a
    line holding text: unsent text until Enter, ctrl+u or ctrl+c), and when the last key came. Esc, the keys that
    only move (left, right, home, end, page up and down) and function keys put no text on the line. What the
    terminal itself sends on this input is not a key: its answers to the harness's queries (cursor position,
    device attributes, colours, keyboard modes), focus and mouse reports. A bracketed paste is text typed.
    Keys fed with `counted=False` (typed into a full-screen program over the prompt: vim, less) only say when the
    last key came."""

    def __init__(self):
        self.unsent = 0
        self.uncertain = False
        self.last_key = float("-inf")
        self.submitted = 0  # Enters that sent text the person had typed (their prompt carried the mail waiting)
        self.partial = b""  # an escape sequence cut by the end of a read
        self.pasting = False

    def clear(self) -> bool:
        return self.unsent == 0 and not self.uncertain

    def feed(self, data: bytes, at: float, counted: bool = True) -> None:
        if not counted:
            self.partial, self.pasting = b"", False
            if any(kind != "report" for kind in _kinds(data)):
                self.last_key = at
            return
        data, self.partial = self.partial + data, b""
        i = 0
        while i < len(data):
            byte = data[i]
            if byte == 0x1b:
                end, kind = _escape(data, i)
                if end is None:
                    self.partial = data[i:]
                    if len(self.partial) > 4096:  # not a sequence after all
                        self.partial, self.uncertain, self.last_key = b"", True, at
                    return
                sequence, i = data[i:end], end
                if kind == "paste":
                    self.pasting = sequence.endswith(b"200~")
                    self.last_key = at
                elif kind == "key":
                    self.last_key = at
                    if _edits(sequence, self.unsent):
                        self.uncertain = True
                continue  # a report of the terminal: not the person
            self.last_key = at
            if self.pasting:
                if byte & 0xC0 != 0x80:
                    self.unsent += 1
            elif byte in (0x0d, 0x0a):  # Enter
                if not self.clear():
                    self.submitted += 1
                self.unsent, self.uncertain = 0, False
            elif byte in (0x03, 0x15):  # ctrl+c, ctrl+u: the line is cleared
                self.unsent, self.uncertain = 0, False
            elif byte in (0x7f, 0x08):  # backspace
                if self.unsent:
                    self.unsent -= 1
            elif byte < 0x20:  # tab completion, ctrl+w, ctrl+a, ...: the line changed in ways not followed here
                self.uncertain = True
            elif byte & 0xC0 != 0x80:  # a character (a UTF-8 continuation byte is part of the one before)
                self.unsent += 1
            i += 1


def _kinds(data: bytes) -> list[str]:
    """What each escape sequence and other byte of `data` is ("key", "report", "paste"): whether a person typed."""
    kinds, i = [], 0
    while i < len(data):
        if data[i] != 0x1b:
            kinds.append("key")
            i += 1
            continue
        end, kind = _escape(data, i)
        if end is None:
            kinds.append("key")
            break
        kinds.append(kind)
        i = end
    return kinds


def _edits(sequence: bytes, unsent: int) -> bool:
    """Whether the key `sequence` (an escape sequence the person typed) may have changed what the prompt line holds:
    up and down (history: text recalled into an empty line too); delete and alt+key (alt+backspace, alt+d) on a line
    holding text. Esc, moves, function keys, Insert: no."""
    if len(sequence) < 2:
        return False  # Esc
    kind, final = sequence[1:2], sequence[-1:]
    if kind in (b"[", b"O"):
        if final in (b"A", b"B"):
            return True
        return bool(unsent) and sequence[2:] == b"3~"  # delete
    if kind == b"\x1b":
        return False  # Esc twice
    return bool(unsent)  # alt+key


_REPORT_FINALS = b"RcnytIOu"  # CSI answers of a terminal: cursor position, attributes, status, modes, focus, flags


def _escape(data: bytes, start: int) -> tuple[int | None, str]:
    """(the index after the escape sequence at data[start], what it is: "key" a key the person pressed, "report"
    what the terminal sent of itself, "paste" a bracketed paste's start or end); (None, "") when the end of `data`
    cuts it. A bare ESC at the end of a read is the Esc key."""
    if start + 1 >= len(data):
        return start + 1, "key"
    kind = data[start + 1]
    if kind in (ord("]"), ord("P"), ord("_"), ord("^")):  # OSC, DCS, APC, PM: until BEL or ST
        i = start + 2
        while i < len(data):
            if data[i] == 0x07:
                return i + 1, "report"
            if data[i] == 0x1b and i + 1 < len(data) and data[i + 1] == ord("\\"):
                return i + 2, "report"
            i += 1
        return None, ""
    if kind == ord("["):
        i = start + 2
        while i < len(data) and not 0x40 <= data[i] <= 0x7e:
            i += 1
        if i >= len(data):
            return None, ""
        params, final = data[start + 2:i], data[i:i + 1]
        if final == b"~" and params in (b"200", b"201"):
            return i + 1, "paste"
        if params[:1] == b"<" and final in (b"M", b"m"):  # a mouse report (SGR)
            return i + 1, "report"
        if final == b"M" and not params:  # a mouse report (X10): three more bytes
            return (i + 4, "report") if i + 3 < len(data) else (None, "")
        if final in (b"I", b"O") and not params:
            return i + 1, "report"  # focus in / out
        if final and final in _REPORT_FINALS and (params[:1] in (b"?", b">", b"=") or final in b"Rnyt"):
            return i + 1, "report"
        return i + 1, "key"
    if kind == ord("O"):
        return (start + 3, "key") if start + 2 < len(data) else (None, "")
    return start + 2, "key"  # alt+key


# -- the decision -------------------------------------------------------------------------------------------------
class Waker:
    """When to type the trigger. The main loop tells it of output, keys and mail; `blocked_by(now)` says why not
    now (None: every condition of an idle session at an empty prompt met), `stuck()` why it cannot type until
    something changes (not for a moment), `next_check(now)` when to ask again. `types`: the program is a harness
    set up here, whose prompt hook reads the trigger (else nothing is ever typed); `empty`: the words its screen
    shows while its prompt is empty (its record's empty_prompt), where known."""

    def __init__(self, screen: Screen, keys: KeyTracker, started: float, types: bool = True,
                 empty: tuple[str, ...] = ()):
        self.screen, self.keys = screen, keys
        self.types, self.empty = types, empty
        self.last_output = started
        self.output_seen = False
        self.pending_since: float | None = None
        self.submitted_at_mail = 0
        self.last_wake = float("-inf")
        self.answered = 0  # dialog lines on the screen the person answered (Enter while they showed)
        self.person_prompted = False  # the person sent a prompt since the pending mail arrived

    def mail(self, now: float) -> None:
        if self.pending_since is None:
            self.pending_since, self.person_prompted = now, False
            self.submitted_at_mail = self.keys.submitted

    def output(self, now: float) -> None:
        self.last_output, self.output_seen = now, True

    def typed(self, submitted_before: int) -> None:
        """After the person's keys: Enters pressed while a dialog was open answered it (a line-oriented program
        leaves the question on the screen: answered, it no longer counts as open) and sent no prompt, so they
        carried no mail."""
        answered = self.keys.submitted - submitted_before
        if answered and self.dialog():
            self.answered = len(self._dialog_lines())
            if self.pending_since is not None:
                self.submitted_at_mail += answered

    def _dialog_lines(self) -> list[str]:
        return [line for line in self.screen.last_lines(SCREEN_LINES_CHECKED).splitlines()
                if any(marker in line for marker in DIALOG_MARKERS)]

    def dialog(self) -> bool:
        """Whether the screen's last lines show a dialog not answered yet."""
        shown = len(self._dialog_lines())
        self.answered = min(self.answered, shown)
        return shown > self.answered

    def carried(self) -> None:
        """The pending mail was told (by the person's own prompt, or the harness's hooks): no wake for it."""
        self.pending_since, self.person_prompted = None, False

    def woke(self, now: float) -> None:
        self.pending_since, self.last_wake, self.person_prompted = None, now, False

    def blocked_by(self, now: float) -> str | None:
        """Why the trigger may not be typed now (None: it may)."""
        if self.pending_since is None:
            return "no mail"
        if self.keys.submitted != self.submitted_at_mail:
            # The person sent a prompt after the mail arrived: its prompt hook most likely told it. Where the
            # mailbox knows the session under run, that is checked before a wake (a slash command tells nothing);
            # elsewhere the prompt is taken to have carried it.
            self.submitted_at_mail, self.person_prompted = self.keys.submitted, True
        if not self.output_seen:
            return "the harness has drawn nothing yet"
        if now - self.last_output < QUIET_SECONDS:
            return "the harness is writing"
        if now - self.keys.last_key < TYPING_PAUSE_SECONDS:
            return "the person typed in the last seconds"
        stuck = self.stuck()
        if stuck is not None:
            return stuck
        if now - self.last_wake < WAKE_INTERVAL_SECONDS:
            return "woken in the last interval"
        return None

    def stuck(self) -> str | None:
        """Why the trigger cannot be typed until the person or the program changes something (None: nothing of
        the kind): not a set-up harness, a full-screen program over the prompt, unsent text, a dialog."""
        if not self.types:
            return "not a harness set up here (its prompt hook would not read the line): told by title and bell"
        if self.empty:
            tail = self.screen.last_lines(SCREEN_LINES_CHECKED)
            if not any(words in tail for words in self.empty):
                return "the harness's empty prompt is not showing (unsent text, a dialog or another program)"
        else:
            if self.screen.alternate:
                return "a full-screen program is open (the alternate screen)"
            if not self.keys.clear():
                return "unsent text at the prompt"
        if self.dialog():
            return "a dialog is open"
        if self.busy():
            return "a turn is under way"
        return None

    def busy(self) -> bool:
        """Whether the screen's last lines show a turn under way (its spinner's "esc to cancel"): the harness's
        hooks tell mail then (after its next tool call, or at its stop), and run types nothing until it is over."""
        tail = self.screen.last_lines(SCREEN_LINES_CHECKED)
        return any(marker in tail for marker in BUSY_MARKERS)

    def next_check(self, now: float) -> float | None:
        """Seconds until a condition may have changed by time alone (None: only an event can change it)."""
        if self.pending_since is None:
            return None
        moments = [self.last_output + QUIET_SECONDS, self.keys.last_key + TYPING_PAUSE_SECONDS,
                   self.last_wake + WAKE_INTERVAL_SECONDS]
        later = [m - now for m in moments if m > now]
        return max(0.02, min(later)) if later else 0.5  # a dialog or unsent text: looked at again each half second


# -- the helper: waiting for mail ---------------------------------------------------------------------------------
class _Changed(Exception):
    """run changed what it wants of the helper's wait (SIGINT) as a wait was starting or ending."""


class _Control:
    """The helper's end of run's control pipe: whether its wait should be armed (b"a": run can type the trigger, so
    senders are told the identity is woken now) or not (b"q": run cannot type now, or never will; the helper still
    waits, holding no session). run writes the byte, then sends SIGINT.

    On the mailbox's machine (`raising` False) the byte is what ends a wait under way: the pipe is slept on with
    the mailbox's wake-ups (Waits.wait_for_mail's `also`), and SIGINT only notes the change (`changed`), never
    raising, so no moment between one wait's signal handlers and the next can lose it. Through a server (`raising`)
    the wait is a long request only a signal ends: SIGINT ends it (its session released on the server: the client's
    own handler), a SIGINT as a wait starts or ends (`waiting`) raises _Changed, elsewhere it is noted and the next
    wait does not start."""

    def __init__(self, fd: int, armed: bool, raising: bool = True):
        import signal

        self.fd, self.armed, self.changed, self.gone, self.waiting = fd, armed, False, False, False
        self.raising = raising
        os.set_blocking(fd, False)
        signal.signal(signal.SIGINT, self._interrupted)

    def _interrupted(self, signum, frame) -> None:
        self.changed = True
        if self.waiting and self.raising:
            self.waiting = False
            raise _Changed

    def wait(self, waiting, *args, **options):
        """waiting(*args, **options), a wait that ends with errors.Interrupted(130) at SIGINT (through a server);
        None when run changed what it wants meanwhile, else what it found."""
        if self.changed:
            return None
        try:
            self.waiting = True
            return waiting(*args, **options)
        except _Changed:
            return None
        except errors.Interrupted as exc:
            if exc.exit_code != 128 + 2:  # SIGINT: run changed what it wants; anything else ends the helper
                raise
            return None
        finally:
            self.waiting = False

    def read(self, wait: float = 0.0) -> bool:
        """Take what run wrote (waiting up to `wait` seconds for something); whether the wanted state changed."""
        import select

        before = self.armed
        self.changed = False  # before the read: a SIGINT from now on comes with a byte not read yet
        if wait > 0:
            try:
                select.select([self.fd], [], [], wait)
            except InterruptedError:
                pass
        try:
            data = os.read(self.fd, 256)
        except BlockingIOError:
            data = None
        if data == b"":
            self.gone = True
        for byte in data or b"":
            if byte in b"aq":
                self.armed = byte == ord("a")
        return self.armed != before


def _helper_local(agent: str, notify: int, parent: int, control: _Control) -> None:
    """Block on the mailbox until mail for `agent` arrives after what was already there when run started, write a
    byte to `notify` per arrival, wait again; until run goes away or stops this process. The wait is armed (a watch
    session: status says the identity is woken now) while run says it can type, and holds no session otherwise."""
    from agent_mail.operations import mail

    with mail.open_mailbox() as mailbox:
        store = mailbox.store
        with store.transaction():
            mark = {"seq": store.newest_seq(), "at": model.now_iso()}
        os.write(notify, b"r")  # mail from now on is seen

        def look() -> list[dict]:
            now = model.now_iso()
            with store.transaction():
                envelopes, new = store.untold(agent, now, mark["seq"], mark["at"], 1)
                if new:
                    mark["seq"] = max(mark["seq"], store.newest_seq())
            if new:
                mark["at"] = now
                os.write(notify, b"m")  # said here, at once: a wait ended by run's SIGINT as it returns loses nothing
            return envelopes if new else []

        def wanted() -> bool:
            return os.getppid() == parent and not control.changed

        while os.getppid() == parent and not control.gone:
            control.read()
            wait = mailbox.wait_armed if control.armed else mailbox.wait_unarmed
            # Woken by run's byte on the control pipe; SIGTERM/SIGHUP still end it, its session released.
            control.wait(wait, agent, WAIT_SECONDS, look, wanted, (control.fd,), stop_on=("SIGTERM", "SIGHUP"))


def _helper_served(agent: str, notify: int, parent: int, served, control: _Control) -> None:
    """The same through an agent-mail server: its watch (a long request, armed there) until unread mail it has not
    reported yet is there; while mail it reported is still unread, or while run wants no armed wait, a look
    (watch --once) every SERVED_LOOK_SECONDS."""
    known: set[str] = set()
    first = served.call("watch", {"agent": agent, "once": True})[1]
    known.update(m["id"] for m in first.get("messages", []))
    os.write(notify, b"r")
    while os.getppid() == parent and not control.gone:
        control.read()
        unread = served.call("watch", {"agent": agent, "once": True})[1].get("messages", [])
        ids = {m["id"] for m in unread}
        if ids - known:
            known |= ids
            os.write(notify, b"m")
        known &= ids  # read mail leaves the set: what is unread now is all it needs
        if unread or not control.armed:
            control.read(SERVED_LOOK_SECONDS)  # a change of what run wants ends it sooner
            continue
        answer = control.wait(served.watch, agent)  # a signal releases its session on the server first
        if answer is None:
            continue
        ids = {m["id"] for m in answer.get("messages", [])}
        if ids - known:
            known |= ids
            os.write(notify, b"m")


def _end_with(parent: int) -> None:
    """Have the kernel SIGTERM this process when its parent dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG; a
    no-op elsewhere, where the helper sees its parent gone at its next refresh)."""
    import signal

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError, ImportError):
        pass
    if os.getppid() != parent:  # it died before that took effect
        raise errors.Interrupted("agent-mail run ended before its helper started", 0)


def start_helper(agent: str, served, armed: bool) -> tuple[int, int, int]:
    """Fork the helper; (its pid, the pipe end it writes a byte to per arrival, the pipe end run tells it on whether
    to arm its wait: _Control)."""
    read_end, write_end = os.pipe()
    control_read, control_write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_end)
            os.close(control_write)
            os.setpgid(0, 0)  # out of the terminal's reach: only run's SIGTERM (or its death) ends it, once
            _end_with(parent)
            control = _Control(control_read, armed, raising=served is not None)
            if served is None:
                _helper_local(agent, write_end, parent, control)
            else:
                _helper_served(agent, write_end, parent, served, control)
        except errors.Interrupted:
            code = 0  # stopped by run: its session released
        except BaseException as exc:  # noqa: BLE001 - the helper's failure is run's to report
            try:
                os.write(write_end, b"!" + str(exc)[:300].encode("utf-8", "replace"))
            except OSError:
                pass
            code = 1
        os._exit(code)
    os.close(write_end)
    os.close(control_read)
    return pid, read_end, control_write


# -- the session under this process -------------------------------------------------------------------------------
def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def under(pid: int, root: int) -> bool:
    """Whether process `pid` is `root` or one of its descendants."""
    for _ in range(64):
        if pid == root:
            return True
        if pid is None or pid <= 1:
            return False
        pid = _parent_of(pid)
    return False


def still_untold(agent: str, child: int) -> bool | None:
    """Whether the harness sessions running under `child` (their hooks recorded them, with their harness's process)
    were not told all the mail for `agent` yet: False when each was told everything (no wake needed), True when
    one was not, None when no such session is known (a harness without agent-mail hooks, or served)."""
    from agent_mail.operations import mail
    from agent_mail.parts.liveness import host_name, live_sessions

    with mail.open_mailbox() as mailbox:
        store = mailbox.store
        with store.transaction():
            now = model.now_iso()
            host = host_name()
            ours = [row for row in live_sessions(store.harness_sessions_of(agent), model.now())
                    if row.get("host") == host and row.get("pid") and under(int(row["pid"]), child)]
            if not ours:
                return None
            for row in ours:
                session = store.harness_session(row["id"])
                if session is None:
                    continue
                if store.untold(agent, now, session["told_seq"], session["told_at"], 1)[1]:
                    return True
    return False


# -- the pseudo-terminal ------------------------------------------------------------------------------------------
def _window(fd: int) -> bytes | None:
    import fcntl
    import termios

    try:
        return fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None


def _set_window(fd: int, size: bytes | None) -> None:
    import fcntl
    import termios

    if size is not None:
        try:
            fcntl.ioctl(fd, termios.TIOCSWINSZ, size)
        except OSError:
            pass


def _rows_cols(size: bytes | None) -> tuple[int, int]:
    import struct

    if not size:
        return 24, 80
    rows, cols = struct.unpack("HHHH", size)[:2]
    return rows or 24, cols or 80


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            import select

            select.select([], [fd], [], 1.0)


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _lead(command: list[str], told: int) -> None:
    """The first process on the pseudo-terminal (its session's leader, in pty.fork's child): start the harness in a
    process group of its own, the terminal's foreground group, and stand between it and run, as a shell does for
    a job. The harness's group then has a parent in its session, so a stop (ctrl+z in a cooked terminal, or the
    harness stopping itself, as Copilot CLI does) is not discarded as the kernel discards it for a session
    leader's orphaned group. When the harness stops, this process stops too (SIGSTOP: run sees it and stops
    itself); continued (run's SIGCONT, after `fg`), it continues the harness's group. SIGHUP, SIGTERM, SIGINT and
    SIGQUIT are passed on to the harness's group; its end is this process's end, with its exit status or by its
    signal. `told`: a pipe on which the harness's process id is written for run."""
    import signal

    signal.set_wakeup_fd(-1)  # run's, inherited: not this process's
    for number in (signal.SIGWINCH, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)
    limit = min(os.sysconf("SC_OPEN_MAX"), 65536) if hasattr(os, "sysconf") else 1024
    os.closerange(3, told)  # run's pipes and files: the helper's, the log
    os.closerange(told + 1, limit)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # taking the terminal's foreground from here
    harness = os.fork()
    if harness == 0:
        os.close(told)
        os.setpgid(0, 0)
        try:
            os.tcsetpgrp(0, os.getpgrp())
        except OSError:
            pass
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"agent-mail run: could not start {command[0]!r}: {exc}\r\n".encode())
        os._exit(127)
    try:
        os.setpgid(harness, harness)
    except OSError:
        pass  # it did so itself (and may have exec'd already)
    try:
        os.tcsetpgrp(0, harness)
    except OSError:
        pass
    os.write(told, str(harness).encode())
    os.close(told)

    def passed_on(signum, frame):
        try:
            os.killpg(harness, signum)
            if signum == signal.SIGHUP:
                os.killpg(harness, signal.SIGCONT)
        except OSError:
            pass
    for number in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(number, passed_on)
    while True:
        try:
            _, status = os.waitpid(harness, os.WUNTRACED)
        except ChildProcessError:
            os._exit(0)
        if os.WIFSTOPPED(status):
            os.kill(os.getpid(), signal.SIGSTOP)  # run sees this stop, and stops itself; `fg` continues it
            try:
                os.tcsetpgrp(0, harness)
                os.killpg(harness, signal.SIGCONT)
            except OSError:
                pass
            continue
        if os.WIFSIGNALED(status):
            number = os.WTERMSIG(status)
            signal.signal(number, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
            os.kill(os.getpid(), number)
            os._exit(128 + number)  # a signal whose default is not to end a process
        os._exit(os.WEXITSTATUS(status))


class Runner:
    """One harness under run: the pseudo-terminal, the person's terminal, the helper, the loop."""

    def __init__(self, agent: str, command: list[str], served=None):
        self.agent, self.command, self.served = agent, command, served
        self.trigger = trigger_text(agent).encode("utf-8")
        self.title = title_text(agent)
        self.gave_up = 0
        self.attempts = 0  # tries of the wake under way whose trigger was not seen
        self.woken = 0
        self.stopped_by: int | None = None
        self.problem: str | None = None
        from agent_mail.harness import setup

        self.harness = setup.set_up_for(command[0], os.getcwd())  # None: its prompt hook would not read a line
        self.harness_pid: int | None = None  # the harness's process (and group), under _lead
        self.armed = False  # what the helper was last told: arm its wait (run can type) or not
        self.helper: int | None = None
        self.control: int | None = None
        where = os.environ.get("AGENT_MAIL_RUN_LOG")
        self.log = open(where, "a", encoding="utf-8") if where else None  # why each pending wake waits (debugging)

    def run(self) -> int:
        import pty
        import select
        import signal
        import termios
        import tty

        stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
        size = _window(stdin)
        helper, notify, self.control = start_helper(self.agent, self.served, False)
        self.helper = helper
        signals_r, signals_w = os.pipe()
        os.set_blocking(signals_w, False)
        os.set_blocking(signals_r, False)
        caught: list[int] = []

        def on_signal(signum, frame):
            caught.append(signum)
        handled = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGWINCH, signal.SIGCHLD, signal.SIGQUIT)
        previous = {number: signal.signal(number, on_signal) for number in handled}
        old_wakeup = signal.set_wakeup_fd(signals_w)
        saved = self.saved = termios.tcgetattr(stdin)
        child = None
        told_r, told_w = os.pipe()
        try:
            child, master = pty.fork()
            if child == 0:  # its own session, the pseudo-terminal its controlling terminal: the harness's leader
                try:
                    for number in handled:
                        signal.signal(number, signal.SIG_DFL)
                    os.close(told_r)
                    _lead(self.command, told_w)
                finally:
                    os._exit(127)
            os.close(told_w)
            told = b""
            while True:
                try:
                    part = os.read(told_r, 32)
                except InterruptedError:
                    continue
                if not part:
                    break
                told += part
            os.close(told_r)
            self.harness_pid = int(told) if told.isdigit() else None
            _set_window(master, size)
            tty.setraw(stdin, termios.TCSANOW)
            return self._loop(child, master, stdin, stdout, notify, signals_r, caught, select)
        finally:
            try:
                termios.tcsetattr(stdin, termios.TCSAFLUSH, saved)
            except termios.error:
                pass
            signal.set_wakeup_fd(old_wakeup)
            for number, handler in previous.items():
                signal.signal(number, handler)
            self.end_helper(helper)
            if child:
                self._end_child(child, signal.SIGHUP)

    def _loop(self, child, master, stdin, stdout, notify, signals_r, caught, select) -> int:
        import signal

        rows, cols = _rows_cols(_window(stdin))
        screen, keys = Screen(rows, cols), KeyTracker()
        now = time.monotonic()
        empty = harnesses.of(self.harness).empty_prompt if self.harness else ()
        waker = Waker(screen, keys, now, types=self.harness is not None, empty=empty)
        self._note(f"the program: the harness {self.harness}, set up here" if self.harness else
                   "the program: not a harness set up here (mail is told by the terminal's title and bell)")
        typing: dict | None = None  # a wake under way (Runner.wake_step)
        held_keys = b""  # the person's keys while a trigger waits to be seen (sent once it is, or erased)
        status = None
        last_told = float("-inf")  # the title and bell, for a program that is not a set-up harness
        inputs = [master, stdin, notify, signals_r]
        while True:
            now = time.monotonic()
            timeout = None
            if typing is not None:
                timeout = max(0.0, min(typing["deadline"], typing.get("next", typing["deadline"])) - now)
            else:
                later = waker.next_check(now)
                if later is not None:
                    timeout = later
            settle = waker.last_output + QUIET_SECONDS - now  # what the screen says, once it is drawn: _steer
            if settle > 0 and (timeout is None or settle < timeout):
                timeout = settle
            try:
                ready, _, _ = select.select(inputs, [], [], timeout)
            except InterruptedError:
                ready = []
            now = time.monotonic()
            if signals_r in ready:
                try:
                    os.read(signals_r, 256)
                except BlockingIOError:
                    pass
            while caught:
                signum = caught.pop(0)
                if signum == signal.SIGWINCH:
                    size = _window(stdin)
                    _set_window(master, size)
                    screen.resize(*_rows_cols(size))
                elif signum == signal.SIGCHLD:
                    done, found = os.waitpid(child, os.WNOHANG | os.WUNTRACED)
                    if done and os.WIFSTOPPED(found):
                        self._suspend(child, master, stdin, screen)
                        waker.output(time.monotonic())  # what is on the screen is looked at again once redrawn
                    elif done:
                        status = found
                else:
                    self.stopped_by = signum
                    self._end_child(child, signal.SIGHUP if signum == signal.SIGHUP else signal.SIGTERM)
                    return 128 + signum
            if master in ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    data = b""
                if not data:  # the harness closed its terminal: it ended (or is ending)
                    if status is None:
                        status = os.waitpid(child, 0)[1]
                    return _exit_code(status)
                _write_all(stdout, data)
                screen.feed(data)
                waker.output(now)
            if status is not None and master not in ready:
                return _exit_code(status)  # ended, its terminal left open by a process it started
            if stdin in ready:
                try:
                    data = os.read(stdin, 65536)
                except OSError:
                    data = b""
                if not data:  # the person's terminal is gone
                    self.stopped_by = signal.SIGHUP
                    self._end_child(child, signal.SIGHUP)
                    return 128 + signal.SIGHUP
                before = keys.submitted
                keys.feed(data, now, counted=not (screen.alternate and not waker.empty))  # vim's keys: not a prompt's
                waker.typed(before)
                if typing is not None and typing["phase"] != "landing":
                    held_keys += data
                else:
                    _write_all(master, data)
                    if typing is not None:
                        typing["person"] = True  # their keys after the trigger's Enter: it is not resent
            if notify in ready:
                data = os.read(notify, 4096)
                if data.startswith(b"!") or not data:
                    self.problem = data[1:].decode("utf-8", "replace") or "the wait for mail ended"
                    inputs.remove(notify)
                else:
                    if b"r" in data:
                        self._note("the wait for mail is ready")
                    if b"m" in data:
                        waker.mail(now)
            if typing is None:
                self._steer(waker, now)
            if typing is not None:
                typing = self.wake_step(typing, screen, waker, master, now, held_keys, child)
                if typing is None or typing["phase"] == "landing":
                    if held_keys:
                        _write_all(master, held_keys)
                        held_keys = b""
                continue
            if not waker.types:
                if waker.pending_since is not None and now - last_told >= WAKE_INTERVAL_SECONDS and \
                        screen.state == "text" and not screen.pending:
                    _write_all(stdout, self.title)  # between the program's sequences, never inside one
                    last_told = now
                    waker.carried()
                    self._note("told by the terminal's title and bell (the program is not a set-up harness)")
                continue
            why = waker.blocked_by(now)
            if waker.pending_since is not None:
                self._note(f"{why or 'wake'} | {screen.last_lines(3)!r}")
            if why is None:
                told = self.session_untold(child)
                if told is False and not keys.submitted and waker.last_wake == float("-inf"):
                    # Told only by the session's start (it came just as the harness started): nothing has been
                    # sent to the model since, so the model has not seen it. The wake's turn carries it.
                    told = True
                if told is False or (told is None and waker.person_prompted):
                    waker.carried()  # the harness's hooks told its session already (or, unknown, the person's prompt)
                    self._note("told already (by a prompt of the person's or the harness's hooks): no wake")
                    continue
                _write_all(master, self.trigger)
                typing = {"phase": "echo", "deadline": now + ECHO_SECONDS,
                          "shown": screen.count(self.trigger.decode("utf-8"))}
                self._note(f"trigger typed (the session under run: {'not known' if told is None else 'not told yet'})")

    def _steer(self, waker: Waker, now: float) -> None:
        """Arm the helper's wait while run can type the trigger (status: woken now), disarm it while it cannot until
        something changes (Waker.stuck): decided once the harness's output has settled, so a frame half drawn
        changes nothing; but a turn under way (Waker.busy) disarms it at once, since its spinner never lets the
        output settle, and mail then is told by the turn's hooks, not by a wake."""
        if waker.busy():
            self._arm(False, "a turn is under way")
            return
        if now - waker.last_output < QUIET_SECONDS:
            return
        stuck = waker.stuck()
        self._arm(stuck is None, stuck)

    def _arm(self, armed: bool, why: str | None = None) -> None:
        import signal

        if armed == self.armed or self.control is None:
            return
        self.armed = armed
        try:
            os.write(self.control, b"a" if armed else b"q")
            os.kill(self.helper, signal.SIGINT)  # ends the wait under way: the next one is as asked
        except OSError:
            pass
        self._note("the wait armed: woken now" if armed else f"the wait disarmed: {why}")

    def _suspend(self, child: int, master: int, stdin: int, screen: Screen) -> None:
        """The harness stopped (ctrl+z): stop as it would have stopped without run, giving the person's terminal back
        as it was and not counted as woken meanwhile; continued (`fg`), take the terminal again, copy its size (it
        may have changed meanwhile) and continue the harness."""
        import signal
        import termios
        import tty

        self._arm(False, "stopped (ctrl+z)")
        self._note("the harness stopped: run stops")
        try:
            termios.tcsetattr(stdin, termios.TCSAFLUSH, self.saved)
        except termios.error:
            pass
        # Stopped as the terminal stops the bare harness's job: run's whole process group (a script that started
        # run with it); `fg` (SIGCONT) returns here.
        os.killpg(os.getpgrp(), signal.SIGTSTP)
        self._note("continued")
        try:
            tty.setraw(stdin, termios.TCSANOW)
        except termios.error:
            pass
        size = _window(stdin)
        _set_window(master, size)
        screen.resize(*_rows_cols(size))
        try:
            os.kill(child, signal.SIGCONT)
        except OSError:
            pass

    def wake_step(self, typing: dict, screen: Screen, waker: Waker, master: int, now: float, held_keys: bytes,
                child: int) -> dict | None:
        """One step of a wake under way: the trigger typed and waiting to be seen (echo), seen and waiting a moment
        before Enter (enter: a harness takes an Enter that follows typing at once for part of a paste), entered and
        waiting to be told (landing: the session under run told the mail by its prompt hook, where the mailbox
        knows the session; one more Enter if not; no landing for a harness whose prompt hook does not tell). None
        once it is over, landed or given up."""
        text = self.trigger.decode("utf-8")
        if typing["phase"] == "echo":
            if screen.count(text) > typing["shown"]:
                self._note("trigger seen on the screen")
                return {**typing, "phase": "enter", "deadline": now + ENTER_DELAY_SECONDS}
            if now >= typing["deadline"] or held_keys:
                _write_all(master, b"\x7f" * len(text))  # not seen (or the person started typing): take it back
                waker.last_wake = now - WAKE_INTERVAL_SECONDS + QUIET_SECONDS * 3  # look again shortly
                self._note("trigger not seen: erased" if not held_keys else "the person typed: trigger erased")
                if not held_keys:
                    self.attempts += 1
                    if self.attempts % ATTEMPTS == 0:  # a harness not ready for keys yet (starting): later, once more
                        waker.last_wake = now
                        self._note(f"trigger not seen in {ATTEMPTS} tries: again after the wake interval")
                    if self.attempts >= ATTEMPTS * ROUNDS:
                        self.gave_up, self.attempts = self.gave_up + 1, 0
                        waker.carried()
                        self._note("trigger never seen: given up")
                return None
            return typing
        if typing["phase"] == "enter":
            if held_keys:
                _write_all(master, b"\x7f" * len(text))
                self._note("the person typed: trigger erased")
                waker.last_wake = now - WAKE_INTERVAL_SECONDS + QUIET_SECONDS * 3
                return None
            if now < typing["deadline"]:
                return typing
            _write_all(master, b"\r")
            self.woken, self.attempts = self.woken + 1, 0
            waker.woke(now)
            self._note("Enter")
            if self.harness and not harnesses.of(self.harness).told_at_prompt:
                self._note("entered: the turn's hooks tell the mail (no prompt hook)")
                return None
            return {**typing, "phase": "landing", "deadline": now + LANDED_SECONDS, "enters": 1,
                    "next": now + LANDED_LOOK_SECONDS}
        # landing
        if now < typing["next"] and now < typing["deadline"]:
            return typing
        untold = self.session_untold(child)
        if untold is False:
            self._note("landed: the prompt hook told the session")
            return None
        if untold is None and now >= typing["deadline"]:
            self._note("entered; no session under run known to the mailbox to ask (a harness without hooks?)")
            return None
        if now < typing["deadline"]:
            return {**typing, "next": now + LANDED_LOOK_SECONDS}
        if typing["enters"] < 2 and not typing.get("person"):
            _write_all(master, b"\r")
            self._note("not told yet: Enter again")
            return {**typing, "deadline": now + LANDED_SECONDS, "enters": 2, "next": now + LANDED_LOOK_SECONDS}
        self.gave_up += 1
        self._note("not told after the trigger: given up")
        return None

    def _note(self, what: str) -> None:
        if self.log is not None:
            self.log.write(f"{time.monotonic():.3f} {what}\n")
            self.log.flush()

    def session_untold(self, child: int) -> bool | None:
        if self.served is not None:
            return None
        try:
            return still_untold(self.agent, child)
        except errors.AgentMailError as exc:
            self._note(f"could not look at the session under run: {exc}")
            return None

    def _end_child(self, child: int, first: int) -> None:
        """Signal the harness's leader (`first`: SIGHUP when its terminal went away, else SIGTERM; it passes the
        signal on to the harness's group), wait for it, SIGKILL both groups after STOP_PATIENCE_SECONDS."""
        import signal

        try:
            os.killpg(child, first)
            if first == signal.SIGHUP:
                os.killpg(child, signal.SIGCONT)
        except OSError:
            pass
        deadline = time.monotonic() + STOP_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                done = child
            if done:
                break
            time.sleep(0.02)
        else:
            try:
                os.killpg(child, signal.SIGKILL)
                os.waitpid(child, 0)
            except (OSError, ChildProcessError):
                pass
        for group in (child, self.harness_pid):  # what else is left (a process that ignored the signal)
            try:
                if group:
                    os.killpg(group, signal.SIGKILL)
            except OSError:
                pass

    @staticmethod
    def end_helper(helper: int) -> None:
        import signal

        try:
            os.kill(helper, signal.SIGTERM)
        except OSError:
            return
        deadline = time.monotonic() + STOP_PATIENCE_SECONDS
        while time.monotonic() < deadline:
            try:
                if os.waitpid(helper, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return
            time.sleep(0.02)
        try:
            os.kill(helper, signal.SIGKILL)
            os.waitpid(helper, 0)
        except (OSError, ChildProcessError):
            pass


def _checked(values: dict) -> tuple[str, list[str]]:
    """The identity (given, or AGENT_MAIL_AGENT) and the command, checked: InvalidInput naming each problem."""
    import shutil

    from agent_mail import calls

    agent = values.get("agent") or os.environ.get("AGENT_MAIL_AGENT") or None
    command = list(values.get("command") or [])
    problems = []
    if agent is None:
        problems.append(("agent", "is required: the identity whose mail wakes the harness (project:name), or set "
                                  "AGENT_MAIL_AGENT (agent-mail setup records it for the harness's hooks)."))
    if command and shutil.which(command[0]) is None:
        problems.append(("command", f"{command[0]!r} was not found (not an executable file, nor on PATH); give "
                                    "the harness's command after --: agent-mail run --agent P:N -- gemini."))
    try:
        at_terminal = sys.stdin is not None and os.isatty(sys.stdin.fileno())
    except (ValueError, OSError):
        at_terminal = False
    if not at_terminal:
        problems.append(("stdin", "is not a terminal: run wraps an interactive harness for a person at a terminal. "
                                  "Start it from a terminal (or tmux); for a session nobody types in, use "
                                  "`agent-mail watch` instead."))
    calls.check("run", {"agent": agent, "command": command}, also=problems, with_inputs=False)
    return agent, command


def main(values: dict, emit, served=None) -> int:
    """`agent-mail run`, as the command line starts it (`served`: a client.commands.Served when AGENT_MAIL_DB names
    an agent-mail server). The harness's exit status."""
    agent, command = _checked(values)
    if served is None:
        from agent_mail.operations import mail

        with mail.open_mailbox():  # a mailbox that cannot be opened is said now, before the terminal is taken
            pass
    runner = Runner(agent, command, served)
    code = runner.run()
    notes = []
    if runner.gave_up:
        notes.append(f"{runner.gave_up} wake(s) given up: the trigger typed was not seen on the screen in "
                     f"{ATTEMPTS * ROUNDS} tries, or the harness's prompt hook did not tell the session after two "
                     "Enters.")
    if runner.problem:
        notes.append(f"the wait for mail stopped: {runner.problem}")
    if notes:
        sys.stderr.write("agent-mail run: " + " ".join(notes) + "\n")
        sys.stderr.flush()
    return code
