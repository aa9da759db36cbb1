"""The drafter's KV at the last position of a non-final prefill chunk (padded drafter batch)."""

from __future__ import annotations

from typing import Any

from .finding import (
    KV_PROBE_READER,
    Claims,
    Detection,
    Finding,
    claim,
    decide,
    differing,
    gaps,
    kv_probed,
    p_prefill,
    rows,
    shared,
)

BUDGET = 64  # P's and D's token budget per step: prompts of 100+ tokens run in 2-3 chunks


def chunk_ends(chunks: list[int]) -> set[int]:
    """The last prompt position of each non-final chunk of a prefill run in ``chunks``."""
    ends, at = set(), 0
    for size in chunks[:-1]:
        at += size
        ends.add(at - 1)
    return ends


def detect(result: dict) -> Detection:
    """D (holding P's chunked prefill) against the unchunked baseline, per request, from the
    KV probe, with P's chunks as measured (``prefill_chunks``): KV that differs in the
    drafter's layers only, at the last position of a non-final chunk, is ``present``; KV
    identical in every layer of every request, at least one of them chunked on P, is
    ``absent``; nothing chunked, a difference elsewhere (a target layer, another position)
    or a comparison missing: ``inconclusive``."""
    at_ends = other = chunked = 0
    seen: set[int] = set()
    for pr in kv_probed(result):
        cmp = pr.get("vs_baseline") or {}
        ends = chunk_ends((pr.get("prefill_chunks") or {}).get("p") or [])
        chunked += bool(ends)
        every = set().union(*differing(cmp).values())
        seen |= every
        if every and set(cmp.get("groups_differing") or []) == {"drafter"} and every <= ends:
            at_ends += 1
        elif every:
            other += 1
    evidence = {"requests_probed": len(kv_probed(result)), "requests_chunked": chunked,
                "requests_drafter_only_at_chunk_ends": at_ends, "requests_differing_otherwise":
                other, "positions": sorted(seen)[:12]}
    if not chunked:
        evidence["why"] = "nothing was chunked: no request's prefill ran in two steps on P"
    missing = gaps([pr.get("vs_baseline") or {} for pr in kv_probed(result)], evidence)
    return decide(at_ends > 0 and not other and not missing,
                  chunked > 0 and not at_ends and not other and not missing, evidence)


def p_chunk_ends(row: dict[str, Any]) -> set[int]:
    """The prompt positions at which P ended a non-final chunk of ``row``'s prefill."""
    start, chunks = p_prefill(row)
    return {start + e for e in chunk_ends(chunks)}


def claims(result: dict[str, Any], row: dict[str, Any]) -> Claims:
    """The drafter's KV at P's chunk ends: ``row``'s own, and those of another request whose
    blocks P's prefix cache handed ``row`` (before ``row``'s prefill began, within the prompt
    they share). D holding P's KV differs there from the baseline; D that computed those
    positions itself (its own prefix cache) differs there from P."""
    start, _ = p_prefill(row)
    mine = row.get("prompt_token_ids") or []
    ends = p_chunk_ends(row)
    for other in rows(result, "kv_probe", "prompt_token_ids"):
        if other is not row:
            upto = min(start, shared(mine, other["prompt_token_ids"]))
            ends |= {e for e in p_chunk_ends(other) if e < upto}
    return claim(ends, groups=("drafter",))


FINDING = Finding(
    id="chunked-prefill-drafter-kv",
    severity="acceptance only (the drafter's KV; greedy tokens unchanged)",
    title="EAGLE drafter KV is wrong at the last position of each non-final prefill chunk",
    where="vllm/v1/spec_decode/llm_base_proposer.py, prepare_next_token_ids_padded: a partial "
    "prefill is a discarded row and gets the backup token get_token_id(num_tokens_no_spec - 1) "
    "(the prompt's last token), which set_inputs_first_pass writes at the chunk's last "
    "position; prepare_next_token_ids_cpu (disable_padded_drafter_batch) gives "
    "get_token_id(num_computed_tokens + num_scheduled_tokens)",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain", "kv_probe": True,
                "max_num_batched_tokens": {"p": BUDGET, "d": BUDGET}, "concurrency": 1},
    detect=detect,
    positive=None,
    negative={"padded_drafter_batch": False},
    measured=("per request, the positions and layers where D's KV (P's, moved by NIXL) "
              "differs from the unchunked baseline's, from the KV probe's digests",
              "the same with disable_padded_drafter_batch"),
    inferred=("the wrong token comes from prepare_next_token_ids_padded's backup token for a "
              "partial prefill (read in the source); vLLM turns asynchronous scheduling off "
              "with disable_padded_drafter_batch",),
    fix="patches/vllm-0.32.0/chunked-prefill-drafter-kv.patch",
    **KV_PROBE_READER,
    symptom="inside",
    # the drafter's KV, so its drafts, never a token; against P where D computed it itself
    explains=("kv_vs_baseline", "kv_vs_p", "accepts"),
    claims=claims,
)
