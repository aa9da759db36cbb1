"""The three training stages, each a loss on top of :func:`loop.run_stage`.

target: next-token cross-entropy from scratch.  target UL (``ul_steps`` > 0): the same
plus copy-continuation unlikelihood, to curb greedy repetition loops.  drafter: the
EAGLE3 head against the frozen target's own distribution, with a training-time-test
unroll of ``ttt_steps`` drafts.  Each stage returns its model and the figures that
``training_info.json`` and the model card report.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from . import tok as tok_mod
from .config import TrainConfig
from .data import Data, eval_windows, sample_batch
from .loop import Run, Stage, autocast, load_finished, run_stage, save_finished
from .model import Eagle3Drafter, Llama

# seed offsets of each stage's batch order: the unlikelihood stage and the drafter see
# other windows than the target did, in another order
UL_SEED_OFFSET = 104729
DRAFTER_SEED_OFFSET = 7919
DRAFT_STEP_DECAY = 0.8  # loss weight of draft step s: 0.8**s (later drafts matter less)


# --------------------------------------------------------------------------- target


def train_target(cfg: TrainConfig, run: Run, data: Data) -> tuple[Llama, dict]:
    """The target from scratch: next-token cross-entropy on random windows of the corpus."""
    stage = Stage("target", cfg.target_steps, cfg.target_lr, cfg.weight_decay,
                  postfix_every=20)
    model = Llama(cfg.target_config(), dropout=cfg.dropout).to(run.device)
    info = load_finished(model, stage, run)
    if info is not None:
        return model, info

    def step(i: int) -> tuple[torch.Tensor, float]:
        x, logits = _lm_forward(model, data.train, i, cfg, run.seed, run.device)
        loss = _next_token_ce(logits, x[:, 1:])
        return loss, loss.item()

    losses, wall = run_stage(stage, model, step, _mean_loss_postfix, run)
    ev = target_eval(model, data.held, cfg.seq, run.device)
    sample = target_eval(model, data.train, cfg.seq, run.device, n=16)
    tokens = cfg.tokens_seen(stage.steps)
    info = {"steps": stage.steps, "tokens_seen": tokens, "epochs": tokens / len(data.train),
            "wall_s": wall,
            "final_train_loss_avg50": float(np.mean(losses[-50:])) if losses else None,
            "heldout": ev, "train_sample": sample}
    save_finished(model, stage, run, info, f"{wall / 60:.1f} min, held-out ppl {ev['ppl']:.2f}")
    return model, info


def finetune_target_ul(model: Llama, cfg: TrainConfig, run: Run, data: Data) -> tuple[Llama, dict]:
    """Optional stage (``ul_steps`` > 0): continue training the target with cross-entropy
    plus ``ul_weight`` x copy-continuation unlikelihood, to curb greedy repetition loops."""
    stage = Stage("target UL", cfg.ul_steps, cfg.ul_lr, cfg.weight_decay,
                  warmup=max(1, cfg.ul_steps // 10), check_total=False)
    info = load_finished(model, stage, run)
    if info is not None:
        return model, info

    def step(i: int) -> tuple[torch.Tensor, tuple[float, float]]:
        x, logits = _lm_forward(model, data.train, i, cfg, run.seed + UL_SEED_OFFSET, run.device)
        y = x[:, 1:]
        ce = _next_token_ce(logits, y)
        ul = unlikelihood_term(logits, x[:, :-1], y)
        return ce + cfg.ul_weight * ul, (ce.item(), ul.item())

    _, wall = run_stage(stage, model, step, _ce_ul_postfix, run)
    ev = target_eval(model, data.held, cfg.seq, run.device)
    info = {"steps": stage.steps, "lr": cfg.ul_lr, "weight": cfg.ul_weight, "wall_s": wall,
            "tokens_seen": cfg.tokens_seen(stage.steps), "heldout": ev}
    save_finished(model, stage, run, info, f"held-out ppl {ev['ppl']:.2f}")
    return model, info


def _lm_forward(model: Llama, ids: np.ndarray, step: int, cfg: TrainConfig, seed: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This step's windows and the target's logits for all but their last token."""
    x = sample_batch(ids, step, cfg, seed, device)
    with autocast(device):
        logits = model(x[:, :-1])
    return x, logits


def _next_token_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def _mean_loss_postfix(losses: list, _loss: torch.Tensor) -> dict:
    return {"loss": f"{np.mean(losses[-20:]):.3f}"}


def _ce_ul_postfix(parts: list, _loss: torch.Tensor) -> dict:
    ce, ul = parts[-1]
    return {"ce": f"{ce:.3f}", "ul": f"{ul:.3f}"}


@torch.no_grad()
def target_eval(model: Llama, ids: np.ndarray, seq: int, device: torch.device, n: int = 64,
                bs: int = 16) -> dict:
    """Loss, perplexity and next-token top-1 over ``n`` evenly spaced windows."""
    model.eval()
    x_all = torch.from_numpy(eval_windows(ids, n, seq))
    tot, cnt, top1 = 0.0, 0, 0
    for i in range(0, len(x_all), bs):
        x = x_all[i : i + bs].to(device)
        logits = model(x)[:, :-1].float()
        y = x[:, 1:]
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               reduction="sum").item()
        top1 += (logits.argmax(-1) == y).sum().item()
        cnt += y.numel()
    model.train()
    return {"loss": tot / cnt, "ppl": math.exp(tot / cnt), "top1": top1 / cnt}


