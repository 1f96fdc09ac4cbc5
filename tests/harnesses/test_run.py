"""`agent-mail run -- COMMAND`: a harness in a pseudo-terminal of its own, woken by a typed one-line trigger when mail
arrives while it is idle at an empty prompt.

The decision (screen model, the person's keys, idle) is tested in-process (fast); the whole wrapper in tmux, first
around tests/lib/run_child.py (a scripted prompt that logs each line it reads), then around the real Gemini CLI set up
by `agent-mail setup gemini`, against the scripted model (tests/lib/fake_model.py)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.lib.cli import am_process, process_env
from tests.lib.harnesses import Terminal, private_tmp
from tests.lib.tools import ROOT, find
from tests.lib.waiting import until

from agent_mail import harnesses
from agent_mail.harness import run as running

AGENT = "proj:coder"
CHILD = os.path.join(ROOT, "tests", "lib", "run_child.py")
TRIGGER = running.trigger_text(AGENT)


# -- the decision, in-process -------------------------------------------------------------------------------------
@pytest.mark.fast
def test_the_screen_model_follows_text_cursor_moves_and_erases():
    screen = running.Screen(5, 20)
    screen.feed(b"hello\r\nworld\x1b[31m!\x1b[0m")
    assert screen.lines()[:2] == ["hello", "world!"]
    screen.feed(b"\x1b[1;1H\x1b[2KHEY\x1b[2;3H\x1b[K")
    assert screen.lines()[:2] == ["HEY", "wo"]
    screen.feed(b"\x1b]0;title\x07\x1b[5;1Hbottom\r\nscrolled")  # a title (OSC) is not text; the last line scrolls
    assert screen.lines()[-2:] == ["bottom", "scrolled"] and screen.lines()[0] == "wo"
    screen.feed("caf\u00e9 \u2713".encode()[:-1])  # a character cut by a read ends with the next
    screen.feed("\u2713".encode()[-1:])
    assert screen.lines()[-1] == "scrolledcaf\u00e9 \u2713"
    screen.feed(b"\x1b[2J")
    assert screen.text().strip() == ""
    screen.feed(b"0123456789012345678901234")  # wraps at 20 columns
    assert screen.count("0123456789012345678901234") == 1


@pytest.mark.fast
def test_the_key_tracker_knows_unsent_text_and_ignores_the_terminals_own_reports():
    keys = running.KeyTracker()
    keys.feed(b"\x1b[12;40R\x1b[?62;c\x1b]11;rgb:0000/0000/0000\x07\x1b[I\x1b[<0;3;4M", 1.0)
    assert keys.clear() and keys.last_key == float("-inf")  # answers to the harness's queries, focus, mouse
    keys.feed("ab\u00e9".encode(), 2.0)
    assert keys.unsent == 3 and keys.last_key == 2.0 and not keys.clear()
    keys.feed(b"\x7f\x7f", 3.0)
    assert keys.unsent == 1
    keys.feed(b"\x7f", 3.1)
    assert keys.clear() and keys.submitted == 0
    keys.feed(b"\x1b[A", 4.0)  # history recalled: the line is not known to be empty
    assert not keys.clear()
    keys.feed(b"\r", 5.0)
    assert keys.clear() and keys.submitted == 1
    keys.feed(b"\x1b[200~pasted\x1b[2", 6.0)  # a paste cut by a read
    keys.feed(b"01~", 6.1)
    assert keys.unsent == 6
    keys.feed(b"\x15", 7.0)  # ctrl+u
    assert keys.clear()
    keys.feed(b"\r", 8.0)  # Enter on an empty prompt sends nothing of the person's
    assert keys.submitted == 1


@pytest.mark.fast
def test_a_wake_waits_for_quiet_no_keys_no_unsent_text_no_dialog_and_the_interval():
    screen, keys = running.Screen(10, 60), running.KeyTracker()
    waker = running.Waker(screen, keys, 0.0)
    assert waker.blocked_by(1.0) == "no mail" and waker.next_check(1.0) is None
    waker.mail(1.0)
    assert waker.blocked_by(1.0) == "the harness has drawn nothing yet"
    screen.feed(b"> ")
    waker.output(1.0)
    assert waker.blocked_by(1.1) == "the harness is writing"
    assert waker.blocked_by(1.01 + running.QUIET_SECONDS) is None
    keys.feed(b"x", 2.0)
    assert waker.blocked_by(2.5) == "the person typed in the last seconds"
    assert waker.blocked_by(2.0 + running.TYPING_PAUSE_SECONDS) == "unsent text at the prompt"
    keys.feed(b"\x7f", 2.0)
    at = 2.0 + running.TYPING_PAUSE_SECONDS
    assert waker.blocked_by(at) is None
    screen.feed(b"\r\nAllow once? (y/n) ")
    assert waker.blocked_by(at) == "a dialog is open"
    screen.feed(b"\r\x1b[2K\\ working (esc to cancel)")
    assert waker.blocked_by(at) == "a turn is under way"
    assert waker.stuck() == "a turn is under way"  # until it ends: run's wait is not armed (status: not woken now)
    screen.feed(b"\r\x1b[2K> ")
    waker.woke(at)
    waker.mail(at + 1)
    assert waker.blocked_by(at + 1) == "woken in the last interval"
    assert waker.blocked_by(at + running.WAKE_INTERVAL_SECONDS) is None
    screen.feed(b"\r\nAllow once? (y/n) ")
    assert waker.blocked_by(at + 20) == "a dialog is open"
    before = keys.submitted
    keys.feed(b"y\r", at + 2)  # an answer to a dialog is no prompt, and the dialog is closed (its line stays)
    waker.typed(before)
    screen.feed(b"y\r\n> ")
    assert waker.blocked_by(at + 20) is None
    keys.feed(b"go\r", at + 2)  # the person sent a prompt after the mail arrived: its prompt hook likely told it
    assert waker.blocked_by(at + 20) is None and waker.person_prompted  # run asks the mailbox before it wakes
    waker.carried()
    assert waker.blocked_by(at + 20) == "no mail" and not waker.person_prompted


@pytest.mark.fast
def test_esc_and_keys_that_only_move_leave_no_unsent_text_and_the_alternate_screen_is_followed():
    keys = running.KeyTracker()
    keys.feed(b"\x1b", 1.0)  # Esc alone, as a read ends
    keys.feed(b"\x1b\x1b\x1b[D\x1b[C\x1b[H\x1b[F\x1bOP\x1b[15~\x1b[5~\x1b[2~\x1b[3~\x1bb", 2.0)
    assert keys.clear() and keys.last_key == 2.0  # Esc, moves, F1, F5, page up, insert; delete, alt+b: empty line
    keys.feed(b"\x1b[1;5A", 3.0)  # ctrl+up: history may put text on the line
    assert not keys.clear()
    keys.feed(b"\r", 4.0)
    keys.feed(b"ab\x1b[3~", 5.0)  # delete on a line with text: unknown
    assert keys.uncertain
    keys.feed(b"\x15", 6.0)
    keys.feed(b"q:wq\r", 7.0, counted=False)  # typed into vim or less over the prompt: not the prompt's
    assert keys.clear() and keys.submitted == 1 and keys.last_key == 7.0
    keys.feed(b"\x1b[I", 8.0, counted=False)  # a focus report is still not a key
    assert keys.last_key == 7.0

    screen = running.Screen(5, 40)
    screen.feed(b"$ vim\r\n\x1b[?1049h\x1b[H~\r\n~")
    assert screen.alternate and "$ vim" not in screen.text()
    screen.feed(b"\x1b[?1049l")
    assert not screen.alternate
    screen.feed(b"\x1b[?47h")
    assert screen.alternate
    screen.feed(b"\x1bc")  # a full reset
    assert not screen.alternate
    screen.feed(b"\x1b[1049h")  # not a private mode: no screen switch
    assert not screen.alternate


@pytest.mark.fast
def test_run_is_stuck_where_it_cannot_type_and_the_screen_says_whether_a_known_prompt_is_empty():
    screen, keys = running.Screen(10, 60), running.KeyTracker()
    waker = running.Waker(screen, keys, 0.0, types=False)
    assert waker.stuck().startswith("not a harness set up here")
    waker = running.Waker(screen, keys, 0.0)  # a harness set up here whose empty prompt's words are not known
    screen.feed(b"> ")
    assert waker.stuck() is None
    screen.feed(b"\x1b[?1049hless's page")
    assert waker.stuck() == "a full-screen program is open (the alternate screen)"
    screen.feed(b"\x1b[?1049l> ")
    keys.feed(b"hi", 1.0)
    assert waker.stuck() == "unsent text at the prompt"

    # Gemini CLI: its placeholder shows while its prompt is empty; keys do not decide there, the screen does.
    screen, keys = running.Screen(10, 60), running.KeyTracker()
    waker = running.Waker(screen, keys, 0.0, empty=harnesses.of("gemini").empty_prompt)
    screen.feed(b" >   Type your message or @path/to/file")
    keys.feed(b"hello\x1b\x1b", 1.0)  # typed, then Esc twice: Gemini CLI clears its line
    assert waker.stuck() is None and not keys.clear()
    screen.feed(b"\r\x1b[2K > hello")
    assert waker.stuck().startswith("the harness's empty prompt is not showing")
    screen.feed(b"\x1b[2J\x1b[H(Use Enter to select, Ctrl+L to reset, Tab to change focus, Esc to close)")
    assert waker.stuck().startswith("the harness's empty prompt is not showing")  # a dialog over the prompt

    # Copilot CLI draws on the alternate screen: that is its own, not a program over its prompt.
    screen, keys = running.Screen(10, 100), running.KeyTracker()
    waker = running.Waker(screen, keys, 0.0, empty=harnesses.of("copilot").empty_prompt)
    screen.feed("\x1b[?1049h\u276f\r\n \u2190 open sidebar \u00b7 / commands \u00b7 ? help".encode())
    assert waker.stuck() is None


@pytest.mark.fast
def test_a_harness_counts_as_set_up_where_its_hooks_file_is_here_or_above(tmp_path, mailbox_path):
    from agent_mail.harness import setup

    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    assert setup.set_up_for("/usr/bin/gemini", str(project / "src")) is None
    done = am_process("setup", "gemini", "--agent", AGENT, "--dir", str(project))
    assert done.returncode == 0, done.stderr
    assert setup.set_up_for("/opt/node/bin/gemini", str(project / "src")) == "gemini"
    assert setup.set_up_for("gemini", str(project)) == "gemini"
    assert setup.set_up_for("copilot", str(project)) is None  # another harness, not set up here
    assert setup.set_up_for("bash", str(project)) is None
    assert setup.set_up_for("gemini", str(tmp_path)) is None


@pytest.mark.fast
def test_the_title_names_whose_mail_and_rings_the_bell():
    assert running.title_text(AGENT) == (f"\x1b]0;agent-mail: new mail for {AGENT}\x07"
                                         f"\x1b]2;agent-mail: new mail for {AGENT}\x07\x07").encode()
    assert b"\x1b[" not in running.title_text("p:x\x1b[2J")  # nothing of the name can end the title early


@pytest.mark.backends
def test_the_helper_arms_its_wait_only_while_run_can_type_and_hears_mail_either_way(mailbox_path):
    """The helper process run forks (a real process on a real mailbox): unarmed, it holds no watch session
    (status: not woken now) and still says when mail comes; told to arm (b"a" and SIGINT), it is an armed watch;
    told not to, that watch is released."""
    import select
    import signal

    def heard(notify, byte: bytes) -> bool:
        ready, _, _ = select.select([notify], [], [], 30)
        return bool(ready) and byte in os.read(notify, 64)

    pid, notify, control = running.start_helper(AGENT, None, False)
    try:
        assert heard(notify, b"r")
        assert "woken" not in _status().get("reached_by", "") and _status().get("watch_state", "never") == "never"
        _send("while unarmed")
        assert heard(notify, b"m")
        os.write(control, b"a")
        os.kill(pid, signal.SIGINT)
        until(lambda: _status().get("watch_state") == "armed", 30, "the helper did not arm its wait")
        assert _status()["reached_by"].startswith("woken now (an armed watch")
        _send("while armed")
        assert heard(notify, b"m")
        until(lambda: _status().get("watch_state") == "armed", 30, "the helper did not arm again after the mail")
        os.write(control, b"q")
        os.kill(pid, signal.SIGINT)
        until(lambda: _status().get("watch_state") == "released", 30, "the helper did not release its watch")
        _send("while unarmed again")
        assert heard(notify, b"m")
        assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 3  # nothing marked read
    finally:
        running.Runner.end_helper(pid)
        os.close(notify)
        os.close(control)


# -- the wrapper around a scripted prompt, in tmux ----------------------------------------------------------------
def _lines(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def _status() -> dict:
    rows = json.loads(am_process("status").stdout)["agents"]
    return next((r for r in rows if r["agent"] == AGENT), {})


def _send(subject: str = "Stop the deploy", body: str = "the body stays in the mailbox") -> None:
    done = am_process("send", "--from", "boss:lead", "--to", AGENT, "--subject", subject, "--body", body)
    assert done.returncode == 0, done.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def through():
    """Variables of run's environment beyond the test's (a test through a server overrides this fixture)."""
    return {}


def _ready(decisions) -> bool:
    return decisions.exists() and "the wait for mail is ready" in decisions.read_text()


def _title(terminal) -> str:
    return _shown(terminal, "#{pane_title}")


def _bell(terminal) -> bool:
    return _shown(terminal, "#{window_bell_flag}") == "1"


def _shown(terminal, what: str) -> str:
    return subprocess.run([*terminal.tmux, "display-message", "-p", "-t", terminal.name, what],
                          capture_output=True, text=True).stdout.strip()


TITLE = f"agent-mail: new mail for {AGENT}"


@pytest.fixture
def wrapped(tmp_path, mailbox_path, through):
    """run around tests/lib/run_child.py in tmux: (terminal, the child's log, run's decision log, the exit file).
    run_child is no harness set up here: run never types into it, and tells of mail by the terminal's title."""
    log, decisions, code = tmp_path / "child.log", tmp_path / "run.log", tmp_path / "exit"
    env = process_env(AGENT_MAIL_RUN_LOG=str(decisions), **through)
    passed = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("AGENT_MAIL_DB", "AGENT_MAIL_RUN_LOG", "PYTHONPATH",
                                                            "HOME", *through))
    command = f"env {passed} {shlex.quote(sys.executable)} -m agent_mail run --agent {AGENT} -- " \
              f"{shlex.quote(sys.executable)} {shlex.quote(CHILD)} {shlex.quote(str(log))}; echo $? > {code}"
    with Terminal(tmp_path, f"agent-mail-run-{os.getpid()}", tmp_path, command) as terminal:
        until(lambda: _lines(log), 30, "the child did not start")
        until(lambda: _ready(decisions), 30, "run's wait for mail did not start")
        yield terminal, log, decisions, code


