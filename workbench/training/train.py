"""Train the Llama target and its EAGLE3 drafter from scratch, in one command.

    python -m workbench.training.train --out data/models            # full run
    python -m workbench.training.train --out /tmp/m --tiny          # ~1 minute on CPU

Stages (each cached in ``--work-dir``, so an interrupted run resumes where it
stopped): corpus list -> byte-level BPE tokenizer -> token ids -> target
training (periodic checkpoints) -> optional unlikelihood fine-tune -> draft
vocabulary -> drafter training with a multi-step (training-time test) unroll ->
export (safetensors + configs + tokenizer) -> MODEL_CARD.md.  Seeds are fixed; the
device is CUDA when available (about 2 minutes for the full run on an H200), else
CPU (about 6 hours on 2 cores).  ``grid`` runs several settings side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict

import numpy as np
import torch
import torch.nn.functional as F

from . import corpus as corpus_mod
from . import tok as tok_mod
from .model import DrafterConfig, Eagle3Drafter, Llama, TargetConfig, count_params

# the shipped pair (data/models): grid variant "n8-ul" (see workbench/training/grid.py,
# data/models/grid.json): ~8 epochs, no dropout, then 300 unlikelihood steps
FULL = dict(
    vocab=2048, layers=8, hidden=256, inter=704, heads=4, seq=512, batch=32,
    target_steps=1216, target_lr=2e-3, drafter_steps=1000, drafter_lr=1.5e-3,
    draft_vocab=1024, ttt_steps=3, weight_decay=0.1, max_files=None,
    ul_steps=300, ul_weight=1.0, ul_lr=5e-4, dropout=0.0, aux_layers="auto",
)
TINY = dict(
    vocab=512, layers=2, hidden=64, inter=176, heads=2, seq=64, batch=8,
    target_steps=60, target_lr=3e-3, drafter_steps=30, drafter_lr=3e-3,
    draft_vocab=256, ttt_steps=3, weight_decay=0.1, max_files=40,
    ul_steps=0, ul_weight=1.0, ul_lr=5e-4, dropout=0.0, aux_layers="auto",
)


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def aux_layer_ids(n_layers: int, spec: str = "auto") -> list[int]:
    """Three target layers whose incoming residual stream feeds the drafter.

    vLLM numbering: id i is the residual stream entering layer i (0 = embeddings,
    L = last layer's output before the final norm); always ascending, since vLLM
    concatenates them in layer order.  ``auto`` takes vLLM's own default
    ``(2, L//2, L-3)`` where those are distinct (L >= 7), the layers a real EAGLE3 head
    reads (Llama-3.1-8B: 2, 16, 29); shallower targets fall back to ``{1, L//2, L}``.
    (Measured in grid.json: reading the last layer instead changed the drafter's
    KV dependence little; dropout in the target changed it a lot.)"""
    if spec != "auto":
        try:
            ids = sorted(int(x) for x in str(spec).split(","))
        except ValueError:
            ids = []
        if len(ids) != 3 or len(set(ids)) != 3 or ids[0] < 0 or ids[-1] > n_layers:
            raise SystemExit(f"--aux-layers {spec!r}: need three distinct ids in 0..{n_layers}")
        return ids
    if n_layers >= 7:
        return [2, n_layers // 2, n_layers - 3]
    if n_layers >= 4:
        return sorted({1, n_layers // 2, n_layers})
    return list(range(n_layers + 1))[-3:]


def _seed_all(seed: int):
    torch.manual_seed(seed)
    np.random.seed(seed)


def _atomic_save(obj, path):
    tmp = path + ".tmp"
    torch.save(obj, tmp)
    os.replace(tmp, path)


WARMUP_STEPS = 100
DECAY_FRACTION = 0.25


def decay_start(total: int) -> int:
    return int(total * (1 - DECAY_FRACTION))


def _lr_at(step, total, peak, warmup=WARMUP_STEPS):
    """Warmup-stable-decay: linear warmup over a fixed number of steps, constant,
    then cosine down to 10% over the last quarter.  Until decay_start(total) the
    schedule does not depend on total, so a run resumed with a different total
    (before its decay began) is the same run as one started with that total."""
    warmup = min(warmup, max(1, total // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    d0 = decay_start(total)
    if step < d0:
        return peak
    p = (step - d0) / max(1, total - d0)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


def _check_total(ck, step, total, log):
    """A checkpoint may resume under a new step total only while still before the
    decay phase of both schedules (then the result equals a fresh run with the new total)."""
    if not os.path.exists(ck):
        return
    st = torch.load(ck, map_location="cpu")
    old_total = st.get("total", total)
    if old_total != total:
        if step > min(decay_start(old_total), decay_start(total)):
            raise SystemExit(f"{ck}: at step {step}, past the decay start; cannot change total "
                             f"{old_total} -> {total}")
        log(f"{os.path.basename(ck)}: step total {old_total} -> {total} (before decay: same run)")


def _make_opt(model, lr, wd, device):
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw,
    )


def sample_batch(ids: np.ndarray, step: int, batch: int, seq: int, seed: int, device):
    """Deterministic per step: BOS followed by seq-1 tokens from a random offset."""
    rng = np.random.default_rng(seed * 1_000_003 + step)
    offs = rng.integers(0, len(ids) - seq, size=batch)
    x = np.stack([ids[o : o + seq - 1] for o in offs]).astype(np.int64)
    x = np.concatenate([np.full((batch, 1), tok_mod.BOS, dtype=np.int64), x], axis=1)
    return torch.from_numpy(x).to(device)


def eval_windows(ids: np.ndarray, n: int, seq: int):
    n = min(n, max(1, (len(ids) - 1) // (seq - 1)))
    stride = max(1, (len(ids) - seq) // n)
    x = np.stack([ids[i * stride : i * stride + seq - 1] for i in range(n)]).astype(np.int64)
    return np.concatenate([np.full((n, 1), tok_mod.BOS, dtype=np.int64), x], axis=1)


@torch.no_grad()
def target_eval(model, ids, seq, device, n=64, bs=16):
    model.eval()
    x_all = torch.from_numpy(eval_windows(ids, n, seq))
    tot, cnt, top1 = 0.0, 0, 0
    for i in range(0, len(x_all), bs):
        x = x_all[i : i + bs].to(device)
        logits = model(x)[:, :-1].float()
        y = x[:, 1:]
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        top1 += (logits.argmax(-1) == y).sum().item()
        cnt += y.numel()
    model.train()
    return {"loss": tot / cnt, "ppl": math.exp(tot / cnt), "top1": top1 / cnt}


def _autocast(device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def _load_finished(model, final, device, log, label):
    """The info of a finished phase (weights loaded into ``model``), or None."""
    if not os.path.exists(final):
        return None
    st = torch.load(final, map_location=device)
    model.load_state_dict(st["model"])
    log(f"{label}: loaded finished checkpoint {final}")
    return st["info"]


def _resume(model, opt, ck, device, log, label):
    """Restore an interrupted phase from its checkpoint; return (step, elapsed seconds)."""
    if not os.path.exists(ck):
        return 0, 0.0
    st = torch.load(ck, map_location=device)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    log(f"{label}: resuming at step {st['step']}")
    return st["step"], st["elapsed"]


def train_target(cfg, hp, train_ids, held_ids, work, device, seed, log):
    from tqdm import tqdm

    ck = os.path.join(work, "target_ckpt.pt")
    final = os.path.join(work, "target_final.pt")
    model = Llama(cfg, dropout=hp["dropout"]).to(device)
    info = _load_finished(model, final, device, log, "target")
    if info is not None:
        return model, info
    opt = _make_opt(model, hp["target_lr"], hp["weight_decay"], device)
    step, elapsed = _resume(model, opt, ck, device, log, "target")
    total = hp["target_steps"]
    _check_total(ck, step, total, log)
    t0, last_ck = time.time() - elapsed, time.time()
    losses = []
    bar = tqdm(total=total, initial=step, desc="target", dynamic_ncols=True, mininterval=2)
    model.train()
    while step < total:
        x = sample_batch(train_ids, step, hp["batch"], hp["seq"], seed, device)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, total, hp["target_lr"])
        with _autocast(device):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        losses.append(loss.item())
        bar.update(1)
        if step % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.3f}")
        if time.time() - last_ck > 120 or step == total:
            _atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                          "elapsed": time.time() - t0, "total": total}, ck)
            last_ck = time.time()
    bar.close()
    wall = time.time() - t0
    ev = target_eval(model, held_ids, hp["seq"], device)
    tr = target_eval(model, train_ids, hp["seq"], device, n=16)
    tokens = total * hp["batch"] * (hp["seq"] - 1)
    info = {"steps": total, "tokens_seen": tokens, "epochs": tokens / len(train_ids), "wall_s": wall,
            "final_train_loss_avg50": float(np.mean(losses[-50:])) if losses else None,
            "heldout": ev, "train_sample": tr}
    log(f"target: done {total} steps, {wall / 60:.1f} min, held-out ppl {ev['ppl']:.2f}")
    _atomic_save({"model": model.state_dict(), "info": info}, final)
    return model, info


def copy_candidates(x: torch.Tensor) -> torch.Tensor:
    """For each position t, the token that followed the latest earlier occurrence of
    the bigram (x[t-1], x[t]) -- what an induction/copy loop would emit next -- or -1."""
    B, T = x.shape
    eq = x[:, :, None] == x[:, None, :]  # [b, t, s]
    big = torch.zeros_like(eq)
    big[:, 1:, 1:] = eq[:, 1:, 1:] & eq[:, :-1, :-1]
    big &= torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    big[:, :, T - 1] = False  # s + 1 must exist
    idx = torch.arange(T, device=x.device)
    last = torch.where(big, idx[None, None, :], torch.full_like(idx, -1)[None, None, :]).amax(-1)
    cand = torch.gather(x, 1, (last + 1).clamp(min=0, max=T - 1))
    return torch.where(last >= 0, cand, torch.full_like(cand, -1))


def unlikelihood_term(logits, x_in, y):
    """Copy-continuation unlikelihood (Welleck et al. 2019, token level, restricted to
    the continuation of a repeated bigram): where copying the earlier continuation
    would be wrong, push its probability down: -log(1 - p(copy))."""
    cand = copy_candidates(x_in)
    m = (cand >= 0) & (cand != y)
    if not m.any():
        return logits.new_zeros(())
    p = logits.float().softmax(-1)
    pc = torch.gather(p, -1, cand.clamp(min=0)[..., None])[..., 0]
    return -(torch.log((1 - pc).clamp(min=1e-5)) * m).sum() / m.sum()


def finetune_target_ul(model, cfg, hp, train_ids, held_ids, work, device, seed, log):
    """Optional stage (``ul_steps`` > 0): continue training the target with cross-entropy
    plus ``ul_weight`` x copy-continuation unlikelihood, to curb greedy repetition loops."""
    from tqdm import tqdm

    ck = os.path.join(work, "target_ul_ckpt.pt")
    final = os.path.join(work, "target_ul_final.pt")
    info = _load_finished(model, final, device, log, "target UL")
    if info is not None:
        return model, info
    opt = _make_opt(model, hp["ul_lr"], hp["weight_decay"], device)
    step, elapsed = _resume(model, opt, ck, device, log, "target UL")
    total = hp["ul_steps"]
    t0, last_ck = time.time() - elapsed, time.time()
    bar = tqdm(total=total, initial=step, desc="target-UL", dynamic_ncols=True, mininterval=2)
    model.train()
    while step < total:
        x = sample_batch(train_ids, step, hp["batch"], hp["seq"], seed + 104729, device)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, total, hp["ul_lr"], warmup=max(1, total // 10))
        with _autocast(device):
            logits = model(x[:, :-1])
        y = x[:, 1:]
        ce = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        ul = unlikelihood_term(logits, x[:, :-1], y)
        loss = ce + hp["ul_weight"] * ul
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        bar.update(1)
        bar.set_postfix(ce=f"{ce.item():.3f}", ul=f"{ul.item():.3f}")
        if time.time() - last_ck > 120 or step == total:
            _atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                          "elapsed": time.time() - t0, "total": total}, ck)
            last_ck = time.time()
    bar.close()
    ev = target_eval(model, held_ids, hp["seq"], device)
    info = {"steps": total, "lr": hp["ul_lr"], "weight": hp["ul_weight"], "wall_s": time.time() - t0,
            "tokens_seen": total * hp["batch"] * (hp["seq"] - 1), "heldout": ev}
    log(f"target UL: done {total} steps, held-out ppl {ev['ppl']:.2f}")
    _atomic_save({"model": model.state_dict(), "info": info}, final)
    return model, info


def choose_draft_vocab(train_ids: np.ndarray, vocab: int, n: int) -> torch.Tensor:
    counts = np.bincount(train_ids, minlength=vocab)
    counts[tok_mod.EOS] += 10**9  # always draftable
    top = np.argsort(-counts, kind="stable")[:n]
    return torch.from_numpy(np.sort(top)).long()


def drafter_loss(drafter, target, x, dmap, ttt, weights):
    with torch.no_grad():
        tlogits, aux = target(x, aux_ids=drafter.config.aux_layer_ids)
        tp = tlogits.float()[..., dmap].softmax(-1)  # target dist restricted to draft vocab
        tgt_arg = tlogits.float().argmax(-1)
    outs = drafter.forward_ttt(x, [a.detach() for a in aux], ttt)
    losses, accs = [], []
    inv = torch.full((tlogits.shape[-1],), -1, dtype=torch.long, device=x.device)
    inv[dmap] = torch.arange(len(dmap), device=x.device)
    for s, lg in enumerate(outs):
        n = lg.shape[1]
        p = tp[:, s + 1 : s + 1 + n]
        logq = lg.float().log_softmax(-1)
        losses.append(-(p * logq).sum(-1).mean())
        want = inv[tgt_arg[:, s + 1 : s + 1 + n]]
        accs.append((lg.argmax(-1) == want).float().mean().item())
    loss = sum(w * l for w, l in zip(weights, losses)) / sum(weights[: len(losses)])
    return loss, [l.item() for l in losses], accs


@torch.no_grad()
def drafter_eval(drafter, target, ids, seq, device, dmap, ttt, n=64, bs=16):
    drafter.eval()
    x_all = torch.from_numpy(eval_windows(ids, n, seq))
    acc_sum = np.zeros(ttt)
    cnt = 0
    for i in range(0, len(x_all), bs):
        x = x_all[i : i + bs].to(device)
        _, _, accs = drafter_loss(drafter, target, x, dmap, ttt, [1.0] * ttt)
        acc_sum += np.array(accs) * len(x)
        cnt += len(x)
    drafter.train()
    return (acc_sum / cnt).tolist()


def train_drafter(dcfg, hp, target, train_ids, held_ids, dmap, work, device, seed, log):
    from tqdm import tqdm

    ck = os.path.join(work, "drafter_ckpt.pt")
    final = os.path.join(work, "drafter_final.pt")
    torch.manual_seed(seed + 1)
    drafter = Eagle3Drafter(dcfg).to(device)
    drafter.set_vocab_map(dmap.cpu())
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    drafter.embed_tokens.weight.requires_grad_(False)  # shared with the target, frozen
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    dmap = dmap.to(device)
    if os.path.exists(final):
        st = torch.load(final, map_location=device)
        drafter.load_state_dict(st["model"])
        log(f"drafter: loaded finished checkpoint {final}")
        return drafter, st["info"]
    opt = _make_opt(drafter, hp["drafter_lr"], 0.0, device)
    step, elapsed = 0, 0.0
    if os.path.exists(ck):
        st = torch.load(ck, map_location=device)
        drafter.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        step, elapsed = st["step"], st["elapsed"]
        log(f"drafter: resuming at step {step}")
    total, ttt = hp["drafter_steps"], hp["ttt_steps"]
    _check_total(ck, step, total, log)
    weights = [0.8**s for s in range(ttt)]
    t0, last_ck = time.time() - elapsed, time.time()
    hist = []
    bar = tqdm(total=total, initial=step, desc="drafter", dynamic_ncols=True, mininterval=2)
    while step < total:
        # different data order from the target's (seed offset)
        x = sample_batch(train_ids, step, hp["batch"], hp["seq"], seed + 7919, device)
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, total, hp["drafter_lr"])
        with _autocast(device):
            loss, parts, accs = drafter_loss(drafter, target, x, dmap, ttt, weights)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        step += 1
        hist.append(accs)
        bar.update(1)
        if step % 10 == 0:
            a = np.mean(hist[-20:], axis=0)
            bar.set_postfix(loss=f"{loss.item():.3f}", acc="/".join(f"{v:.2f}" for v in a))
        if time.time() - last_ck > 120 or step == total:
            _atomic_save({"model": drafter.state_dict(), "opt": opt.state_dict(), "step": step,
                          "elapsed": time.time() - t0, "total": total}, ck)
            last_ck = time.time()
    bar.close()
    wall = time.time() - t0
    ev = drafter_eval(drafter, target, held_ids, hp["seq"], device, dmap, ttt)
    info = {"steps": total, "ttt_steps": ttt, "step_weights": weights,
            "tokens_seen": total * hp["batch"] * (hp["seq"] - 1), "wall_s": wall,
            "heldout_top1_match_per_step": ev}
    log(f"drafter: done {total} steps, {wall / 60:.1f} min, held-out argmax match per step "
        + "/".join(f"{v:.3f}" for v in ev))
    _atomic_save({"model": drafter.state_dict(), "info": info}, final)
    return drafter, info


def save_target(model, cfg: TargetConfig, tok_dir: str, out_dir: str):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {k: v.float().cpu() for k, v in model.export_state_dict().items()}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg.hf_dict(), f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                   "pad_token_id": cfg.pad_token_id, "do_sample": False}, f, indent=2)
    import shutil

    for fn in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(tok_dir, fn), os.path.join(out_dir, fn))


def save_drafter(drafter, dcfg: DrafterConfig, out_dir: str):
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    sd = {k: (v.float() if v.is_floating_point() else v).cpu().contiguous()
          for k, v in drafter.export_state_dict().items()}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(dcfg.hf_dict(), f, indent=2)


def configs_from_hp(hp) -> tuple[TargetConfig, DrafterConfig]:
    L = hp["layers"]
    tc = TargetConfig(vocab_size=hp["vocab"], hidden_size=hp["hidden"], intermediate_size=hp["inter"],
                      num_hidden_layers=L, num_attention_heads=hp["heads"],
                      num_key_value_heads=hp["heads"])
    dc = DrafterConfig(vocab_size=hp["vocab"], draft_vocab_size=hp["draft_vocab"],
                       hidden_size=hp["hidden"], target_hidden_size=hp["hidden"],
                       intermediate_size=hp["inter"], num_attention_heads=hp["heads"],
                       num_key_value_heads=hp["heads"], aux_layer_ids=aux_layer_ids(L, hp["aux_layers"]))
    return tc, dc


def prepare_data(hp, work, log, stdlib_root=None):
    """Corpus list, tokenizer and token ids (cached in work)."""
    c = corpus_mod.load_corpus(stdlib_root, max_files=hp["max_files"])
    info = c.info()
    meta_path = os.path.join(work, "corpus.json")
    if os.path.exists(meta_path):
        old = json.load(open(meta_path))
        if old["file_list_sha256"] != info["file_list_sha256"]:
            raise SystemExit(f"{work} was made from a different file list; use another --work-dir")
    json.dump({**info, "train_files": c.train_files, "heldout_files": c.heldout_files,
               "excluded": c.excluded}, open(meta_path, "w"), indent=1)
    tok_dir = os.path.join(work, "tokenizer")
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        log(f"tokenizer: training byte-level BPE, vocab {hp['vocab']}, on {len(c.train_files)} files")
        tk = tok_mod.train_tokenizer((c.read(f) for f in c.train_files), hp["vocab"])
        tok_mod.save_tokenizer(tk, tok_dir)
    tk = tok_mod.load_raw(tok_dir)
    ids_path = os.path.join(work, "ids.npz")
    if not os.path.exists(ids_path):
        from tqdm import tqdm

        def enc(files):
            out = []
            for f in tqdm(files, desc="tokenize", dynamic_ncols=True, mininterval=2):
                out.extend(tok_mod.encode_plain(tk, c.read(f)))
                out.append(tok_mod.EOS)
            return np.array(out, dtype=np.uint16)

        np.savez(ids_path + ".tmp.npz", train=enc(c.train_files), held=enc(c.heldout_files))
        os.replace(ids_path + ".tmp.npz", ids_path)
    z = np.load(ids_path)
    return c, info, tok_dir, tk, z["train"].astype(np.int64), z["held"].astype(np.int64)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data/models")
    ap.add_argument("--work-dir", default=None, help="checkpoints/cache (default training-work/, training-work/tiny/ with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="2 layers, 64 wide, a few steps (tests)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--prompts-out", default=None,
                    help="write the held-out prompt set here (default: <out>/../prompts/indomain.jsonl; "
                         "none with --tiny)")
    ap.add_argument("--n-prompts", type=int, default=128)
    ap.add_argument("--stdlib-root", default=None, help=argparse.SUPPRESS)
    for k in ("layers", "hidden", "inter", "heads", "seq", "batch", "target_steps", "drafter_steps",
              "draft_vocab", "ttt_steps", "vocab", "ul_steps"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    for k in ("target_lr", "drafter_lr", "weight_decay", "ul_weight", "ul_lr", "dropout"):
        ap.add_argument("--" + k.replace("_", "-"), type=float, default=None)
    ap.add_argument("--aux-layers", default=None,
                    help="target aux layer ids for the drafter, e.g. 2,4,5 (default auto: vLLM's (2, L//2, L-3))")
    args = ap.parse_args(argv)

    hp = dict(TINY if args.tiny else FULL)
    for k in list(hp):
        v = getattr(args, k, None)
        if v is not None:
            hp[k] = v
    device = pick_device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    work = args.work_dir or (os.path.join("training-work", "tiny") if args.tiny else "training-work")
    os.makedirs(work, exist_ok=True)
    hp_path = os.path.join(work, "hparams.json")
    if os.path.exists(hp_path):
        old = json.load(open(hp_path))
        free = ("target_steps", "drafter_steps", "ul_steps", "ul_weight", "ul_lr")  # checked against the schedule on resume
        if {k: old.get(k) for k in hp if k not in free} != {k: v for k, v in hp.items() if k not in free}:
            pass_ = False
        else:
            pass_ = True
        if not pass_:
            raise SystemExit(f"{work} holds a run with other settings {old}; use another --work-dir")
    json.dump(hp, open(hp_path, "w"), indent=1)
    logf = open(os.path.join(work, "train.log"), "a")

    def log(msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, file=sys.stderr, flush=True)
        logf.write(line + "\n")
        logf.flush()

    t_start = time.time()
    _seed_all(args.seed)
    log(f"device {device}, threads {torch.get_num_threads()}, settings {hp}")
    c, cinfo, tok_dir, tk, train_ids, held_ids = prepare_data(hp, work, log, args.stdlib_root)
    log(f"corpus: {len(c.train_files)} train files ({len(train_ids)} tokens), "
        f"{len(c.heldout_files)} held-out files ({len(held_ids)} tokens)")

    prompts_out = args.prompts_out
    if prompts_out is None and not args.tiny:
        prompts_out = os.path.join(os.path.dirname(os.path.abspath(args.out)), "prompts", "indomain.jsonl")
    n_prompts = 0
    if prompts_out:
        prompts = corpus_mod.build_prompts(c, tok_mod._HFLike(tk), n_prompts=args.n_prompts)
        corpus_mod.write_prompts(prompts, prompts_out)
        n_prompts = len(prompts)
        log(f"prompts: {n_prompts} held-out prompts -> {prompts_out}")

    tcfg, dcfg = configs_from_hp(hp)
    _seed_all(args.seed)
    target, tinfo = train_target(tcfg, hp, train_ids, held_ids, work, device, args.seed, log)
    if hp["ul_steps"] > 0:
        target, ulinfo = finetune_target_ul(target, tcfg, hp, train_ids, held_ids, work, device, args.seed, log)
        tinfo = {**tinfo, "ul": ulinfo}
    dmap = choose_draft_vocab(train_ids, hp["vocab"], hp["draft_vocab"])
    drafter, dinfo = train_drafter(dcfg, hp, target, train_ids, held_ids, dmap, work, device, args.seed, log)

    tdir, ddir = os.path.join(args.out, "target"), os.path.join(args.out, "drafter")
    save_target(target, tcfg, tok_dir, tdir)
    save_drafter(drafter, dcfg, ddir)
    info = {
        "command": "python -m workbench.training.train " + " ".join(argv if argv is not None else sys.argv[1:]),
        "tiny": args.tiny, "seed": args.seed, "device": str(device),
        "torch": torch.__version__, "host": platform.machine(), "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "hparams": hp, "corpus": cinfo, "n_excluded_files": len(c.excluded),
        "excluded_files": c.excluded,
        "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(held_ids)),
        "target_config": asdict(tcfg), "drafter_config": {**asdict(dcfg)},
        "target_params": count_params(target),
        "drafter_params": count_params(drafter),
        "target": tinfo, "drafter": dinfo, "n_prompts": n_prompts, "prompts_path": prompts_out,
        "total_wall_s": time.time() - t_start,
    }
    with open(os.path.join(args.out, "training_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    from .card import write_card

    write_card(args.out)
    log(f"wrote {tdir}, {ddir}, {os.path.join(args.out, 'MODEL_CARD.md')}")
    return tdir, ddir


if __name__ == "__main__":
    main()
