"""Model Runner V2 live on the CPU (knob ``runner=v2``: Triton's interpreter runs its kernels),
on the shared Session: the runner every worker built, PD's parity with an MRV2 baseline
(tokens, per-request counts, the KV probe), the legacy hand-off still breaking the bad case,
and each kernel stand-in equal to the interpreter on every launch these runs make (the MRV2
servers run with ``WORKBENCH_TRITON_STANDINS=verify``). A change of runner restarts all three
servers: these tests run last of all.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from conftest import alive, tree_pids

from workbench.knobs.triton_cpu import kernels, profile, standins

pytestmark = [pytest.mark.vllm, pytest.mark.restart, pytest.mark.runner]

MRV2_CLASS = "vllm.v1.worker.cpu.model_runner:CPUModelRunner"


@pytest.fixture(scope="module")
def v2(pd_session, base_cfg, tmp_path_factory):
    """8 prompts at 8 in flight on MRV2 with the KV probe, then the legacy hand-off on the
    bad case; the V1 servers before the change of runner (in the suite the connector tests'
    last: P and D restart for the connector too, the baseline for the runner alone); each
    role's stand-in counts."""
    if set(pd_session.servers) != {"p", "d", "baseline"}:  # run alone: V1 servers to leave
        pd_session.ensure(base_cfg)
    before = {r: tree_pids(s) for r, s in pd_session.servers.items()}
    counts = tmp_path_factory.mktemp("triton-profile")
    cfg = replace(base_cfg, num_prompts=8, max_tokens=32, concurrency=8, kv_probe=True,
                  knobs={**base_cfg.knobs, "runner": "v2"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(standins.ENV, "verify")
        mp.setenv(profile.ENV, str(counts))
        fixed = pd_session.run(cfg)
        legacy = pd_session.run(replace(cfg, prompt_set="badcase", kv_probe=False, knobs={
            **cfg.knobs, "block_handoff": "legacy"}))
    time.sleep(2.5)  # the counts are written every second
    return before, fixed, legacy, profile.read(counts)


def test_every_worker_built_model_runner_v2(v2):
    r = v2[1]
    assert r.runner == {"p": "v2", "d": "v2", "baseline": "v2"} and r.model_runner == "v2"
    for role in ("p", "d", "baseline"):
        ev = r.knobs["detail"][role]["components"]["worker"]["events"]["runner"]
        assert ev["model_runner_class"] == MRV2_CLASS and ev["triton_interpret"] == "1"


def test_a_change_of_runner_restarts_every_server_the_baseline_too(v2, pd_session):
    before = v2[0]
    for role, pids in before.items():
        assert not alive(pids), f"the V1 {role} server is left running"
        assert not tree_pids(pd_session.servers[role]) & pids


def test_every_fix_in_place_d_equals_the_mrv2_baseline_request_by_request(v2):
    r = v2[1]
    assert r.token_agreement == 1.0
    for q in r.requests:
        assert q["pd"]["accepted_per_pos"] == q["baseline"]["accepted_per_pos"], q["id"]
        pr = q["kv_probe"]
        assert pr["vs_p"]["identical"], (q["id"], pr["vs_p"]["first_differing"])
        assert "drafter" in pr["layers"].values()  # MRV2's speculator layers are told apart


def test_the_legacy_hand_off_still_breaks_the_bad_case_on_mrv2(v2):
    r = v2[2]
    assert r.runner == {"p": "v2", "d": "v2", "baseline": "v2"}
    assert r.knobs["p"]["block_handoff"] == "legacy"
    affected = [q for q in r.requests if q["affected"]]
    assert affected and r.token_agreement < 1.0
    assert all(q["agree"] for q in r.requests if not q["affected"])


def test_every_stand_in_equals_the_interpreter_on_every_launch_of_these_runs(v2):
    """Every launch a stand-in covered, in every role, compared equal byte for byte; D ran
    every stand-in."""
    counts = v2[3]
    for role, kernels_of_role in counts.items():
        for name in set(kernels_of_role) & set(kernels.STANDINS):
            c = kernels_of_role[name]
            assert not c.get("mismatched") and not c.get("source_changed"), (role, name, c)
            assert c.get("compared", 0) + c.get("deferred", 0) == c["launches"], (role, name, c)
    assert all(counts["d"][name].get("compared", 0) > 0 for name in kernels.STANDINS), counts["d"]
    ev = v2[1].knobs["detail"]["d"]["components"]["worker"]["events"]["runner"]
    assert ev["triton_standins"] == "verify"