def _run_of(child: int) -> int:
    """run's process, from the harness's: run -> the harness's session leader -> the harness."""
    return _parent(_parent(child))


def _parent(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def _state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


@pytest.mark.requires("tmux")
def test_a_program_not_set_up_is_told_by_the_title_and_bell_and_never_typed_into(wrapped):
    terminal, log, decisions, code = wrapped
    row = _status()
    assert not row.get("reachable") and "woken" not in row.get("reached_by", "")  # run cannot wake it: not said
    assert row.get("watch_state", "never") == "never"
    assert not _bell(terminal)
    _send()
    until(lambda: _title(terminal) == TITLE, 30, lambda: f"no title: {_title(terminal)!r}")
    assert _bell(terminal)
    assert "told by the terminal's title and bell" in decisions.read_text()
    assert _lines(log) == [_lines(log)[0]]  # nothing was typed into the program
    assert "Stop the deploy" not in _title(terminal)
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1  # waiting marked nothing
    assert "woken" not in _status().get("reached_by", "")
    terminal.type("exit 7", "Enter")
    until(lambda: code.exists() and code.read_text().strip(), 30, "run did not exit")
    assert code.read_text().strip() == "7"


@pytest.mark.requires("tmux")
def test_a_harness_killed_by_a_signal_exits_run_with_128_plus_n(wrapped):
    terminal, log, _, code = wrapped
    terminal.type("signal 15", "Enter")
    until(lambda: code.exists() and code.read_text().strip(), 30, "run did not exit")
    assert code.read_text().strip() == "143"


@pytest.mark.requires("tmux")
def test_a_resize_and_colours_pass_through_and_sigterm_to_run_ends_the_harness(wrapped):
    terminal, log, _, code = wrapped
    subprocess.run([*terminal.tmux, "resize-window", "-t", terminal.name, "-x", "100", "-y", "30"], check=True)
    terminal.type("size", "Enter")
    until(lambda: any(x.startswith("size: ") for x in _lines(log)), 30, "no size logged")
    assert "size: 100x30" in _lines(log)  # the harness's terminal took the new size (SIGWINCH)
    shown = subprocess.run([*terminal.tmux, "capture-pane", "-p", "-e", "-t", terminal.name], capture_output=True,
                           text=True).stdout
    assert "\x1b[31mred" in shown  # colours reach the terminal as written
    child = int(_lines(log)[0].split()[1])
    os.kill(_run_of(child), 15)
    until(lambda: code.exists() and code.read_text().strip(), 30, "run did not exit on SIGTERM")
    assert code.read_text().strip() == "143" and not _alive(child)


@pytest.mark.requires("tmux")
def test_run_killed_outright_leaves_neither_the_harness_nor_its_wait(wrapped):
    terminal, log, _, _ = wrapped
    child = int(_lines(log)[0].split()[1])
    run = _run_of(child)
    helpers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and _parent(int(p)) == run
               and int(p) != _parent(child)]
    os.kill(run, 9)  # no handler runs: the terminal hangs up on the harness, the kernel stops the helper
    until(lambda: not _alive(child), 30, "the harness outlived run")
    until(lambda: not any(_alive(p) for p in helpers), 30, "run's helper outlived run")


