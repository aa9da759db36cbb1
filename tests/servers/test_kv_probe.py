"""The KV probe on real vLLM servers on the CPU (the shared Session): each mechanism's KV
signature, and that the probe observes without changing anything.

The host-staging signature needs restarted servers: it is in ``test_knob_effects.py`` with
the other host-staged tests (``test_eager_finalize_with_host_staging_...``).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

pytestmark = pytest.mark.vllm


def knobs(cfg, **kv):
    return replace(cfg, knobs={**cfg.knobs, **kv})


def probes(r):
    out = [q for q in r.requests if q.get("kv_probe")]
    assert len(out) == len(r.requests), "D captured every PD request"
    return out


def groups(q, ref):
    return set(q["kv_probe"][ref]["groups_differing"])


@pytest.fixture(scope="module")
def fixed(pd_session, base_cfg):
    cfg = replace(base_cfg, prompt_set="badcase", num_prompts=8, max_tokens=16)
    return cfg, pd_session.run(replace(cfg, kv_probe=True)), pd_session.run(cfg)


def test_probe_changes_nothing_it_observes(fixed):
    _, on, off = fixed
    assert on.kv_probe_summary and off.kv_probe_summary is None
    for a, b in zip(on.requests, off.requests, strict=True):
        assert a["pd_tokens"] == b["pd_tokens"] and a["baseline_tokens"] == b["baseline_tokens"]
        assert a["pd"]["accepted_per_pos"] == b["pd"]["accepted_per_pos"], a["id"]
        assert a["pd"]["num_drafts"] == b["pd"]["num_drafts"], a["id"]
        assert "kv_probe" not in b


def test_a_run_without_the_probe_captures_nothing(pd_session, fixed):
    """Off, the workers' hooks only test a flag: nothing captured, nothing kept."""
    replies = pd_session.channel.kv_probe(pd_session.servers, {"op": "records"})
    assert {r["role"] for r in replies} == {"p", "d", "baseline"}
    for reply in replies:
        assert not reply["enabled"] and reply["records"] == [] and reply["snapshot_bytes"] == 0


def test_every_fix_in_place_d_equals_p_and_the_baseline_bit_for_bit(fixed):
    _, on, _ = fixed
    for q in probes(on):
        pr = q["kv_probe"]
        assert pr["vs_p"]["identical"], (q["id"], pr["vs_p"]["first_differing"])
        assert pr["vs_baseline"]["identical"], (q["id"], pr["vs_baseline"]["first_differing"])
        assert pr["positions_compared"] == q["prompt_len"]
        assert set(pr["layers"].values()) == {"target", "drafter"}
    s = on.kv_probe_summary
    assert s["target"]["vs_baseline"]["affected"]["share"] == 0.0
    assert s["cost"]["captured"] == {"p": 8, "d": 8, "baseline": 8}


def test_legacy_handoff_shifts_d_by_one_block_for_exactly_the_affected(pd_session, fixed):
    cfg, _, _ = fixed
    r = pd_session.run(replace(knobs(cfg, block_handoff="legacy"), kv_probe=True))
    hit = [q for q in probes(r) if q["affected"]]
    clean = [q for q in probes(r) if not q["affected"]]
    assert hit and clean
    for q in hit:
        pr = q["kv_probe"]
        assert groups(q, "vs_baseline") == {"target", "drafter"}, q["id"]
        assert pr["vs_baseline"]["first_differing"]["position"] == 0, q["id"]
        # Block for block, D holds what P sent under P's numbering: P's list shifted by one.
        assert pr["vs_p"]["block_shift"] == 1, q["id"]
    for q in clean:
        assert q["kv_probe"]["vs_baseline"]["identical"], q["id"]
        assert q["kv_probe"]["vs_p"]["identical"], q["id"]


def test_last_block_handoff_two_blocks_differ_and_the_last_follows_the_fill(pd_session,
                                                                              base_cfg):
    """Measured (the issue predicted the last block only): D's prefix cache covers all but
    the last two blocks (the last prompt token is recomputed and, with EAGLE, the last matched
    block is not reused), so D loads two blocks and keeps P's tail: its second-last block is
    P's last real block (shifted, the same in every fill), its last is P's never-written
    lookahead block, whose difference from the baseline grows with what the fill wrote."""
    cfg = replace(base_cfg, prompt_set="lastblock", num_prompts=4, max_tokens=8)
    last_block = {}
    for blocks in ("zeroed", "poisoned"):
        r = pd_session.run(replace(knobs(cfg, block_handoff="legacy", blocks=blocks),
                                   kv_probe=True))
        sizes = []
        for q in probes(r):
            base = q["kv_probe"]["vs_baseline"]
            last = (q["prompt_len"] - 1) // cfg.block_size
            assert set(base["groups_differing"]) == {"target", "drafter"}, q["id"]
            for layer, blks in base["blocks_differing"].items():
                assert blks == [last - 1, last], (q["id"], layer, blks)
            assert base["first_differing"]["position"] == (last - 1) * cfg.block_size
            sizes += [per[str(last)] for per in base["max_abs_diff_per_block"].values()]
        last_block[blocks] = min(sizes)
    assert last_block["poisoned"] > 10 * last_block["zeroed"], last_block
