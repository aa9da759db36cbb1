"""The fuzzer's share of time in server starts, per server start mode.

    .venv/bin/python benchmarks/fuzz_start_share.py [--budget 20m] [--modes zygote] [--seed 0]
        [--docs]

Runs ``python -m workbench fuzz --budget B --seed S`` once per mode (``WORKBENCH_SERVER_START``,
``serving/servers.py``), one after the other, and prints each run's trials, warm trials per
minute and share of all trial time spent starting servers (``fuzz_power.throughput``, from
the run's ``trials.jsonl``); ``--docs`` writes them to ``data/performance/fuzz-starts.json``
and a table into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import doc_tables  # sibling scripts, not a package
from fuzz_power import throughput


def table(doc: dict) -> str:
    rows = ["| start mode | trials | warm trials a minute | time in server starts |",
            "|---|---|---|---|"]
    rows += [f"| `{m}` | {r['trials']} | {r['warm_trials_per_minute']} | "
             f"**{r['start_share']:.0%}** |" for m, r in doc["modes"].items()]
    return "\n".join(rows) + (
        f"\n\n`python -m workbench fuzz --budget {doc['budget']} --seed {doc['seed']}` per "
        f"mode (`benchmarks/fuzz_start_share.py`, {doc['date']}, {doc['cores']} cores).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="20m")
    ap.add_argument("--modes", default="zygote")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    doc = {"modes": {}, "budget": args.budget, "seed": args.seed,
           "date": dt.date.today().isoformat(), "cores": os.cpu_count()}
    for mode in args.modes.split(","):
        d = Path(tempfile.mkdtemp(prefix=f"fuzz-{mode}-"))
        subprocess.run([sys.executable, "-m", "workbench", "fuzz", "--budget", args.budget,
                        "--seed", args.seed, "--out", str(d)], check=False,
                       env={**os.environ, "WORKBENCH_SERVER_START": mode},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        doc["modes"][mode] = throughput(d)
        print(f"{mode}: {json.dumps(doc['modes'][mode])}", flush=True)
    print(table(doc))
    if args.docs:
        doc_tables.write("fuzz-starts", doc, table(doc))


if __name__ == "__main__":
    main()
