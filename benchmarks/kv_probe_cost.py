"""What the KV probe costs: the same run with and without --kv-probe, side by side.

    .venv/bin/python benchmarks/kv_probe_cost.py [--prompts 32] [--max-tokens 64]
        [--concurrency 32] [--repeats 3] [--knob NAME=VALUE ...]

Starts the servers once; each repeat runs the config without the probe, then with it, on the
same warm servers (the baseline measured in both: the probe bypasses the baseline cache, so
the comparison does too). Prints each run's wall time, the medians and their ratio, the
medians of the per-request capture time on D, P and the baseline, the collect time, and
whether the probe changed any token or per-position count.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.knobs import spec


def changed(a, b) -> int:
    """Requests whose tokens or per-position counts differ between the two runs."""
    return sum(x.get("pd_tokens") != y.get("pd_tokens")
               or x["pd"]["accepted_per_pos"] != y["pd"]["accepted_per_pos"]
               or x["pd"]["num_drafts"] != y["pd"]["num_drafts"]
               for x, y in zip(a.requests, b.requests, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--knob", action="append", default=[])
    args = ap.parse_args()
    cfg = ExperimentConfig(num_prompts=args.prompts, max_tokens=args.max_tokens,
                           concurrency=args.concurrency,
                           knobs=spec.parse_assignments(args.knob))
    wall: dict[bool, list[float]] = {False: [], True: []}
    capture: dict[str, list[float]] = {"d": [], "p": [], "baseline": []}
    collect, diffs = [], 0
    with Session() as s:
        s.run(cfg)  # warm-up: servers started, first-request effects out of the way
        for rep in range(args.repeats):
            off = s.run(cfg)
            on = s.run(replace(cfg, kv_probe=True))
            wall[False].append(off.wall_seconds)
            wall[True].append(on.wall_seconds)
            for q in on.requests:
                for role, v in (q.get("kv_probe") or {}).get("capture_s", {}).items():
                    if v is not None:
                        capture[role].append(v)
            collect.append(on.kv_probe_summary["cost"]["collect_s"])
            diffs += changed(off, on)
            print(f"repeat {rep + 1}: without {off.wall_seconds:.1f} s, with "
                  f"{on.wall_seconds:.1f} s", flush=True)
    m_off, m_on = statistics.median(wall[False]), statistics.median(wall[True])
    print(f"median wall: without {m_off:.1f} s, with {m_on:.1f} s (x{m_on / m_off:.2f})")
    print("median capture per request (ms): " + ", ".join(
        f"{role} {1000 * statistics.median(v):.1f}" for role, v in capture.items() if v))
    print(f"median collect: {statistics.median(collect):.2f} s")
    print(f"requests whose tokens or counts the probe changed: {diffs}")


if __name__ == "__main__":
    main()
