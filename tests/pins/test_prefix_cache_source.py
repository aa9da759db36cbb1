"""The source facts behind ``prefix-cache-drafter-kv`` in the installed vLLM: a block hash
covers the block's own tokens only, ``BlockPool`` keeps several blocks under one hash and
hands out the first, and the EAGLE drop removes only the last block of a hit. When one of
them changes, the finding's explanation (docs/findings.md) must be read again."""

from __future__ import annotations

import inspect

from vllm.v1.core import block_pool, kv_cache_coordinator, kv_cache_utils


def test_the_pool_keeps_duplicates_under_one_hash_and_hands_out_the_first():
    src = inspect.getsource(block_pool)
    assert "If there are duplicated blocks, we return the first block in the cache." in src
    assert "return next(iter(blocks.values()))" in inspect.getsource(
        block_pool.BlockHashToBlockMap.get_one_block)


def test_the_eagle_drop_takes_only_the_last_block_of_a_hit():
    src = inspect.getsource(kv_cache_coordinator)
    assert "# EAGLE matches one block past the aligned boundary, then drops it." in src


def test_a_block_hash_is_made_of_its_parent_its_own_tokens_and_extra_keys_only():
    # no next token among them (the lookahead-aware hash of vLLM RFC #50438 would add one)
    params = list(inspect.signature(kv_cache_utils.hash_block_tokens).parameters)
    assert params == ["hash_function", "parent_block_hash", "curr_block_token_ids",
                      "extra_keys"]
