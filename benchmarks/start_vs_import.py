"""A one-request run against one cold import of vLLM's API server, per server start mode.

    .venv/bin/python benchmarks/start_vs_import.py [--repeats 2] [--modes spawn,zygote] [--docs]

Each repeat, one after the other on the same machine: ``python -c "import
vllm.entrypoints.openai.api_server"`` (a fresh interpreter), then per mode a fresh ``python -m
workbench run --prompts 1 --max-tokens 4`` (three servers, one prompt, four tokens) with
``WORKBENCH_SERVER_START`` set to the mode (``serving/servers.py``). Prints each measurement,
the medians, and each mode's run over the import; ``--docs`` writes them to
``data/performance/one-request-run.json`` and their table into docs/performance.md. The modes
and the import alternate, so a busier minute weighs on all of them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import doc_tables  # a sibling script

NAME = "one-request-run"
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


def table(doc: dict) -> str:
    rows = ["| start mode | one-request run | slowest server's start in it | run / import |",
            "|---|---|---|---|"]
    for m in doc["modes"]:
        r = doc[m]
        rows.append(f"| `{m}` | {r['run_s']:.1f} s | {r['slowest_server_s']:.1f} s | "
                    f"**{r['run_over_import']:.2f}** |")
    return "\n".join(rows) + (
        f"\n\nOne cold `import vllm.entrypoints.openai.api_server`: {doc['import_s']:.1f} s. "
        f"Medians of {doc['repeats']}, the import and the modes alternating "
        f"(`benchmarks/start_vs_import.py`, {doc['date']}, {doc['cores']} cores).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="spawn,zygote")
    ap.add_argument("--docs", action="store_true")
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
    doc = {"import_s": imp, "repeats": args.repeats, "modes": modes, "raw": seen,
           "date": dt.date.today().isoformat(), "cores": os.cpu_count()}
    for m in modes:
        wall = statistics.median(r["wall_s"] for r in seen[m])
        doc[m] = {"run_s": wall, "run_over_import": round(wall / imp, 2),
                  "slowest_server_s": statistics.median(r["slowest_server_s"] for r in seen[m])}
    print(table(doc))
    if args.docs:
        doc_tables.write(NAME, doc, table(doc))


if __name__ == "__main__":
    main()
