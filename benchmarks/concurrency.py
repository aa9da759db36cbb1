"""One run on warm servers, one request at a time against N in flight: time and exactness.

    .venv/bin/python benchmarks/concurrency.py [--prompts 16] [--max-tokens 64]
        [--concurrency 1,16] [--repeats 3] [--knob NAME=VALUE ...] [--prompt-set indomain]

Starts the servers once, then for each repeat runs the same config at every concurrency side
by side and prints each run's wall time (baseline + PD, servers warm), the median per
concurrency, the ratio to the first one, and whether greedy outputs and per-position counts
are identical to the first concurrency's, request by request (a batching effect must never be
mistaken for a KV bug; docs/measurement.md#concurrency).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.knobs import spec


def same(a, b) -> dict[str, int]:
    """Requests whose tokens / counts differ between two runs of the same prompts."""
    out = {"baseline_tokens": 0, "pd_tokens": 0, "baseline": 0, "pd": 0}
    for x, y in zip(a.requests, b.requests, strict=True):
        for key in out:
            if key.endswith("_tokens"):
                out[key] += x.get(key) != y.get(key)
            else:
                fields = ("num_drafts", "accepted_per_pos")
                out[key] += any(x[key][f] != y[key][f] for f in fields)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-set", default="indomain")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--knob", action="append", default=[])
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    cfg = ExperimentConfig(num_prompts=args.prompts, max_tokens=args.max_tokens,
                           prompt_set=args.prompt_set, knobs=spec.parse_assignments(args.knob))
    walls: dict[int, list[float]] = {c: [] for c in levels}
    with Session() as s:
        s.ensure(cfg)
        for rep in range(args.repeats):
            runs = {c: s.run(replace(cfg, concurrency=c)) for c in levels}
            for c, r in runs.items():
                walls[c].append(r.engine_seconds)
                diff = same(runs[levels[0]], r)
                print(f"repeat {rep}: concurrency {c:>3}: {r.engine_seconds:6.1f} s "
                      f"(baseline + PD, warm), token agreement {r.token_agreement}, "
                      f"crosscheck {r.measurement.get('crosscheck')}, requests differing "
                      f"from concurrency {levels[0]}: {diff}", flush=True)
    first = statistics.median(walls[levels[0]])
    for c in levels:
        med = statistics.median(walls[c])
        print(f"concurrency {c:>3}: median {med:6.1f} s over {args.repeats}; "
              f"{first / med:.2f}x the speed of concurrency {levels[0]}")


if __name__ == "__main__":
    main()
