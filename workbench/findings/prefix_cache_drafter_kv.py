"""The drafter's KV at a cached block's last slot, reused from a request whose prompt ended
there (found by ``workbench fuzz``)."""

from __future__ import annotations

from typing import Any

from .finding import KV_PROBE_READER, Detection, Finding, decide, differing, rows


def prefixes(result: dict[str, Any], row: dict[str, Any]) -> list[int]:
    """The lengths of the earlier primed prompts of the run that ``row``'s prompt extends."""
    mine = row.get("prompt_token_ids") or []
    out = []
    for other in rows(result, "prompt_token_ids"):
        if other is row:
            break
        ids = other["prompt_token_ids"]
        if other.get("prime_d") and len(ids) < len(mine) and mine[:len(ids)] == ids:
            out.append(len(ids))
    return out


def detect(result: dict) -> Detection:
    """D's KV against P's (``vs_p``) per request that extends an earlier prompt D computed
    first. Differing in the drafter's layers only, at the last slot of such a prompt that ends
    on a block boundary, in some request and in no other way anywhere: ``present``; D equal to
    P in every layer of every request, some of them extending one: ``absent``."""
    bs = int((result.get("config") or {}).get("block_size", 32))
    at_end = other = extending = 0
    for r in rows(result, "kv_probe"):
        cmp = r["kv_probe"].get("vs_p") or {}
        lengths = prefixes(result, r)
        extending += bool(lengths)
        ends = {n - 1 for n in lengths if n % bs == 0}
        every = set().union(*differing(cmp).values())
        if every and set(cmp.get("groups_differing") or []) == {"drafter"} and every <= ends:
            at_end += 1
        elif every:
            other += 1
    evidence = {"requests_probed": len(rows(result, "kv_probe")),
                "requests_extending_a_primed_prompt": extending,
                "requests_drafter_only_at_the_boundary": at_end,
                "requests_differing_otherwise": other,
                "token_agreement": result.get("token_agreement")}
    if not extending:
        evidence["why"] = "no request extends a prompt D computed first"
    return decide(at_end > 0 and not other, extending > 0 and not at_end and not other,
                  evidence)


FINDING = Finding(
    id="prefix-cache-drafter-kv",
    title="D reuses a cached block whose last drafter slot was computed for another request's "
    "next token",
    where="vllm/v1/core/block_pool.py, BlockPool.get_cached_block returns the first of the "
    "blocks cached under one hash; the EAGLE drop in UnitaryKVCacheCoordinator."
    "find_longest_cache_hit (vllm/v1/core/kv_cache_coordinator.py) recomputes only the last "
    "block of a hit, and the hash does not include the token after the block, which the "
    "drafter's KV at the block's last slot depends on",
    found_on="0.32.0",
    experiment={"prompt_set": "blockprefix", "kv_probe": True, "concurrency": 1},
    detect=detect,
    positive=None,
    negative={"prompt_set": "blockshort"},
    measured=("D's KV against P's per layer and position (the KV probe), for prompts that "
              "extend a prompt of exactly four blocks D computed first, and with that prompt "
              "one token short (the negative control)",),
    inferred=("D's prefix cache holds two blocks under the fourth block's hash: the short "
              "prompt's, cached at its prefill with the drafter's KV at its last slot computed "
              "from its sampled token, and the long prompt's own, recomputed because the "
              "EAGLE drop re-runs the last block of a hit; get_cached_block hands out the "
              "first (read in the source)",
              "a standalone server shows the same after the same three requests (the short "
              "prompt, the long one, the long one again); P and the baseline do not here "
              "because each sees the long prompt once",
              "the open upstream RFC vLLM #50438 (lookahead-aware prefix-cache hashing, PR "
              "#50897) puts the next token into the hash, which would keep the two apart"),
    # Measured through NIXL pull only: the mechanism is D's own prefix cache, so the other
    # connectors are expected to show it too, but no run of theirs says so yet.
    connectors=("nixl",),
    **KV_PROBE_READER,
    symptom="inside",
    explains=("kv_vs_p", "kv_vs_baseline", "accepts"),  # the drafter's KV, so its drafts
)
