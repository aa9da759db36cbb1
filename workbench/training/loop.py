"""The one optimisation loop every training stage runs (target, unlikelihood, drafter).

A stage is its settings (:class:`Stage`) plus a function from the step number to the
loss; this module owns what the three share: AdamW, the warmup-stable-decay schedule,
gradient clipping, the progress bar, and the two checkpoints that make an interrupted
run resume where it stopped (``<name>_ckpt.pt`` every two minutes, ``<name>_final.pt``
with the stage's figures once it is done).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..provenance import atomic_path

WARMUP_STEPS = 100
DECAY_FRACTION = 0.25
CHECKPOINT_EVERY_S = 120  # wall seconds between resumable checkpoints
GRAD_CLIP = 1.0

Log = Callable[[str], None]
# step number -> (loss to back-propagate, what the stage keeps of that step)
StepFn = Callable[[int], tuple[torch.Tensor, Any]]
# (every kept record so far, the last loss) -> progress-bar postfix
PostfixFn = Callable[[list, torch.Tensor], dict]


@dataclass(frozen=True)
class Run:
    """Where and how one training run executes; not part of its settings (hparams.json)."""

    work: Path
    """Checkpoints and caches; an interrupted run resumes from what it finds here."""
    device: torch.device
    seed: int
    log: Log


@dataclass(frozen=True)
class Stage:
    """One stage's optimiser settings; its checkpoints are named after its label."""

    label: str
    """In the log (``target UL``); the bar shows ``target-UL``, the files ``target_ul_*.pt``."""
    steps: int
    lr: float
    weight_decay: float
    warmup: int = WARMUP_STEPS
    postfix_every: int = 1
    check_total: bool = True
    """Refuse to resume under a new step total once past the decay start (_check_total).
    Off for the unlikelihood stage, which has never checked it (kept as shipped)."""

    def checkpoint(self, run: Run, kind: str) -> Path:
        """``kind`` ``ckpt``: resumable, every few minutes; ``final``: weights and figures."""
        return run.work / f"{self.label.replace(' ', '_').lower()}_{kind}.pt"


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device) -> AbstractContextManager:
    """bf16 autocast on CUDA; float32 throughout on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def decay_start(total: int) -> int:
    return int(total * (1 - DECAY_FRACTION))


def lr_at(step: int, total: int, peak: float, warmup: int = WARMUP_STEPS) -> float:
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


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                   device: torch.device) -> torch.optim.AdamW:
    """AdamW (0.9, 0.95); matrices decay, norms and other vectors do not."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw,
    )


def atomic_save(obj: dict, path: Path) -> None:
    """Write then rename, so a run killed mid-save leaves the previous checkpoint whole."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def load_finished(model: torch.nn.Module, stage: Stage, run: Run) -> dict | None:
    """The figures of a finished stage (its weights loaded into ``model``), or None."""
    final = stage.checkpoint(run, "final")
    if not final.exists():
        return None
    st = torch.load(final, map_location=run.device)
    model.load_state_dict(st["model"])
    run.log(f"{stage.label}: loaded finished checkpoint {final}")
    return st["info"]


def save_finished(model: torch.nn.Module, stage: Stage, run: Run, info: dict,
                  summary: str) -> None:
    run.log(f"{stage.label}: done {stage.steps} steps, {summary}")
    atomic_save({"model": model.state_dict(), "info": info}, stage.checkpoint(run, "final"))


def run_stage(stage: Stage, model: torch.nn.Module, step_fn: StepFn, postfix: PostfixFn,
              run: Run) -> tuple[list, float]:
    """Train ``model`` from its checkpoint (if any) to ``stage.steps``; returns what
    ``step_fn`` kept of each step run here and the stage's wall seconds (resumes included)."""
    from tqdm import tqdm

    opt = make_optimizer(model, stage.lr, stage.weight_decay, run.device)
    step, elapsed = _resume(model, opt, stage, run)
    t0, last_ck = time.time() - elapsed, time.time()
    history: list = []
    bar = tqdm(total=stage.steps, initial=step, desc=stage.label.replace(" ", "-"),
               dynamic_ncols=True, mininterval=2)
    model.train()
    while step < stage.steps:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, stage.steps, stage.lr, stage.warmup)
        loss, record = step_fn(step)
        _update(model, opt, loss)
        step += 1
        history.append(record)
        bar.update(1)
        if step % stage.postfix_every == 0:
            bar.set_postfix(**postfix(history, loss))
        if time.time() - last_ck > CHECKPOINT_EVERY_S or step == stage.steps:
            atomic_save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                         "elapsed": time.time() - t0, "total": stage.steps},
                        stage.checkpoint(run, "ckpt"))
            last_ck = time.time()
    bar.close()
    return history, time.time() - t0


def _update(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    opt.step()


def _resume(model: torch.nn.Module, opt: torch.optim.Optimizer, stage: Stage,
            run: Run) -> tuple[int, float]:
    """Restore an interrupted stage from its checkpoint; return (step, elapsed seconds)."""
    ckpt = stage.checkpoint(run, "ckpt")
    if not ckpt.exists():
        return 0, 0.0
    st = torch.load(ckpt, map_location=run.device)
    model.load_state_dict(st["model"])
    opt.load_state_dict(st["opt"])
    run.log(f"{stage.label}: resuming at step {st['step']}")
    if stage.check_total:
        _check_total(ckpt, st["step"], st.get("total", stage.steps), stage.steps, run.log)
    return st["step"], st["elapsed"]


def _check_total(ckpt: Path, step: int, old_total: int, total: int, log: Log) -> None:
    """A checkpoint may resume under a new step total only while still before the
    decay phase of both schedules (then the result equals a fresh run with the new total)."""
    if old_total == total:
        return
    if step > min(decay_start(old_total), decay_start(total)):
        raise SystemExit(f"{ckpt}: at step {step}, past the decay start; cannot change "
                         f"total {old_total} -> {total}")
    log(f"{ckpt.name}: step total {old_total} -> {total} (before decay: same run)")
