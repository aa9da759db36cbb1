"""One old release, natively (no workbench knobs), through the CPU PD + EAGLE3 pipeline.

Why: before ``python -m workbench releases`` can run an old release the way it runs 0.32.0,
somebody has to find out whether that release runs the pipeline at all, with which flags, and
what its bugs look like natively. This is that trial, kept so it can be rerun:

* the servers are the CPU profile's (``plan.server_specs`` of ``ExperimentConfig.for_profile
  ("cpu")``: same flags, variables, cores, shipped model pair), started under the workbench's
  reaper (``servers.VllmServer``) but with the old environment's Python, no knob control file,
  the workbench plugin in its observe-only mode (``knobs/observe.py``: the release's
  compatibility fixes and nothing else; every process's report goes into the record), and
  without the flags the release lacks (``--per-request-spec-decode-metrics`` before it
  existed);
* the baseline runs alone first (the CPU profile gives it D's core), then P and D: one set of
  servers at a time on this 2-core machine;
* requests go one at a time with a ``/metrics`` scrape before and after each (the release has
  no per-request spec-decode field), P then D as ``proxy.pd_complete`` does;
* recorded per request: prompt length, P's ``remote_block_ids`` against the blocks the prompt
  needs (``ceil(N / block_size)``) and P's allocation (``ceil((N + k_p) / block_size)``), D's
  and the baseline's counter deltas, and token agreement.

``python -m workbench.releases.trial --python .venvs/vllm-0.24.0/bin/python --out
data/releases/0.24.0`` (run from the workbench's own venv).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from ..config import ExperimentConfig
from ..inputs import prompts
from ..knobs import observe
from ..measuring import metrics
from ..measuring.measure import request_body
from ..measuring.results import first_diff
from ..provenance import atomic_write_json, portable_text
from ..serving import proxy
from ..serving.plan import server_specs
from ..serving.servers import ServerSpec, VllmServer
from .native import NativeRelease, version_of

# Lines of a server log worth keeping in the record (the rest is start-up noise).
LOG_KEEP = ("Error", "error", "Traceback", "WARNING", "workbench release fixes", "nixl",
            "NIXL", "Nixl", "use_host_buffer", "speculative", "Speculative", "eagle", "EAGLE",
            "Application startup complete", "KV cache", "kv_cache", "model runner",
            "Model Runner", "SpecDecoding metrics", "Exception", "raise ", "assert")


def specs_for(python: str, log_dir: Path, per_request_metrics: bool,
              fixes_log: Path) -> tuple[dict[str, ServerSpec], ExperimentConfig, NativeRelease]:
    """The CPU profile's servers on ``python``, each with the plugin observe-only: its
    processes' reports go to ``log_dir/observe-<role>/``."""
    cfg = ExperimentConfig.for_profile("cpu")
    rel = NativeRelease(version_of(Path(python)), Path(python), per_request_metrics, log_dir,
                        fixes_log)
    return {s.role: rel.adapt(s) for s in server_specs(cfg, log_dir)}, cfg, rel


def scrape(client: httpx.Client, url: str) -> metrics.SpecCounters:
    return metrics.parse(client.get(f"{url}/metrics", timeout=30).text)


def tokens(resp: dict[str, Any]) -> list[int] | None:
    ch = resp["choices"][0]
    return ch.get("token_ids")


def run_baseline(client: httpx.Client, srv: VllmServer, body: dict, ps: list) -> list[dict]:
    rows = []
    for p in ps:
        before = scrape(client, srv.url)
        t0 = time.monotonic()
        r = client.post(f"{srv.url}/v1/completions", json={**body, "prompt": p.token_ids},
                        timeout=300)
        r.raise_for_status()
        dt = time.monotonic() - t0
        after = scrape(client, srv.url)
        resp = r.json()
        rows.append({"id": p.id, "n": len(p.token_ids), "seconds": dt,
                     "text": resp["choices"][0]["text"], "token_ids": tokens(resp),
                     "delta": (after - before).summary(), "response": resp})
    return rows


