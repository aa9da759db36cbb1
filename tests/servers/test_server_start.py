"""Servers forked from the zygote (``serving/zygote.py``, ``knobs/fork_start.py``) compute what
servers started as vLLM starts them on a CPU compute: the same tokens, counts and KV digests,
with the same OpenMP threads on the same cores."""

from __future__ import annotations

from dataclasses import replace

import pytest

from workbench.experiment import Session
from workbench.serving.servers import START_ENV

pytestmark = pytest.mark.vllm


def _run(mode: str, cfg, tmp_path, monkeypatch):
    monkeypatch.setenv(START_ENV, mode)
    replies = []
    with Session(tmp_path / mode) as s:
        ask = s.channel.kv_probe

        def keep(servers, request, **kw):  # the run's own record fetch, before it clears them
            out = ask(servers, request, **kw)
            replies.extend(out if request.get("op") == "records" else [])
            return out

        monkeypatch.setattr(s.channel, "kv_probe", keep)
        result = s.run(cfg)
    digests = {(r["role"], rec["key"], name): layer["digests"]
               for r in replies for rec in r["records"] for name, layer in rec["layers"].items()}
    return result, digests


def _workers(result) -> dict[str, dict]:
    detail = result.knobs["detail"]
    return {role: detail[role]["components"]["worker"]["info"] for role in ("p", "d", "baseline")}


@pytest.fixture(scope="module")
def both(base_cfg, tmp_path_factory):
    # One request at a time: with several in flight, whether the scheduler splits a prompt
    # across steps depends on arrival timing, and a split prompt's drafter KV differs at the
    # chunk's end (finding chunked-prefill-drafter-kv), on spawned servers as on forked ones.
    cfg = replace(base_cfg, prompt_set="badcase", num_prompts=8, max_tokens=16, kv_probe=True,
                  concurrency=1)
    tmp = tmp_path_factory.mktemp("starts")
    with pytest.MonkeyPatch.context() as mp:
        return {mode: _run(mode, cfg, tmp, mp) for mode in ("spawn", "zygote")}


def test_forked_servers_give_the_spawned_servers_tokens_counts_and_kv(both):
    (spawned, kv_spawned), (forked, kv_forked) = both["spawn"], both["zygote"]
    assert len(spawned.requests) == len(forked.requests) == 8
    for a, b in zip(spawned.requests, forked.requests, strict=True):
        assert a["pd_tokens"] == b["pd_tokens"], a["id"]
        assert a["baseline_tokens"] == b["baseline_tokens"], a["id"]
        for side in ("pd", "baseline"):
            assert a[side]["accepted_per_pos"] == b[side]["accepted_per_pos"], (a["id"], side)
            assert a[side]["num_drafts"] == b[side]["num_drafts"], (a["id"], side)
    assert kv_spawned and {r for r, _, _ in kv_spawned} == {"p", "d", "baseline"}
    assert kv_forked == kv_spawned


def test_forked_workers_run_the_spawned_workers_threads_on_their_cores(both):
    spawned, forked = _workers(both["spawn"][0]), _workers(both["zygote"][0])
    for role in ("p", "d", "baseline"):
        s, f = spawned[role], forked[role]
        assert s["openmp_applied_after_fork"] is None, role
        assert f["openmp_applied_after_fork"] == {"cores": s["omp_threads_bind"],
                                                  "threads": 1}, role
        assert f["omp_threads"] == s["omp_threads"] == 1, role
        assert f["main_thread_cpus"] == s["main_thread_cpus"] == s["omp_threads_bind"], role
