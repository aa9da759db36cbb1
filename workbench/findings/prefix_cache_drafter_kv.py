"""The drafter's KV at a cached block's last slot, reused by a request whose next token is
not the one it was computed with (found by ``workbench fuzz``)."""

from __future__ import annotations

from typing import Any

from ..measuring.results import first_diff
from .finding import (
    KV_PROBE_READER,
    Claims,
    Detection,
    Finding,
    claim,
    decide,
    differing,
    gaps,
    rows,
)


def prefixes(result: dict[str, Any], row: dict[str, Any]) -> list[int]:
    """For each earlier request of the run sharing at least one full block with ``row``'s
    prompt, the length of what they share (less than ``row``'s prompt: ``row`` goes on)."""
    bs = int((result.get("config") or {}).get("block_size", 32))
    mine = row.get("prompt_token_ids") or []
    out = []
    for other in rows(result, "prompt_token_ids"):
        if other is row:
            break
        d = first_diff(mine, other["prompt_token_ids"])
        n = len(mine) if d is None else d  # the tokens they share
        if bs <= n < len(mine):
            out.append(n)
    return out


def detect(result: dict) -> Detection:
    """Each request's KV against P's and the baseline's (``vs_p``, ``vs_baseline``), per
    request that shares at least a block with an earlier one. Differing in the drafter's
    layers only, at the last slot of a block after which the two prompts part (or the earlier
    one ended), in some request and in no other way anywhere: ``present``; every request
    identical to both, some sharing a block: ``absent``; a comparison missing: neither."""
    bs = int((result.get("config") or {}).get("block_size", 32))
    at_end = other = sharing = 0
    for r in rows(result, "kv_probe"):
        cmps = [r["kv_probe"].get(k) or {} for k in ("vs_p", "vs_baseline")]
        lengths = prefixes(result, r)
        sharing += bool(lengths)
        ends = {n - 1 for n in lengths if n % bs == 0}
        every = set().union(*(set().union(*differing(c).values()) for c in cmps))
        groups = set().union(*(c.get("groups_differing") or [] for c in cmps))
        if every and groups == {"drafter"} and every <= ends:
            at_end += 1
        elif every:
            other += 1
    evidence = {"requests_probed": len(rows(result, "kv_probe")),
                "requests_sharing_a_block": sharing,
                "requests_drafter_only_at_the_boundary": at_end,
                "requests_differing_otherwise": other,
                "token_agreement": result.get("token_agreement")}
    if not sharing:
        evidence["why"] = "no request shares a full block with an earlier one"
    missing = gaps([r["kv_probe"].get(k) or {} for r in rows(result, "kv_probe")
                    for k in ("vs_p", "vs_baseline")], evidence)
    return decide(at_end > 0 and not other and not missing,
                  sharing > 0 and not at_end and not other and not missing, evidence)


def claims(result: dict[str, Any], row: dict[str, Any]) -> Claims:
    """The drafter's KV at the last slot of a block after which ``row`` and an earlier request
    part (or the earlier one ended), on either server whose prefix cache held that block."""
    bs = int((result.get("config") or {}).get("block_size", 32))
    return claim({n - 1 for n in prefixes(result, row) if n % bs == 0}, groups=("drafter",))


FINDING = Finding(
    id="prefix-cache-drafter-kv",
    severity="acceptance only (the drafter's KV; greedy tokens unchanged)",
    title="A cached block's last drafter slot is reused by a request whose next token differs",
    where="vllm/v1/core/block_pool.py, BlockPool.get_cached_block returns the first of the "
    "blocks cached under one hash, and the hash does not include the token after the block, "
    "which the drafter's KV at the block's last slot depends on; the EAGLE drop in "
    "FullAttentionManager.find_longest_cache_hit (vllm/v1/core/single_type_kv_cache_manager.py, "
    "drop_eagle_block) recomputes only the last block of a hit",
    found_on="0.32.0",
    experiment={"prompt_set": "blockprefix", "kv_probe": True, "concurrency": 1},
    detect=detect,
    positive=None,
    negative={"prompt_set": "blockshort"},
    measured=("D's KV against P's and the baseline's per layer and position (the KV probe), "
              "for prompts that extend a prompt of exactly four blocks D computed first, and "
              "with that prompt one token short (the negative control)",),
    inferred=("D's prefix cache holds two blocks under the fourth block's hash: the short "
              "prompt's, cached at its prefill with the drafter's KV at its last slot computed "
              "from its sampled token, and the long prompt's own, recomputed because the "
              "EAGLE drop re-runs the last block of a hit; get_cached_block hands out the "
              "first (read in the source)",
              "any two prompts that share a block and part right after it do the same, on P, "
              "D or a standalone server (the fuzzer met it on P and the baseline too)",
              "the open upstream RFC vLLM #50438 (lookahead-aware prefix-cache hashing, PR "
              "#50897) puts the next token into the hash, which would keep the two apart"),
    # Measured through NIXL pull only: the mechanism is D's own prefix cache, so the other
    # connectors are expected to show it too, but no run of theirs says so yet.
    connectors=("nixl",),
    **KV_PROBE_READER,
    symptom="inside",
    explains=("kv_vs_p", "kv_vs_baseline", "accepts"),  # the drafter's KV, so its drafts
    claims=claims,
)
