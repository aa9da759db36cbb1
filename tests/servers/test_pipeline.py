"""The real PD + EAGLE3 pipeline on the CPU: parity with the baseline, exact counter deltas."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from workbench.measuring import metrics

pytestmark = pytest.mark.vllm


def test_pd_matches_baseline_token_for_token_and_per_position(pd_session, base_cfg, tmp_path):
    r = pd_session.run(base_cfg, out_dir=tmp_path)
    assert r.num_prompts >= 16 and r.complete
    assert r.token_agreement == 1.0, [(q["id"], q["first_diff"]) for q in r.requests
                                      if not q["agree"]]
    assert r.pd["num_drafts"] > 0 and r.baseline["num_drafts"] > 0
    # Request by request, D accepts exactly what the baseline accepts at every position.
    for q in r.requests:
        assert q["pd"]["accepted_per_pos"] == q["baseline"]["accepted_per_pos"], q["id"]
        # vLLM 0.32 on D counts one more draft per request, all rejected: its first decode step
        # after the KV load (with max_tokens=1, D counts 1 draft and the baseline 0).
        assert q["extra_pd_drafts"] == 1, q
    # Without those drafts PD equals the baseline within 2% at every position; vLLM's raw
    # rates on D are lower by exactly extra / num_drafts (reported, not hidden).
    n, extra = r.pd["num_drafts"], r.pd["extra_drafts_vs_baseline"]
    for pos, (adj, raw, base_rate) in enumerate(zip(r.pd["per_position_without_extra_drafts"],
                                                    r.pd["per_position"],
                                                    r.baseline["per_position"], strict=True)):
        assert adj == pytest.approx(base_rate, rel=0.02, abs=1e-12), (pos, r.pd, r.baseline)
        assert raw == pytest.approx(base_rate * (n - extra) / n, rel=1e-9, abs=1e-12)
    assert any("more drafts than the baseline" in note for note in r.notes)
    # Knob values are read back from the servers' processes, not echoed from the request.
    for role in ("p", "d", "baseline"):
        assert r.knobs[role]["finalize"] == "deferred", r.knobs
    saved = (tmp_path / "result.json").read_text()
    for key in ("config", "vllm_version", "pd", "baseline", "token_agreement", "num_prompts",
                "wall_seconds", "knobs", "requests"):
        assert f'"{key}"' in saved


def d_counters(session) -> metrics.SpecCounters:
    """D's counters now (the workbench scrapes asynchronously; a test needs one read)."""
    r = httpx.get(f"{session.servers['d'].url}/metrics", timeout=10)
    r.raise_for_status()
    return metrics.parse(r.text)


def test_consecutive_runs_report_only_their_own_drafts(pd_session, base_cfg):
    cfg = replace(base_cfg, num_prompts=4)
    a = pd_session.run(cfg)
    d_before = d_counters(pd_session)
    b = pd_session.run(cfg)
    d_after = d_counters(pd_session)
    # Same prompts, greedy, prefix caches reset: the second run sees exactly what the first saw,
    # not the first run's drafts plus its own.
    assert a.pd["num_drafts"] == b.pd["num_drafts"] > 0
    assert a.baseline["num_drafts"] == b.baseline["num_drafts"] > 0
    assert a.pd["accepted_per_pos"] == b.pd["accepted_per_pos"]
    # The per-request deltas add up to D's whole-run delta: nothing missed, nothing extra.
    whole = d_after - d_before
    assert b.pd["num_drafts"] == whole.num_drafts
    assert b.pd["accepted_per_pos"] == [int(x) for x in whole.accepted_per_pos]
    # The prefix caches were reset between the runs: the repeated prompts found nothing cached.
    assert b.baseline["prefix_cache_hits"] == 0


def test_own_servers_run_without_dev_mode_and_reset_through_the_knob_channel(pd_session,
                                                                            base_cfg):
    """No /collective_rpc (any worker method by name) and no /reset_prefix_cache on the
    workbench's own servers; each run's control version reset every engine core's cache."""
    r = pd_session.run(replace(base_cfg, num_prompts=2, max_tokens=4))
    for role, server in pd_session.servers.items():
        for path in ("/collective_rpc", "/reset_prefix_cache"):
            got = httpx.post(f"{server.url}{path}", json={"method": "x"}, timeout=10)
            assert got.status_code == 404, (role, path, got.status_code)
        events = r.knobs["detail"][role]["components"]["engine_core"]["events"]
        assert events["prefix_cache_reset"] is True, role
    assert not any("NOT reset" in n for n in r.notes)


def test_a_new_version_waits_for_p_to_free_blocks_d_has_not_read_yet(pd_session, base_cfg):
    """P keeps a finished prefill's blocks until D has read them (vLLM's delayed free), and vLLM
    refuses a prefix-cache reset while any block is held: the version's reset waits for D.
    Here D reads 2 s after the new version is written; the reset must succeed, not give up."""
    import threading
    import time

    from workbench.measuring import measure
    from workbench.serving import proxy

    body = {**measure.request_body(base_cfg), "max_tokens": 2,
            "prompt": "def held_blocks(x):\n    return x\n" * 12}
    pd_session.ensure(base_cfg)
    p, d = pd_session.servers["p"].url, pd_session.servers["d"].url
    headers = {"X-Request-Id": "wb-held-blocks"}
    p_resp = httpx.post(f"{p}/v1/completions", json=proxy.prefill_request(body),
                        headers=headers, timeout=60).json()
    late = threading.Thread(target=lambda: (time.sleep(2.0), httpx.post(
        f"{d}/v1/completions", json=proxy.decode_request(body, p_resp), headers=headers,
        timeout=60)))
    late.start()
    try:
        knobs = pd_session.apply_knobs(base_cfg)
    finally:
        late.join()
    events = knobs["detail"]["p"]["components"]["engine_core"]["events"]
    assert events["prefix_cache_reset"] is True, events
    assert events["prefix_cache_reset_wait_s"] >= 1.0, events


