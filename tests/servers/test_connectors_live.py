"""Each KV connector that runs on the CPU, live on the shared Session: the fixed pipeline's
parity with the baseline (tokens, per-request counts, the KV probe) through NIXL push,
ExampleConnector's shared storage and MultiConnector, and which servers a change restarts.

The knob ``connector`` is restart-time: these tests run last of all (``restart``,
``connector``) and restart P and D once per connector; the baseline keeps running.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import alive, tree_pids

from workbench.knobs import connector as kv_connector

pytestmark = [pytest.mark.vllm, pytest.mark.restart, pytest.mark.connector]

LIVE = ("nixl-push", "example", "multi")


@pytest.fixture(scope="module")
def runs(pd_session, base_cfg):
    """8 prompts at 8 in flight through each connector, with the KV probe; the servers before
    each change, to see which ones it restarted. The first connector restarts P and D from
    whatever ran before (in the suite the host-staged tests' servers): no return to NIXL
    first, since only example's change to multi is read as the connector's own."""
    cfg = replace(base_cfg, num_prompts=8, max_tokens=32, concurrency=8, kv_probe=True)
    out = {}
    for name in LIVE:
        before = {r: (s, tree_pids(s)) for r, s in pd_session.servers.items()}
        out[name] = (before, pd_session.run(replace(cfg, knobs={**cfg.knobs, "connector": name})))
    return out


@pytest.mark.parametrize("name", LIVE)
def test_the_connector_vllm_built_is_the_one_asked_for(runs, name):
    r = runs[name][1]
    assert r.knobs["p"]["connector"] == r.knobs["d"]["connector"] == name
    assert "connector" not in r.knobs["baseline"]  # the baseline has no KV connector
    for role, kv_role in (("p", "kv_producer"), ("d", "kv_consumer")):
        ev = r.knobs["detail"][role]["components"]["engine_core"]["events"]["connector"]
        want = kv_connector.get(name).kv_config(kv_role, "cpu", "")
        assert ev["kv_transfer_config"]["kv_connector"] == want["kv_connector"]
        assert ev["kv_transfer_config"]["kv_role"] == want["kv_role"]


@pytest.mark.parametrize("name", LIVE)
def test_every_fix_in_place_d_equals_the_baseline_request_by_request(runs, name):
    """Greedy tokens equal, and per request the same accepted tokens per position; D's drafts
    are the baseline's plus its padded load step where the connector loads asynchronously
    (NIXL), and exactly the baseline's where it loads synchronously in the forward
    (ExampleConnector: D's first step computes the prompt's last token itself)."""
    r = runs[name][1]
    assert r.token_agreement == 1.0
    extra = 0 if kv_connector.get(name).flow == kv_connector.SAME_PROMPT else 1
    for q in r.requests:
        assert q["pd"]["accepted_per_pos"] == q["baseline"]["accepted_per_pos"], q["id"]
        assert q["extra_pd_drafts"] == extra, (q["id"], q["pd"]["num_drafts"],
                                               q["baseline"]["num_drafts"])


@pytest.mark.parametrize("name", LIVE)
def test_kv_probe_d_equals_p_in_every_layer(runs, name):
    """D's KV, moved by the connector, equals P's bit for bit in every layer (the drafter's
    included); against the baseline, the known chunked-prefill position is the only
    exception allowed (the baseline chunks some prompts at 8 in flight)."""
    r = runs[name][1]
    probed = [q for q in r.requests if q.get("kv_probe")]
    assert len(probed) == len(r.requests), "every request probed on P and D"
    for q in probed:
        pr = q["kv_probe"]
        assert pr["vs_p"]["identical"], (q["id"], pr["vs_p"]["first_differing"])
        if len(pr["prefill_chunks"]["baseline"]) == 1:
            assert pr["vs_baseline"]["identical"], (q["id"], pr["vs_baseline"]["first_differing"])
        else:
            assert set(pr["vs_baseline"]["groups_differing"]) <= {"drafter"}, q["id"]


def test_a_connector_change_restarts_p_and_d_only(runs, pd_session):
    before = runs["multi"][0]  # the servers example ran on
    now = {r: (s, tree_pids(s)) for r, s in pd_session.servers.items()}
    assert now["baseline"][1] == before["baseline"][1]
    for role in ("p", "d"):
        assert not now[role][1] & before[role][1]
        assert not alive(before[role][1]), f"the old {role} server is left running"
