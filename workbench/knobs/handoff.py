"""Knob ``block_handoff``: the block ids P hands to the connector on finish (engine core, P).

clipped: vLLM untouched: ``KVCacheManager.get_block_ids_for_computed_tokens`` clips each
         attention group to ``cdiv(num_computed_tokens, block_size)`` blocks.
legacy:  the pre-0.25 behaviour: it returns every block of the request
         (``self.get_block_ids(request_id)``), lookahead blocks included, so D's
         ``prefill_blocks[-num_decode_blocks:]`` keeps the wrong tail when P has more blocks.

The wrapper always computes both lists and counts, per version: hand-offs performed,
how many of them handed more blocks than computed (legacy) or would have (clipped), and
the last few (block counts handed vs computed). The knob table makes it act on role ``p``
only; elsewhere the component applies ``clipped`` and notes why.
"""

from __future__ import annotations

from typing import Any

from . import _patch
from .component import Component, running

TARGETS = (
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "get_block_ids_for_computed_tokens",
     ["self", "request_id", "num_computed_tokens"]),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "get_block_ids",
     ["self", "request_id"]),
)
# The clipped hand-off the knob undoes, and the scheduler's call to it on request finish.
SOURCE = (
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager.get_block_ids_for_computed_tokens",
     ("self.get_block_ids(request_id)", "cdiv(num_computed_tokens")),
    ("vllm.v1.core.sched.scheduler", "Scheduler", ("get_block_ids_for_computed_tokens(",)),
)

_state = {"legacy": False}


def install(comp: Component) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    def make(orig):
        def get_block_ids_for_computed_tokens(self, request_id, num_computed_tokens):
            clipped = orig(self, request_id, num_computed_tokens)
            comp = running("engine_core")
            if comp is None:
                return clipped
            full = self.get_block_ids(request_id)
            handed = full if _state["legacy"] else clipped
            n_clipped = [len(g) for g in clipped]
            n_handed = [len(g) for g in handed]
            comp.bump("block_handoff", "handoffs")
            if _state["legacy"]:
                comp.bump("block_handoff", "legacy_handoffs")
            if n_handed != n_clipped:
                comp.bump("block_handoff", "handoffs_with_extra_blocks")
                comp.bump("block_handoff", "extra_blocks_handed",
                          sum(a - b for a, b in zip(n_handed, n_clipped, strict=True)))
            elif [len(g) for g in full] != n_clipped:
                comp.bump("block_handoff", "clipped_away_extra_blocks")
            comp.append("block_handoff", "recent", {
                "request_id": str(request_id),
                "num_computed_tokens": int(num_computed_tokens),
                "blocks_computed": n_clipped,
                "blocks_allocated": [len(g) for g in full],
                "blocks_handed": n_handed,
            })
            return handed

        return get_block_ids_for_computed_tokens

    _patch.patch(KVCacheManager, "get_block_ids_for_computed_tokens", make)


def apply(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    value = knobs["block_handoff"]
    _state["legacy"] = value == "legacy"
    return value, {"handoffs": 0, "legacy_handoffs": 0, "handoffs_with_extra_blocks": 0,
                   "extra_blocks_handed": 0, "mode": value}
