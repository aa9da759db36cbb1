"""The shipped pair's evaluation beside two busy neighbours, per OpenMP setting of its engine.

    .venv/bin/python benchmarks/openmp_under_load.py [--repeats 2] [--settings a,b] [--docs]

What ``tests/training``'s in-process engine (``training.evaluate.make_llm``) costs while the
other pytest-xdist worker of ``make test`` keeps both cores busy. Each repeat, the settings
alternating: two counting loops, one pinned to each core (as the other worker's P and D are),
and beside them a fresh ``evaluate(n_prompts=16, max_tokens=128, kv_corruption=True)`` (the
tests' ``shipped_eval`` fixture) in the setting's environment; first, the two loops alone for
20 s. Prints the evaluation's wall, the core-seconds it took from the loops (their counts lost
against their rate alone: what ``make test``'s other worker loses), and whether the clean and
zeroed-KV acceptance equal the first setting's. ``--docs`` writes them to
``data/performance/openmp-under-load.json`` and their table into docs/performance.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time

import doc_tables  # a sibling script

NAME = "openmp-under-load"
SETTINGS = {  # name -> (the environment it adds, what it means)
    "both-cores": ({}, "two threads, one per core (`make_llm`'s default binding)"),
    "both-cores-passive": ({"OMP_WAIT_POLICY": "passive"},
                           "two threads, waiting threads asleep (`OMP_WAIT_POLICY=passive`)"),
    "core-0": ({"VLLM_CPU_OMP_THREADS_BIND": "0"},
               "one thread, on core 0 (`VLLM_CPU_OMP_THREADS_BIND=0`)"),
}
EVALUATE = """
import json, time
from workbench.training.evaluate import evaluate
t = time.monotonic()
r = evaluate("data/models", "data/prompts/indomain.jsonl", n_prompts=16, max_tokens=128,
             kv_corruption=True, write=False)
print("RESULT " + json.dumps({"wall_s": round(time.monotonic() - t, 1),
      "clean": r["clean"]["per_pos"], "zeroed": r["corrupt"]["per_pos"]}))
"""
NEIGHBOUR = """
import signal, sys, time
n, t = 0, time.monotonic()
def stop(*_):
    print(round(n / (time.monotonic() - t)), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    n += 1
"""


def neighbours() -> list[subprocess.Popen]:
    return [subprocess.Popen(["taskset", "-c", str(c), sys.executable, "-c", NEIGHBOUR],
                             stdout=subprocess.PIPE, text=True) for c in range(os.cpu_count())]


def rate(procs: list[subprocess.Popen]) -> int:
    """The neighbours' counts a second, summed."""
    for p in procs:
        p.terminate()
    return sum(int(p.communicate()[0]) for p in procs)


def alone(seconds: float = 20.0) -> int:
    procs = neighbours()
    time.sleep(seconds)
    return rate(procs)


def one(setting: str, alone_per_s: int) -> dict:
    procs = neighbours()
    try:
        out = subprocess.run([sys.executable, "-c", EVALUATE], capture_output=True, text=True,
                             env={**os.environ, **SETTINGS[setting][0]}, check=True,
                             cwd=doc_tables.REPO).stdout
    finally:  # the neighbours stop even when the evaluation fails
        counted = rate(procs)
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    run = json.loads(line[len("RESULT "):])
    took = os.cpu_count() * run["wall_s"] * (1 - counted / alone_per_s)
    return {**run, "neighbours_per_s": counted, "alone_per_s": alone_per_s,
            "core_s": round(took, 1)}


def summary(runs: list[dict], first: list[dict]) -> dict:
    same = all(r["clean"] == f["clean"] and r["zeroed"] == f["zeroed"]
               for r in runs for f in first)
    return {"wall_s": statistics.median(r["wall_s"] for r in runs),
            "core_s": statistics.median(r["core_s"] for r in runs),
            "same_acceptance": same}


def orders(doc: dict) -> list[list[str]]:
    """Each repeat's settings, fastest evaluation first."""
    return [sorted(doc["settings"], key=lambda s, i=i: doc["raw"][s][i]["wall_s"])
            for i in range(doc["repeats"])]


def table(doc: dict) -> str:
    base = doc[doc["settings"][0]]
    rows = ["| engine's OpenMP | evaluation | cores' time it took | acceptance |",
            "|---|---|---|---|"]
    for s in doc["settings"]:
        r = doc[s]
        rows.append(f"| {doc['meaning'][s]} | {r['wall_s']:.0f} s "
                    f"({r['wall_s'] / base['wall_s']:.2f}) | "
                    f"{r['core_s']:.0f} core-s ({r['core_s'] / base['core_s']:.2f}) | "
                    f"{'same' if r['same_acceptance'] else 'differs'} |")
    alone = [f"{doc['raw'][doc['settings'][0]][i]['alone_per_s'] / 1e6:.1f}"
             for i in range(doc["repeats"])]
    ranked = orders(doc)
    agree = ("in the same order in every repeat" if all(o == ranked[0] for o in ranked)
             else "in different orders in different repeats")
    return "\n".join(rows) + (
        f"\n\nThe shipped pair's evaluation (16 prompts, 128 tokens, zeroed and noise drafter "
        f"KV) beside one counting loop pinned to each core. Cores' time: what the loops lost, "
        f"their counts against their rate alone (20 s before each repeat: {', '.join(alone)} "
        f"million a second; where these differ, other work shared the machine and the figure is "
        f"rough). The evaluation's wall ranks the settings {agree}. Acceptance: the "
        f"clean and zeroed-KV rates at each position against the first row's (the noise is "
        f"drawn afresh each run). Medians of {doc['repeats']}, the settings alternating "
        f"(`benchmarks/openmp_under_load.py`, {doc['date']}, {doc['cores']} cores).")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--docs", action="store_true")
    args = ap.parse_args()
    settings = args.settings.split(",")
    if bad := [s for s in settings if s not in SETTINGS]:
        ap.error(f"--settings {','.join(bad)}: not one of {', '.join(SETTINGS)}")
    seen: dict[str, list[dict]] = {s: [] for s in settings}
    for i in range(args.repeats):
        alone_per_s = alone()
        for s in settings:
            seen[s].append(one(s, alone_per_s))
            print(f"repeat {i + 1}, {s}: {seen[s][-1]}", flush=True)
    doc = {"settings": settings, "meaning": {s: SETTINGS[s][1] for s in settings},
           "repeats": args.repeats, "raw": seen, "date": dt.date.today().isoformat(),
           "cores": os.cpu_count()}
    doc.update({s: summary(seen[s], seen[settings[0]]) for s in settings})
    print(table(doc))
    if args.docs:
        doc_tables.write(NAME, doc, table(doc))


if __name__ == "__main__":
    main()
