# SPDX-License-Identifier: Apache-2.0
# Location in vLLM's tree: tests/v1/spec_decode/test_padded_partial_prefill_next_token.py
# Runs in seconds on a CPU: the proposer's input preparation, no weights loaded, no server.
# The target's and the EAGLE3 drafter's configs are read from VLLM_TEST_MODEL and
# VLLM_TEST_EAGLE3_MODEL (local directories for an offline run; default: the hub ids
# tests/v1/spec_decode/test_eagle.py uses). The proposer is built as that file's
# _create_proposer builds it; that file itself cannot be imported on a CPU (its attention
# backend list raises "Unsupported platform" at collection).
"""With the padded drafter batch (the default), a request whose prefill the scheduler splits
across steps is "discarded" in every step but its last, and
``prepare_next_token_ids_padded`` gives the drafter a backup next token,
``get_token_id(num_tokens_no_spec - 1)``: the prompt's last token. The unpadded path,
``prepare_next_token_ids_cpu``, takes ``get_token_id(num_computed_tokens +
num_scheduled_tokens)``: the token right after the chunk. The drafter writes its KV at the
chunk's last position with the token it is given, and the next chunk does not rewrite that
position, so every later draft of the request attends to a wrong entry.

The fix passes the chunk's end (the model runner's ``optimistic_seq_lens_cpu``) to
``prepare_next_token_ids_padded``; the test passes it where the function takes it, so the
same test runs before and after the fix.
"""

import inspect
import os
from unittest import mock

import numpy as np
import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    SpeculativeConfig,
    VllmConfig,
)
from vllm.platforms import current_platform
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

TARGET = os.environ.get("VLLM_TEST_MODEL", "meta-llama/Llama-3.1-8B-Instruct")
DRAFTER = os.environ.get("VLLM_TEST_EAGLE3_MODEL", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")
PROMPT_LEN = 10
CHUNK = 4  # the first step schedules prompt positions 0-3 of 10
FIRST_ID = 100  # prompt position i holds token FIRST_ID + i


def _proposer() -> EagleProposer:
    model = ModelConfig(model=TARGET, runner="generate", max_model_len=100)
    speculative = SpeculativeConfig(
        target_model_config=model,
        target_parallel_config=ParallelConfig(),
        model=DRAFTER,
        method="eagle3",
        num_speculative_tokens=3,
    )
    config = VllmConfig(
        model_config=model,
        cache_config=CacheConfig(block_size=16),
        speculative_config=speculative,
        device_config=DeviceConfig(device=current_platform.device_type),
        parallel_config=ParallelConfig(),
        scheduler_config=SchedulerConfig(
            max_model_len=model.max_model_len, is_encoder_decoder=False
        ),
    )
    return EagleProposer(vllm_config=config, device=current_platform.device_type)


def test_a_partial_prefill_drafts_from_the_token_after_its_chunk():
    proposer = _proposer()
    device = torch.device(current_platform.device_type)

    batch = mock.MagicMock(spec=InputBatch)
    batch.req_ids = ["req"]
    batch.num_reqs = 1
    batch.vocab_size = 1000
    batch.num_tokens_no_spec = np.array([PROMPT_LEN])
    state = mock.MagicMock(spec=CachedRequestState)
    state.get_token_id.side_effect = lambda i: FIRST_ID + i
    state.num_computed_tokens = 0
    requests = {"req": state}

    after_chunk = int(
        proposer.prepare_next_token_ids_cpu([[]], requests, batch, {"req": CHUNK})[0]
    )
    assert after_chunk == FIRST_ID + CHUNK  # the unpadded path: the token after the chunk

    padded = proposer.prepare_next_token_ids_padded
    extra = (
        {"seq_lens_cpu": torch.tensor([CHUNK], dtype=torch.int32)}
        if "seq_lens_cpu" in inspect.signature(padded).parameters
        else {}
    )
    next_ids, valid = padded(
        torch.full((1, 4), -1, dtype=torch.int32, device=device),  # nothing sampled
        requests,
        batch,
        torch.tensor([True], device=device),  # a partial prefill is discarded
        **extra,
    )
    got = int(next_ids[0])
    assert int(valid[0]) == 0
    assert got == after_chunk, (
        f"the padded drafter batch gave a partial prefill (a {PROMPT_LEN}-token prompt, "
        f"positions 0-{CHUNK - 1} scheduled) next token {got}, prompt position "
        f"{got - FIRST_ID} (the prompt's last); expected {after_chunk}, position {CHUNK} "
        f"(the token after the chunk, as prepare_next_token_ids_cpu gives): the drafter "
        f"writes its KV at position {CHUNK - 1} with it, and no later chunk rewrites it"
    )
