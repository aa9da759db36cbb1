"""A regression that must stay away: P hands D its never-written lookahead block."""

from __future__ import annotations

from .finding import ABSENT, DIFFERENCES, INCONCLUSIVE, PRESENT, Detection, Finding, rows


def _blocks(n: int, bs: int) -> int:
    return -(-n // bs)


def detect_handoff(result: dict) -> Detection:
    """P hands D more blocks than the prompt fills (its never-written lookahead block) in a
    bad-case request whose output then parts from the baseline's: ``present``; every request
    handed exactly the prompt's blocks and every output equal: ``absent``."""
    bs = (result.get("config") or {}).get("block_size") or 32
    both = rows(result, "p_handed_blocks", "agree")
    extra = [r for r in both if r["p_handed_blocks"] > _blocks(r["prompt_len"], bs)]
    hurt = [r for r in extra if not r["agree"]
            or r["pd"]["accepted_per_pos"] != r["baseline"]["accepted_per_pos"]]
    evidence = {"requests": len(both), "affected": sum(bool(r.get("affected")) for r in both),
                "handed_an_extra_block": len(extra), "extra_block_and_output_differs": len(hurt),
                "token_agreement": result.get("token_agreement")}
    if hurt:
        return PRESENT, evidence
    if both and not extra and all(r["agree"] for r in both):
        return ABSENT, evidence
    return INCONCLUSIVE, evidence


FINDING = Finding(
    id="unclipped-handoff",
    severity="changes tokens",
    title="P hands D its never-written lookahead block (the block mapping shifts by one)",
    where="vllm/v1/core/kv_cache_manager.py, KVCacheManager.get_block_ids_for_computed_tokens "
    "clips P's blocks to cdiv(num_computed_tokens, block_size) since vLLM 0.25; before, "
    "D's NixlBaseConnectorWorker._apply_prefix_caching kept prefill_blocks[-num_decode_blocks:]",
    found_on="0.24.0",
    experiment={"prompt_set": "badcase"},
    detect=detect_handoff,
    positive={"knobs": {"block_handoff": "legacy"}},
    negative={"knobs": {"block_handoff": "legacy", "prefill_lookahead": "0"}},
    measured=("blocks P handed per request (kv_transfer_params.remote_block_ids) against the "
              "prompt's blocks", "D's output and per-position counts against the baseline's"),
    symptom="tokens",
    explains=DIFFERENCES,  # the whole block mapping shifted on D: every comparison downstream of it
)
