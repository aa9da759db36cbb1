# SPDX-License-Identifier: Apache-2.0
# Location in vLLM's tree: tests/v1/core/test_spec_decode_padding_not_counted.py
# Runs in seconds on a CPU: the scheduler with a mock KV connector, no model weights, no server.
# The model's config is read from VLLM_TEST_MODEL (a local directory for an offline run;
# default: the hub id vLLM's helpers use).
"""The first step after a KV load is a one-token step; ``Scheduler.schedule`` pads it
(``pad_spec_decode``) to ``1 + num_spec_tokens`` rows with ``-1`` placeholder drafts so the
batch stays uniform. Nothing proposed those drafts; the rejection sampler rejects them and
``update_from_output`` rolls them back, but also counts them as a draft with nothing
accepted, in ``SpecDecodingStats`` (the ``vllm:spec_decode_*`` counters) and in the request's
spec-decode metrics: a decode instance reports one draft per request more than a standalone
server, and lower per-position acceptance.
"""

import os

from tests.v1.kv_connector.unit.utils import create_model_runner_output

from .utils import create_requests, create_scheduler, mock_kv

NUM_SPEC = 3
MODEL = os.environ.get("VLLM_TEST_MODEL", "facebook/opt-125m")


def test_the_placeholder_drafts_of_a_padded_first_step_are_not_counted():
    scheduler = create_scheduler(
        model=MODEL,
        num_speculative_tokens=NUM_SPEC,
        use_kv_connector=mock_kv(matched_tokens=32, is_async=False),
    )
    (request,) = create_requests(num_requests=1, num_tokens=33, max_tokens=16)
    scheduler.add_request(request)
    output = scheduler.schedule()
    assert output.scheduled_spec_decode_tokens[request.request_id] == [-1] * NUM_SPEC

    # The rejection sampler rejects every placeholder: one token comes back.
    outputs = scheduler.update_from_output(
        output, create_model_runner_output([request], token_id=42)
    )
    stats = outputs[0].scheduler_stats.spec_decoding_stats if outputs else None
    drafts = stats.num_drafts if stats is not None else 0
    assert drafts == 0, (
        f"the padded first step after the KV load counted {drafts} draft(s) "
        f"({stats.num_draft_tokens} draft tokens, {stats.num_accepted_tokens} accepted); "
        f"expected none: its {NUM_SPEC} drafts are placeholders nobody proposed"
    )
