"""Stand-ins for the EAGLE speculator's input kernels
(``vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .memory import flat, int32

MODULE = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


def prefill_inputs(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_prepare_prefill_inputs_kernel``: the target's tokens shifted by one with the next
    token last, its positions, query starts and sequence lengths; the last program pads."""
    idx, qsl, rejected = (flat(a[k]) for k in ("idx_mapping_ptr", "query_start_loc_ptr",
                                                "num_rejected_ptr"))
    rows = [(r, int(idx[r]), int(qsl[r]), int(qsl[r + 1]) - int(qsl[r]) - int(rejected[r]))
            for r in range(grid[0])]
    if any(req < 0 or start + n - 1 < 0 for _, req, start, n in rows):
        return False  # the kernel would address before a buffer's start
    for r, req, start, n in rows:
        _prefill_request(a, r, req, start, n)
    if rows:  # the last program pads
        _prefill_pad(a, grid[0], int(qsl[grid[0]]))
    return True


def _prefill_request(a: dict[str, Any], r: int, req: int, start: int, n: int) -> None:
    ids, pos = flat(a["draft_input_ids_ptr"]), flat(a["draft_positions_ptr"])
    if int(flat(a["num_sampled_ptr"])[r]) > 0:
        token = int32(flat(a["last_sampled_ptr"])[req])
    else:
        token = flat(a["next_prefill_tokens_ptr"])[req]
    if n > 1:
        ids[start:start + n - 1] = flat(a["target_input_ids_ptr"])[start + 1:start + n]
    flat(a["last_token_indices_ptr"])[r] = start + n - 1
    ids[start + n - 1] = token
    if n > 0:
        pos[start:start + n] = flat(a["target_positions_ptr"])[start:start + n]
    flat(a["draft_query_start_loc_ptr"])[r] = start
    flat(a["draft_seq_lens_ptr"])[r] = flat(a["seq_lens_ptr"])[r]


def _prefill_pad(a: dict[str, Any], n: int, query_end: int) -> None:
    most = int(a["max_num_reqs"])
    flat(a["draft_current_step_ptr"])[0] = 0
    flat(a["draft_query_start_loc_ptr"])[n:most + 1] = query_end
    flat(a["draft_seq_lens_ptr"])[n:most] = 0
    flat(a["last_token_indices_ptr"])[n:most] = 0


def decode_inputs(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_prepare_decode_inputs_kernel``: each request's first draft as its input, its
    sampling key, position and sequence length advanced; the last program writes the query
    starts (one token each) and pads."""
    n, most, longest = grid[0] - 1, int(a["max_num_reqs"]), int(a["max_model_len"])
    drafts, ids, keys = flat(a["draft_tokens_ptr"]), flat(a["input_ids_ptr"]), \
        flat(a["sample_src_positions_ptr"])
    target, rejected = flat(a["target_seq_lens_ptr"]), flat(a["num_rejected_ptr"])
    pos, seq = flat(a["positions_ptr"]), flat(a["seq_lens_ptr"])
    for r in range(n):
        ids[r] = drafts[r * int(a["draft_tokens_stride"])]
        keys[r] += 1
        seq_len = int(target[r]) - int(rejected[r])
        if a["ADVANCE_DRAFT_POSITIONS"]:
            pos[r] = min(int(pos[r]) + 1, longest - 1)
            seq_len = min(seq_len + 1, longest)
        seq[r] = seq_len
    flat(a["query_start_loc_ptr"])[:most + 1] = np.minimum(np.arange(most + 1), n)
    seq[n:most] = 0
    return True


def update_draft_inputs(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_update_draft_inputs_kernel``: the sampled draft stored at the current step and, but
    for the last step, made the next step's input with its hidden state, key and position."""
    if a["hidden_states_ptr"].dtype != a["next_input_hidden_states_ptr"].dtype:
        return False  # a converting copy: the interpreter's float path, not a bit copy
    step = int(flat(a["current_draft_step_ptr"])[0])
    drafts, out = flat(a["draft_tokens_ptr"]), flat(a["output_draft_tokens_ptr"])
    for r in range(grid[0]):
        out[r * int(a["output_draft_tokens_stride"]) + step] = drafts[r]
        if step < a["num_speculative_steps"] - 1:
            _next_draft_input(a, r, drafts[r])
    return True


def _next_draft_input(a: dict[str, Any], r: int, token) -> None:
    flat(a["sample_src_positions_ptr"])[r] += 1
    flat(a["input_ids_ptr"])[r] = token
    size, src = int(a["hidden_size"]), r * int(a["hidden_states_stride"])
    dst = r * int(a["next_input_hidden_states_stride"])
    flat(a["next_input_hidden_states_ptr"])[dst:dst + size] = \
        flat(a["hidden_states_ptr"])[src:src + size]
    if a["ADVANCE_DRAFT_POSITIONS"]:
        longest = int(a["max_model_len"])
        pos, seq = flat(a["positions_ptr"]), flat(a["seq_lens_ptr"])
        pos[r] = min(int(pos[r]) + 1, longest - 1)
        seq[r] = min(int(seq[r]) + 1, longest)
