"""Sending a run's requests and counting what each one drafted and accepted.

Every server the workbench starts runs with ``--per-request-spec-decode-metrics detailed``
(``ObservabilityConfig.per_request_spec_decode_metrics`` in ``vllm/config/observability.py``),
so each completion's body carries ``metrics.speculative_decoding`` with that request's ordered
``per_step_accepted`` / ``per_step_drafted`` arrays (``RequestSpecDecodeMetrics`` in
``vllm/v1/metrics/stats.py``, observed in the same scheduler branch as the ``/metrics``
counters). A request's counts come from its own response, so up to ``cfg.concurrency``
requests can be in flight on each side; ``/metrics`` is scraped before and after each phase
and the per-request sums must equal the counter deltas (``measurement.crosscheck``).

Servers without the flag (attach mode) are detected on each phase's first request, which goes
alone with a scrape around it; the phase then continues one request at a time with a scrape
before and after each (``measurement.source: "metrics-scrape"``), as the workbench did before.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..config import ExperimentConfig
from ..inputs.prompts import Prompt
from ..knobs import connector as kv_connector
from ..serving.proxy import pd_complete
from . import metrics
from .baseline_cache import BaselineCache

# (phase, done, total): "start" (servers starting) and "knobs" (applying them) count nothing;
# "baseline" and "pd" once per request returned, done and total over both sides' requests.
Progress = Callable[[str, int, int], None]
SIDE_SERVERS = {"baseline": ("baseline",), "pd": ("d", "p")}  # counted server first


class RunBars:
    """A :data:`Progress` drawn with tqdm (the CLI's): "starting servers" with its elapsed
    time while the servers start, then one bar per side counting prompts, opened when its
    first request returns, so neither the start nor the other side enters a side's rate and
    ETA. A baseline reused from the cache gets no bar."""

    def __init__(self, cfg: ExperimentConfig, bar: Callable[..., Any] | None = None,
                 tick_s: float = 1.0) -> None:
        if bar is None:
            from tqdm import tqdm as bar
        self.make, self.tick_s = bar, tick_s
        self.sides = int(cfg.run_baseline) + int(cfg.run_pd)
        self.side: str | None = None
        self.bar: Any = None
        self.stop = threading.Event()
        self.ticker: threading.Thread | None = None

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase == "start":
            self.close()
            self.bar = self.make(desc="starting servers", bar_format="{desc} {elapsed}")
            self.stop = threading.Event()
            self.ticker = threading.Thread(target=self._tick, args=(self.bar, self.stop),
                                           daemon=True, name="workbench-progress")
            self.ticker.start()
        elif phase == "knobs":
            if self.ticker is not None:  # the servers are up
                self.bar.set_description_str("servers up after", refresh=False)
            self.close()
        elif phase in SIDE_SERVERS:
            if phase != self.side:
                self.close()
                self.side = phase
                self.bar = self.make(desc=phase, total=total // self.sides, unit="prompt")
            self.bar.update(1)  # one call per request returned on this side

    def _tick(self, bar: Any, stop: threading.Event) -> None:
        while not stop.wait(self.tick_s):
            bar.refresh()  # tqdm redraws only on an update: keep the elapsed time moving

    def close(self) -> None:
        if self.ticker is not None:
            self.stop.set()
            self.ticker.join()
            self.ticker = None
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def handed_blocks(remote_block_ids) -> int | None:
    """Blocks P handed to D: a flat list, or one list per KV cache group (first group counted)."""
    if not remote_block_ids:
        return None
    first = remote_block_ids[0]
    return len(first) if isinstance(first, (list, tuple)) else len(remote_block_ids)


def p_fields(p_resp: dict) -> dict:
    """What a request row keeps of P's response: its spec-decode metrics and what it handed
    D (``kv_transfer_params``: the block count and the tokens)."""
    params = p_resp.get("kv_transfer_params") or {}
    return {"p_spec": spec_metrics(p_resp),
            "p_handed_blocks": handed_blocks(params.get("remote_block_ids")),
            "p_remote_num_tokens": params.get("remote_num_tokens")}


def request_body(cfg: ExperimentConfig) -> dict[str, Any]:
    """Greedy completions that return token ids (``temperature=0, top_p=1``, as vLLM's test)."""
    return {"model": cfg.target, "max_tokens": cfg.max_tokens, "temperature": 0.0,
            "top_p": 1.0, "return_token_ids": True, "ignore_eos": False}


def spec_metrics(response: dict) -> dict | None:
    """A completion's ``metrics.speculative_decoding`` with its per-step arrays, or None when
    the server does not report them (the field is experimental upstream: read defensively)."""
    sd = ((response.get("metrics") or {}).get("speculative_decoding")) or None
    if not isinstance(sd, dict) or "num_spec_tokens" not in sd:
        return None
    steps = sd.get("per_step_accepted"), sd.get("per_step_drafted")
    if sd.get("num_spec_steps", 0) and not all(isinstance(s, list) for s in steps):
        return None  # "summary" level: no per-step arrays
    return sd


IDLE_TIMEOUT_S = 60.0  # a run waits this long for an earlier run's requests to end


@dataclass
class Requests:
    """One run's requests on one set of servers."""

    client: httpx.AsyncClient
    urls: dict[str, str]
    cfg: ExperimentConfig
    tag: str  # request ids start with it (the knob version: ids stay unique across runs)
    progress: Progress | None = None
    total: int = 0
    done: int = 0
    engine_seconds: float = 0.0  # wall time with requests in flight, summed over phases
    phases: dict[str, dict] = field(default_factory=dict)  # side -> how it was measured
    stopped: bool = False  # a request failed: what arrives after it is not recorded

    async def scrape(self, role: str) -> metrics.SpecCounters:
        r = await self.client.get(f"{self.urls[role]}/metrics")
        r.raise_for_status()
        return metrics.parse(r.text)

    async def wait_idle(self, timeout: float = IDLE_TIMEOUT_S) -> None:
        """Until no server runs or queues a request: a run interrupted before this one (a
        Jupyter interrupt cancels its requests; vLLM aborts them as the client leaves) must
        not add its drafts to this run's ``/metrics`` deltas."""
        deadline = time.monotonic() + timeout
        for role, url in self.urls.items():
            while True:
                r = await self.client.get(f"{url}/metrics")
                r.raise_for_status()
                busy = metrics.in_flight(r.text)
                if not busy:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{role} server at {url} still has {busy} requests in "
                                       f"flight after {timeout:.0f} s; another client is using "
                                       "it, or an earlier run's requests did not stop")
                await asyncio.sleep(0.2)

    async def complete(self, role: str, body: dict, rid: str) -> dict:
        r = await self.client.post(f"{self.urls[role]}/v1/completions", json=body,
                                   headers={"X-Request-Id": rid})
        r.raise_for_status()
        return r.json()

    def record(self, side: str, row: dict, values: dict) -> None:
        """Keep one request's measurement and count it done (nothing once a request failed:
        a failed run keeps exactly what was measured before the failure)."""
        if self.stopped:
            return
        spec = values.get(f"{side}_spec")
        if spec is not None and side not in values:
            values[side] = metrics.counts_from_steps(spec)
        row.update(values)
        self.done += 1
        if self.progress:
            self.progress(side, self.done, self.total)

    async def baseline(self, p: Prompt) -> dict:
        t = time.monotonic()
        resp = await self.complete("baseline", {**request_body(self.cfg), "prompt": p.token_ids},
                                   f"{self.tag}-base-{p.id}")
        return {"baseline_seconds": time.monotonic() - t,
                "baseline_tokens": resp["choices"][0]["token_ids"],
                "baseline_spec": spec_metrics(resp)}

    async def pd(self, p: Prompt) -> dict:
        body = {**request_body(self.cfg), "prompt": p.token_ids}
        t, legs = time.monotonic(), {}
        p_resp, d_resp = await pd_complete(self.client, self.urls["p"], self.urls["d"], body,
                                           f"{self.tag}-pd-{p.id}", timings=legs,
                                           flow=kv_connector.flow(self.cfg.knobs))
        return {"pd_seconds": time.monotonic() - t, "p_seconds": legs["p"],
                "d_seconds": legs["d"],
                "pd_tokens": d_resp["choices"][0]["token_ids"],
                "pd_spec": spec_metrics(d_resp), **p_fields(p_resp)}

    async def prime(self, prompts: list[Prompt]) -> None:
        """D computes these prompts itself first and caches their blocks, so the PD request
        then loads only the tail from P (the ``lastblock`` set)."""
        body = {**request_body(self.cfg), "max_tokens": 1}
        await self.gather([lambda p=p: self.complete("d", {**body, "prompt": p.token_ids},
                                                     f"{self.tag}-prime-{p.id}")
                           for p in prompts])

    async def gather(self, sends: list[Callable[[], Awaitable[Any]]]) -> None:
        """Every send, at most ``cfg.concurrency`` in flight."""
        gate = asyncio.Semaphore(self.cfg.concurrency)

        async def limited(send):
            async with gate:
                try:
                    await send()
                except BaseException:
                    self.stopped = True
                    raise

        tasks = [asyncio.ensure_future(limited(s)) for s in sends]
        try:
            await asyncio.gather(*tasks)
        finally:  # the first failure cancels the requests still in flight
            for t in tasks:
                t.cancel()

    async def phase(self, side: str, prompts: list[Prompt], rows: list[dict]) -> None:
        """One side's requests. The first goes alone, between two scrapes: if its response has
        no per-request metrics, the rest go one at a time between scrapes too."""
        send = self.baseline if side == "baseline" else self.pd
        role = SIDE_SERVERS[side][0]
        t0 = time.monotonic()
        before = {r: await self.scrape(r) for r in SIDE_SERVERS[side]}
        first = await send(prompts[0])
        per_request = first.get(f"{side}_spec") is not None
        self.phases[side] = {"source": "per-request" if per_request else "metrics-scrape",
                             "concurrency": self.cfg.concurrency if per_request else 1,
                             "servers": {}}  # each server's /metrics delta, once measured
        if not per_request:
            first[side] = (await self.scrape(role) - before[role]).summary()
            self.record(side, rows[0], first)
            await self._sequential(side, send, prompts[1:], rows[1:])
        else:
            self.record(side, rows[0], first)

            async def one(p: Prompt, row: dict) -> None:
                self.record(side, row, await send(p))

            await self.gather([lambda p=p, row=row: one(p, row)
                               for p, row in zip(prompts[1:], rows[1:], strict=True)])
            await self._crosscheck(side, rows, before)
        self.engine_seconds += time.monotonic() - t0

    async def _sequential(self, side, send, prompts, rows) -> None:
        role = SIDE_SERVERS[side][0]
        for p, row in zip(prompts, rows, strict=True):
            b = await self.scrape(role)
            values = await send(p)
            values[side] = (await self.scrape(role) - b).summary()
            self.record(side, row, values)

    async def _crosscheck(self, side: str, rows: list[dict], before: dict) -> None:
        """Each server's ``/metrics`` delta over the phase, for ``results.crosscheck`` to
        compare with the per-request sums."""
        for role in SIDE_SERVERS[side]:
            delta = (await self.scrape(role) - before[role]).summary()
            self.phases[side]["servers"][role] = {"metrics_delta": delta}


async def measure(req: Requests, prompts: list[Prompt], rows: list[dict],
                  cache: BaselineCache | None, notes: list[str]) -> None:
    """The baseline (or its cached rows), then PD, into ``rows``."""
    cfg = req.cfg
    await req.wait_idle()
    req.total = len(prompts) * (int(cfg.run_baseline) + int(cfg.run_pd))
    token_ids = [p.token_ids for p in prompts]
    cached = cache.load(cfg, token_ids) if cache is not None and cfg.run_baseline else None
    if cached is not None:
        for row, c in zip(rows, cached["rows"], strict=True):
            row.update(c)
        req.phases["baseline"] = {**cached.get("phase", {}), "cached": cached["measured_at"]}
        notes.append(f"baseline reused from {cached['measured_at']} (same baseline server "
                     "shape, prompts and max_tokens)")
        req.done += len(prompts)
    elif cfg.run_baseline:
        await req.phase("baseline", prompts, rows)
        if cache is not None:
            cache.store(cfg, token_ids, rows, req.phases["baseline"])
    if cfg.run_pd:
        await req.prime([p for p in prompts if p.prime_d])
        await req.phase("pd", prompts, rows)


def run_coro(coro):
    """asyncio.run, also from inside Jupyter's running event loop: there the coroutine runs on
    a loop of its own in a helper thread, and an interrupt (KeyboardInterrupt in this thread,
    as ipykernel delivers it) cancels it and waits until its requests are cancelled before
    re-raising, so nothing keeps sending after the run was stopped."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    box: dict[str, Any] = {}

    # An Event, not Thread.join: a join interrupted by KeyboardInterrupt marks a thread that
    # still runs as stopped (CPython 3.11 threading.Thread._wait_for_tstate_lock, the
    # bpo-45274 branch: the lock it finds held is the live thread's), so a second join
    # would return at once; measured here, 2 of 3 interrupts left the coroutine running.
    done = threading.Event()

    def target():
        try:
            box["value"] = loop.run_until_complete(task)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="workbench-run", daemon=True).start()
    try:
        while not done.wait(0.1):
            pass
    except BaseException:
        # The loop is closed here, not in the thread: an interrupt handled after the run
        # ended must still find it open (cancelling a finished task does nothing).
        loop.call_soon_threadsafe(task.cancel)
        done.wait()
        raise
    finally:
        if done.is_set():
            loop.close()
    if "error" in box:
        raise box["error"]
    return box["value"]
