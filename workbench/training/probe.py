"""Offline check of an exported target + drafter pair with the training code alone (no vLLM).

    python -m workbench.training.probe --models data/models --n 64 [--json out.json]

Why: choosing between training runs needs the quality bar's figures in seconds, on
whatever machine trained them (a GPU box has no vLLM).  Greedy continuations come from
the target itself; per-position acceptance follows the chains vLLM drafts under greedy verification
(each one where the last verification stopped); the KV-zeroed figure zeroes the drafter's
step-0 K/V for the whole prompt, as ``evaluate --kv-corruption`` does inside vLLM.
``evaluate`` in real vLLM stays the measurement of record.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import fields
from pathlib import Path

import torch

from .evaluate import DEFAULT_PROMPTS, degeneracy, load_prompts
from .loop import pick_device
from .model import DrafterConfig, Eagle3Drafter, Llama, TargetConfig


def _known_fields(cls, model_dir: Path, **override):
    """``cls`` (a training config class) from an exported config.json: the keys it knows."""
    raw = json.loads((model_dir / "config.json").read_text())
    return cls(**{f.name: raw[f.name] for f in fields(cls) if f.name in raw}, **override)


def load_pair(models_dir: str, device) -> tuple[Llama, Eagle3Drafter]:
    """Read the exported safetensors/config.json back into the training classes."""
    from safetensors.torch import load_file

    tdir, ddir = Path(models_dir, "target"), Path(models_dir, "drafter")
    tc = _known_fields(TargetConfig, tdir)
    target = Llama(tc)
    sd = load_file(tdir / "model.safetensors")
    if tc.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    target.load_state_dict(sd)
    aux = json.loads((ddir / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]
    drafter = Eagle3Drafter(_known_fields(DrafterConfig, ddir, aux_layer_ids=aux))
    drafter.load_state_dict(load_file(ddir / "model.safetensors"))
    return target.to(device).eval(), drafter.to(device).eval()


def encode_prompts(models_dir: str, prompts: list[dict]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(Path(models_dir, "target", "tokenizer.json")))
    return [tk.encode(p["text"]).ids for p in prompts]  # BOS comes from the post-processor


@torch.no_grad()
def greedy(target: Llama, prompts: list[list[int]], n_new: int, device,
           batch: int = 64) -> list[list[int]]:
    """Batched greedy decoding, right-padded (causal attention keeps pads out of view)."""
    out = []
    for b in range(0, len(prompts), batch):
        seqs = [list(p) for p in prompts[b : b + batch]]
        for _ in range(n_new):
            T = max(len(s) for s in seqs)
            x = torch.zeros(len(seqs), T, dtype=torch.long)
            for i, s in enumerate(seqs):
                x[i, : len(s)] = torch.tensor(s)
            logits = target(x.to(device))
            last = torch.tensor([len(s) - 1 for s in seqs], device=device)
            nxt = logits[torch.arange(len(seqs), device=device), last].argmax(-1).tolist()
            for s, t in zip(seqs, nxt, strict=True):
                s.append(t)
        out.extend(s[len(p):] for s, p in zip(seqs, prompts[b : b + batch], strict=True))
    return out


@torch.no_grad()
def chain_acceptance(target: Llama, drafter: Eagle3Drafter, prompt: list[int], gen: list[int],
                     k: int, device, zero_prompt_kv: bool = False) -> torch.Tensor:
    """(n_chains, k) bool: draft step s of the chain started at each position accepted
    together with all earlier steps (greedy verification against ``gen``)."""
    x = torch.tensor([prompt + gen], device=device)
    P = len(prompt)
    _, aux = target(x, aux_ids=drafter.config.aux_layer_ids)
    outs = drafter.forward_ttt(x, aux, k, zero_kv_before=P if zero_prompt_kv else 0)
    ids = drafter.draft_ids()
    T = x.shape[1]
    starts = range(P - 1, T - k - 1)  # chain at j drafts tokens j+2 .. j+k+1
    j = torch.tensor(list(starts), device=device)
    match = torch.stack([ids[outs[s][0, j].argmax(-1)] == x[0, j + s + 2] for s in range(k)],
                        dim=1)
    return match.cumprod(dim=1).bool()


def walk(acc: torch.Tensor) -> torch.Tensor:
    """The chains vLLM would draft: the first after the prompt, each next one where the
    last verification stopped (accepted drafts plus the target's own token).  Chains
    right after a rejection start at harder text, so this is lower than averaging
    over every start (kept as ``per_pos_every_start``)."""
    rows, j = [], 0
    while j < len(acc):
        rows.append(acc[j])
        j += int(acc[j].sum()) + 1
    return torch.stack(rows) if rows else acc[:0]


def probe(models_dir: str, prompts_file: str | None = None, n: int = 64, max_tokens: int = 128,
          k: int = 3, device: str = "auto") -> dict:
    """The quality bar's figures for the pair in ``models_dir``, without vLLM."""
    dev = pick_device(device)
    target, drafter = load_pair(models_dir, dev)
    prompts = load_prompts(prompts_file or DEFAULT_PROMPTS, n)
    enc = encode_prompts(models_dir, prompts)
    gens = greedy(target, enc, max_tokens, dev)
    distinct, share = degeneracy(gens)
    res = {"models": models_dir, "n_prompts": len(prompts), "max_tokens": max_tokens, "k": k,
           "distinct_median": statistics.median(distinct), "distinct_min": min(distinct),
           "max_token_share": max(share)}
    for label, zero in (("clean", False), ("kv_zeroed", True)):
        accs = [chain_acceptance(target, drafter, p, g, k, dev, zero)
                for p, g in zip(enc, gens, strict=True)]
        res[label] = _acceptance(accs)
    c0 = res["clean"]["per_pos"][0]
    res["kv_pos0_rel_drop"] = 1 - res["kv_zeroed"]["per_pos"][0] / c0 if c0 > 0 else 0.0
    return res


def _acceptance(accs: list[torch.Tensor]) -> dict:
    """Per-position acceptance over the chains vLLM would draft (and over every start)."""
    walked = torch.cat([walk(a) for a in accs])
    pp = walked.float().mean(0).tolist()
    every = torch.cat(accs).float().mean(0).tolist()
    return {"per_pos": pp, "acceptance_length": 1 + sum(pp), "n_drafts": len(walked),
            "per_pos_every_start": every}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="data/models")
    ap.add_argument("--prompts-file", default=None)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    r = probe(args.models, args.prompts_file, args.n, args.max_tokens, args.k, args.device)
    txt = json.dumps(r, indent=1)
    print(txt)
    if args.json:
        Path(args.json).write_text(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
