"""`reservations --check` of a 1,000-path commit against 1,000 reservations, as a whole process.

The issue's bar: <= 100 ms. There is no reference to compare with (the seed lineage has no reservations; the
peer that has them is another product with another store), so this prints ours only.

Load: 1,000 live reservations in one repository by 20 identities (each with a fresh heartbeat): 800 single
files (/src/mNNN/fNNN.rs), 150 directories (/src/mNNN/**), 50 wildcards matching at any depth (*.gen-NN.py);
the commit: 1,000 paths, 10 of them on another identity's files. Run from this checkout:
    PYTHONPATH=src python bench/bench_reservations.py [--runs N] [--db postgresql://...]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
from common import cli_env, report, summary  # noqa: E402


def seed(db: str, root: str) -> str:
    """1,000 reservations in the repository at `root`; the key they are filed under."""
    os.environ["AGENT_MAIL_DB"] = db
    from agent_mail import model
    from agent_mail.parts import repos
    from agent_mail.store import open_store

    key = repos.locate(cwd=root).key
    store = open_store(db)
    now = model.now_iso()
    expires = model.iso(model.now() + __import__("datetime").timedelta(hours=1))
    rows = []
    for i in range(1000):
        if i < 800:
            pattern = f"/src/m{i % 100:03d}/f{i:03d}.rs"
        elif i < 950:
            pattern = f"/src/m{100 + i:03d}/**"
        else:
            pattern = f"*.gen-{i}.py"
        rows.append({"id": model.new_message_id(), "repo": key, "agent": f"team:a{i % 20}", "pattern": pattern,
                     "exclusive": True, "reason": "bench", "created": now, "renewed_at": now, "expires_at": expires})
    with store.transaction(write=True):
        store.save_reservations(rows)
        for i in range(20):
            store.record_heartbeat(f"team:a{i}", now)
    store.close()
    return key


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--db", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "repo")
        os.makedirs(root)
        subprocess.run(["git", "init", "-q", root], check=True)
        subprocess.run(["git", "-C", root, "remote", "add", "origin", "git@example.com:team/bench.git"], check=True)
        db = args.db or os.path.join(tmp, "mail.db")
        seed(db, root)
        paths = [f"src/m{i % 100:03d}/f{i:03d}.rs" for i in range(10)]  # held by others
        paths += [f"lib/p{i // 50}/file{i}.rs" for i in range(990)]
        argv = [sys.executable, "-m", "agent_mail", "reservations", "--check", "--agent", "me:x", *paths]
        env = cli_env(db)
        env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
        times = []
        for _ in range(args.runs + 1):
            start = time.perf_counter()
            done = subprocess.run(argv, cwd=root, env=env, capture_output=True)
            times.append((time.perf_counter() - start) * 1000)
            assert done.returncode == 3, done.stderr
        median, p90 = summary(times[1:])
        report("reservations --check: 1,000 paths against 1,000 reservations, as a process",
               [("median (p90)", f"{median:.1f} ms ({p90:.1f} ms)", "none: no reservations", "-")])


if __name__ == "__main__":
    main()
