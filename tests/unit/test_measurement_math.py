"""Per-request counts from vLLM's per-step arrays, the cross-check against /metrics deltas,
and the concurrency setting (pure logic, typed-in numbers)."""

from __future__ import annotations

import pytest

from workbench.config import ConfigError, ExperimentConfig
from workbench.knobs import spec
from workbench.knobs.notes import knob_notes
from workbench.measuring import metrics, results
from workbench.measuring.measure import spec_metrics

# D's padded first step (0 accepted), then steps accepting 2, 0, 3 and 1 of k=3 drafts.
SD = {"num_spec_tokens": 3, "num_spec_steps": 5, "per_step_accepted": [0, 2, 0, 3, 1],
      "per_step_drafted": [3, 3, 3, 3, 3]}


def test_counts_follow_vllms_observe_draft():
    c = metrics.counts_from_steps(SD)
    assert c["num_drafts"] == 5 and c["num_draft_tokens"] == 15 and c["num_accepted"] == 6
    # position i counts a step when it accepted more than i tokens
    assert c["accepted_per_pos"] == [3, 2, 1]
    assert c["per_position"] == [0.6, 0.4, 0.2]
    assert c["prefix_cache_hits"] is None  # not per request


def test_mismatch_is_the_largest_count_difference():
    one = metrics.counts_from_steps(SD)
    delta = metrics.total([one, one]).summary()
    assert metrics.mismatch([one, one], delta) == 0
    off = {**delta, "accepted_per_pos": [6, 4, 4]}
    assert metrics.mismatch([one, one], off) == 2
    assert metrics.mismatch([one], delta) == 15  # a missing request: its 15 draft tokens


def test_crosscheck_of_a_result_turns_false_on_a_corrupted_row():
    row = {"pd": metrics.counts_from_steps(SD), "p_spec": None}
    delta = metrics.total([row["pd"]]).summary()
    r = results.Result(config={}, command="", vllm_version="", git_commit="", created="",
                       prompt_set="", num_prompts=1, wall_seconds=0, engine_seconds=0, knobs={},
                       pd=None, baseline=None, token_agreement=None, requests=[row],
                       measurement={"sides": {"pd": {"source": "per-request", "servers": {
                           "d": {"metrics_delta": delta},
                           "p": {"metrics_delta": metrics.SpecCounters().summary()}}}}})
    results.crosscheck(r)
    assert r.measurement["crosscheck"] is True and r.measurement["source"] == "per-request"
    row["pd"]["accepted_per_pos"][2] += 1
    results.crosscheck(r)
    assert r.measurement["crosscheck"] is False and r.measurement["crosscheck_mismatch"] == 1


@pytest.mark.parametrize("response, has", [
    ({"metrics": {"speculative_decoding": SD}}, True),
    ({"metrics": None}, False),
    ({}, False),
    ({"metrics": {"speculative_decoding": {**SD, "per_step_accepted": None}}}, False),  # summary
    ({"metrics": {"speculative_decoding": {"num_spec_tokens": 3, "num_spec_steps": 0}}}, True),
])
def test_per_request_metrics_are_read_defensively(response, has):
    assert (spec_metrics(response) is not None) == has


@pytest.mark.parametrize("bad", [0, -2, True, "8", 2.5])
def test_concurrency_must_be_a_positive_integer(bad):
    with pytest.raises(ConfigError, match=f"concurrency={bad!r}"):
        ExperimentConfig(require_models=False, concurrency=bad)


def test_bug_settings_under_load_say_their_outputs_depend_on_the_batch():
    def notes(c, **k):
        return knob_notes({**spec.defaults(), **k}, device="cpu", prompt_set="lastblock",
                          enforce_eager=True, concurrency=c)

    assert not any("concurrency" in n for n in notes(32))  # every fix in place
    assert not any("concurrency" in n for n in notes(1, block_handoff="legacy"))
    assert any(n.startswith("concurrency 32:") for n in notes(32, block_handoff="legacy"))
    assert any(n.startswith("concurrency 8:") for n in notes(8, transfer="host-staged"))
    assert not any("concurrency" in n
                   for n in notes(32, block_handoff="legacy", prefill_lookahead="0"))
