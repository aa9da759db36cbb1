"""Measure the shipped target + EAGLE3 drafter in real vLLM (offline ``LLM`` API, CPU).

    python -m workbench.training.evaluate --models data/models --prompts 64 [--kv-corruption]

Greedy, ``--max-tokens`` (128) new tokens per held-out prompt, EAGLE3 with k=3.
Per-position acceptance i = accepted_per_pos[i] / num_drafts from vLLM's own
spec-decode counters (``llm.get_metrics()``), acceptance length = 1 + accepted /
drafts; degeneracy = distinct-token fraction of each request's generated tokens
and the largest single-token share.  With ``--kv-corruption`` the same engine
runs the prompts again with a hook on the drafter layer's attention that zeroes
the K/V it writes for every position of the prompt (prompts of equal length run
together, with that length as the threshold), and reports the relative drop of
position-0 acceptance.  Results go to ``eval_results.json`` and
the model card (unless ``--no-card``).

Run vLLM engines one at a time on a small CPU (``flock /tmp/wb/vllm.lock ...``).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from .. import ipc_dir

BAR = {
    "acc_len": (1.8, 3.2),
    "pos0_min": 0.45,
    "pos2_over_pos0_max": 0.8,
    "distinct_median_min": 0.25,
    "max_token_share_max": 0.40,
    "kv_pos0_rel_drop_min": 0.20,
}

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts" / "indomain.jsonl"
BLOCK_SIZE = 32  # CPU attention needs a multiple of 32
DTYPE = "float32"
# vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py) -> our names
COUNTERS = {
    "vllm:spec_decode_num_drafts": "num_drafts",
    "vllm:spec_decode_num_draft_tokens": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "num_accepted",
}
PER_POS_COUNTER = "vllm:spec_decode_num_accepted_tokens_per_pos"


# --------------------------------------------------------------------------- hook

def _corrupting_forward(self, positions, hidden_states):
    """LlamaAttention.forward (vllm/model_executor/models/llama.py) plus K/V zeroing."""
    qkv, _ = self.qkv_proj(hidden_states)
    q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
    q, k = self.rotary_emb(positions, q, k)
    thr = getattr(self, "_wb_zero_kv_below", 0)
    if thr > 0:
        k, v = _corrupt_kv(positions < thr, k, v, getattr(self, "_wb_mode", "zero"))
    attn_output = self.attn(q, k, v)
    output, _ = self.o_proj(attn_output)
    return output


def _corrupt_kv(below, k, v, mode: str):
    """K/V of the positions flagged in ``below`` zeroed, or (``noise``) overwritten."""
    import torch

    m = below.unsqueeze(-1)
    if mode == "noise":
        # stale/garbage blocks: large deterministic noise instead of zeros
        g = torch.Generator(device="cpu").manual_seed(1234)
        nk = (torch.randn(k.shape, generator=g) * 10).to(k.device, k.dtype)
        nv = (torch.randn(v.shape, generator=g) * 10).to(v.device, v.dtype)
        return torch.where(m, nk, k), torch.where(m, nv, v)
    return torch.where(m, torch.zeros_like(k), k), torch.where(m, torch.zeros_like(v), v)


def set_drafter_kv_corruption(worker, threshold: int, mode: str = "zero") -> int:
    """Runs inside the vLLM worker (via ``LLM.collective_rpc``): install the hook on
    every drafter decoder layer and set its threshold (0 = off).  Returns #layers."""
    import types

    drafter = worker.model_runner.drafter
    model = drafter.model
    layers = model.model.layers
    for layer in layers:
        attn = layer.self_attn
        if not getattr(attn, "_wb_hooked", False):
            attn.forward = types.MethodType(_corrupting_forward, attn)
            attn._wb_hooked = True
        attn._wb_zero_kv_below = int(threshold)
        attn._wb_mode = mode
    return len(layers)


# --------------------------------------------------------------------------- engine