def copy_candidates(x: torch.Tensor) -> torch.Tensor:
    """For each position t, the token that followed the latest earlier occurrence of
    the bigram (x[t-1], x[t]) -- what an induction/copy loop would emit next -- or -1."""
    _, T = x.shape
    eq = x[:, :, None] == x[:, None, :]  # [b, t, s]
    big = torch.zeros_like(eq)
    big[:, 1:, 1:] = eq[:, 1:, 1:] & eq[:, :-1, :-1]
    big &= torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-1)
    big[:, :, T - 1] = False  # s + 1 must exist
    idx = torch.arange(T, device=x.device)
    last = torch.where(big, idx[None, None, :], torch.full_like(idx, -1)[None, None, :]).amax(-1)
    cand = torch.gather(x, 1, (last + 1).clamp(min=0, max=T - 1))
    return torch.where(last >= 0, cand, torch.full_like(cand, -1))


def unlikelihood_term(logits: torch.Tensor, x_in: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
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


# --------------------------------------------------------------------------- drafter


def train_drafter(cfg: TrainConfig, run: Run, data: Data,
                  target: Llama) -> tuple[Eagle3Drafter, dict]:
    """The EAGLE3 head on the frozen target's aux hidden states (see :func:`drafter_loss`)."""
    dmap = choose_draft_vocab(data.train, cfg.vocab, cfg.draft_vocab)
    drafter = _new_drafter(cfg, run, target, dmap)
    dmap = dmap.to(run.device)
    stage = Stage("drafter", cfg.drafter_steps, cfg.drafter_lr, 0.0, postfix_every=10)
    info = load_finished(drafter, stage, run)
    if info is not None:
        return drafter, info
    weights = [DRAFT_STEP_DECAY**s for s in range(cfg.ttt_steps)]

    def step(i: int) -> tuple[torch.Tensor, list[float]]:
        x = sample_batch(data.train, i, cfg, run.seed + DRAFTER_SEED_OFFSET, run.device)
        with autocast(run.device):
            loss, _, accs = drafter_loss(drafter, target, x, dmap, cfg.ttt_steps, weights)
        return loss, accs

    _, wall = run_stage(stage, drafter, step, _accuracy_postfix, run)
    ev = drafter_eval(drafter, target, data.held, cfg, dmap, run.device)
    info = {"steps": stage.steps, "ttt_steps": cfg.ttt_steps, "step_weights": weights,
            "tokens_seen": cfg.tokens_seen(stage.steps), "wall_s": wall,
            "heldout_top1_match_per_step": ev}
    save_finished(drafter, stage, run, info, f"{wall / 60:.1f} min, held-out argmax match "
                  "per step " + "/".join(f"{v:.3f}" for v in ev))
    return drafter, info


def _new_drafter(cfg: TrainConfig, run: Run, target: Llama,
                 dmap: torch.Tensor) -> Eagle3Drafter:
    """A fresh drafter on the target's (frozen, shared) embeddings; freezes the target."""
    torch.manual_seed(run.seed + 1)
    drafter = Eagle3Drafter(cfg.drafter_config()).to(run.device)
    drafter.set_vocab_map(dmap.cpu())
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    drafter.embed_tokens.weight.requires_grad_(False)
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return drafter


def _accuracy_postfix(accs: list, loss: torch.Tensor) -> dict:
    a = np.mean(accs[-20:], axis=0)
    return {"loss": f"{loss.item():.3f}", "acc": "/".join(f"{v:.2f}" for v in a)}


def choose_draft_vocab(train_ids: np.ndarray, vocab: int, n: int) -> torch.Tensor:
    """The ``n`` most frequent training tokens, EOS always among them, in id order."""
    counts = np.bincount(train_ids, minlength=vocab)
    counts[tok_mod.EOS] += 10**9  # always draftable
    top = np.argsort(-counts, kind="stable")[:n]
    return torch.from_numpy(np.sort(top)).long()


def drafter_loss(drafter: Eagle3Drafter, target: Llama, x: torch.Tensor, dmap: torch.Tensor,
                 ttt: int, weights: list[float]) -> tuple[torch.Tensor, list[float], list[float]]:
    """Weighted soft cross-entropy of each unrolled draft step against the target's
    distribution restricted to the draft vocabulary; also each step's loss and its
    argmax agreement with the target."""
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
    weighted = sum(w * loss for w, loss in zip(weights, losses, strict=False))
    return weighted / sum(weights[: len(losses)]), [loss.item() for loss in losses], accs


@torch.no_grad()
def drafter_eval(drafter: Eagle3Drafter, target: Llama, ids: np.ndarray, cfg: TrainConfig,
                 dmap: torch.Tensor, device: torch.device, n: int = 64,
                 bs: int = 16) -> list[float]:
    """Per draft step, the argmax agreement with the target on ``n`` held-out windows."""
    drafter.eval()
    x_all = torch.from_numpy(eval_windows(ids, n, cfg.seq))
    acc_sum = np.zeros(cfg.ttt_steps)
    cnt = 0
    for i in range(0, len(x_all), bs):
        x = x_all[i : i + bs].to(device)
        _, _, accs = drafter_loss(drafter, target, x, dmap, cfg.ttt_steps, [1.0] * cfg.ttt_steps)
        acc_sum += np.array(accs) * len(x)
        cnt += len(x)
    drafter.train()
    return (acc_sum / cnt).tolist()
