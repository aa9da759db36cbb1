# SPDX-License-Identifier: Apache-2.0
# Location in vLLM's tree: tests/v1/kv_connector/unit/test_example_connector_chunked_store.py
# Runs in seconds on a CPU: the scheduler and ExampleConnector's scheduler side only, no model
# weights, no server. The model's config is read from VLLM_TEST_MODEL (a local directory for an
# offline run; default: the hub id vLLM's helpers use).
"""ExampleConnector adds a request's store only in the step where it is a new request
(``build_connector_meta`` reads ``scheduled_new_reqs``), with that step's ``block_ids``. A
prompt the scheduler splits into chunks is stored from its first chunk's blocks only, while a
later load of the same prompt reads ``align_to_block_size(len(prompt))`` positions: the load
fails on the shapes (the decode engine dies), or, where the first step's blocks (with
speculative lookahead slots) cover the aligned prompt, it loads positions the prefill had not
computed when they were saved.
"""

import os

from .utils import create_request, create_scheduler, create_vllm_config

BLOCK = 16
BUDGET = 64  # tokens per step: a 150-token prompt runs in three chunks
PROMPT = 150
MODEL = os.environ.get("VLLM_TEST_MODEL", "facebook/opt-125m")


def test_a_chunked_prompt_is_stored_whole_and_only_once_computed(tmp_path):
    vllm_config = create_vllm_config(
        model=MODEL,
        block_size=BLOCK,
        max_num_batched_tokens=BUDGET,
        kv_connector="ExampleConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    scheduler = create_scheduler(vllm_config)
    request = create_request(num_tokens=PROMPT, block_size=BLOCK)
    scheduler.add_request(request)

    aligned = (PROMPT - 1) // BLOCK * BLOCK  # what a load of this prompt reads
    stores = []  # (positions stored, positions computed by the end of that step)
    done = 0
    while done < PROMPT:
        output = scheduler.schedule()
        done += output.num_scheduled_tokens.get(request.request_id, 0)
        for meta in output.kv_connector_metadata.requests:
            if meta.is_store:
                stores.append((len(meta.slot_mapping), done))

    assert stores, "the prompt was never stored"
    stored, computed = max(stores)
    assert stored >= aligned and computed >= stored, (
        f"the prompt ({PROMPT} tokens, run {BUDGET} a step) was stored as {stored} positions "
        f"when {computed} were computed; a load of it reads {aligned}: expected a store of "
        f"{aligned} positions made once they were computed"
    )