def make_llm(models_dir: str | None, k: int = 3, kv_bytes: int = 512 * 2**20,
             max_model_len: int = 512, block_size: int = BLOCK_SIZE, dtype: str = DTYPE,
             target_dir: str | None = None, drafter_dir: str | None = None):
    # one rank; bind its OpenMP threads to every CPU this process may use (unless told otherwise)
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpus)
    # collective_rpc ships set_drafter_kv_corruption (a function) to the worker; vLLM's msgpack
    # encoder refuses callables unless pickle fallback is allowed (local offline engine only)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vllm import LLM

    target_dir = target_dir or str(Path(models_dir, "target"))
    drafter_dir = drafter_dir or str(Path(models_dir, "drafter"))
    with _engine_dies_with_this_process(), _ipc_sockets_removed_at_exit():
        return LLM(
            model=target_dir,
            tokenizer=target_dir,
            speculative_config={"method": "eagle3", "model": drafter_dir,
                                "num_speculative_tokens": k},
            dtype=dtype,
            block_size=block_size,
            kv_cache_memory_bytes=kv_bytes,
            max_model_len=max_model_len,
            max_num_seqs=64,
            enforce_eager=True,  # no compiled graphs: the KV hook must see every drafter call
            enable_prefix_caching=False,  # reruns must prefill again, drafter included
            disable_log_stats=False,
            seed=0,
        )


@contextlib.contextmanager
def _engine_dies_with_this_process():
    """vLLM's engine core, started in here, stops when this process dies however it dies
    (``knobs/parent_death.py``); processes started later from this one are left as they are.
    Only from the main thread: the kernel's signal follows the thread that started the child."""
    from ..knobs.spec import ENV_DIE_WITH_PID

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _env(ENV_DIE_WITH_PID, str(os.getpid())):
        yield


@contextlib.contextmanager
def _ipc_sockets_removed_at_exit():
    """The IPC socket files of the engine built in here go to a directory of their own, removed
    when this process exits (``workbench/ipc_dir.py``): vLLM leaves them behind. A SIGKILLed
    process leaves them, as a server's would without its reaper."""
    path = ipc_dir.make(os.environ.get(ipc_dir.ENV))
    atexit.register(ipc_dir.remove, path)
    with _env(ipc_dir.ENV, path):
        yield


@contextlib.contextmanager
def _env(name: str, value: str):
    """``name`` set to ``value`` in here, and as it was after."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def spec_counters(llm) -> dict:
    out = {name: 0 for name in COUNTERS.values()}
    out["per_pos"] = []
    for m in llm.get_metrics():
        if m.name in COUNTERS:
            out[COUNTERS[m.name]] += m.value
        elif m.name == PER_POS_COUNTER:
            vals = list(m.values)
            if not out["per_pos"]:
                out["per_pos"] = [0] * len(vals)
            out["per_pos"] = [a + b for a, b in zip(out["per_pos"], vals, strict=False)]
    return out


def _diff(a: dict, b: dict) -> dict:
    d = {name: b[name] - a[name] for name in COUNTERS.values()}
    before = a["per_pos"] or [0] * len(b["per_pos"])
    d["per_pos_counts"] = [y - x for x, y in zip(before, b["per_pos"], strict=False)]
    return d


def _with_rates(d: dict) -> dict:
    """Add vLLM's per-position rates and acceptance length to summed counters."""
    n = max(1, d["num_drafts"])
    d["per_pos"] = [c / n for c in d["per_pos_counts"]]
    d["acceptance_length"] = 1 + d["num_accepted"] / n
    return d


def degeneracy(token_lists):
    distinct, share = [], []
    for t in token_lists:
        if not t:
            distinct.append(0.0)
            share.append(1.0)
            continue
        distinct.append(len(set(t)) / len(t))
        share.append(collections.Counter(t).most_common(1)[0][1] / len(t))
    return distinct, share