async def _pd_one(p_url: str, d_url: str, body: dict) -> tuple[dict, dict, dict]:
    timings: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=300) as ac:
        p_resp, d_resp = await proxy.pd_complete(ac, p_url, d_url, body, timings=timings)
    return p_resp, d_resp, timings


def run_pd(client: httpx.Client, p: VllmServer, d: VllmServer, body: dict, ps: list,
           block_size: int, k_p: int, prime_p: bool = False) -> list[dict]:
    """P then D per prompt. ``prime_p``: first send the plain prompt to P alone (one token),
    so the PD request finds it in P's prefix cache: to test whether a prefix hit makes
    releases up to 0.22.1 give P's request its lookahead slots (on 0.22.1 it does not: the
    scheduler tests ``request.num_computed_tokens``, still 0 at the first step)."""
    rows = []
    for pr in ps:
        if prime_p:
            client.post(f"{p.url}/v1/completions", timeout=300,
                        json={**body, "max_tokens": 1, "prompt": pr.token_ids}).raise_for_status()
        before = scrape(client, d.url)
        p_before = scrape(client, p.url)
        p_resp, d_resp, timings = asyncio.run(
            _pd_one(p.url, d.url, {**body, "prompt": pr.token_ids}))
        after = scrape(client, d.url)
        p_after = scrape(client, p.url)
        n = len(pr.token_ids)
        params = p_resp.get("kv_transfer_params") or {}
        ids = params.get("remote_block_ids")
        # remote_block_ids: a list of ints (one KV cache group) or a list of lists per group.
        groups = ids if ids and isinstance(ids[0], list) else [ids or []]
        rows.append({
            "id": pr.id, "n": n, "n_mod_block": n % block_size,
            "blocks_needed": math.ceil(n / block_size),
            "blocks_allocated_on_p": math.ceil((n + k_p) / block_size),
            "bad_case": prompts.bad_case(n, k_p, block_size),
            "remote_block_ids": ids, "blocks_handed": [len(g) for g in groups],
            "kv_transfer_params": params, "seconds": timings,
            "text": d_resp["choices"][0]["text"], "token_ids": tokens(d_resp),
            "delta": (after - before).summary(), "p_delta": (p_after - p_before).summary(),
            "p_response": p_resp, "d_response": d_resp,
        })
    return rows


def trim_log(path: Path, out: Path) -> None:
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    kept = [ln for ln in lines if ln.startswith("# ") or any(k in ln for k in LOG_KEEP)]
    out.write_text(portable_text("\n".join(kept) + "\n"))


def start(spec: ServerSpec, timeout: float = 600) -> VllmServer:
    """Start one server (its observe-only reports of an earlier start cleared first)."""
    shutil.rmtree(spec.extra_env[observe.ENV], ignore_errors=True)
    srv = VllmServer(spec).start()
    srv.wait_ready(timeout)
    return srv


def agreement(base: list[dict], pd: list[dict]) -> list[dict]:
    out = []
    for b, d in zip(base, pd, strict=True):
        bt, dt = b["token_ids"] or [], d["token_ids"] or []
        first = first_diff(bt, dt)
        same = (bt == dt) if b["token_ids"] is not None else (b["text"] == d["text"])
        out.append({"id": b["id"], "n": b["n"], "bad_case": d["bad_case"], "match": same,
                    "first_diff": first})
    return out


def total(rows: list[dict], key: str = "delta") -> dict:
    return metrics.total([r[key] for r in rows]).summary()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m workbench.releases.trial")
    ap.add_argument("--python", required=True, help="the old release's environment's python")
    ap.add_argument("--out", required=True, help="data/releases/<version>")
    ap.add_argument("--prompt-set", default="indomain")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--per-request-metrics", action="store_true",
                    help="pass --per-request-spec-decode-metrics (releases that have it)")
    ap.add_argument("--only", choices=("baseline", "pd", "both"), default="both")
    ap.add_argument("--prime-p", action="store_true",
                    help="send each prompt to P alone first (a prefix-cache hit on P)")
    return ap