@pytest.mark.requires("tmux")
def test_the_terminal_going_away_ends_the_harness_and_releases_the_wait(wrapped):
    terminal, log, _, _ = wrapped
    child = int(_lines(log)[0].split()[1])
    run = _run_of(child)
    subprocess.run([*terminal.tmux, "kill-server"], capture_output=True)  # the pane's terminal closes: SIGHUP
    until(lambda: not _alive(child), 30, "the harness outlived its terminal")
    until(lambda: not _alive(run), 30, "run outlived its terminal")


def _in_a_shell(tmp_path, name: str, program: list[str], cwd=None, **extra) -> tuple[Terminal, object, object]:
    """A tmux pane running an interactive bash (job control on), with a script that starts `run -- PROGRAM` (in
    `cwd`) as one job: (the terminal, the script's path to type, run's decision log)."""
    decisions = tmp_path / "run.log"
    env = process_env(AGENT_MAIL_RUN_LOG=str(decisions), **extra)
    passed = " ".join(f"{k}={shlex.quote(env[k])}" for k in ("AGENT_MAIL_DB", "AGENT_MAIL_RUN_LOG", "PYTHONPATH",
                                                            "HOME", "PATH", *extra))
    script = tmp_path / "start.sh"
    script.write_text(f"cd {shlex.quote(str(cwd or tmp_path))}\n"
                      f"exec env {passed} {shlex.quote(sys.executable)} -m agent_mail run --agent {AGENT} -- "
                      f"{shlex.join(program)}\n")
    shell = f"env -i {passed} TERM=xterm-256color PS1='outer$ ' bash --norc --noprofile -i"
    return Terminal(tmp_path, name, tmp_path, shell), script, decisions