def run_batch(llm, prompts, max_tokens: int):
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
    before = spec_counters(llm)
    t0 = time.time()
    outs = llm.generate([p["text"] for p in prompts], sp, use_tqdm=False)
    wall = time.time() - t0
    d = _with_rates(_diff(before, spec_counters(llm)))
    toks = [list(o.outputs[0].token_ids) for o in outs]
    texts = [o.outputs[0].text for o in outs]
    distinct, share = degeneracy(toks)
    d.update(
        wall_s=wall,
        distinct_median=statistics.median(distinct),
        distinct_min=min(distinct),
        distinct=distinct,
        max_token_share=max(share),
        prompt_lens=[len(o.prompt_token_ids) for o in outs],
    )
    return d, toks, texts


def run_corrupted(llm, prompts, prompt_lens, max_tokens: int, mode: str):
    """Rerun the prompts with the drafter's K/V corrupted for each one's whole prompt.

    The hook only sees positions, so prompts run in groups of equal length, each with
    its own threshold; counters are summed over the groups."""
    groups = collections.defaultdict(list)
    for i, n in enumerate(prompt_lens):
        groups[n].append(i)
    tot = {**{name: 0 for name in COUNTERS.values()}, "per_pos_counts": None}
    toks = [None] * len(prompts)
    for n, idx in sorted(groups.items()):
        llm.collective_rpc(set_drafter_kv_corruption, args=(n, mode))
        try:
            d, t, _ = run_batch(llm, [prompts[i] for i in idx], max_tokens)
        finally:
            llm.collective_rpc(set_drafter_kv_corruption, args=(0,))
        _add_counts(tot, d)
        for i, tt in zip(idx, t, strict=True):
            toks[i] = tt
    _with_rates(tot)
    tot.update(mode=mode, n_groups=len(groups),
               scope="each prompt's whole drafter KV (positions < its length)")
    return tot, toks


def _add_counts(tot: dict, d: dict) -> None:
    for name in COUNTERS.values():
        tot[name] += d[name]
    pc, so_far = d["per_pos_counts"], tot["per_pos_counts"]
    tot["per_pos_counts"] = pc if so_far is None else [
        a + b for a, b in zip(so_far, pc, strict=False)]


def _row(name: str, value: str, bar: str, ok) -> dict:
    return {"name": name, "value": value, "bar": bar, "ok": bool(ok)}


def checks(clean, corrupt=None, corrupt_noise=None):
    pp = clean["per_pos"]
    lo, hi = BAR["acc_len"]
    acc_len, distinct, share = (clean["acceptance_length"], clean["distinct_median"],
                                clean["max_token_share"])
    rows = [
        _row("acceptance length", f"{acc_len:.3f}", f"{lo} .. {hi}", lo <= acc_len <= hi),
        _row("per-position acceptance", " / ".join(f"{v:.3f}" for v in pp),
             "strictly decreasing", all(pp[i] > pp[i + 1] for i in range(len(pp) - 1))),
        _row("position 0", f"{pp[0]:.3f}", f">= {BAR['pos0_min']}", pp[0] >= BAR["pos0_min"]),
    ]
    if len(pp) >= 3:
        rows.append(_row("position 2 / position 0", f"{pp[2] / max(pp[0], 1e-9):.3f}",
                         f"<= {BAR['pos2_over_pos0_max']}",
                         pp[2] <= BAR["pos2_over_pos0_max"] * pp[0]))
    rows += [
        _row("median distinct-token fraction", f"{distinct:.3f}",
             f">= {BAR['distinct_median_min']}", distinct >= BAR["distinct_median_min"]),
        _row("largest single-token share (any request)", f"{share:.3f}",
             f"<= {BAR['max_token_share_max']}", share <= BAR["max_token_share_max"]),
    ]
    drop_min = BAR["kv_pos0_rel_drop_min"]
    for what, bad in (("zeroed", corrupt), ("noise (x10)", corrupt_noise)):
        if bad is not None:
            rows.append(_row(f"pos-0 relative drop, drafter prompt KV {what}",
                             f"{bad['pos0_rel_drop']:.3f}", f">= {drop_min}",
                             bad["pos0_rel_drop"] >= drop_min))
    return rows


def load_prompts(path, n):
    with Path(path).open() as f:
        ps = [json.loads(line) for line in f if line.strip()]
    return ps[:n]


