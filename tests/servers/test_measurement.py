"""Counts from vLLM's per-request spec-decode metrics, under concurrency, cross-checked
against the servers' /metrics counters (real servers on the CPU)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from workbench.measuring import metrics, results

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def concurrent(pd_session, base_cfg):
    return pd_session.run(replace(base_cfg, concurrency=8))


def test_per_request_sums_equal_the_metrics_deltas_of_a_concurrent_run(concurrent):
    m = concurrent.measurement
    assert m["source"] == "per-request" and m["concurrency"] == 8
    assert m["crosscheck"] is True and m["crosscheck_mismatch"] == 0
    for side, roles in (("baseline", ("baseline",)), ("pd", ("d", "p"))):
        servers = m["sides"][side]["servers"]
        assert set(servers) == set(roles)
        delta = servers[roles[0]]["metrics_delta"]
        summed = metrics.total([q[side] for q in concurrent.requests]).summary()
        assert summed["num_drafts"] == delta["num_drafts"] > 0
        assert summed["accepted_per_pos"] == delta["accepted_per_pos"]  # per position
        assert summed["num_draft_tokens"] == delta["num_draft_tokens"]
    # P only prefills (max_tokens=1): no verify step, on either count
    assert m["sides"]["pd"]["servers"]["p"]["metrics_delta"]["num_drafts"] == 0


def test_a_corrupted_per_request_count_fails_the_crosscheck(concurrent):
    bad = copy.deepcopy(concurrent)
    bad.requests[3]["pd"]["accepted_per_pos"][1] += 1
    results.crosscheck(bad)
    assert bad.measurement["crosscheck"] is False
    assert bad.measurement["crosscheck_mismatch"] == 1
    assert bad.measurement["sides"]["pd"]["servers"]["d"]["mismatch"] == 1
    assert bad.measurement["sides"]["baseline"]["servers"]["baseline"]["mismatch"] == 0


def test_d_pads_its_first_step_per_request_visible_in_its_arrays(concurrent):
    """D's response holds one verify step more than the baseline's, at the start, with 0
    accepted: the scheduler's padded first step after the KV load (README)."""
    for q in concurrent.requests:
        # vLLM leaves the arrays out (None) for a request with no verify step at all
        d = q["pd_spec"]["per_step_accepted"] or []
        b = q["baseline_spec"]["per_step_accepted"] or []
        assert q["pd_tokens"] == q["baseline_tokens"], q["id"]
        assert d[:1] == [0] and d[1:] == b, (q["id"], d, b)
        assert q["extra_pd_drafts"] == 1


def test_concurrency_changes_no_token_and_no_count_with_every_fix_in_place(pd_session, base_cfg,
                                                                            concurrent):
    seq = pd_session.run(replace(base_cfg, concurrency=1))
    assert seq.measurement["concurrency"] == 1 and seq.measurement["crosscheck"] is True
    for a, b in zip(seq.requests, concurrent.requests, strict=True):
        assert a["baseline_tokens"] == b["baseline_tokens"], a["id"]
        assert a["pd_tokens"] == b["pd_tokens"], a["id"]
        for side in ("baseline", "pd"):
            assert a[side]["num_drafts"] == b[side]["num_drafts"], (a["id"], side)
            assert a[side]["accepted_per_pos"] == b[side]["accepted_per_pos"], (a["id"], side)
    assert seq.token_agreement == concurrent.token_agreement == 1.0


def test_intervals_and_the_paired_effect_are_in_the_result(concurrent, tmp_path):
    for side in (concurrent.baseline, concurrent.pd):
        for (low, high), rate in zip(side["per_position_ci95"], side["per_position"],
                                     strict=True):
            assert low <= rate <= high
    e = concurrent.effect
    assert len(e["per_position_diff"]) == len(e["verdict"]) == 3
    # Without D's padded first step, PD equals the baseline exactly (same tokens, same steps).
    assert e["without_extra_drafts"]["per_position_diff"] == [0.0, 0.0, 0.0]
    assert e["without_extra_drafts"]["verdict"] == ["within"] * 3
    # the headline reads within, the padding attributed request by request, the raw beside it
    assert all(q["padded_load_step"] for q in concurrent.requests)
    assert e["headline"]["verdict"] == ["within"] * 3 and e["headline"]["raw_verdict"] == e[
        "verdict"] and e["headline"]["attributed"] == ["padded-load-step"]
    assert concurrent.pd["padded_load_step_drafts"] == len(concurrent.requests)
    row = concurrent.summary_row()
    assert row["concurrency"] == 8 and row["measurement_source"] == "per-request"
    assert {"pd_pos0_ci95_low", "effect_pos0_verdict", "baseline_acceptance_length_ci95_high",
            "effect_without_extra_drafts_pos2_diff_ci95_high"} <= set(row)