@pytest.mark.requires("tmux")
def test_ctrl_z_stops_run_with_the_program_and_fg_continues_both(tmp_path, mailbox_path):
    log = tmp_path / "child.log"
    terminal, script, decisions = _in_a_shell(tmp_path, f"agent-mail-run-stop-{os.getpid()}",
                                              [sys.executable, CHILD, str(log)])
    with terminal:
        terminal.wait_for(lambda: "outer$" in terminal.screen(), 30, "no outer shell")
        terminal.type(f"bash {script}", "Enter")
        until(lambda: _lines(log), 30, "the child did not start")
        child = int(_lines(log)[0].split()[1])
        run = _run_of(child)
        terminal.type("C-z")  # the pseudo-terminal sends the program SIGTSTP, as a terminal does the bare program
        terminal.wait_for(lambda: "Stopped" in terminal.screen(), 30, "the outer shell saw no stop")
        assert _state(run) == "T" and _state(child) == "T"
        terminal.type("fg", "Enter")
        until(lambda: _state(run) != "T" and _state(child) != "T", 30, "fg did not continue run and the program")
        terminal.type("size", "Enter")  # the terminal is raw again, keys reach the program, its size is copied
        until(lambda: "size: 160x45" in _lines(log), 30, lambda: f"the program does not work after fg: {_lines(log)}")
        terminal.type("exit 3", "Enter")
        terminal.wait_for(lambda: "outer$" in terminal.screen().rstrip().splitlines()[-1], 30, "run did not exit")
        terminal.type("echo code=$?", "Enter")
        terminal.wait_for(lambda: "code=3" in terminal.screen(), 30, "run's exit status")


@pytest.mark.requires("tmux", "vim", "less")
def test_under_bash_the_notice_is_never_typed_into_the_shell_vim_or_less(tmp_path, mailbox_path):
    vim, less = find("vim"), find("less")
    page = tmp_path / "page.txt"
    page.write_text("".join(f"line {i}\n" for i in range(200)))
    terminal, script, decisions = _in_a_shell(tmp_path, f"agent-mail-run-bash-{os.getpid()}",
                                              ["bash", "--norc", "--noprofile", "-i"])
    with terminal:
        terminal.wait_for(lambda: "outer$" in terminal.screen(), 30, "no outer shell")
        terminal.type(f"bash {script}", "Enter")
        until(lambda: _ready(decisions), 30, "run's wait for mail did not start")
        assert "not a harness set up here" in decisions.read_text()
        terminal.type("PS1='inner$ '", "Enter")
        terminal.wait_for(lambda: "inner$" in terminal.screen(), 30, "no inner shell")
        _send("first")  # at the shell's prompt: the title, never a command line
        until(lambda: _title(terminal) == TITLE, 30, lambda: f"no title: {_title(terminal)!r}")
        terminal.type("printf '\\033]2;reset\\007'", "Enter")
        until(lambda: _title(terminal) == "reset", 30, "the title was not reset")

        terminal.type(f"{vim} -u NONE {shlex.quote(str(page))}", "Enter")  # on the alternate screen
        terminal.wait_for(lambda: "line 0" in terminal.screen() and "inner$" not in terminal.screen(), 30, "no vim")
        _send("second")
        until(lambda: _title(terminal) == TITLE, 30, lambda: f"no title in vim: {_title(terminal)!r}")
        terminal.type(":wq", "Enter")
        terminal.wait_for(lambda: "inner$" in terminal.screen(), 30, "vim did not end")
        assert page.read_text().splitlines()[0] == "line 0" and len(page.read_text().splitlines()) == 200
        terminal.type("printf '\\033]2;reset\\007'", "Enter")
        until(lambda: _title(terminal) == "reset", 30, "the title was not reset")

        terminal.type(f"{less} {shlex.quote(str(page))}", "Enter")
        terminal.wait_for(lambda: "line 0" in terminal.screen() and "inner$" not in terminal.screen(), 30, "no less")
        _send("third")
        until(lambda: _title(terminal) == TITLE, 30, lambda: f"no title in less: {_title(terminal)!r}")
        assert "HELP" not in terminal.screen().upper() and "log file" not in terminal.screen()
        terminal.type("q")
        terminal.wait_for(lambda: "inner$" in terminal.screen(), 30, "less did not end")
        terminal.type("echo still-here", "Enter")
        terminal.wait_for(lambda: "still-here" in terminal.screen(), 30, "the shell does not answer")
        screen = terminal.screen()
        assert "syntax error" not in screen and "agent-mail: new mail" not in screen  # never run as a command
        assert "trigger typed" not in decisions.read_text()
        assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 3
        terminal.type("exit", "Enter")
        terminal.wait_for(lambda: "outer$" in terminal.screen().rstrip().splitlines()[-1], 30, "run did not exit")


