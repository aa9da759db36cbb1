"""What a fresh connection per request costs the measurement client, against reusing one.

    .venv/bin/python benchmarks/connection_reuse.py [--requests 40] [--rounds 3]

The client keeps no idle connection (``experiment.client_limits``): a reused one can be
closed under a request by vLLM's keep-alive timeout (httpx.ReadError). This starts one
baseline server (the CPU profile) and sends the same one-token completion one at a time,
alternating rounds of a keep-alive client and of the workbench's client, and prints the
median latency of each and their ratio, measured side by side in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from workbench.config import ExperimentConfig
from workbench.experiment import Session, client_limits


async def latencies(url: str, limits: httpx.Limits, n: int) -> list[float]:
    body = {"model": "x", "prompt": [1, 2, 3, 4], "max_tokens": 1, "temperature": 0}
    out = []
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        model = (await client.get(f"{url}/v1/models")).json()["data"][0]["id"]
        for _ in range(n):
            t = time.monotonic()
            r = await client.post(f"{url}/v1/completions", json={**body, "model": model})
            r.raise_for_status()
            out.append(time.monotonic() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    cfg = ExperimentConfig(run_pd=False)
    kinds = {"keep-alive (httpx default)": httpx.Limits(),
             "fresh connection (workbench)": client_limits(1)}
    got: dict[str, list[float]] = {k: [] for k in kinds}
    with Session() as s:
        s.ensure(cfg)
        url = s.servers["baseline"].url
        asyncio.run(latencies(url, kinds["keep-alive (httpx default)"], 5))  # warm-up
        for _ in range(args.rounds):
            for name, limits in kinds.items():
                got[name] += asyncio.run(latencies(url, limits, args.requests))
    med = {k: statistics.median(v) * 1e3 for k, v in got.items()}
    for k, v in med.items():
        print(f"{k}: median {v:.2f} ms over {len(got[k])} requests")
    fresh, reuse = med["fresh connection (workbench)"], med["keep-alive (httpx default)"]
    print(f"fresh / keep-alive = {fresh / reuse:.3f} ({fresh - reuse:+.2f} ms a request)")


if __name__ == "__main__":
    main()
