"""The workbench's findings, one module each, registered here in the order ``check`` runs them.

Regressions (``unclipped_handoff``, ``stale_last_block``, ``eager_finalize_host_staged``) are
bugs the knobs re-create: their as-released run must stay ``absent``, and the knob is their
positive control. Only what a vLLM build can change is a finding here: the client's double BOS
(knob ``double_bos``) is the workbench's own prompt building, pinned by its unit tests.

``python -m workbench check`` runs them on the installed vLLM build (``check.py``); each
finding's module says what vLLM does and where, the experiment that shows it and its detector
(``finding.Finding``).
"""

from __future__ import annotations

from . import (
    chunked_prefill_drafter_kv,
    eager_finalize_host_staged,
    example_chunked_store,
    host_buffer_chunk_boundary,
    nixl_cpu_forward_thread,
    padded_load_step,
    prefix_cache_drafter_kv,
    stale_last_block,
    unclipped_handoff,
)
from .finding import Finding

FINDINGS: dict[str, Finding] = {f.id: f for f in (
    padded_load_step.FINDING,
    nixl_cpu_forward_thread.FINDING,
    unclipped_handoff.FINDING,
    stale_last_block.FINDING,
    chunked_prefill_drafter_kv.FINDING,
    eager_finalize_host_staged.FINDING,
    host_buffer_chunk_boundary.FINDING,
    prefix_cache_drafter_kv.FINDING,
    example_chunked_store.FINDING,
)}