class TestThroughAServer:
    """AGENT_MAIL_DB names an agent-mail server: run waits with the server's watch (armed there)."""

    @pytest.fixture
    def through(self, server):
        return {"AGENT_MAIL_DB": server.url, "AGENT_MAIL_TOKEN": server.token("--agent", AGENT)}

    @pytest.mark.requires("tmux")
    def test_a_program_not_set_up_is_told_by_the_title_through_the_server(self, wrapped):
        terminal, log, _, code = wrapped
        assert "woken" not in _status().get("reached_by", "")  # no armed watch on the server: run cannot type
        _send()
        until(lambda: _title(terminal) == TITLE, 30, lambda: f"no title: {_title(terminal)!r}")
        assert _lines(log) == [_lines(log)[0]]
        assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 1
        terminal.type("exit 0", "Enter")
        until(lambda: code.exists() and code.read_text().strip(), 30, "run did not exit")
        assert code.read_text().strip() == "0"


def test_without_a_terminal_on_stdin_run_refuses_clearly(mailbox_path):
    done = am_process("run", "--agent", AGENT, "--", sys.executable, CHILD, "/dev/null", stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    problems = json.loads(done.stderr)["problems"]
    assert [p["field"] for p in problems] == ["stdin"] and "not a terminal" in problems[0]["message"]
    missing = am_process("run", "--", "no-such-harness-xyz", stdin=subprocess.DEVNULL,
                         env={k: v for k, v in process_env().items() if k != "AGENT_MAIL_AGENT"})
    fields = [p["field"] for p in json.loads(missing.stderr)["problems"]]
    assert missing.returncode == 2 and fields == ["--agent", "command", "stdin"]


# -- the real Gemini CLI under run --------------------------------------------------------------------------------
GEMINI = find("gemini")


@pytest.fixture
def gemini_project(tmp_path, mailbox_path):
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    directory = tmp_path / "project"
    directory.mkdir()
    home = tmp_path / "gemini-home"
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({"security": {"auth": {
        "selectedType": "gemini-api-key"}}}))
    done = am_process("setup", "gemini", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def _main(request: dict) -> bool:
    return any(f["name"] == "mcp_agent-mail_read" for t in request.get("tools", [])
               for f in t.get("functionDeclarations", []))


def _prompts(model) -> list[str]:
    """The person's (or run's) prompt of each of the session's own requests: its last user text part that is not
    a hook's context."""
    said = []
    for request in [r for r in model.requests if _main(r)]:
        users = [c for c in request.get("contents", []) if c.get("role") == "user"]
        texts = [p.get("text", "") for p in users[-1].get("parts", []) if "text" in p] if users else []
        said.append(next((t for t in texts if not t.startswith(("<hook_context>", "<session_context>"))), ""))
    return said


def _answer(request: dict):
    """The session's own turns are answered; the harness's side questions (routing, next speaker) get their JSON."""
    return [{"type": "text", "text": "ok from the model"}] if _main(request) else None


def gemini_under_run(project, model, name: str, *options: str):
    """A Terminal running `agent-mail run --agent AGENT -- gemini [OPTIONS]` in `project` against `model`."""
    home = project.parent / "gemini-home"
    env = process_env(HOME=str(home), GEMINI_API_KEY="test", GOOGLE_GEMINI_BASE_URL=model.url,
                      GEMINI_CLI_TRUST_WORKSPACE="true", TMPDIR=private_tmp(home),
                      AGENT_MAIL_RUN_LOG=str(project.parent / "run.log"))
    passed = [k for k in env if k.startswith(("GEMINI_", "GOOGLE_")) or k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH",
                                                                           "AGENT_MAIL_RUN_LOG")]
    command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), sys.executable, "-m",
                          "agent_mail", "run", "--agent", AGENT, "--", GEMINI, *options])
    command += f"; echo $? > {shlex.quote(str(project.parent / 'exit'))}"
    return Terminal(project.parent, name, project, command)


def _at_prompt(terminal) -> bool:
    screen = terminal.screen()
    return "Type your message" in screen and "Executing Hook" not in screen and "esc to cancel" not in screen


def _processes_in(directory) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.readlink(f"/proc/{entry}/cwd") == str(directory) and _alive(int(entry)):
                    found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.requires("gemini", "tmux")
