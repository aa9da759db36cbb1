"""A standalone reproduction written by ``python -m workbench check --report``: vLLM untouched.

Starts P (kv_producer), D (kv_consumer) and a standalone baseline with the command lines
below, sends every prompt to P with max_tokens=1 and do_remote_decode, then to D with P's
kv_transfer_params (what vLLM's toy_proxy_server.py does), and the same prompt to the
baseline; prints per request the drafts and accepted tokens each side reports in
``metrics.speculative_decoding`` (--per-request-spec-decode-metrics detailed), then stops the
servers. Needs only vLLM (with NIXL) and httpx.
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

SERVERS = []
PROMPTS = []
MAX_TOKENS = 0
NO_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
         "remote_block_ids": None, "remote_host": None, "remote_port": None}


def start(server):
    env = {**os.environ, **server["env"]}
    log = Path(f"repro-{server['role']}.log").open("w")  # noqa: SIM115 - open while it runs
    argv = [sys.executable, *server["argv"][1:]]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait(url, proc, timeout=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited (see repro-*.log)")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{url}: not up after {timeout} s")


def complete(url, prompt, request_id, **extra):
    """A greedy completion of token ids (the prompt is not tokenized again: no second BOS)."""
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0, "top_p": 1.0,
            "return_token_ids": True, "ignore_eos": False, "stream": False, **extra}
    r = httpx.post(f"{url}/v1/completions", json={"model": MODEL, **body}, timeout=600,
                   headers={"X-Request-Id": request_id})
    r.raise_for_status()
    return r.json()


def spec(resp):
    sd = (resp.get("metrics") or {}).get("speculative_decoding") or {}
    return {"drafts": sd.get("num_spec_steps"), "accepted": sd.get("num_accepted_draft_tokens"),
            "per_step_accepted": (sd.get("per_step_accepted") or [])[:4]}


def main():
    url = {s["role"]: f"http://127.0.0.1:{s['port']}" for s in SERVERS}
    procs = {s["role"]: start(s) for s in SERVERS}
    try:
        for role, p in procs.items():
            wait(url[role], p)
        rows = []
        for prompt in PROMPTS:
            rid = str(uuid.uuid4())
            p_resp = complete(url["p"], prompt, rid, max_tokens=1, kv_transfer_params=NO_KV)
            d = complete(url["d"], prompt, rid, kv_transfer_params=p_resp["kv_transfer_params"])
            b = complete(url["baseline"], prompt, f"base-{rid}")
            rows.append({"d": spec(d), "baseline": spec(b),
                         "same_tokens": d["choices"][0]["text"] == b["choices"][0]["text"]})
        extra = [r["d"]["drafts"] - r["baseline"]["drafts"] for r in rows]
        print(json.dumps({"requests": rows, "d_drafts_minus_baseline": extra}, indent=1))
        print(f"D counted {sum(extra)} more drafts than the baseline over {len(rows)} requests")
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


MODEL = SERVERS[0]["argv"][SERVERS[0]["argv"].index("--model") + 1] if SERVERS else ""

if __name__ == "__main__":
    main()
