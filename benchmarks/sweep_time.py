"""Wall time of the default sweep, the time the engines were busy, and their ratio.

    .venv/bin/python benchmarks/sweep_time.py [--out DIR] [--grid default] [--in-process]
    .venv/bin/python benchmarks/sweep_time.py --report data/reference-sweep
    .venv/bin/python benchmarks/sweep_time.py --before REV [--after REV] [--repeats N]

Runs the sweep from scratch into DIR (default: a fresh temporary directory) and prints the
sweep's wall time, server start-up time, the engines' busy time (sum of request latencies
over all runs) and busy / wall. ``--report DIR`` prints the same for a sweep already run
(wall time from its ``sweep-timing.json``), running nothing.

``--before REV`` measures two commits side by side: each is checked out into a temporary git
worktree and runs ``python -m workbench sweep`` there (this venv, the worktree first on
``PYTHONPATH``), alternating before / after ``--repeats`` times, each from a cold prompt cache
as a first ``make figures`` has it. It prints every run, the medians and after / before.
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
from pathlib import Path

from workbench.config import SWEEP_NUM_PROMPTS, ExperimentConfig
from workbench.measuring.results import Result
from workbench.notebook import sweep
from workbench.paths import REPO


def summary(out: Path, wall: float) -> dict:
    """What one sweep in ``out`` took, from its ``sweep-timing.json`` and points."""
    timing = json.loads((out / "sweep-timing.json").read_text())
    busy = sum(Result.load(p).engine_seconds for p in sorted(out.glob("points/*/result.json")))
    return {"wall": wall, "starts": sum(timing["start_seconds"]),
            "points": sum(timing["points"].values()), "busy": busy}


def one_commit(rev: str, work: Path, grid: str) -> dict:
    tree = work / f"tree-{rev[:12]}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=REPO,
                       check=True)
    subprocess.run(["rm", "-rf", str(tree / ".cache" / "prompts")], check=True)
    out = Path(tempfile.mkdtemp(prefix="sweep-", dir=work))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.monotonic()
    subprocess.run([sys.executable, "-m", "workbench", "sweep", "--grid", grid, "--out",
                    str(out)], cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return summary(out, time.monotonic() - t)


def side_by_side(before: str, after: str, repeats: int, grid: str) -> None:
    revs = {name: subprocess.run(["git", "rev-parse", rev], cwd=REPO, check=True,
                                 capture_output=True, text=True).stdout.strip()
            for name, rev in (("before", before), ("after", after))}
    work = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        for i in range(repeats):
            for name, rev in revs.items():
                runs[name].append(s := one_commit(rev, work, grid))
                print(f"run {i + 1} {name} ({rev[:10]}): wall {s['wall']:.1f} s, server starts "
                      f"{s['starts']:.1f} s, points {s['points']:.1f} s, engines busy "
                      f"{s['busy']:.1f} s", flush=True)
    finally:
        for rev in revs.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(work / f"tree-{rev[:12]}")],
                           cwd=REPO, check=False)
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in runs.items()}
    print(f"\nmedians of {repeats} ({grid} grid)  " + "  ".join(f"{k:>8}" for k in med["after"]))
    for n in ("before", "after"):
        print(f"{n:>30}  " + "  ".join(f"{v:8.1f}" for v in med[n].values()))
    print(f"{'after / before':>30}  " + "  ".join(
        f"{med['after'][k] / med['before'][k]:8.2f}" for k in med["after"]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--grid", default="default")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--prompts", type=int, default=SWEEP_NUM_PROMPTS)
    ap.add_argument("--report", help="report on a sweep already run in this directory")
    ap.add_argument("--before", help="a commit to measure side by side with --after")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    if args.before:
        side_by_side(args.before, args.after, args.repeats, args.grid)
        return
    if args.report:
        out = Path(args.report)
        wall = json.loads((out / "sweep-timing.json").read_text())["wall_seconds"]
    else:
        out = Path(args.out or tempfile.mkdtemp(prefix="sweep-bench-"))
        t = time.monotonic()
        sweep.run_sweep(args.grid, out, ExperimentConfig(num_prompts=args.prompts),
                        use_papermill=not args.in_process, resume=False)
        wall = time.monotonic() - t
    s = summary(out, wall)
    print(f"sweep '{args.grid}': wall {s['wall']:.1f} s; server starts {s['starts']:.1f} s; "
          f"points {s['points']:.1f} s")
    print(f"engines busy {s['busy']:.1f} s; busy / wall = {s['busy'] / s['wall']:.2f}")
    print(f"output: {out}")


if __name__ == "__main__":
    main()