def test_an_idle_gemini_is_woken_by_mail_quiet_while_text_is_typed_and_ends_with_its_terminal(gemini_project):
    from tests.lib.fake_model import FakeModel

    with FakeModel(_answer) as model:
        with gemini_under_run(gemini_project, model, f"agent-mail-run-gemini-{os.getpid()}") as terminal:
            terminal.wait_for(lambda: _at_prompt(terminal), 90, "gemini did not reach its prompt")
            until(lambda: _status().get("watch_state") == "armed", 30, "run did not arm its wait at the empty prompt")
            assert _status()["reachable"]
            # Gemini's own session (which cannot be woken) does not hide that run wakes it.
            until(lambda: _status()["sessions"] == 1, 30, "gemini's session start hook did not run")
            assert _status()["reached_by"].startswith("woken now (an armed watch")
            turns = len(_prompts(model))
            _send()
            terminal.wait_for(lambda: len(_prompts(model)) > turns, 60, "the idle session was not woken")
            assert _prompts(model)[turns] == TRIGGER  # one line, never the mail
            loop = [r for r in model.requests if _main(r)]
            context = json.dumps(loop[turns]["contents"])
            assert context.count("Stop the deploy") == 1 and "the body stays in the mailbox" not in context
            terminal.wait_for(lambda: _at_prompt(terminal) and "ok from the model" in terminal.screen(), 60,
                              "the woken turn did not end")

            # Text at the prompt: mail waits; cleared, it wakes.
            turns = len(_prompts(model))
            terminal.type("h", "e", "l", "l", "o")
            decisions = gemini_project.parent / "run.log"
            decisions.write_text("")
            _send("Second thing")
            until(lambda: "empty prompt is not showing" in decisions.read_text(), 30, "run did not hold the wake")
            assert len(_prompts(model)) == turns and "hello" in terminal.screen()
            until(lambda: _status()["reached_by"].startswith("told at its next prompt"), 30,  # not "woken now"
                  lambda: f"status while text is unsent: {_status()['reached_by']}")
            terminal.type(*["BSpace"] * 5)
            terminal.wait_for(lambda: len(_prompts(model)) > turns, 60, "no wake once the prompt was cleared")
            assert _prompts(model)[turns] == TRIGGER and "Second thing" in json.dumps(
                [r for r in model.requests if _main(r)][turns]["contents"])
            terminal.wait_for(lambda: _at_prompt(terminal), 60, "the second woken turn did not end")
            assert _processes_in(gemini_project)
            subprocess.run([*terminal.tmux, "kill-server"], capture_output=True)  # SIGHUP: the terminal is gone
            until(lambda: not _processes_in(gemini_project), 30,
                  lambda: f"left running after SIGHUP: {_processes_in(gemini_project)}")
    assert json.loads(am_process("read", AGENT, "--no-mark-read").stdout)["count"] == 2  # told, never consumed


@pytest.mark.requires("gemini", "tmux")
def test_gemini_is_woken_after_escape_and_not_typed_into_while_a_dialog_is_open(gemini_project):
    from tests.lib.fake_model import FakeModel

    decisions = gemini_project.parent / "run.log"
    with FakeModel(_answer) as model:
        with gemini_under_run(gemini_project, model, f"agent-mail-run-esc-{os.getpid()}") as terminal:
            terminal.wait_for(lambda: _at_prompt(terminal), 90, "gemini did not reach its prompt")
            until(lambda: _status().get("watch_state") == "armed", 30, "run did not arm its wait at the empty prompt")
            # Esc at the empty prompt puts nothing on it: the mail wakes the session as if it had not been pressed.
            terminal.type("Escape")
            turns = len(_prompts(model))
            _send()
            terminal.wait_for(lambda: len(_prompts(model)) > turns, 60, "no wake after Esc at the empty prompt")
            assert _prompts(model)[turns] == TRIGGER
            terminal.wait_for(lambda: _at_prompt(terminal) and "ok from the model" in terminal.screen(), 60,
                              "the woken turn did not end")

            # A dialog (/settings, with a search box of its own): nothing typed into it, and status says so.
            terminal.type("/settings", "Enter")
            terminal.wait_for(lambda: "Esc to close" in terminal.screen(), 30, "no settings dialog")
            until(lambda: _status()["reached_by"].startswith("told at its next prompt"), 30,
                  lambda: f"status while a dialog is open: {_status()['reached_by']}")
            turns = len(_prompts(model))
            decisions.write_text("")
            _send("Second thing")
            until(lambda: "empty prompt is not showing" in decisions.read_text(), 30, "run did not hold the wake")
            assert TRIGGER not in terminal.screen() and "agent-mail" not in terminal.screen()
            terminal.type("Escape")  # closed: the pending mail wakes the session
            terminal.wait_for(lambda: len(_prompts(model)) > turns, 60, "no wake after the dialog closed")
            assert _prompts(model)[turns] == TRIGGER and "Second thing" in json.dumps(
                [r for r in model.requests if _main(r)][turns]["contents"])
            assert "given up" not in decisions.read_text()
            terminal.wait_for(lambda: _at_prompt(terminal), 60, "the woken turn did not end")
            until(lambda: _status().get("reached_by", "").startswith("woken now"), 30, "not armed again when idle")
            terminal.type("/quit", "Enter")
            code = gemini_project.parent / "exit"
            until(lambda: code.exists() and code.read_text().strip(), 60, "run did not exit after /quit")


def _tool_results(request: dict) -> int:
    return sum("functionResponse" in part for content in request.get("contents", [])
               for part in content.get("parts", []))


