"""Wall time of ``python -m workbench check`` (goal: every finding in at most 10 minutes on the
2-core CPU, from an installed environment), and where it went.

    .venv/bin/python benchmarks/check_time.py [--only ID,...] [--out DIR]
    .venv/bin/python benchmarks/check_time.py --report DIR   # a check already run into DIR
    .venv/bin/python benchmarks/check_time.py --modes spawn,zygote --docs   # per start mode

Prints the command's wall time (measured around the process, server starts included), the
number of runs, the servers' start-up seconds per run shape from each run's result.json, and
each finding's seconds (a run shared by several findings is charged to the first). With
``--modes`` it runs the check once per server start mode (``WORKBENCH_SERVER_START``), one
after the other; ``--docs`` writes their wall and start seconds to
``data/performance/check-starts.json`` and a table into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import doc_tables  # a sibling script


def started_s(out: Path) -> float:
    """The servers' start seconds of the check's runs (the slowest role of each server set)."""
    runs = sorted((out / "runs").glob("*/result.json"))
    starts = [json.loads(p.read_text())["knobs"].get("startup_seconds") or {} for p in runs]
    unique = {json.dumps(s, sort_keys=True): s for s in starts if s}  # one per server set
    return sum(max(s.values(), default=0.0) for s in unique.values())


def report(out: Path, wall: float | None) -> None:
    doc = json.loads((out / "check.json").read_text())
    runs = sorted((out / "runs").glob("*/result.json"))
    started = started_s(out)
    if wall is not None:
        print(f"wall: {wall:.0f} s (goal: 600 s)")
    print(f"runs: {len(runs)}; server start-ups seen in results: {started:.0f} s "
          "(the slowest role of each start)")
    for f in doc["findings"]:
        print(f"  {f['id']:30} {f['verdict']:16} {f['seconds']:6.0f} s")
    print(f"findings total: {sum(f['seconds'] for f in doc['findings']):.0f} s")


def run_check(out: Path, only: str | None, mode: str | None) -> tuple[int, float]:
    cmd = [sys.executable, "-m", "workbench", "check", "--out", str(out)]
    env = {**os.environ, **({"WORKBENCH_SERVER_START": mode} if mode else {})}
    t0 = time.monotonic()
    rc = subprocess.run([*cmd, *(["--only", only] if only else [])], env=env).returncode
    return rc, time.monotonic() - t0


def table(doc: dict) -> str:
    rows = ["| start mode | `check` wall | server starts in it | exit |", "|---|---|---|---|"]
    rows += [f"| `{m}` | {r['wall_s']:.0f} s | {r['starts_s']:.0f} s | {r['exit']} |"
             for m, r in doc["modes"].items()]
    return "\n".join(rows) + (
        f"\n\nEvery finding, {doc['runs']} runs, one check per mode one after the other "
        f"(`benchmarks/check_time.py --modes`, {doc['date']}, {doc['cores']} cores).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--out")
    ap.add_argument("--report", help="report on a check already run into this directory")
    ap.add_argument("--modes", help="server start modes to run the check in, in turn")
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    if args.report:
        report(Path(args.report), None)
        return
    base = Path(args.out or tempfile.mkdtemp(prefix="check-bench-"))
    doc = {"modes": {}, "date": dt.date.today().isoformat(), "cores": os.cpu_count()}
    for mode in args.modes.split(",") if args.modes else [None]:
        out = base / f"check-{mode or 'default'}"
        rc, wall = run_check(out, args.only, mode)
        print(f"{mode or 'default'}: exit status {rc}")
        report(out, wall)
        doc["modes"][mode or "default"] = {"wall_s": round(wall, 1), "exit": rc,
                                           "starts_s": round(started_s(out), 1)}
        doc["runs"] = len(list((out / "runs").glob("*/result.json")))
    if args.docs:
        doc_tables.write("check-starts", doc, table(doc))


if __name__ == "__main__":
    main()
