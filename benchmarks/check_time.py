"""Wall time of ``python -m workbench check`` (goal: every finding in at most 10 minutes on the
2-core CPU, from an installed environment), and where it went.

    .venv/bin/python benchmarks/check_time.py [--only ID,...] [--out DIR]
    .venv/bin/python benchmarks/check_time.py --report DIR   # a check already run into DIR

Prints the command's wall time (measured around the process, server starts included), the
number of runs, the servers' start-up seconds per run shape from each run's result.json, and
each finding's seconds (a run shared by several findings is charged to the first).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def report(out: Path, wall: float | None) -> None:
    doc = json.loads((out / "check.json").read_text())
    runs = sorted((out / "runs").glob("*/result.json"))
    starts = [json.loads(p.read_text())["knobs"].get("startup_seconds") or {} for p in runs]
    unique = {json.dumps(s, sort_keys=True): s for s in starts if s}  # one per server set
    started = sum(max(s.values(), default=0.0) for s in unique.values())
    if wall is not None:
        print(f"wall: {wall:.0f} s (goal: 600 s)")
    print(f"runs: {len(runs)}; server start-ups seen in results: {started:.0f} s "
          "(the slowest role of each start)")
    for f in doc["findings"]:
        print(f"  {f['id']:30} {f['verdict']:16} {f['seconds']:6.0f} s")
    print(f"findings total: {sum(f['seconds'] for f in doc['findings']):.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--out")
    ap.add_argument("--report", help="report on a check already run into this directory")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report), None)
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="check-bench-")) / "check"
    cmd = [sys.executable, "-m", "workbench", "check", "--out", str(out)]
    t0 = time.monotonic()
    rc = subprocess.run([*cmd, *(["--only", args.only] if args.only else [])]).returncode
    wall = time.monotonic() - t0
    print(f"exit status {rc}")
    report(out, wall)


if __name__ == "__main__":
    main()
