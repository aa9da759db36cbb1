"""The stand-ins: one function per Triton kernel of vLLM 0.32.0's Model Runner V2, in a
module per vLLM module (``block_table``, ``input_batch``, ``rejection``, ``speculator``).

Each takes the launch's grid (three ints) and its arguments by name, and either writes what
the kernel writes and returns True, or returns False before writing anything (a case it does
not cover: the interpreter runs the launch). Each mirrors its kernel program by program, in
program order: the same pointer arithmetic on the arguments' storages (``memory.flat``),
numpy over the program's block where the interpreter does numpy over it (``np.nanmax`` and
``np.nanargmax`` for ``tl.max`` with indices and ``tl.argmax``, as
``triton.runtime.interpreter.ReduceOps`` does).

``Entry.sha256`` pins each to the kernel text it mirrors: a sha256 of the kernel's source and
of the ``@triton.jit`` helpers it calls, as ``inspect.getsource`` returns them. Another text
(another vLLM release) sends the launch to the interpreter; ``tests/pins`` fails first.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import block_table, input_batch, rejection, speculator
from .memory import flat

BLOCK_TABLE, REJECTION = block_table.MODULE, rejection.MODULE


@dataclass
class Entry:
    name: str  # module:qualname of the kernel
    fn: Callable[[tuple[int, int, int], dict[str, Any]], bool]
    sha256: str  # of the kernel's and its helpers' source
    helpers: tuple[str, ...] = ()
    _seen: dict[int, bool] = field(default_factory=dict, repr=False)

    def source_matches(self, kernel) -> bool:
        if id(kernel) not in self._seen:
            self._seen[id(kernel)] = source_sha256(kernel, self.helpers) == self.sha256
        return self._seen[id(kernel)]


def source_sha256(kernel, helpers: tuple[str, ...]) -> str:
    """The kernel's text and its helpers' (looked up in the kernel's module)."""
    fns = [kernel, *(kernel.__globals__[h] for h in helpers)]
    text = "".join(inspect.getsource(getattr(f, "fn", f)) for f in fns)
    return hashlib.sha256(text.encode()).hexdigest()


def _entries():
    b, r, i, s = block_table.MODULE, rejection.MODULE, input_batch.MODULE, speculator.MODULE
    return (
        Entry(f"{b}:_compute_slot_mappings_kernel", block_table.slot_mappings,
              "71e2f8ce757c54aa44508718efa7cb2a08ec81d2b8dfba46f26af7c66de10d74",
              helpers=("_load_ptr",)),
        Entry(f"{r}:_compute_local_logits_stats_kernel", rejection.local_logits_stats,
              "4d036d011e2231a349c316040ffaca838a532dc7f5b87f9e49b4e7ac44d5ffaf"),
        Entry(f"{r}:_rejection_kernel", rejection.rejection,
              "0bdaa28a9d9cf25d6723a25c0f3e67eef8e2297b861125489448d8c7c1e9b3f4",
              helpers=("_compute_global_target_argmax",)),
        Entry(f"{i}:_prepare_pos_seq_lens_kernel", input_batch.pos_seq_lens,
              "33c07567a9fe63e1744b02482a33d24fcf9a80983cbf3797a33410ef7192487a"),
        Entry(f"{i}:_combine_sampled_and_draft_tokens_kernel", input_batch.combine_tokens,
              "c02435e0be07b2faaf3470fdc5bb3da56fe3feeb84a6754edabeb8a4a9c9ffb5"),
        Entry(f"{i}:_get_num_sampled_and_rejected_kernel", input_batch.num_sampled_rejected,
              "17bfac5e1599de85b571ef87ebf3f903ff0059666bc126ec69a0fb0a93ce3880"),
        Entry(f"{i}:_post_update_kernel", input_batch.post_update,
              "1f8738a0c9e9928a4759df1b42a864d353daf89966051cc8abd96742fc99d4ec"),
        Entry(f"{i}:_expand_idx_mapping_kernel", input_batch.expand_idx_mapping,
              "7636f8d252d474bfcf2063d5d0909093055e6e73fffc3d910ac30c4d138caff4"),
        Entry(f"{s}:_prepare_prefill_inputs_kernel", speculator.prefill_inputs,
              "b09e3977036c8bde44aaf7b78915f0b9c311f3e45b660a7290cdf160378bfd0f"),
        Entry(f"{s}:_prepare_decode_inputs_kernel", speculator.decode_inputs,
              "3d1d578a2ad99a425000df0384ba9de0c42f1e57492e1cc7f8518e298a197ebb"),
        Entry(f"{s}:_update_draft_inputs_kernel", speculator.update_draft_inputs,
              "85b4cbc9847f4e27bcc289b87441e7cce135e1540cf24c0ece75dfc0f143b029"),
    )


STANDINS = {e.name: e for e in _entries()}
__all__ = ["BLOCK_TABLE", "REJECTION", "STANDINS", "Entry", "flat", "source_sha256"]
