"""A standalone reproduction written by ``python -m workbench check --report``.

Starts P (kv_producer), D (kv_consumer) and a standalone baseline with the command lines
below, on free ports and side-channel ports picked at start, sends every prompt to P with
max_tokens=1 and do_remote_decode (D first computes the prompts the run primed it with, as
the run did), then to D with P's kv_transfer_params (what vLLM's
toy_proxy_server.py does; with FLOW "same-prompt", a connector that shares storage, P and D
get the plain prompt, as vLLM's disaggregated-prefill-v1 example sends it), and the same
prompt to the baseline; where the finding has a loud half (LOUD), one more prompt that takes
D down, last; prints per request the tokens
and the drafts and accepted tokens each side reports in ``metrics.speculative_decoding``
(--per-request-spec-decode-metrics detailed), then the finding's symptom in one line, and
stops the servers (also when this script is killed: each server gets SIGTERM when the script
is gone, on Linux). Needs vLLM (with NIXL) and httpx; where PLUGIN_ENV is not empty, also the
workbench installed in the same environment (its vLLM plugin does what vLLM alone cannot on
this platform; the script never imports it).

    python REPRO.py [--target DIR] [--drafter DIR]

The models default to the workbench repository's data/models/ (found from this script's
location, or ``$WORKBENCH_MODELS``).
"""

import argparse
import ctypes
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from importlib import metadata
from pathlib import Path

import httpx

FINDING = ""
SYMPTOM = ""
SERVERS = []
PROMPTS = []
PRIME_D = []  # PROMPTS' indexes D computes itself first (the run's primed prompts)
LOUD = 0  # a prompt length that takes D's engine down, sent last (the loud half); 0: none
MAX_TOKENS = 0
PLUGIN_ENV = {}
PLUGIN_KNOBS = {}
FLOW = "params"
NO_KV = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
         "remote_block_ids": None, "remote_host": None, "remote_port": None}


def default_models():
    """``$WORKBENCH_MODELS``, else the first ``data/models`` above this script."""
    if os.environ.get("WORKBENCH_MODELS"):
        return Path(os.environ["WORKBENCH_MODELS"])
    for up in Path(__file__).resolve().parents:
        if (up / "data" / "models" / "target" / "config.json").is_file():
            return up / "data" / "models"
    return None


def free_port():
    """A random port outside the kernel's ephemeral range that binds now. A server binds it
    tens of seconds later, and a port from bind(0) lies in the range where, meanwhile, the
    kernel may give it to any outgoing connection or another process's bind(0)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    candidates = [p for p in range(20000, 65536) if not low <= p <= high]
    for port in random.SystemRandom().sample(candidates, 200):
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    sys.exit("no free port between 20000 and 65535 outside the ephemeral range")


def cpu_plan():
    """P on the first half of this process's cores, D and the baseline on the rest."""
    cores = sorted(os.sched_getaffinity(0))
    half = max(1, len(cores) // 2)
    first, rest = cores[:half], cores[half:] or cores[:half]
    return {"p": ",".join(map(str, first)), "d": ",".join(map(str, rest)),
            "baseline": ",".join(map(str, rest))}


def fill(value, values):
    for k, v in values.items():
        value = value.replace("{" + k + "}", str(v))
    return value


def plugin_files(tmp):
    """The control file the workbench's plugin reads (knobs as below) and its state dir."""
    if not PLUGIN_ENV:
        return {}
    if not any(e.name == "workbench_knobs" for e in metadata.entry_points(
            group="vllm.general_plugins")):
        sys.exit(f"{FINDING} needs the workbench's vLLM plugin on this platform "
                 f"({', '.join(f'{k}={v}' for k, v in PLUGIN_KNOBS.items())}): install the "
                 "workbench (pip install -e .) in this environment")
    control = Path(tmp) / "knobs.json"
    control.write_text(json.dumps({"version": 1, "knobs": PLUGIN_KNOBS, "seed": 0}))
    (Path(tmp) / "state").mkdir()
    return {"WORKBENCH_KNOBS_FILE": str(control), "WORKBENCH_KNOBS_STATE_DIR":
            str(Path(tmp) / "state")}


def triton_cpu():
    """Model Runner V2 on the CPU: where the workbench's Triton backend declares its entry point
    (docs/runners.md), for the servers' PYTHONPATH; None where no server needs it."""
    if not any("{triton_cpu}" in v for s in SERVERS for v in s["env"].values()):
        return None
    try:
        from workbench.knobs.triton_cpu import ENTRY_POINT_DIR
    except ImportError:
        sys.exit(f"{FINDING} runs Model Runner V2 on the CPU, whose Triton kernels need the "
                 "workbench's Triton backend: install the workbench (pip install -e .) here")
    return os.pathsep.join(p for p in (str(ENTRY_POINT_DIR), os.environ.get("PYTHONPATH"))
                           if p)


def start(server, values, extra_env):
    env = {**os.environ, **{k: fill(v, values) for k, v in server["env"].items()}}
    if PLUGIN_ENV and server["role"] != "baseline":
        env.update({**PLUGIN_ENV, **extra_env, "WORKBENCH_ROLE": server["role"]})
    log = Path(f"repro-{server['role']}.log").open("w")  # noqa: SIM115 - open while it runs
    argv = [sys.executable, *(fill(a, values) for a in server["argv"][1:])]
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, preexec_fn=die_with(os.getpid()))


def die_with(parent):
    """A child's first step: SIGTERM (vLLM's own clean shutdown) when ``parent`` is gone, so
    a killed script leaves no server behind (Linux ``PR_SET_PDEATHSIG``; elsewhere nothing)."""
    def first_step():
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
    return first_step