def baseline_leg(client: httpx.Client, spec: ServerSpec, body: dict, ps: list,
                 record: dict[str, Any]) -> list[dict]:
    """The baseline alone: start it, run every prompt, stop it."""
    srv = start(spec)
    try:
        record["baseline_ready_s"] = srv.ready_seconds
        t0 = time.monotonic()
        rows = run_baseline(client, srv, body, ps)
        record["baseline_wall_s"] = time.monotonic() - t0
    finally:
        srv.stop()
    return rows


def pd_leg(client: httpx.Client, specs: dict[str, ServerSpec], body: dict, ps: list, cfg,
           prime_p: bool, record: dict[str, Any]) -> list[dict]:
    """P and D: start both, run every prompt P then D, stop both."""
    p = start(specs["p"])
    try:
        d = start(specs["d"])
        try:
            record["p_ready_s"], record["d_ready_s"] = p.ready_seconds, d.ready_seconds
            t0 = time.monotonic()
            rows = run_pd(client, p, d, body, ps, cfg.block_size, cfg.k_p, prime_p)
            record["pd_wall_s"] = time.monotonic() - t0
        finally:
            d.stop()
    finally:
        p.stop()
    return rows


def summarise(record: dict[str, Any], base: list[dict], pd: list[dict]) -> None:
    """Token agreement, the summed counters and the hand-off per request, into the record."""
    agree = agreement(base, pd)
    record.update(
        agreement=agree,
        token_agreement=sum(a["match"] for a in agree) / len(agree),
        token_agreement_bad_case=[a["match"] for a in agree if a["bad_case"]],
        d=total(pd), baseline=total(base), p=total(pd, "p_delta"),
        handoff=[{k: r[k] for k in ("id", "n", "blocks_needed", "blocks_allocated_on_p",
                                     "blocks_handed", "bad_case")} for r in pd],
    )


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    suffix = "-primed-p" if args.prime_p else ""
    logs = out / f"logs-full{suffix}"  # untrimmed: kept out of git (trimmed copies committed)
    base_tag = f"{args.prompt_set}{args.prompts}"
    tag = base_tag + suffix
    fixes_log = out / f"fixes-{tag}.log"  # each process appends: a fresh trial starts it anew
    if args.only == "both":
        fixes_log.unlink(missing_ok=True)
    specs, cfg, rel = specs_for(args.python, logs, args.per_request_metrics, fixes_log)
    ps = prompts.build(args.prompt_set, args.prompts, str(cfg.target),
                       block_size=cfg.block_size)
    body = {**request_body(cfg), "max_tokens": 64}
    record: dict[str, Any] = {
        "vllm_version": rel.version, "python": args.python,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "prompt_set": args.prompt_set, "num_prompts": args.prompts, "request": body,
        "prime_p": args.prime_p, "knobs": "none (the workbench plugin observe-only)",
        "commands": {r: {"argv": s.command(), "env": s.env()} for r, s in specs.items()},
    }
    client = httpx.Client()
    if args.only in ("baseline", "both"):
        base = baseline_leg(client, specs["baseline"], body, ps, record)
        atomic_write_json(out / f"baseline-{base_tag}.json", base, portable=True)
    else:
        base = json.loads((out / f"baseline-{base_tag}.json").read_text())
    pd: list[dict] = []
    if args.only in ("pd", "both"):
        pd = pd_leg(client, specs, body, ps, cfg, args.prime_p, record)
        atomic_write_json(out / f"pd-{tag}.json", pd, portable=True)
    for role in specs:
        if (logs / f"{role}.log").is_file():  # roles this invocation started
            trim_log(logs / f"{role}.log", out / f"{role}-{tag}.log")
    record["plugin"] = rel.plugin_reports()
    if base and pd:
        summarise(record, base, pd)
    atomic_write_json(out / f"trial-{tag}.json", record, portable=True)
    print(json.dumps({k: record.get(k) for k in ("vllm_version", "token_agreement", "d",
                                                 "baseline")}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
