"""Wall time of the default sweep, the time the engines were busy, and their ratio.

    .venv/bin/python benchmarks/sweep_time.py [--out DIR] [--grid default] [--in-process]
    .venv/bin/python benchmarks/sweep_time.py --report data/reference-sweep

Runs the sweep from scratch into DIR (default: a fresh temporary directory) and prints the
sweep's wall time, server start-up time, the engines' busy time (sum of request latencies
over all runs) and busy / wall. ``--report DIR`` prints the same for a sweep already run
(wall time from its ``sweep-timing.json``), running nothing.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from workbench.config import SWEEP_NUM_PROMPTS, ExperimentConfig
from workbench.notebook import sweep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--grid", default="default")
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--prompts", type=int, default=SWEEP_NUM_PROMPTS)
    ap.add_argument("--report", help="report on a sweep already run in this directory")
    args = ap.parse_args()
    if args.report:
        out = Path(args.report)
        timing = json.loads((out / "sweep-timing.json").read_text())
        wall = timing["wall_seconds"]
    else:
        out = Path(args.out or tempfile.mkdtemp(prefix="sweep-bench-"))
        t = time.monotonic()
        sweep.run_sweep(args.grid, out, ExperimentConfig(num_prompts=args.prompts),
                        use_papermill=not args.in_process, resume=False)
        wall = time.monotonic() - t
        timing = json.loads((out / "sweep-timing.json").read_text())
    results = sweep.load_results(out)
    busy = sum(r.engine_seconds for r in results)
    starts = timing.get("startup_seconds", {})
    print(f"sweep '{args.grid}': {len(results)} points, wall {wall:.1f} s")
    print(f"engines busy {busy:.1f} s; busy / wall = {busy / wall:.2f}")
    print(f"last server start-up: {', '.join(f'{k} {v:.1f} s' for k, v in starts.items())}")
    print(f"output: {out}")


if __name__ == "__main__":
    main()