def exit_on_sigterm(signum, _frame):
    """A SIGTERM runs the clean-up below (stop the servers) as Ctrl-C does."""
    sys.exit(128 + signum)


def wait(role, url, proc, timeout=600):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited (see repro-{role}.log)")
        if any("address already in use" in line and "retrying" not in line for line in
               Path(f"repro-{role}.log").read_text(errors="replace").lower().splitlines()):
            # vLLM's NIXL handshake listener dies of it in its thread; the server never answers
            raise RuntimeError(f"{url}: a port picked for {role} was taken before the server "
                               f"bound it (repro-{role}.log): run the script again")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"{url}: not up after {timeout} s")


def complete(url, model, prompt, request_id, **extra):
    """A greedy completion of token ids (the prompt is not tokenized again: no second BOS)."""
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "top_p": 1.0, "return_token_ids": True, "ignore_eos": False, "stream": False,
            **extra}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600,
                   headers={"X-Request-Id": request_id})
    r.raise_for_status()
    return r.json()


def spec(resp):
    sd = (resp.get("metrics") or {}).get("speculative_decoding") or {}
    return {"drafts": sd.get("num_spec_steps"), "accepted": sd.get("num_accepted_draft_tokens"),
            "per_step_accepted": (sd.get("per_step_accepted") or [])[:4]}


def tokens(resp):
    return resp["choices"][0].get("token_ids") or resp["choices"][0]["text"]


def loud(url, model):
    """The finding's loud half, sent after every other request (it takes D down): one prompt
    of LOUD tokens, the run's prompts laid end to end, reversed. Reversed, it starts as no
    earlier prompt does: P's prefix cache holds the first prompt's blocks, and a hit moves P's
    first chunk (laid end to end, a 192-token prompt left D answering; 200 tokens took it
    down)."""
    tokens = itertools.chain.from_iterable(itertools.cycle(PROMPTS))
    prompt = list(itertools.islice(tokens, LOUD))[::-1]
    rid = str(uuid.uuid4())
    params = FLOW == "params"
    try:
        p_resp = complete(url["p"], model, prompt, rid, max_tokens=1,
                          **({"kv_transfer_params": NO_KV} if params else {}))
        complete(url["d"], model, prompt, rid,
                 **({"kv_transfer_params": p_resp["kv_transfer_params"]} if params else {}))
    except httpx.HTTPError as e:
        return f"loud half: D failed on a {LOUD}-token prompt ({type(e).__name__}: {e})"
    return f"loud half: D answered a {LOUD}-token prompt; it did not show here"


def summary(rows):
    """The finding's symptom in one line."""
    n = len(rows)
    differ = sum(not r["same_tokens"] for r in rows)
    extra = [r["d"]["drafts"] - r["baseline"]["drafts"] for r in rows]
    if SYMPTOM == "drafts":
        return f"D counted {sum(extra)} more drafts than the baseline over {n} requests"
    if SYMPTOM == "tokens":
        return f"D's tokens differ from the baseline's in {differ} of {n} requests"
    accepted = [r["d"]["accepted"] - r["baseline"]["accepted"] for r in rows]
    return (f"{FINDING}: its symptom is read inside vLLM's processes by the workbench's plugin "
            f"(the KV probe or thread affinities), not visible here; the acceptance side: D's "
            f"tokens differ in {differ} of {n} requests, D accepted {sum(accepted)} tokens "
            f"more than the baseline over {sum(extra)} more drafts")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    models = default_models()
    ap.add_argument("--target", default=models and str(models / "target"))
    ap.add_argument("--drafter", default=models and str(models / "drafter"))
    args = ap.parse_args()
    if not (args.target and args.drafter):
        ap.error("no data/models found above this script: pass --target and --drafter "
                 "(or set WORKBENCH_MODELS)")
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    cpus = cpu_plan()
    with tempfile.TemporaryDirectory(prefix="repro-") as tmp:
        values = {s["role"]: {"target": args.target, "drafter": args.drafter,
                              "port": free_port(), "side_channel_port": free_port(),
                              "cpus": cpus[s["role"]], "storage": f"{tmp}/kv-storage",
                              "triton_cpu": triton_cpu()}
                  for s in SERVERS}
        url = {role: f"http://127.0.0.1:{v['port']}" for role, v in values.items()}
        extra_env = plugin_files(tmp)
        procs = {s["role"]: start(s, values[s["role"]], extra_env) for s in SERVERS}
        try:
            for role, p in procs.items():
                wait(role, url[role], p)
            for i in PRIME_D:  # as the run did: D caches these blocks before any PD request
                complete(url["d"], args.target, PROMPTS[i], f"prime-{i}", max_tokens=1)
            rows = []
            for prompt in PROMPTS:
                rid = str(uuid.uuid4())
                params = FLOW == "params"
                p_resp = complete(url["p"], args.target, prompt, rid, max_tokens=1,
                                  **({"kv_transfer_params": NO_KV} if params else {}))
                d = complete(url["d"], args.target, prompt, rid,
                             **({"kv_transfer_params": p_resp["kv_transfer_params"]}
                                if params else {}))
                b = complete(url["baseline"], args.target, prompt, f"base-{rid}")
                rows.append({"d": spec(d), "baseline": spec(b),
                             "same_tokens": tokens(d) == tokens(b)})
            extra = [r["d"]["drafts"] - r["baseline"]["drafts"] for r in rows]
            print(json.dumps({"requests": rows, "d_drafts_minus_baseline": extra}, indent=1))
            print(summary(rows))
            if LOUD:
                print(loud(url, args.target))
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGTERM)
            for p in procs.values():
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
