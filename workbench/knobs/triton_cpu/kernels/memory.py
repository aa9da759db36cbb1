"""What a kernel's pointers address, as numpy arrays over the same memory (no copies)."""

from __future__ import annotations

import numpy as np


def flat(t) -> np.ndarray:
    """The tensor's storage from its first element to the storage's end, as a numpy array:
    what ``ptr + i`` addresses in a kernel. bfloat16, which numpy lacks, comes as its bits
    (int16): right for copying, not for arithmetic (``as_f32``)."""
    import torch

    view = _to_storage_end(t)
    return (view.view(torch.int16) if t.dtype == torch.bfloat16 else view).numpy()


def _to_storage_end(t):
    """The 1-D tensor view from ``t``'s first element to its storage's end."""
    n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
    return t.as_strided((n,), (1,))


def flat_at(address: int, ctype, n: int) -> np.ndarray:
    """``n`` elements at a raw address (a pointer a kernel loads from a pointer table)."""
    return np.ctypeslib.as_array((ctype * n).from_address(address))


def as_f32(t) -> np.ndarray:
    """``flat`` read as float32, as ``tl.load(...).to(tl.float32)`` reads it (a copy unless
    the tensor is float32)."""
    import torch

    if t.dtype == torch.float32:
        return flat(t)
    return _to_storage_end(t).float().numpy()


def int32(x) -> np.int32:
    """``.to(tl.int32)`` of an integer: its low 32 bits."""
    return np.array(x).astype(np.int32)[()]
