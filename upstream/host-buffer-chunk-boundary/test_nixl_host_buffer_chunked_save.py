# SPDX-License-Identifier: Apache-2.0
# Location in vLLM's tree: tests/v1/kv_connector/unit/test_nixl_host_buffer_chunked_save.py
# Runs in seconds on a CPU: the scheduler and NixlConnector's scheduler side only, no model
# weights, no server. The model's config is read from VLLM_TEST_MODEL (a local directory for an
# offline run; default: the hub id vLLM's helpers use).
"""With a host staging buffer (``kv_buffer_device="cpu"``), the prefill instance copies a
request's blocks to the host at the end of the step listed in ``reqs_to_save``.
``NixlBaseConnectorScheduler._build_save_meta`` lists, per step, only the blocks newly
allocated in that step. A prefill split into chunks writes into a block in a later step than
the one that allocated it (a chunk that ends inside a block), so the copy of that block is
taken before its last write and the decode instance reads stale KV there.
"""

import os

from .utils import create_request, create_scheduler, create_vllm_config

BLOCK = 16
BUDGET = 24  # tokens per step: chunk boundaries inside blocks
PROMPT = 64
MODEL = os.environ.get("VLLM_TEST_MODEL", "facebook/opt-125m")


def test_every_block_is_saved_to_the_host_after_its_last_write():
    vllm_config = create_vllm_config(
        model=MODEL,
        block_size=BLOCK,
        max_num_batched_tokens=BUDGET,
        kv_role="kv_producer",
    )
    vllm_config.kv_transfer_config.kv_buffer_device = "cpu"
    scheduler = create_scheduler(vllm_config)
    # what a GPU with kv_buffer_device="cpu" runs (the CPU platform copies nothing)
    scheduler.connector.connector_scheduler.use_host_buffer = True

    request = create_request(num_tokens=PROMPT, do_remote_decode=True, block_size=BLOCK)
    scheduler.add_request(request)
    rid = request.request_id

    saved: dict[int, int] = {}  # block id -> the last step that lists it for the host copy
    written: dict[int, int] = {}  # block id -> the last step that writes one of its slots
    done, step = 0, 0
    while done < PROMPT:
        output = scheduler.schedule()
        n = output.num_scheduled_tokens.get(rid, 0)
        blocks = scheduler.kv_cache_manager.get_block_ids(rid)[0]
        for pos in range(done, done + n):
            written[blocks[pos // BLOCK]] = step
        meta = output.kv_connector_metadata.reqs_to_save.get(rid)
        for block_id in meta.local_block_ids[0] if meta is not None else ():
            saved[block_id] = step
        done += n
        step += 1

    stale = {b: (written[b], saved.get(b)) for b in written if saved.get(b, -1) < written[b]}
    assert not stale, (
        f"blocks copied to the host buffer before their last write "
        f"(block: (last step writing it, last step saving it)): {stale}; with chunks of "
        f"{BUDGET} tokens and blocks of {BLOCK}, expected each block saved in or after the "
        f"step that completes it"
    )
