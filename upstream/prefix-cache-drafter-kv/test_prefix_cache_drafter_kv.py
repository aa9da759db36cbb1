# SPDX-License-Identifier: Apache-2.0
# Location in vLLM's tree: tests/v1/core/test_prefix_cache_drafter_kv.py
# Runs in seconds on a CPU: no model, no server; the block pool and the KV cache manager only.
"""With EAGLE, a cached block's last slot holds drafter KV computed from the token *after*
the block, which the block hash does not include. ``FullAttentionManager`` drops the last
block of a hit under ``use_eagle`` and recomputes it, so a request that continues a cached
prompt (A, then A + tail) caches a second block under the same hash, holding the right
drafter KV for the tail. ``BlockHashToBlockMap.insert`` keeps both and
``BlockPool.get_cached_block`` hands out the first: a third request continuing the same way
(A + tail + more) is given A's block, whose drafter KV at the last slot was computed with
A's sampled token, not with the tail's first token.
"""

from tests.v1.core.test_prefix_caching import (  # noqa: F401 - the autouse hash fixture
    _auto_init_hash_fn,
    make_kv_cache_config,
    make_kv_cache_manager,
    make_request,
)
from vllm.utils.hashing import sha256

BLOCK = 16


def _run(manager, req) -> list[int]:
    """Schedule the whole prompt of ``req`` (its hit, then the rest) and free it."""
    computed, num_computed, _ = manager.get_computed_blocks(req)
    blocks = manager.allocate_slots(
        req, len(req.all_token_ids) - num_computed, num_computed, computed
    )
    assert blocks is not None
    ids = list(manager.get_block_ids(req.request_id)[0])
    manager.free(req)
    return ids


def test_a_continued_prompt_reuses_the_block_computed_for_its_continuation():
    manager = make_kv_cache_manager(
        make_kv_cache_config(BLOCK, 64),
        max_model_len=8192,
        enable_caching=True,
        hash_block_size=BLOCK,
        use_eagle=True,
    )
    a = [i for i in range(4) for _ in range(BLOCK)]  # prompt A: exactly four blocks
    tail = [100 + i for i in range(BLOCK + 5)]  # one full block past A, and a partial one

    first = _run(manager, make_request("a", a, BLOCK, sha256))
    second = _run(manager, make_request("a+tail", a + tail, BLOCK, sha256))
    assert second[3] != first[3], "EAGLE's drop should have recomputed A's last block"

    third = make_request("a+tail+more", a + tail + [7] * BLOCK, BLOCK, sha256)
    computed, _, _ = manager.get_computed_blocks(third)
    hit = list(computed.get_block_ids()[0])
    # Any fix will do: hand out the tail's own block 3, or recompute it; never A's.
    assert len(hit) <= 3 or hit[3] != first[3], (
        f"block 3 of a prompt that continues A with the tail came back as block {hit[3]}, "
        f"the one cached for A alone (its last drafter slot computed from A's sampled "
        f"token); expected block {second[3]} (computed with the tail's first token) or a "
        f"recompute"
    )
