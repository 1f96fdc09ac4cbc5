"""A scripted interactive program for `agent-mail run` tests: a prompt in a cooked terminal (the terminal echoes what
is typed), each line it reads appended to the log file named by its first argument. Lines it understands:
`busy S` (draws a spinner for S seconds), `dialog` (asks "Allow once? (y/n)" and reads the answer), `exit N`,
`signal N` (kills itself with signal N), `size` (logs its terminal's size, answers in red); anything else is
answered "ok"."""

import os
import sys
import time

log = sys.argv[1]


def note(line: str) -> None:
    with open(log, "a") as handle:
        handle.write(line + "\n")


note(f"started {os.getpid()}")
while True:
    sys.stdout.write("> ")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if not line:
        note("eof")
        sys.exit(0)
    line = line.rstrip("\n")
    note(f"line: {line}")
    word, _, rest = line.partition(" ")
    if word == "busy":
        end = time.monotonic() + float(rest)
        while time.monotonic() < end:
            for ch in "|/-\\":
                sys.stdout.write(f"\r{ch} working (esc to cancel)")
                sys.stdout.flush()
                time.sleep(0.1)
        sys.stdout.write("\r\ndone\r\n")
    elif word == "dialog":
        sys.stdout.write("Allow once? (y/n) ")
        sys.stdout.flush()
        note(f"answer: {sys.stdin.readline().strip()}")
    elif word == "size":
        columns, lines = os.get_terminal_size(0)
        note(f"size: {columns}x{lines}")
        sys.stdout.write("\x1b[31mred\x1b[0m\r\n")
    elif word == "exit":
        sys.exit(int(rest))
    elif word == "signal":
        os.kill(os.getpid(), int(rest))
    else:
        sys.stdout.write("ok\r\n")