def test_each_worker_computes_on_its_own_cores_after_nixl_moved_it(pd_session, base_cfg):
    """vLLM's CPU NIXL worker moves the forward thread to the last core
    (``NixlBaseConnectorWorker.__init__``: ``os.sched_setaffinity(0, ...)``); the CPU profile
    puts it back on the cores ``VLLM_CPU_OMP_THREADS_BIND`` gave the server, so P does not
    compute on D's core."""
    import os

    from workbench.knobs.cpu_pin import parse_cpus

    pd_session.ensure(base_cfg)
    state = pd_session.in_force()
    last = max(os.sched_getaffinity(0))
    for role, server in pd_session.servers.items():
        info = state[role]["components"]["worker"]["info"]
        bound = sorted(parse_cpus(server.spec.cpus))
        assert info["main_thread_cpus"] == bound, (role, info)
        if role in ("p", "d"):  # the connector's choice: the last core of the NUMA node
            assert last in info["main_thread_cpus_vllm"], (role, info)
    assert state["p"]["components"]["worker"]["info"]["main_thread_cpus"] != \
        state["d"]["components"]["worker"]["info"]["main_thread_cpus"]


def test_extra_draft_on_d_is_the_schedulers_spec_decode_padding(pd_session, base_cfg, tmp_path,
                                                                 monkeypatch):
    """D's one extra, all-rejected draft per request comes from vLLM's scheduler padding D's
    first one-token step after the KV load with placeholder drafts (``pad_spec_decode`` in
    ``vllm/v1/core/sched/scheduler.py``, skipped when dynamic speculative decoding is on).
    A second P/D pair whose D sets ``num_speculative_tokens_per_batch_size`` (same k=3 at
    every batch size, so nothing else changes) must count exactly the baseline's drafts."""
    import json

    from workbench.experiment import Session
    from workbench.serving import plan

    cfg = replace(base_cfg, num_prompts=8, max_tokens=32)
    ref = pd_session.run(cfg)
    plain = plan.server_specs

    def specs(c, *args, **kwargs):
        out = plain(c, *args, **kwargs)
        for spec in out:
            if spec.role == "d":
                sc = {"method": "eagle3", "model": str(spec.drafter), "num_speculative_tokens": 3,
                      "num_speculative_tokens_per_batch_size": [[1, 256, 3]]}
                spec.extra_args = ["--speculative-config", json.dumps(sc)]  # the last one wins
        return out

    monkeypatch.setattr(plan, "server_specs", specs)
    with Session(tmp_path / "unpadded") as s:
        r = s.run(replace(cfg, run_baseline=False))
        d_argv = s.servers["d"].spec.command()
    assert "num_speculative_tokens_per_batch_size" in d_argv[-1]
    assert [q["id"] for q in r.requests] == [q["id"] for q in ref.requests]
    for a, b in zip(ref.requests, r.requests, strict=True):
        assert a["pd"]["num_drafts"] == a["baseline"]["num_drafts"] + 1, a["id"]
        assert b["pd"]["num_drafts"] == a["baseline"]["num_drafts"], b["id"]
        assert b["pd"]["accepted_per_pos"] == a["baseline"]["accepted_per_pos"], b["id"]
        assert b["pd_tokens"] == a["baseline_tokens"], b["id"]


def test_load_step_gated_async_removes_ds_padded_draft_and_the_prs_gate_never_fires(pd_session,
                                                                                    base_cfg):
    """vLLM PR #50173 as a knob. ``gated`` (the PR as written: synchronous loads only) changes
    nothing under NIXL, which loads asynchronously: no pass gated, one padded draft per request
    on D, a note says why. ``gated-async`` gates D's first step after the load lands: D counts
    the baseline's drafts exactly, per request, with the same tokens and accepted counts."""
    cfg = replace(base_cfg, num_prompts=8, max_tokens=32)
    runs, events = {}, {}
    for v in ("gated", "gated-async"):
        runs[v] = r = pd_session.run(replace(cfg, knobs={**cfg.knobs, "load_step": v}))
        assert r.knobs["d"]["load_step"] == v and r.token_agreement == 1.0, (v, r.knobs["d"])
        events[v] = pd_session.in_force()["d"]["components"]["engine_core"]["events"][
            "load_step"]
    gated, fixed = runs["gated"], runs["gated-async"]
    assert all(q["extra_pd_drafts"] == 1 for q in gated.requests), gated.requests
    assert any("PR #50173 as written" in n for n in gated.notes)
    assert events["gated"]["gated_passes"] == 0, events
    assert events["gated"]["load_steps"] == events["gated"]["load_steps_padded"] == 8, events
    for q in fixed.requests:
        assert q["pd"]["num_drafts"] == q["baseline"]["num_drafts"], q["id"]
        assert q["pd"]["accepted_per_pos"] == q["baseline"]["accepted_per_pos"], q["id"]
    assert fixed.pd["num_drafts"] == fixed.baseline["num_drafts"]
    assert not any("more drafts than the baseline" in n for n in fixed.notes)
    ev = events["gated-async"]
    assert ev["load_steps"] == ev["gated_passes"] == 8 and ev["load_steps_padded"] == 0, ev
