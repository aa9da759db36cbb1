"""One fuzz trial on a ``Session``'s servers: the baseline twice (the noise reference), then
the baseline and PD in the scenario's order, the KV probe, and a ``result.json``-shaped
record the known findings' detectors can read.

Each pass starts from reset prefix caches (a new knob version resets every engine core's
and clears the probe, ``knobs/plugin.py``), so the second baseline computes what the first
did, and D finds in its cache only what the scenario put there (``d_first``, shared
prefixes). Requests arrive at their ``delay_s``; an aborted one is cut by closing its
connection (vLLM aborts a request whose client left) and is judged on nothing but itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..config import ExperimentConfig
from ..experiment import Session, client_limits, new_result, probe_kv
from ..inputs.prompts import Prompt, apply_double_bos, bad_case, load_tokenizer
from ..knobs import connector as kv_connector
from ..knobs.kv_probe import prompt_key
from ..measuring import kv_compare, metrics
from ..measuring.measure import Requests, p_fields, request_body, run_coro, spec_metrics
from ..measuring.results import aggregate
from ..serving.proxy import decode_request, prefill_request
from . import attribute, oracle
from .crash import Crash, classify
from .scenario import Request, Scenario

ABORT_AFTER_S = 0.05  # a during-d abort closes D's connection this long after sending it


@dataclass
class Trial:
    """A trial's records and verdict."""

    scenario: Scenario
    result: dict[str, Any]
    judged: list[oracle.Judged] = field(default_factory=list)
    seconds: float = 0.0
    start_seconds: float = 0.0  # servers started or restarted for it
    error: str | None = None
    crash: Crash | None = None  # vLLM failed it (``error`` says how the client saw it)

    @property
    def verdict(self) -> str:
        if self.crash:
            return oracle.CRASH
        return oracle.ERROR if self.error else oracle.trial_verdict(self.judged)

    @property
    def signatures(self) -> list[str]:
        if self.crash:
            return [self.crash.signature]
        return [] if self.error else oracle.signatures(self.judged)


def sent(r: Request, cfg: ExperimentConfig) -> list[int]:
    """The prompt as the workbench's client sends it to every server: the client-side knob
    ``double_bos`` puts a second BOS in front, on both sides alike."""
    if cfg.knobs["double_bos"] == "on":
        return apply_double_bos(list(r.tokens), load_tokenizer(str(cfg.target)).bos_token_id)
    return list(r.tokens)


def row_of(i: int, r: Request, cfg: ExperimentConfig) -> dict[str, Any]:
    ids = sent(r, cfg)
    n, ahead = len(ids), (cfg.k_p if cfg.knobs["prefill_lookahead"] == "default" else 0)
    return {"id": f"r{i}", "prompt_len": n, "prompt_len_mod_block": n % cfg.block_size,
            "affected": bad_case(n, ahead, cfg.block_size), "prime_d": r.d_first,
            "source": "fuzz", "prompt_token_ids": ids, "max_tokens": r.max_tokens,
            "delay_s": r.delay_s, "abort": r.abort}


class Sender:
    """The scenario's requests on one set of servers (one ``httpx`` client per pass)."""

    def __init__(self, session: Session, cfg: ExperimentConfig, tag: str) -> None:
        self.urls = {r: s.url for r, s in session.servers.items()}
        self.cfg, self.tag = cfg, tag
        self.flow = kv_connector.flow(cfg.knobs)

    def body(self, r: Request) -> dict[str, Any]:
        return {**request_body(self.cfg), "max_tokens": r.max_tokens, "prompt": sent(r, self.cfg)}

    async def baseline(self, req: Requests, i: int, r: Request) -> dict[str, Any]:
        resp = await req.complete("baseline", self.body(r), f"{req.tag}-base-r{i}")
        spec = spec_metrics(resp)
        return {"baseline_tokens": resp["choices"][0]["token_ids"], "baseline_spec": spec,
                "baseline": metrics.counts_from_steps(spec) if spec else None}

    async def pd(self, req: Requests, i: int, r: Request) -> dict[str, Any]:
        rid, body = f"{req.tag}-pd-r{i}", self.body(r)
        head = {"X-Request-Id": rid}
        p = await req.client.post(f"{self.urls['p']}/v1/completions",
                                  json=prefill_request(body, self.flow), headers=head)
        p.raise_for_status()
        p_resp = p.json()
        out = p_fields(p_resp)
        if r.abort == "after-p":
            return {**out, "aborted": "after-p"}
        send = req.client.post(f"{self.urls['d']}/v1/completions",
                               json=decode_request(body, p_resp, self.flow), headers=head)
        if r.abort == "during-d":
            return {**out, "aborted": await _cut(send)}
        d = await send
        d.raise_for_status()
        d_resp = d.json()
        spec = spec_metrics(d_resp)
        return {**out, "pd_tokens": d_resp["choices"][0]["token_ids"], "pd_spec": spec,
                "pd": metrics.counts_from_steps(spec) if spec else None}

    async def prime(self, req: Requests, i: int, r: Request) -> None:
        await req.complete("d", {**self.body(r), "max_tokens": 1}, f"{req.tag}-prime-r{i}")

    async def pass_(self, side: str, reqs: tuple[Request, ...], rows: list[dict]) -> None:
        """One side's requests, each at its delay, all in flight together."""
        async with httpx.AsyncClient(timeout=self.cfg.request_timeout_s,
                                     limits=client_limits(len(reqs))) as client:
            req = Requests(client, self.urls, self.cfg, f"{self.tag}{side[0]}")
            if side == "pd":
                await asyncio.gather(*(self.prime(req, i, r) for i, r in enumerate(reqs)
                                       if r.d_first))
            send = self.pd if side == "pd" else self.baseline

            async def one(i: int, r: Request) -> None:
                await asyncio.sleep(r.delay_s)
                rows[i].update(await send(req, i, r))

            await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))


