"""A regression that must stay away: D loads only the last block and gets a stale one."""

from __future__ import annotations

from .finding import ABSENT, DIFFERENCES, INCONCLUSIVE, PRESENT, Detection, Finding, rows


def detect_last_block(result: dict) -> Detection:
    """D holds all but the last block (primed) and loads one block: a request whose output or
    per-position acceptance then parts from the baseline's is ``present``; none: ``absent``."""
    primed = [r for r in rows(result, "agree") if r.get("prime_d")]
    hurt = [r for r in primed if not r["agree"]
            or r["pd"]["accepted_per_pos"] != r["baseline"]["accepted_per_pos"]]
    evidence = {"primed_requests": len(primed), "differing": len(hurt),
                "d_prefix_cache_hits": (result.get("pd") or {}).get("prefix_cache_hits"),
                "token_agreement": result.get("token_agreement")}
    if hurt:
        return PRESENT, evidence
    return (ABSENT if primed else INCONCLUSIVE), evidence


FINDING = Finding(
    id="stale-last-block",
    severity="changes tokens",
    title="D loads only the last block and gets P's never-written lookahead block, stale",
    where="as unclipped-handoff, with D holding the rest of the prompt in its prefix cache "
    "(NixlBaseConnectorWorker loads only the blocks D lacks)",
    found_on="0.24.0",
    experiment={"prompt_set": "lastblock"},
    detect=detect_last_block,
    positive={"knobs": {"block_handoff": "legacy", "blocks": "poisoned"}},
    negative={"knobs": {"block_handoff": "legacy", "blocks": "poisoned",
                        "prefill_lookahead": "0"}},
    measured=("D's output and per-position counts against the baseline's on primed prompts",),
    symptom="tokens",
    explains=DIFFERENCES,  # a block of another request's KV on D: every comparison downstream of it
)
