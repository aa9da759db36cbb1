"""The CPU profile with and without the worker main thread put back on its own core.

    .venv/bin/python benchmarks/worker_pinning.py [--prompts 16] [--max-tokens 64]
        [--concurrency 1,32] [--repeats 2]

vLLM's NIXL worker on a CPU moves the thread that runs the forwards to the last core
(``workbench/knobs/cpu_pin.py``), so on the 2-core box P computes on D's and the baseline's core.
This starts the servers twice, once as vLLM leaves them (``WORKBENCH_PIN_MAIN_THREAD`` unset)
and once as the CPU profile runs them, and on each runs the same prompts at each concurrency:
wall time (baseline + PD, warm servers), P's and D's leg medians, whether tokens and
per-position counts are identical between the two, and where each worker's main thread was.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.inputs import profiles
from workbench.knobs.spec import ENV_PIN_MAIN_THREAD


def legs(r) -> str:
    med = {k: statistics.median(q[k] for q in r.requests if q.get(k) is not None)
           for k in ("p_seconds", "d_seconds", "baseline_seconds")
           if any(q.get(k) is not None for q in r.requests)}
    return ", ".join(f"{k} {v:.3f}" for k, v in med.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,32")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    cfg = ExperimentConfig(num_prompts=args.prompts, max_tokens=args.max_tokens)
    pinned = profiles.PROFILES["cpu"]
    unpinned = replace(pinned, server_env={k: v for k, v in pinned.server_env.items()
                                           if k != ENV_PIN_MAIN_THREAD})
    walls: dict[tuple[str, int], list[float]] = {}
    runs = {}
    for name, prof in (("as vLLM leaves it", unpinned), ("main thread restored", pinned)):
        profiles.PROFILES["cpu"] = prof
        try:
            with Session() as s:
                for rep in range(args.repeats):
                    for c in levels:
                        r = s.run(replace(cfg, concurrency=c))
                        runs[(name, c)] = r
                        walls.setdefault((name, c), []).append(r.engine_seconds)
                        print(f"{name}: repeat {rep} concurrency {c}: {r.engine_seconds:.1f} s "
                              f"(baseline + PD, warm); legs: {legs(r)}", flush=True)
                cpus = {role: {k: v for k, v in s.in_force()[role]["components"]["worker"]
                               ["info"].items() if k.startswith("main_thread")}
                        for role in s.servers}
                print(f"{name}: worker main threads: {cpus}", flush=True)
        finally:
            profiles.PROFILES["cpu"] = pinned
    for c in levels:
        a, b = (statistics.median(walls[(n, c)]) for n in ("as vLLM leaves it",
                                                           "main thread restored"))
        x, y = runs[("as vLLM leaves it", c)], runs[("main thread restored", c)]
        same = all(q["pd_tokens"] == w["pd_tokens"] and q["pd"]["accepted_per_pos"] ==
                   w["pd"]["accepted_per_pos"] and q["baseline_tokens"] == w["baseline_tokens"]
                   for q, w in zip(x.requests, y.requests, strict=True))
        print(f"concurrency {c}: median {a:.1f} s -> {b:.1f} s ({a / b:.2f}x); tokens and "
              f"per-position counts identical request by request: {same}")


if __name__ == "__main__":
    main()
