"""A fresh clone's ``make test``: its wall time, install included, and pytest's count.

    .venv/bin/python benchmarks/make_test_time.py [--docs] [--keep DIR]

Clones this repository's HEAD into a temporary directory (no ``.venv``, no ``.cache``: what CI
gets) and runs ``make test`` there, the output to ``make-test.log`` beside it. Prints the wall
time, the time until pytest started (setup and lint), pytest's own seconds and its summary
line; ``--docs`` adds them to the runs in ``data/performance/make-test.json`` and writes their
table, one row per run, into docs/performance.md. One cold
``import vllm.entrypoints.openai.api_server`` is timed before and after the run
(``start_vs_import.py``'s reference): this shared machine's speed moves from hour to hour, and
the suite over the import says whether a change or the machine moved.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import doc_tables  # a sibling script
from start_vs_import import IMPORT, timed  # a sibling script

SUMMARY = re.compile(r"^=+ (.*\d+ passed.*) in ([\d.]+)s")
STARTED = "test session starts"


def run(repo: Path, log: Path) -> dict:
    imports = [timed(IMPORT, dict(os.environ))]
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
    imports.append(timed(IMPORT, dict(os.environ)))
    summary = [m for line in log.read_text().splitlines() if (m := SUMMARY.match(line))]
    return {"commit": commit, "exit": rc, "wall_s": round(wall, 1),
            "setup_and_lint_s": round(pytest_at, 1) if pytest_at is not None else None,
            "pytest_s": float(summary[-1].group(2)) if summary else None,
            "summary": summary[-1].group(1) if summary else None,
            "import_s": [round(t, 1) for t in imports],
            "wall_over_import": round(wall / statistics.median(imports), 1),
            "date": dt.date.today().isoformat(), "cores": os.cpu_count()}


def table(doc: dict) -> str:
    """One row per recorded run, oldest first."""
    return "\n".join([
        "| fresh clone | date | wall | setup and lint | pytest | tests | cold imports | "
        "wall / import |", "|---|---|---|---|---|---|---|---|",
        *map(row, doc["runs"]),
        "", "Cold imports: one `import vllm.entrypoints.openai.api_server` before and one after "
        "the run; wall / import is the wall over their median, this shared machine's speed "
        "taken out. `benchmarks/make_test_time.py --docs` adds a row."])


def row(run: dict) -> str:
    imports = " and ".join(f"{t:.1f} s" for t in run["import_s"])
    return (f"| `{run['commit']}` | {run['date']} | **{run['wall_s'] / 60:.1f} min** | "
            f"{run['setup_and_lint_s'] / 60:.1f} min | {run['pytest_s'] / 60:.1f} min | "
            f"{run['summary']} (exit {run['exit']}), {run['cores']} cores | {imports} | "
            f"{run['wall_over_import']:.0f} |")


def with_run(run: dict) -> dict:
    """The committed runs and this one."""
    path = doc_tables.RECORDS / "make-test.json"
    runs = json.loads(path.read_text())["runs"] if path.exists() else []
    return {"runs": [*runs, run]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", action="store_true")
    ap.add_argument("--keep", help="clone into this directory (kept) instead of a temporary one")
    args = ap.parse_args()
    where = Path(args.keep or tempfile.mkdtemp(prefix="make-test-"))
    this = run(where / "repo", where / "make-test.log")
    print(row(this))
    if args.docs and this["summary"]:
        doc = with_run(this)
        doc_tables.write("make-test", doc, table(doc))
    sys.exit(this["exit"])


if __name__ == "__main__":
    main()
