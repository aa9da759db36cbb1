"""Sending a run's requests and counting what each one drafted and accepted.

Requests go one at a time, with a /metrics scrape before and after each: the per-request
counter deltas are exact (no other request shares the step), and greedy outputs are compared
under the same batch shape on both sides (fp32 CPU kernels may round differently for other
batch shapes), so token agreement means what it says.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from . import metrics
from .baseline_cache import BaselineCache
from .config import ExperimentConfig
from .prompts import Prompt
from .proxy import pd_complete

Progress = Callable[[str, int, int], None]  # (phase, done, total)


def handed_blocks(remote_block_ids) -> int | None:
    """Blocks P handed to D: a flat list, or one list per KV cache group (first group counted)."""
    if not remote_block_ids:
        return None
    first = remote_block_ids[0]
    return len(first) if isinstance(first, (list, tuple)) else len(remote_block_ids)


def request_body(cfg: ExperimentConfig) -> dict[str, Any]:
    """Greedy completions that return token ids (``temperature=0, top_p=1``, as vLLM's test)."""
    return {"model": cfg.target, "max_tokens": cfg.max_tokens, "temperature": 0.0,
            "top_p": 1.0, "return_token_ids": True, "ignore_eos": False}


@dataclass
class Requests:
    """One run's requests on one set of servers; ``engine_seconds`` sums their wall times."""

    client: httpx.AsyncClient
    urls: dict[str, str]
    cfg: ExperimentConfig
    tag: str  # request ids start with it (the knob version: ids stay unique across runs)
    progress: Progress | None = None
    total: int = 0
    done: int = 0
    engine_seconds: float = 0.0

    async def scrape(self, role: str) -> metrics.SpecCounters:
        r = await self.client.get(f"{self.urls[role]}/metrics")
        r.raise_for_status()
        return metrics.parse(r.text)

    async def complete(self, role: str, body: dict, rid: str) -> dict:
        r = await self.client.post(f"{self.urls[role]}/v1/completions", json=body,
                                   headers={"X-Request-Id": rid})
        r.raise_for_status()
        return r.json()

    def tick(self, phase: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(phase, self.done, self.total)

    async def baseline(self, p: Prompt, row: dict) -> None:
        before = await self.scrape("baseline")
        t = time.monotonic()
        resp = await self.complete("baseline", {**request_body(self.cfg), "prompt": p.token_ids},
                                   f"{self.tag}-base-{p.id}")
        row["baseline_seconds"] = time.monotonic() - t
        self.engine_seconds += row["baseline_seconds"]
        row["baseline"] = (await self.scrape("baseline") - before).summary()
        row["baseline_tokens"] = resp["choices"][0]["token_ids"]
        self.tick("baseline")

    async def pd(self, p: Prompt, row: dict) -> None:
        body = {**request_body(self.cfg), "prompt": p.token_ids}
        if p.prime_d:  # D computes the prompt itself first and caches its blocks
            await self.complete("d", {**body, "max_tokens": 1}, f"{self.tag}-prime-{p.id}")
        before = await self.scrape("d")
        t = time.monotonic()
        p_resp, d_resp = await pd_complete(self.client, self.urls["p"], self.urls["d"], body,
                                           f"{self.tag}-pd-{p.id}")
        row["pd_seconds"] = time.monotonic() - t
        self.engine_seconds += row["pd_seconds"]
        row["pd"] = (await self.scrape("d") - before).summary()
        row["pd_tokens"] = d_resp["choices"][0]["token_ids"]
        params = p_resp.get("kv_transfer_params") or {}
        row["p_handed_blocks"] = handed_blocks(params.get("remote_block_ids"))
        row["p_remote_num_tokens"] = params.get("remote_num_tokens")
        self.tick("pd")


async def measure(req: Requests, prompts: list[Prompt], rows: list[dict],
                  cache: BaselineCache | None, notes: list[str]) -> None:
    """The baseline (or its cached rows), then PD, one request at a time, into ``rows``."""
    cfg = req.cfg
    req.total = len(prompts) * (int(cfg.run_baseline) + int(cfg.run_pd))
    token_ids = [p.token_ids for p in prompts]
    cached = cache.load(cfg, token_ids) if cache is not None and cfg.run_baseline else None
    if cached is not None:
        for row, c in zip(rows, cached["rows"], strict=True):
            row.update(c)
        notes.append(f"baseline reused from {cached['measured_at']} (same baseline server "
                     "shape, prompts and max_tokens)")
        req.done += len(prompts)
    elif cfg.run_baseline:
        for p, row in zip(prompts, rows, strict=True):
            await req.baseline(p, row)
        if cache is not None:
            cache.store(cfg, token_ids, rows)
    if cfg.run_pd:
        for p, row in zip(prompts, rows, strict=True):
            await req.pd(p, row)


def run_coro(coro):
    """asyncio.run, also from inside Jupyter's running event loop (in a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
