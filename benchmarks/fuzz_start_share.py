"""The fuzzer's share of time in server starts, per server start mode.

    .venv/bin/python benchmarks/fuzz_start_share.py [--budget 20m] [--modes zygote] [--seed 0]

Runs ``python -m workbench fuzz --budget B --seed S`` once per mode (``WORKBENCH_SERVER_START``,
``serving/servers.py``), one after the other, and prints each run's trials, warm trials per
minute and share of all trial time spent starting servers (``fuzz_power.throughput``, from
the run's ``trials.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_power import throughput  # a sibling script, not a package


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="20m")
    ap.add_argument("--modes", default="zygote")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {}
    for mode in args.modes.split(","):
        d = Path(tempfile.mkdtemp(prefix=f"fuzz-{mode}-"))
        subprocess.run([sys.executable, "-m", "workbench", "fuzz", "--budget", args.budget,
                        "--seed", args.seed, "--out", str(d)], check=False,
                       env={**os.environ, "WORKBENCH_SERVER_START": mode},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        out[mode] = throughput(d)
        print(f"{mode}: {json.dumps(out[mode])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
