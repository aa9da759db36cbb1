"""Stand-ins for ``vllm/v1/worker/gpu/spec_decode/rejection_sampler_utils.py``'s kernels,
greedy requests only (temperature 0: what the workbench's runs send)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .memory import as_f32, flat

MODULE = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"


def local_logits_stats(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_compute_local_logits_stats_kernel`` for greedy rows: each vocab block's max and
    its token. Covers launches whose every non-bonus row has temperature 0."""
    steps, reqs = flat(a["expanded_local_pos_ptr"]), flat(a["expanded_idx_mapping_ptr"])
    temp = flat(a["temp_ptr"])
    rows = [r for r in range(grid[0]) if steps[r] < a["num_speculative_steps"]]
    if any(np.float32(temp[int(reqs[r])]) != 0.0 for r in rows):
        return False
    logits, bsz, vocab = as_f32(a["target_logits_ptr"]), a["BLOCK_SIZE"], a["vocab_size"]
    amax, vmax = flat(a["target_local_argmax_ptr"]), flat(a["target_local_max_ptr"])
    for r in rows:
        base = r * int(a["target_logits_stride"])
        for b in range(grid[1]):
            x = np.full(bsz, -np.inf, np.float32)
            lo, hi = b * bsz, min((b + 1) * bsz, vocab)
            x[:max(hi - lo, 0)] = logits[base + lo:base + hi]
            amax[r * int(a["target_local_argmax_stride"]) + b] = lo + int(np.nanargmax(x))
            vmax[r * int(a["target_local_max_stride"]) + b] = np.nanmax(x)
    return True


def rejection(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_rejection_kernel`` for greedy requests: accept while the draft is the target's
    argmax, store the argmax at the first rejection. Covers launches without
    ``SYNTHETIC_MODE`` whose every request has temperature 0."""
    idx, cu, temp = flat(a["idx_mapping_ptr"]), flat(a["cu_num_logits_ptr"]), flat(a["temp_ptr"])
    if a["SYNTHETIC_MODE"] or any(np.float32(temp[int(idx[r])]) != 0.0
                                  for r in range(grid[0])):
        return False
    for r in range(grid[0]):
        accepted = _greedy_request(a, r, int(cu[r]), int(cu[r + 1]))
        flat(a["rejected_steps_ptr"])[r] = accepted
        flat(a["target_rejected_logsumexp_ptr"])[r] = 0.0
        flat(a["draft_rejected_logsumexp_ptr"])[r] = 0.0
    return True


def _greedy_request(a, r: int, start: int, end: int) -> int:
    drafts, sampled = flat(a["draft_sampled_ptr"]), flat(a["sampled_ptr"])
    accepted = 0
    for i in range(end - start - 1):
        draft = int(drafts[start + i + 1])
        target = _global_argmax(a, start + i)
        ok = target == max(0, draft) and draft >= 0
        sampled[r * int(a["sampled_stride"]) + i] = max(0, draft) if ok else target
        accepted += ok
        if not ok:
            break
    return accepted


def _global_argmax(a, logit: int) -> int:
    """``_compute_global_target_argmax``: the block with the largest max (NaN as -inf), then
    that block's stored token."""
    n = int(a["vocab_num_blocks"])
    at = logit * int(a["target_local_max_stride"])
    maxes = np.full(a["PADDED_VOCAB_NUM_BLOCKS"], -np.inf, np.float32)
    maxes[:n] = flat(a["target_local_max_ptr"])[at:at + n]
    maxes[np.isnan(maxes)] = -np.inf
    block = int(np.nanargmax(maxes))
    return int(flat(a["target_local_argmax_ptr"])[
        logit * int(a["target_local_argmax_stride"]) + block])