def evaluate(models_dir, prompts_file=None, n_prompts=64, max_tokens=128, k=3, kv_corruption=False,
             llm=None, write=True, command=None):
    import vllm

    prompts_file = prompts_file or DEFAULT_PROMPTS
    prompts = load_prompts(prompts_file, n_prompts)
    own = llm is None
    t0 = time.time()
    if own:
        llm = make_llm(models_dir, k=k)
    start_s = time.time() - t0
    try:
        clean, toks, texts = run_batch(llm, prompts, max_tokens)
        result = {
            "command": command or _command(models_dir, n_prompts, kv_corruption),
            "vllm_version": vllm.__version__, "n_prompts": len(prompts),
            # os.path: Path.relative_to cannot walk up ("../") before Python 3.12
            "prompts_file": os.path.relpath(prompts_file), "max_tokens": max_tokens, "k": k,
            "block_size": BLOCK_SIZE, "dtype": DTYPE, "engine_start_s": start_s, "clean": clean,
            "samples": [{"id": p["id"], "prompt_tail": p["text"][-200:], "output": t}
                        for p, t in list(zip(prompts, texts, strict=True))[:3]],
        }
        if kv_corruption:
            result.update(_kv_corruption(llm, prompts, clean, toks, max_tokens))
        result["checks"] = checks(clean, result.get("corrupt"), result.get("corrupt_noise"))
        result["all_ok"] = all(r["ok"] for r in result["checks"])
    finally:
        if own:
            del llm
    if write:
        _write_results(Path(models_dir), result)
    return result


def _command(models_dir, n_prompts: int, kv_corruption: bool) -> str:
    return (f"python -m workbench.training.evaluate --models {models_dir} --prompts {n_prompts}"
            + (" --kv-corruption" if kv_corruption else ""))


def _kv_corruption(llm, prompts, clean: dict, toks, max_tokens: int) -> dict:
    """The prompts again with the drafter's prompt K/V zeroed, then overwritten by noise."""
    out = {}
    for mode, key in (("zero", "corrupt"), ("noise", "corrupt_noise")):
        bad, btoks = run_corrupted(llm, prompts, clean["prompt_lens"], max_tokens, mode)
        bad["pos0_rel_drop"] = 1 - bad["per_pos"][0] / max(clean["per_pos"][0], 1e-9)
        bad["same_output"] = sum(a == b for a, b in zip(toks, btoks, strict=True))
        out[key] = bad
    return out


def _write_results(models_dir: Path, result: dict) -> None:
    """``eval_results.json``, and the model card again where the pair has one."""
    (models_dir / "eval_results.json").write_text(json.dumps(result, indent=1))
    if (models_dir / "training_info.json").exists():
        from .card import write_card

        write_card(models_dir)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="data/models")
    ap.add_argument("--prompts", type=int, default=64, help="number of held-out prompts")
    ap.add_argument("--prompts-file", default=None)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--kv-corruption", action="store_true",
                    help="also measure with drafter KV zeroed")
    ap.add_argument("--no-card", action="store_true", help="do not write eval_results.json / card")
    args = ap.parse_args(argv)
    cmd = "python -m workbench.training.evaluate " + " ".join(
        sys.argv[1:] if argv is None else argv)
    r = evaluate(args.models, args.prompts_file, n_prompts=args.prompts,
                 max_tokens=args.max_tokens, k=args.k, kv_corruption=args.kv_corruption,
                 write=not args.no_card, command=cmd)
    for row in r["checks"]:
        print(f"{'ok ' if row['ok'] else 'NO '} {row['name']}: {row['value']}  (bar {row['bar']})")
    c = r["clean"]
    print(f"drafts {c['num_drafts']}, accepted {c['num_accepted']}, "
          f"generation {c['wall_s']:.1f} s, engine start {r['engine_start_s']:.1f} s")
    for s in r["samples"][:2]:
        print("---", s["id"], "\n" + s["prompt_tail"][-120:] + "⟨⟩" + s["output"])
    return 0 if r["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
