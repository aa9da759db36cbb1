"""Stand-ins for ``vllm/v1/worker/gpu/input_batch.py``'s per-request kernels. Each leaves a
launch with a dummy request (``idx_mapping`` -1) to the interpreter where the kernel would
read before a buffer's start."""

from __future__ import annotations

from typing import Any

import numpy as np

from .memory import flat

MODULE = "vllm.v1.worker.gpu.input_batch"


def pos_seq_lens(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_prepare_pos_seq_lens_kernel``: each request's positions and sequence length; the
    last program zeroes the unused sequence lengths."""
    n = grid[0] - 1
    idx, qsl = flat(a["idx_mapping_ptr"])[:n], flat(a["query_start_loc_ptr"])
    if (idx < 0).any():
        return False
    done, pos, seq = flat(a["num_computed_tokens_ptr"]), flat(a["pos_ptr"]), flat(a["seq_lens_ptr"])
    for r in range(n):
        c, s, e = int(done[int(idx[r])]), int(qsl[r]), int(qsl[r + 1])
        seq[r] = c + e - s
        if e > s:
            pos[s:e] = c + np.arange(e - s)
    seq[n:int(a["max_num_reqs"])] = 0
    return True


def combine_tokens(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_combine_sampled_and_draft_tokens_kernel``: logits indices, then the last sampled
    token and the drafts written over the generated-token slots of ``input_ids``."""
    idx = flat(a["idx_mapping_ptr"])[:grid[0]]
    if (idx < 0).any():
        return False
    for b in range(grid[0]):
        _combine_request(a, b, int(idx[b]))
    return True


def _combine_request(a: dict[str, Any], b: int, req: int) -> None:
    width, new = a["BLOCK_SIZE"], a["NUM_NEW_SAMPLED_TOKENS"]
    cu, ids = flat(a["cu_num_logits_ptr"]), flat(a["input_ids_ptr"])
    start, num_logits = int(cu[b]), int(cu[b + 1]) - int(cu[b])
    end = int(flat(a["query_start_loc_ptr"])[b + 1])
    k = min(max(num_logits, 0), width)
    flat(a["logits_indices_ptr"])[start:start + k] = end - num_logits + np.arange(k)
    seq_len, prefill = int(flat(a["seq_lens_ptr"])[b]), int(flat(a["prefill_len_ptr"])[req])
    if seq_len <= prefill:
        return
    if new > 0 and seq_len - num_logits >= prefill:
        ids[end - num_logits] = flat(a["last_sampled_tokens_ptr"])[req]
    drafts = min(num_logits - new, width)
    if drafts > 0:
        at = req * int(a["draft_tokens_stride"])
        ids[end - (num_logits - new):end - (num_logits - new) + drafts] = \
            flat(a["draft_tokens_ptr"])[at:at + drafts]


def num_sampled_rejected(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_get_num_sampled_and_rejected_kernel``: both zero while a request is still
    chunk-prefilling."""
    idx = flat(a["idx_mapping_ptr"])[:grid[0]]
    if (idx < 0).any():
        return False
    seq, prefill, cu = (flat(a[k]) for k in ("seq_lens_ptr", "prefill_len_ptr",
                                              "cu_num_logits_ptr"))
    sampled, rejected = flat(a["num_sampled_ptr"]), flat(a["num_rejected_ptr"])
    for b in range(grid[0]):
        chunked = seq[b] < prefill[int(idx[b])]
        n = 0 if chunked else int(sampled[b])
        sampled[b] = n
        rejected[b] = 0 if chunked else int(cu[b + 1]) - int(cu[b]) - n
    return True


def post_update(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_post_update_kernel``: the sampled tokens appended to each request's state, its
    computed-token count advanced by what was not rejected."""
    idx = flat(a["idx_mapping_ptr"])
    for r in range(grid[0]):
        if int(idx[r]) >= 0:
            _post_update_request(a, r, int(idx[r]))
    return True


def _post_update_request(a: dict[str, Any], r: int, req: int) -> None:
    total_len, sampled = flat(a["total_len_ptr"]), flat(a["sampled_tokens_ptr"])
    total, n = int(total_len[req]), int(flat(a["num_sampled_ptr"])[r])
    row = r * int(a["sampled_tokens_stride"])
    if n > 0:
        flat(a["last_sampled_tokens_ptr"])[req] = sampled[row + n - 1]
        total_len[req] = total + n
    at = req * int(a["all_token_ids_stride"]) + total
    bins = a["output_bin_counts_ptr"]
    for i in range(n):
        token = int(sampled[row + i])
        flat(a["all_token_ids_ptr"])[at + i] = token
        if bins is not None:
            flat(bins)[req * int(a["output_bin_counts_stride"]) + token] += 1
    qsl = a["query_start_loc_ptr"]
    query_len = 0 if qsl is None else int(flat(qsl)[r + 1]) - int(flat(qsl)[r])
    delta = query_len - int(flat(a["num_rejected_ptr"])[r])
    if delta != 0:
        flat(a["num_computed_tokens_ptr"])[req] += delta


def expand_idx_mapping(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_expand_idx_mapping_kernel``: each logit's request and its position in the request."""
    idx, cu = flat(a["idx_mapping_ptr"]), flat(a["cu_num_logits_ptr"])
    out_idx, out_pos = flat(a["expanded_idx_mapping_ptr"]), flat(a["expanded_local_pos_ptr"])
    for r in range(grid[0]):
        s = int(cu[r])
        n = min(max(int(cu[r + 1]) - s, 0), a["BLOCK_SIZE"])
        out_idx[s:s + n] = idx[r]
        out_pos[s:s + n] = np.arange(n)
    return True