async def _cut(send) -> str:
    task = asyncio.ensure_future(send)
    done, _ = await asyncio.wait({task}, timeout=ABORT_AFTER_S)
    if done:
        return "during-d (D finished first)"
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return "during-d"


async def idle(session: Session, cfg: ExperimentConfig) -> None:
    """Until no server holds a request (an aborted one of the last trial included): a prefix
    cache is only reset when no request holds its blocks (``Scheduler.reset_prefix_cache``)."""
    async with httpx.AsyncClient(timeout=cfg.request_timeout_s) as client:
        await Requests(client, {r: s.url for r, s in session.servers.items()}, cfg,
                       "idle").wait_idle()


def baseline_records(session: Session, rows: list[dict]) -> dict[str, dict]:
    """The baseline's KV probe records of the pass just run, by request (row id)."""
    replies = session.channel.kv_probe(session.servers, {"op": "records"})
    return kv_compare.by_role(replies, keyed(rows)).get("baseline", {})


def keyed(rows: list[dict]) -> kv_compare.Rows:
    return [(r["id"], prompt_key(r["prompt_token_ids"])) for r in rows]


def run(session: Session, scenario: Scenario, base: ExperimentConfig,
        attribute_on: bool = True, only: Collection[str] | None = None) -> Trial:
    """Run ``scenario``; a failure (a server gone, a request refused) becomes the trial's
    ``error`` with what was measured kept. ``only``: the findings attribution may name (all
    when None)."""
    cfg = scenario.config(base)
    t0 = time.monotonic()
    try:
        session.ensure(cfg)
        started = time.monotonic() - t0
        run_coro(idle(session, cfg))
    except Exception as e:  # noqa: BLE001 - servers that cannot start, or stay busy
        return Trial(scenario, {}, seconds=time.monotonic() - t0, error=f"servers: {e}",
                     crash=classify(e, session.servers, "start"))
    n = len(scenario.requests)
    rows = [row_of(i, r, cfg) for i, r in enumerate(scenario.requests)]
    first = [row_of(i, r, cfg) for i, r in enumerate(scenario.requests)]
    result = new_result(cfg, "python -m workbench fuzz", n, session.apply_knobs(cfg),
                        session.startup_seconds)
    result.requests = rows
    trial = Trial(scenario, {}, start_seconds=started)
    try:
        sender = Sender(session, cfg, f"fz{session.channel.version}")
        run_coro(sender.pass_("baseline", scenario.requests, first))
        kv_first = baseline_records(session, first)
        session.apply_knobs(cfg)
        sides = ("baseline", "pd") if scenario.order == "baseline-first" else ("pd", "baseline")
        for side in sides:
            run_coro(sender.pass_(side, scenario.requests, rows))
        kv_second = baseline_records(session, rows)
        probe_kv(session.channel, session.servers, result, rows,
                 [Prompt(r["id"], r["prompt_token_ids"]) for r in rows])
        aggregate(result, [r for r in rows if "aborted" not in r])
        trial.result = result.to_dict()
        trial.judged = judge_all(trial.result, first, (kv_first, kv_second),
                                 attribute_on, only)
    except Exception as e:  # noqa: BLE001 - kept as the trial's error, with its rows
        result.complete, result.error = False, f"{type(e).__name__}: {e}"
        trial.result, trial.error = result.to_dict(), result.error
        trial.crash = classify(e, session.servers)
    trial.seconds = time.monotonic() - t0
    return trial


def judge_all(result: dict, first: list[dict], kv: tuple[dict, dict], attribute_on: bool,
              only: Collection[str] | None = None) -> list[oracle.Judged]:
    """Every request that ran to the end; an aborted one is listed with its abort only.
    ``first``: the rows of the first baseline pass; ``kv``: both baseline passes' probe
    records by row id."""
    out = []
    errors = ((result.get("kv_probe_summary") or {}).get("cost") or {}).get("errors") or []
    for row, a in zip(result["requests"], first, strict=True):
        if "aborted" in row:
            out.append(oracle.Judged(row["id"], oracle.SAME, aborted=row["aborted"]))
            continue
        noisy = oracle.noise(a, row, kv[0].get(row["id"]), kv[1].get(row["id"]))
        explains = attribute.present_in(result, row, only) if attribute_on else {}
        out.append(oracle.judge(row, noisy, explains, errors))
    return out
