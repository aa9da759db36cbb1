"""A one-request run against one cold import of vLLM's API server, per server start mode.

    .venv/bin/python benchmarks/start_vs_import.py [--repeats 2] [--modes spawn,zygote]
        [--json OUT]

Each repeat, one after the other on the same machine: ``python -c "import
vllm.entrypoints.openai.api_server"`` (a fresh interpreter), then per mode a fresh ``python -m
workbench run --prompts 1 --max-tokens 4`` (three servers, one prompt, four tokens) with
``WORKBENCH_SERVER_START`` set to the mode (``serving/servers.py``). Prints each measurement,
the medians, and each mode's run over the import; ``--json`` writes them too. The modes and
the import alternate, so a busier minute weighs on all of them.
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

IMPORT = [sys.executable, "-c", "import vllm.entrypoints.openai.api_server"]
RUN = [sys.executable, "-m", "workbench", "run", "--prompts", "1", "--max-tokens", "4"]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.monotonic() - t


def one_run(mode: str) -> dict:
    """The run's wall time and its servers' start (from its result.json)."""
    out = Path(tempfile.mkdtemp(prefix=f"run-{mode}-"))
    wall = timed([*RUN, "--out", str(out)], {**os.environ, "WORKBENCH_SERVER_START": mode})
    result = json.loads((out / "result.json").read_text())
    starts = result["knobs"].get("startup_seconds") or {}
    return {"wall_s": round(wall, 1), "slowest_server_s": round(max(starts.values()), 1)
            if starts else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="spawn,zygote")
    ap.add_argument("--json")
    args = ap.parse_args()
    modes = args.modes.split(",")
    seen: dict[str, list] = {"import": [], **{m: [] for m in modes}}
    for i in range(args.repeats):
        seen["import"].append(round(timed(IMPORT, dict(os.environ)), 1))
        print(f"repeat {i + 1}: cold import {seen['import'][-1]} s", flush=True)
        for m in modes:
            seen[m].append(one_run(m))
            print(f"repeat {i + 1}: one-request run, {m}: {seen[m][-1]}", flush=True)
    imp = statistics.median(seen["import"])
    summary = {"import_s": imp, "repeats": args.repeats, "raw": seen}
    print(f"cold import of vllm.entrypoints.openai.api_server: median {imp:.1f} s")
    for m in modes:
        wall = statistics.median(r["wall_s"] for r in seen[m])
        summary[m] = {"run_s": wall, "run_over_import": round(wall / imp, 2)}
        print(f"one-request run, {m}: median {wall:.1f} s = {wall / imp:.2f} x the import")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
