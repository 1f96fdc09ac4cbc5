"""Concurrent senders and readers as real processes: failures, losses, duplicates, throughput.

    python bench/bench_concurrency.py [--senders 8] [--readers 4] [--sends 25]

Each sender is a loop that runs the implementation's own `agent-mail send` --sends
times (one process per send, as agents do), addressing the readers in turn. Each
reader loops `agent-mail read` on its own inbox until every sender has finished and
its inbox is empty. Every process exit code is checked, every delivered subject is
collected, and at the end: failed commands, messages lost (sent successfully but
never delivered), messages delivered more than once, and throughput (successful
sends per second while senders ran).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cli_env, implementations, report  # noqa: E402


def run(cli: str, db: str, senders: int, readers: int, sends: int, prefix=None, env_for=None) -> dict:
    """prefix(role, index) / env_for(role, index): where and how the index-th sender or reader runs its commands
    (bench_postgres places them on two hosts); by default here, with AGENT_MAIL_DB=db."""
    env = cli_env(db)
    prefix = prefix or (lambda role, index: [])
    env_for = env_for or (lambda role, index: env)
    subprocess.run([*prefix("reader", 0), cli, "status"], env=env_for("reader", 0), check=True,
                   stdout=subprocess.DEVNULL)
    inboxes = [f"sink:r{i}" for i in range(readers)]
    sent, failures, delivered = [], [], []
    lock = threading.Lock()
    senders_done = threading.Event()

    def sender(index: int) -> None:
        for k in range(sends):
            subject = f"s{index}-{k}"
            done = subprocess.run([*prefix("sender", index), cli, "send", "--from", f"src:s{index}", "--to",
                                   inboxes[k % readers], "--subject", subject, "--body", "payload"],
                                  env=env_for("sender", index), capture_output=True)
            with lock:
                if done.returncode == 0:
                    sent.append(subject)
                else:
                    failures.append(("send", done.returncode, done.stderr.decode()[:200]))

    def reader(index: int) -> None:
        inbox = inboxes[index]
        while True:
            finished = senders_done.is_set()
            done = subprocess.run([*prefix("reader", index), cli, "read", inbox, "--limit", "100"],
                                  env=env_for("reader", index), capture_output=True)
            if done.returncode != 0:
                with lock:
                    failures.append(("read", done.returncode, done.stderr.decode()[:200]))
                continue
            payload = json.loads(done.stdout)
            messages = payload["messages"] if isinstance(payload, dict) else payload
            with lock:
                delivered.extend(m["subject"] for m in messages)
            if finished and not messages:
                return

    reader_threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    sender_threads = [threading.Thread(target=sender, args=(i,)) for i in range(senders)]
    for thread in reader_threads:
        thread.start()
    started = time.perf_counter()
    for thread in sender_threads:
        thread.start()
    for thread in sender_threads:
        thread.join()
    elapsed = time.perf_counter() - started
    senders_done.set()
    for thread in reader_threads:
        thread.join()
    unique = set(delivered)
    return {
        "failed": len(failures),
        "lost": len(set(sent) - unique),
        "duplicated": len(delivered) - len(unique),
        "throughput": len(sent) / elapsed,
        "examples": failures[:3],
    }


def rows(clis: dict[str, str], senders: int = 8, readers: int = 4, sends: int = 25) -> list[tuple]:
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cli in clis.items():
            results[name] = run(cli, os.path.join(tmp, name, "mail.db"), senders, readers, sends)
    ours, ref = results["agent-mail"], results["reference"]
    label = f"{senders} senders x {readers} readers ({senders * sends} sends)"
    table_rows = [(f"{label}: {key}", str(ours[key]), str(ref[key]), "") for key in ("failed", "lost", "duplicated")]
    table_rows.append((f"{label}: throughput, sends/s", f"{ours['throughput']:.1f}", f"{ref['throughput']:.1f}",
                       f"{ours['throughput'] / ref['throughput']:.2f}"))
    for name in ("agent-mail", "reference"):
        for example in results[name]["examples"]:
            print(f"  {name} failure example: {example}", file=sys.stderr)
    return table_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--sends", type=int, default=25)
    args = parser.parse_args()
    result = rows(implementations(), args.senders, args.readers, args.sends)
    report("concurrency benchmark", result)


if __name__ == "__main__":
    main()
