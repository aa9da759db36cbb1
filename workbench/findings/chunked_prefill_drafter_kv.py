"""The drafter's KV at the last position of a non-final prefill chunk (padded drafter batch)."""

from __future__ import annotations

from .finding import ABSENT, INCONCLUSIVE, PRESENT, Detection, Finding, rows

BUDGET = 64  # P's and D's token budget per step: prompts of 100+ tokens run in 2-3 chunks


def _positions(cmp: dict) -> dict[str, list[int]]:
    return {layer: [p for a, b in runs for p in range(a, b + 1)]
            for layer, runs in (cmp.get("positions_differing") or {}).items()}


def detect(result: dict) -> Detection:
    """D (holding P's chunked prefill) against the unchunked baseline, per request, from the
    KV probe: KV that differs in the drafter's layers only, at the last position of a
    non-final chunk (``k * budget - 1``), is ``present``; KV identical in every layer of every
    request is ``absent``; anything else (a target layer, another position) ``inconclusive``."""
    budget = (result.get("config") or {}).get("max_num_batched_tokens") or {}
    budget = budget.get("p") if isinstance(budget, dict) else budget
    probed = rows(result, "kv_probe")
    at_ends, other, chunked = 0, 0, 0
    seen: set[int] = set()
    for r in probed:
        cmp = r["kv_probe"].get("vs_baseline") or {}
        n = r["prompt_len"]
        ends = {k * budget - 1 for k in range(1, n // budget + 1) if k * budget < n} if budget \
            else set()
        chunked += bool(ends)
        pos = _positions(cmp)
        groups = set(cmp.get("groups_differing") or [])
        every = {p for ps in pos.values() for p in ps}
        seen |= every
        if every and groups == {"drafter"} and every <= ends:
            at_ends += 1
        elif every:
            other += 1
    evidence = {"requests_probed": len(probed), "requests_chunked": chunked,
                "requests_drafter_only_at_chunk_ends": at_ends, "requests_differing_otherwise":
                other, "positions": sorted(seen)[:12], "budget": budget}
    if probed and at_ends and not other:
        return PRESENT, evidence
    if probed and not at_ends and not other:
        return ABSENT, evidence
    return INCONCLUSIVE, evidence


FINDING = Finding(
    id="chunked-prefill-drafter-kv",
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
    figure="kv_probe",
    reads="the KV probe (digests of every KV layer per request, taken in vLLM's workers)",
    standalone=False,
)
