"""Stand-ins for ``vllm/v1/worker/gpu/block_table.py``'s kernels."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .memory import flat, flat_at

MODULE = "vllm.v1.worker.gpu.block_table"


def slot_mappings(grid: tuple[int, int, int], a: dict[str, Any]) -> bool:
    """``_compute_slot_mappings_kernel``: each request's slot per token, and the pad program
    (the last along axis 1) filling the rest with ``PAD_ID``. Covers ``CP_SIZE == 1``."""
    if a["CP_SIZE"] != 1:
        return False
    qsl, pos, idx = flat(a["query_start_loc"]), flat(a["pos"]), flat(a["idx_mapping"])
    n_req = grid[1] - 1
    if (pos[:qsl[n_req]] < 0).any() if n_req else False:
        return False  # integer division and modulo would need C semantics
    out = flat(a["slot_mappings_ptr"])
    for g in range(grid[0]):
        row = g * int(a["slot_mappings_stride"])
        for b in range(n_req):
            _slots_of_request(a, g, b, int(idx[b]), int(qsl[b]), int(qsl[b + 1]), out, row)
        out[row + int(qsl[n_req]):row + int(a["max_num_tokens"])] = a["PAD_ID"]
    return True


def _slots_of_request(a, g, b, req, start, end, out, row) -> None:
    if end <= start:
        return
    bs = int(flat(a["block_sizes"])[g])
    enabled = bool(flat(a["slot_mapping_enabled"])[g])
    positions = flat(a["pos"])[start:end]
    blocks = positions // bs if enabled else np.zeros_like(positions)
    numbers = np.zeros_like(positions)
    if req >= 0:
        stride = int(flat(a["block_table_strides"])[g])
        table = flat_at(int(flat(a["block_table_ptrs"])[g]) + req * stride * 4,
                        ctypes.c_int32, int(blocks.max()) + 1)
        numbers = table[blocks].astype(np.int32)
    slots = (numbers * np.int32(bs)).astype(np.int64) + positions % bs  # int32 product, as loaded
    out[row + start:row + end] = slots if (enabled and req >= 0) else a["PAD_ID"]
