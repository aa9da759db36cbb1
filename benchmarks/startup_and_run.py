"""Server start-up time and the default experiment's wall time, medians of several runs.

    .venv/bin/python benchmarks/startup_and_run.py [--starts 3] [--runs 3] [--unpinned]
        [--prompts 16] [--max-tokens 64] [--prompt-set indomain] [--concurrency N]

    # vLLM's PD acceptance test shape (80 MT-Bench prompts, 256 tokens), start-up included:
    .venv/bin/python benchmarks/startup_and_run.py --starts 1 --runs 1 --prompts 80 \
        --max-tokens 256 --prompt-set mt_bench

Prints one line per measurement and the medians. --unpinned repeats the run measurement with
every server free to use both cores, to show why the CPU profile pins P and D apart.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.inputs import profiles


def measure(cfg: ExperimentConfig, starts: int, runs: int) -> dict:
    startup, walls, engine = [], [], []
    for i in range(starts):
        t = time.monotonic()
        with Session() as s:
            s.ensure(cfg)
            startup.append(time.monotonic() - t)
            print(f"start {i}: all servers healthy after {startup[-1]:.1f} s "
                  f"(each: {', '.join(f'{k} {v:.1f}' for k, v in s.startup_seconds.items())})",
                  flush=True)
            if i == 0:
                for j in range(runs):
                    r = s.run(cfg)
                    walls.append(r.wall_seconds)
                    engine.append(r.engine_seconds)
                    print(f"run {j}: wall {r.wall_seconds:.1f} s, engine busy "
                          f"{r.engine_seconds:.1f} s, {r.num_prompts} prompts x "
                          f"{cfg.max_tokens} tokens", flush=True)
    return {"startup": statistics.median(startup), "wall": statistics.median(walls),
            "engine": statistics.median(engine)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-set", default="indomain")
    ap.add_argument("--concurrency", type=int, default=None)
    ap.add_argument("--unpinned", action="store_true")
    args = ap.parse_args()
    extra = {} if args.concurrency is None else {"concurrency": args.concurrency}
    cfg = ExperimentConfig(num_prompts=args.prompts, max_tokens=args.max_tokens,
                           prompt_set=args.prompt_set, **extra)
    pinned = measure(cfg, args.starts, args.runs)
    print(f"pinned: median start-up {pinned['startup']:.1f} s, median run wall "
          f"{pinned['wall']:.1f} s (engine busy {pinned['engine']:.1f} s); start-up + run "
          f"{pinned['startup'] + pinned['wall']:.1f} s at concurrency {cfg.concurrency}")
    if args.unpinned:
        cpu = profiles.PROFILES["cpu"]
        profiles.PROFILES["cpu"] = replace(cpu, cpus={})
        try:
            free = measure(cfg, 1, args.runs)
        finally:
            profiles.PROFILES["cpu"] = cpu
        print(f"unpinned: median run wall {free['wall']:.1f} s; pinned is "
              f"{free['wall'] / pinned['wall']:.2f}x faster")


if __name__ == "__main__":
    main()