@pytest.mark.requires("gemini", "tmux")
def test_a_working_gemini_under_run_is_not_said_woken_now_and_mail_then_is_told_after_its_tool_call(gemini_project):
    """Issue 33 #7: while a Gemini CLI turn is under way (its spinner drawn, a 5 s tool call running), run cannot type
    the trigger, so its wait is not armed: status says the session hears at its next prompt or tool call, not
    "woken now". Mail sent then is told after the tool call, in that turn (AfterTool), once; no trigger is typed for
    it. Once the turn is over and the prompt idle, run's wait is armed again (woken now)."""
    from tests.lib.fake_model import FakeModel

    gate = gemini_project / "mail-sent"  # the call lasts 5 s and until the test sent its mail
    slow = f"sleep 5; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.1; done"

    def script(request):
        if not _main(request):
            return None
        if "run the slow step" in json.dumps(request["contents"]) and not _tool_results(request):
            return [{"type": "tool_use", "name": "run_shell_command",
                     "input": {"command": slow, "description": "the slow step"}}]
        return [{"type": "text", "text": "ok from the model"}]

    with FakeModel(script) as model:
        with gemini_under_run(gemini_project, model, f"agent-mail-run-busy-{os.getpid()}", "--approval-mode",
                              "yolo") as terminal:
            terminal.wait_for(lambda: _at_prompt(terminal), 90, "gemini did not reach its prompt")
            until(lambda: _status().get("reached_by", "").startswith("woken now"), 30,
                  lambda: f"run did not arm its wait at the empty prompt: {_status()}")
            terminal.type("run the slow step", "Enter")
            assert model.wait_for(lambda r: _main(r) and "run the slow step" in json.dumps(r["contents"]), 60)
            row = until(lambda: (lambda r: not r["reached_by"].startswith("woken") and r)(_status()), 3,
                        lambda: f"a working session is said to be woken: {_status()}")
            assert row["reachable"] and row["watch_state"] != "armed"
            assert row["reached_by"].startswith("told at its next prompt or tool call (a live Gemini CLI session")
            _send("During the call")
            assert not _status()["reached_by"].startswith("woken")
            gate.touch()
            after = model.wait_for(lambda r: _main(r) and _tool_results(r), 60)
            assert after is not None, terminal.screen()
            assert "During the call" in json.dumps(after["contents"])  # told after the tool call, in the turn
            terminal.wait_for(lambda: _at_prompt(terminal) and "ok from the model" in terminal.screen(), 60,
                              "the turn did not end")
            until(lambda: _status().get("reached_by", "").startswith("woken now"), 30, "not armed again when idle")
            assert TRIGGER not in _prompts(model)  # told in the turn: no wake for it
            assert json.dumps([r for r in model.requests if _main(r)][-1]["contents"]).count("During the call") == 1
            terminal.type("/quit", "Enter")
            code = gemini_project.parent / "exit"
            until(lambda: code.exists() and code.read_text().strip(), 60, "run did not exit after /quit")


@pytest.mark.requires("gemini", "tmux")
def test_a_flood_of_mail_is_one_wake_and_gemini_s_exit_status_is_runs(gemini_project):
    from tests.lib.fake_model import FakeModel

    with FakeModel(_answer) as model:
        with gemini_under_run(gemini_project, model, f"agent-mail-run-flood-{os.getpid()}") as terminal:
            # The flood comes as Gemini starts: before or after its session-start hook tells it, it is one wake
            # (told by the start alone, the model has not seen it yet).
            until(lambda: _status().get("watch_state") == "armed", 60, "run's wait did not arm")
            turns = len(_prompts(model))
            flood = subprocess.run([sys.executable, "-c", (
                "from agent_mail import calls\n"
                "for i in range(8):\n"
                f"    calls.call('send', {{'from': 'boss:lead', 'to': ['{AGENT}'], 'subject': f'flood {{i}}'}})\n")],
                env=process_env(), capture_output=True, text=True, timeout=60)
            assert flood.returncode == 0, flood.stderr
            until(lambda: all(f"flood {i}" in json.dumps(model.requests) for i in range(8)), 60,
                  "the flood did not reach the model")
            woken = time.monotonic()
            terminal.wait_for(lambda: _at_prompt(terminal), 60, "the woken turn did not end")
            # A second wake could come only after the interval: wait past it, then count.
            until(lambda: time.monotonic() > woken + running.WAKE_INTERVAL_SECONDS + 2, 30)
            assert _prompts(model)[turns:].count(TRIGGER) == 1
            terminal.type("/quit", "Enter")
            code = gemini_project.parent / "exit"
            until(lambda: code.exists() and code.read_text().strip(), 60, "run did not exit after /quit")
            assert code.read_text().strip() == "0"


# -- the real Copilot CLI under run -------------------------------------------------------------------------------
COPILOT = find("copilot")
COPILOT_CACHE = os.path.join(ROOT, ".cache", "copilot")


@pytest.fixture
def copilot_project(tmp_path, mailbox_path):
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    directory = tmp_path / "project"
    directory.mkdir()
    home = tmp_path / "copilot-home"
    (home / ".copilot").mkdir(parents=True)
    (home / ".copilot" / "config.json").write_text(json.dumps({"trustedFolders": [str(directory)]}))
    done = am_process("setup", "copilot", "--agent", AGENT, "--dir", str(directory))
    assert done.returncode == 0, done.stderr
    return directory


def _copilot_main(request: dict) -> bool:
    return "create" in [t.get("function", {}).get("name") for t in request.get("tools") or []]


def _copilot_env(home, model) -> dict:
    return {"HOME": str(home), "COPILOT_OFFLINE": "true", "COPILOT_AUTO_UPDATE": "false",
            "COPILOT_PROVIDER_BASE_URL": f"{model.url}/v1", "COPILOT_PROVIDER_API_KEY": "x",
            "COPILOT_MODEL": "scripted", "COPILOT_CACHE_HOME": COPILOT_CACHE, "TMPDIR": private_tmp(home)}


@pytest.mark.requires("copilot", "tmux")
def test_ctrl_z_suspends_copilot_under_run_as_without_it_and_fg_resumes_it(copilot_project):
    """Copilot CLI stops itself at ctrl+z ("Copilot has been suspended"); under run the shell sees run stop, and
    after fg Copilot works (and is woken) as before."""
    from tests.lib.fake_model import FakeModel

    home = copilot_project.parent / "copilot-home"
    os.makedirs(COPILOT_CACHE, exist_ok=True)
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}]) as model:
        terminal, script, decisions = _in_a_shell(copilot_project.parent, f"agent-mail-run-cz-{os.getpid()}",
                                                  [COPILOT], cwd=copilot_project, **_copilot_env(home, model))
        with terminal:
            terminal.wait_for(lambda: "outer$" in terminal.screen(), 30, "no outer shell")
            terminal.type(f"bash {script}", "Enter")
            terminal.wait_for(lambda: "/ commands" in terminal.screen(), 90, "copilot did not reach its prompt")
            until(lambda: _status().get("watch_state") == "armed", 30, "run did not arm its wait at the empty prompt")
            terminal.type("C-z")
            terminal.wait_for(lambda: "Stopped" in terminal.screen(), 30, "the outer shell saw no stop")
            run = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _alive(int(p)) and
                       b"agent_mail\0run" in open(f"/proc/{p}/cmdline", "rb").read())
            assert _state(run) == "T"
            until(lambda: not _status().get("reached_by", "").startswith("woken now"), 30,
                  "a stopped run still said woken now")
            terminal.type("fg", "Enter")
            terminal.wait_for(lambda: "/ commands" in terminal.screen(), 60, "copilot did not come back after fg")
            turns = len([r for r in model.requests if _copilot_main(r)])
            _send()
            terminal.wait_for(lambda: len([r for r in model.requests if _copilot_main(r)]) > turns, 60,
                              "copilot was not woken after fg")
            terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the woken turn did not end")
            terminal.type("/exit", "Enter")
            terminal.wait_for(lambda: "outer$" in terminal.screen().rstrip().splitlines()[-1], 60, "run did not exit")


