"""From a send to its webhook's POST (issue 34): how long after a send commits `agent-mail serve` POSTs its event.

    python bench/bench_webhooks.py [--sends 50] [--backend sqlite|postgresql|both]

For each backend: a fresh mailbox (a file, or a schema of its own on the test PostgreSQL server, dropped after), one
webhook for every new mail pointing at a receiver on loopback in this process (tests/lib/webhook_receiver.py), and
one `agent-mail serve` process of this tree. Then SENDS sends one after another, each through the library in this
process (Mailbox.send: it returns once committed): the time from its return to its POST's arrival at the receiver,
the next send only after that POST. The server is woken by the commit's wake-up (SQLite's pipes, PostgreSQL's
NOTIFY), so this is the wake-up, one claim, the signing and one HTTP POST on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # for tests.lib
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
from common import cli_env, machine, percentile, table  # noqa: E402
from tests.lib.webhook_receiver import Receiver  # noqa: E402


def run(location: str, sends: int) -> list[float]:
    from agent_mail.operations.mail import open_mailbox

    os.environ["AGENT_MAIL_DB"] = location
    receiver = Receiver()
    secret = os.path.join(tempfile.mkdtemp(), "secret")
    with open(secret, "w") as handle:
        handle.write("bench-secret-0123456789abcdef\n")
    os.chmod(secret, 0o600)
    env = cli_env(location)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(HERE), "src")
    subprocess.run([sys.executable, "-m", "agent_mail", "webhook", "add", "--url", receiver.url, "--event", "mail",
                    "--secret-file", secret], env=env, check=True, capture_output=True)
    server = subprocess.Popen([sys.executable, "-m", "agent_mail", "serve", "--listen", "127.0.0.1:0"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        json.loads(server.stderr.readline())  # listening
        time.sleep(1.0)  # its deliveries task started, its hub listening
        took = []
        with open_mailbox() as mailbox:
            for n in range(sends):
                mailbox.send(from_="bench:lead", to=[f"bench:w{n % 8}"], subject=f"job {n}", body="b")
                committed = time.monotonic()
                deadline = committed + 10
                while len(receiver.posts) <= n and time.monotonic() < deadline:
                    time.sleep(0.0005)
                if len(receiver.posts) <= n:
                    raise SystemExit(f"send {n}: no POST within 10 s")
                took.append((receiver.posts[n]["at"] - committed) * 1000)
        return took
    finally:
        server.terminate()
        server.wait(timeout=20)
        receiver.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sends", type=int, default=50)
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="both")
    args = parser.parse_args()
    rows = []
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        if backend == "sqlite":
            took = run(os.path.join(tempfile.mkdtemp(), "mail.db"), args.sends)
        else:
            from tests.lib.postgres import drop_schema, new_schema_name, pg_url

            schema = new_schema_name()
            try:
                took = run(pg_url(schema), args.sends)
            finally:
                drop_schema(schema)
        rows.append((backend, args.sends, f"{statistics.median(took):.1f}", f"{percentile(took, 0.95):.1f}",
                     f"{max(took):.1f}"))
    print(f"# send -> webhook POST ({machine()})\n")
    print(table(rows, ("backend", "sends", "median ms", "p95 ms", "max ms")))


if __name__ == "__main__":
    main()
