"""A fresh clone's ``make test``: its wall time, install included, and pytest's count.

    .venv/bin/python benchmarks/make_test_time.py [--docs] [--keep DIR]

Clones this repository's HEAD into a temporary directory (no ``.venv``, no ``.cache``: what CI
gets) and runs ``make test`` there, the output to ``make-test.log`` beside it. Prints the wall
time, the time until pytest started (setup and lint), pytest's own seconds and its summary
line; ``--docs`` writes them to ``data/performance/make-test.json`` and a table into
docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import doc_tables  # a sibling script

SUMMARY = re.compile(r"^=+ (.*\d+ passed.*) in ([\d.]+)s")
STARTED = "test session starts"


def run(repo: Path, log: Path) -> dict:
    subprocess.run(["git", "clone", "-q", str(doc_tables.REPO), str(repo)], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                            check=True, capture_output=True, text=True).stdout.strip()
    t0, pytest_at = time.monotonic(), None
    with log.open("w") as out:
        # SIGINT as CI's shell leaves it: a benchmark started with `&` inherits it ignored,
        # and the suite's interrupt tests would measure that instead of the code
        proc = subprocess.Popen(["make", "test"], cwd=repo, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        for line in proc.stdout:
            out.write(line)
            if pytest_at is None and STARTED in line:
                pytest_at = time.monotonic() - t0
        rc = proc.wait()
    wall = time.monotonic() - t0
    summary = [m for line in log.read_text().splitlines() if (m := SUMMARY.match(line))]
    return {"commit": commit, "exit": rc, "wall_s": round(wall, 1),
            "setup_and_lint_s": round(pytest_at, 1) if pytest_at is not None else None,
            "pytest_s": float(summary[-1].group(2)) if summary else None,
            "summary": summary[-1].group(1) if summary else None,
            "date": dt.date.today().isoformat(), "cores": os.cpu_count()}


def table(doc: dict) -> str:
    return "\n".join([
        "| fresh clone | wall | setup and lint | pytest | tests |", "|---|---|---|---|---|",
        f"| `{doc['commit']}` | **{doc['wall_s'] / 60:.1f} min** | "
        f"{doc['setup_and_lint_s'] / 60:.1f} min | {doc['pytest_s'] / 60:.1f} min | "
        f"{doc['summary']} (exit {doc['exit']}) |",
        "", f"`benchmarks/make_test_time.py`, {doc['date']}, {doc['cores']} cores."])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", action="store_true")
    ap.add_argument("--keep", help="clone into this directory (kept) instead of a temporary one")
    args = ap.parse_args()
    where = Path(args.keep or tempfile.mkdtemp(prefix="make-test-"))
    doc = run(where / "repo", where / "make-test.log")
    print(table(doc))
    if args.docs and doc["summary"]:
        doc_tables.write("make-test", doc, table(doc))
    sys.exit(doc["exit"])


if __name__ == "__main__":
    main()