@pytest.mark.requires("copilot", "tmux")
def test_an_idle_copilot_is_woken_by_mail(copilot_project):
    from tests.lib.fake_model import FakeModel

    home = copilot_project.parent / "copilot-home"
    os.makedirs(COPILOT_CACHE, exist_ok=True)
    with FakeModel(lambda request: [{"type": "text", "text": "ok from the model"}]) as model:
        env = process_env(HOME=str(home), COPILOT_OFFLINE="true", COPILOT_AUTO_UPDATE="false",
                          COPILOT_PROVIDER_BASE_URL=f"{model.url}/v1", COPILOT_PROVIDER_API_KEY="x",
                          COPILOT_MODEL="scripted", COPILOT_CACHE_HOME=COPILOT_CACHE, TMPDIR=private_tmp(home))
        passed = [k for k in env if k.startswith("COPILOT_") or k in ("HOME", "TMPDIR", "PYTHONPATH", "PATH")]
        command = shlex.join(["env", "-u", "AGENT_MAIL_DB", *(f"{k}={env[k]}" for k in passed), sys.executable,
                              "-m", "agent_mail", "run", "--agent", AGENT, "--", COPILOT])
        command += f"; echo $? > {shlex.quote(str(copilot_project.parent / 'exit'))}"
        with Terminal(copilot_project.parent, f"agent-mail-run-copilot-{os.getpid()}", copilot_project,
                      command) as terminal:
            terminal.wait_for(lambda: "/ commands" in terminal.screen(), 90, "copilot did not reach its prompt")
            turns = len([r for r in model.requests if _copilot_main(r)])
            _send()
            terminal.wait_for(lambda: len([r for r in model.requests if _copilot_main(r)]) > turns, 60,
                              "the idle session was not woken")
            said = json.dumps([r for r in model.requests if _copilot_main(r)][turns]["messages"])
            assert TRIGGER in said and said.count("Stop the deploy") == 1
            assert "the body stays in the mailbox" not in said
            terminal.wait_for(lambda: "ok from the model" in terminal.screen(), 60, "the woken turn did not end")
            terminal.type("/exit", "Enter")
            code = copilot_project.parent / "exit"
            until(lambda: code.exists() and code.read_text().strip(), 60, "run did not exit after /exit")
            assert code.read_text().strip() == "0"


@pytest.mark.fast
def test_a_wake_is_typed_seen_entered_and_checked_or_erased_and_given_up():
    """Runner.wake_step with the pseudo-terminal's master as a pipe: what is written to the harness, step by step."""
    read_end, write_end = os.pipe()
    runner = running.Runner(AGENT, ["true"])
    told = {"untold": True}
    runner.session_untold = lambda child: told["untold"]
    screen, keys = running.Screen(5, 120), running.KeyTracker()
    waker = running.Waker(screen, keys, 0.0)

    def written() -> bytes:
        os.set_blocking(read_end, False)
        try:
            return os.read(read_end, 65536)
        except BlockingIOError:
            return b""

    def step(typing, now, held=b""):
        return runner.wake_step(typing, screen, waker, write_end, now, held, 0)

    # Seen on the screen, Enter a moment later, told by the prompt hook.
    typing = {"phase": "echo", "deadline": 1.0 + running.ECHO_SECONDS, "shown": 0}
    assert step(typing, 1.1) is typing
    screen.feed(f"> {TRIGGER}".encode())
    typing = step(typing, 1.2)
    assert typing["phase"] == "enter" and written() == b""
    assert step(typing, 1.25) is typing
    typing = step(typing, 1.2 + running.ENTER_DELAY_SECONDS)
    assert typing["phase"] == "landing" and written() == b"\r" and runner.woken == 1
    told["untold"] = False
    assert step(typing, typing["next"]) is None

    # Entered but never told: one more Enter, then given up.
    told["untold"] = True
    typing = {**typing, "deadline": 10.0, "next": 10.0, "enters": 1}
    typing = step(typing, 10.0)
    assert written() == b"\r" and typing["enters"] == 2
    assert step(typing, typing["deadline"]) is None and runner.gave_up == 1

    # Never seen: erased each time; after ATTEMPTS tries, again after the wake interval; after ROUNDS, given up.
    waker.mail(20.0)
    for attempt in range(1, running.ATTEMPTS * running.ROUNDS + 1):
        typing = {"phase": "echo", "deadline": 20.0 + attempt, "shown": screen.count(TRIGGER)}
        assert step(typing, 20.0 + attempt) is None
        assert written() == b"\x7f" * len(TRIGGER)
        if attempt == running.ATTEMPTS:
            assert waker.pending_since is not None and waker.last_wake == 20.0 + attempt
    assert runner.gave_up == 2 and waker.pending_since is None

    # The person types while it waits to be seen: erased at once, not counted as a failed try.
    typing = {"phase": "echo", "deadline": 31.0, "shown": screen.count(TRIGGER)}
    assert step(typing, 30.1, b"x") is None and written() == b"\x7f" * len(TRIGGER) and runner.attempts == 0
    os.close(read_end)
    os.close(write_end)
