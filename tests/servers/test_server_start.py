"""Servers forked from the zygote (``serving/zygote.py``, ``knobs/fork_start.py``) compute what
servers started as vLLM starts them on a CPU compute: a fresh forked baseline against a fresh
spawned one on the same prompts, token for token, count for count and KV digest for KV digest,
with the same OpenMP threads on the same cores. (P and D equal their own baseline bit for bit in
``test_kv_probe.py``; the shared session's forked P and D workers' threads and cores are checked
here too.) A fresh baseline on both sides: the shared session's baseline, after the suite's
earlier runs, gave other target-layer digests for 2 of 8 prompts than a fresh server (not yet
explained)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workbench.experiment import Session
from workbench.serving.servers import START_ENV

pytestmark = pytest.mark.vllm


def _run(session, cfg, monkeypatch):
    """The run's result and every KV digest its probe records (the run's own fetch, before
    it clears them)."""
    replies = []
    ask = session.channel.kv_probe

    def keep(servers, request, **kw):
        out = ask(servers, request, **kw)
        replies.extend(out if request.get("op") == "records" else [])
        return out

    monkeypatch.setattr(session.channel, "kv_probe", keep)
    result = session.run(cfg)
    return result, {(r["role"], rec["key"], name): layer["digests"] for r in replies
                    for rec in r["records"] for name, layer in rec["layers"].items()}


def _workers(result) -> dict[str, dict]:
    detail = result.knobs["detail"]
    return {role: detail[role]["components"]["worker"]["info"] for role in detail}


@pytest.fixture(scope="module")
def both(base_cfg, tmp_path_factory):
    # One request at a time: with several in flight, whether the scheduler splits a prompt
    # across steps depends on arrival timing, and a split prompt's drafter KV differs at the
    # chunk's end (finding chunked-prefill-drafter-kv), on spawned servers as on forked ones.
    cfg = replace(base_cfg, prompt_set="badcase", num_prompts=8, max_tokens=16, kv_probe=True,
                  concurrency=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(START_ENV, "zygote")
        with Session(tmp_path_factory.mktemp("forked")) as s:
            forked = _run(s, replace(cfg, run_pd=False), mp)
        mp.setenv(START_ENV, "spawn")
        with Session(tmp_path_factory.mktemp("spawned")) as s:
            spawned = _run(s, replace(cfg, run_pd=False), mp)
    return forked, spawned


@pytest.fixture(scope="module")
def shared_pd(pd_session, base_cfg):
    """The shared session's P and D (forked from the zygote, the default start), one short
    run: what their workers report."""
    return pd_session.run(replace(base_cfg, num_prompts=1, max_tokens=4, run_baseline=False))


def test_a_forked_baseline_gives_the_spawned_ones_tokens_counts_and_kv(both):
    (forked, kv_forked), (spawned, kv_spawned) = both
    assert len(spawned.requests) == len(forked.requests) == 8
    for a, b in zip(spawned.requests, forked.requests, strict=True):
        assert a["baseline_tokens"] == b["baseline_tokens"], a["id"]
        assert a["baseline"]["accepted_per_pos"] == b["baseline"]["accepted_per_pos"], a["id"]
        assert a["baseline"]["num_drafts"] == b["baseline"]["num_drafts"], a["id"]
    base = {k: v for k, v in kv_forked.items() if k[0] == "baseline"}
    assert kv_spawned and set(kv_spawned) == set(base)  # every layer of every prompt
    assert base == kv_spawned


def test_forked_workers_run_the_spawned_workers_threads_on_their_cores(both, shared_pd):
    forked = {**_workers(shared_pd), **_workers(both[0][0])}
    spawned = _workers(both[1][0])
    s = spawned["baseline"]
    assert s["openmp_applied_after_fork"] is None  # spawned: its runtime read the variables
    assert s["omp_threads"] == 1 and s["main_thread_cpus"] == s["omp_threads_bind"]
    for role in ("p", "d", "baseline"):
        f = forked[role]
        assert f["openmp_applied_after_fork"] == {"cores": f["omp_threads_bind"],
                                                  "threads": 1}, role
        assert f["omp_threads"] == 1, role
        assert f["main_thread_cpus"] == f["omp_threads_bind"], role
    assert forked["baseline"]["main_thread_cpus"] == s["main_thread_cpus"]
