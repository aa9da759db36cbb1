"""A regression that must stay away: host staging copies the drafter's KV before it exists."""

from __future__ import annotations

from .finding import KV_PROBE_READER, Detection, Finding, decide, gaps, kv_probed


def detect_drafter_not_staged(result: dict) -> Detection:
    """Host staging: D's drafter KV differs from P's while every target layer is identical, in
    some request (the drafter's blocks were copied before it wrote them): ``present``; D's KV
    equal to P's in every layer of every request: ``absent``; a comparison missing: neither."""
    vs_p = [pr.get("vs_p") or {} for pr in kv_probed(result)]
    drafter_only = sum(set(c.get("groups_differing") or []) == {"drafter"} for c in vs_p)
    target = sum("target" in (c.get("groups_differing") or []) for c in vs_p)
    evidence = {"requests_probed": len(vs_p), "drafter_only_differs": drafter_only,
                "target_differs": target, "token_agreement": result.get("token_agreement")}
    missing = gaps(vs_p, evidence)
    return decide(drafter_only > 0 and not target and not missing, bool(vs_p)
                  and not drafter_only and not target and not missing, evidence)


FINDING = Finding(
    id="eager-finalize-host-staged",
    severity="acceptance only (the drafter's KV; greedy tokens unchanged)",
    title="With a host staging buffer, eager finalize copies the drafter's KV before it exists",
    where="vllm/v1/worker/kv_connector_model_runner_mixin.py, maybe_get_kv_connector_output("
    "defer_finalize=...) and finalize_kv_connector after propose_draft_token_ids (V1 runner); "
    "the copy is NIXL's save_kv_to_host in wait_for_save",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain", "kv_probe": True, "concurrency": 1,
                "knobs": {"transfer": "host-staged"}},
    detect=detect_drafter_not_staged,
    positive={"knobs": {"transfer": "host-staged", "finalize": "eager"}},
    negative={"knobs": {"transfer": "direct", "finalize": "eager"}},
    measured=("per request, which layers of D's KV differ from P's (KV probe digests)",),
    **KV_PROBE_READER,
    symptom="inside",
    explains=("kv_vs_p", "kv_vs_baseline", "accepts"),  # the drafter's KV only
)
