"""KV lost in the host staging buffer when a prefill runs in chunks (NIXL, use_host_buffer)."""

from __future__ import annotations

from typing import Any

from .finding import (
    DIFFERENCES,
    KV_PROBE_READER,
    Claims,
    Detection,
    Finding,
    claim,
    decide,
    observed,
    p_prefill,
    rows,
    shared,
    tally_vs_p,
)

BUDGET = 64  # P's token budget per step: boundaries on block multiples (block size 32)


def lookahead(config: dict[str, Any]) -> int:
    """P's ``Scheduler.num_lookahead_tokens``: its k with speculative decoding, unless the
    ``prefill_lookahead`` knob set it to 0."""
    knobs = config.get("knobs") or {}
    return 0 if knobs.get("prefill_lookahead", "default") == "0" else int(config.get("k_p", 1))


def lost_positions(chunks: list[int] | None, n: int, block_size: int, ahead: int,
                   start: int = 0) -> set[int]:
    """The prompt positions (< ``n``) written into a block in a step after the step that
    allocated it, for a prefill run in ``chunks`` (tokens per step) from position ``start``
    (P's prefix-cache hit before it: whole blocks P held already). A step allocates the
    blocks that hold its chunk and ``ahead`` lookahead slots past it, and P copies to the host
    buffer, once, the blocks a step newly allocated: these positions never reach D."""
    if not chunks:
        return set()
    alloc = dict.fromkeys(range(start // block_size), -1)  # block -> the step allocating it
    step_of: list[int] = [-1] * start
    end = start
    for step, size in enumerate(chunks):
        step_of += [step] * size
        end += size
        for b in range(-(-(end + ahead) // block_size)):
            alloc.setdefault(b, step)
    return {p for p, step in enumerate(step_of[:n]) if step > alloc[p // block_size]}


def lost_as_allocated(row: dict[str, Any], block_size: int) -> set[int] | None:
    """``lost_positions`` from P's allocation as the KV probe saw it (the block ids each
    prefill step gave the request first: what ``_build_save_meta`` lists for the copy), not
    from a model of it; None where the record lacks it."""
    pre = ((row.get("kv_probe") or {}).get("prefill_p")) or {}
    start, chunks = p_prefill(row)
    if not pre.get("new_blocks") or len(pre["new_blocks"]) != len(chunks):
        return None
    listed: dict[int, int] = {}
    for step, blocks in enumerate(pre["new_blocks"]):
        for b in blocks:
            listed.setdefault(b, step)
    ids, at, out = pre.get("block_ids") or [], start, set()
    for step, size in enumerate(chunks):
        out |= {p for p in range(at, at + size)
                if p // block_size < len(ids) and listed.get(ids[p // block_size], step) < step}
        at += size
    return out


def claims(result: dict[str, Any], row: dict[str, Any]) -> Claims:
    """Every layer at the positions P wrote after its copy to the host buffer (an upper
    bound: another request listing the same block for its own copy later, a prefix hit on
    P, copies it again, complete, if D reads after that), and at the positions D's prefix
    cache handed ``row`` from an earlier request whose loaded KV lost them."""
    config = result.get("config") or {}
    if (config.get("knobs") or {}).get("transfer") != "host-staged":
        return {}
    bs, ahead = int(config.get("block_size", 32)), lookahead(config)

    def own(r: dict[str, Any]) -> set[int]:
        lost = lost_as_allocated(r, bs)
        if lost is None:
            start, chunks = p_prefill(r)
            lost = lost_positions(chunks, r.get("prompt_len") or 0, bs, ahead, start)
        return lost

    lost, mine = own(row), row.get("prompt_token_ids") or []
    for other in rows(result, "kv_probe", "prompt_token_ids"):
        if other is row:
            break
        upto = shared(mine, other["prompt_token_ids"]) // bs * bs
        seen = set().union(*observed(other, "vs_p").values())
        lost |= {p for p in seen & own(other) if p < upto}
    return claim(lost)


def detect(result: dict) -> Detection:
    """D's KV against P's (the KV probe's ``vs_p``), per request whose prefill P ran in
    chunks. Differing in every layer, exactly at ``lost_positions``, in some request and in
    no other way anywhere: ``present``. D equal to P in every request, chunked ones included
    (at least one): ``absent``. No chunked request, or D differing elsewhere: ``inconclusive``.
    """
    config = result.get("config") or {}
    bs, ahead = int(config.get("block_size", 32)), lookahead(config)
    t = tally_vs_p(result, lambda chunks, n: lost_positions(
        chunks, n, bs, ahead, start=max(0, n - sum(chunks))), every_layer)
    evidence = {"requests_probed": t.probed, "requests_chunked_on_p": t.chunked,
                "requests_predicted_to_lose_slots": t.predicted,
                "requests_differing_exactly_there": t.exact,
                "requests_differing_otherwise": t.other, "p_lookahead": ahead,
                "transfer": (config.get("knobs") or {}).get("transfer"),
                "token_agreement": result.get("token_agreement")}
    if not t.chunked:
        evidence["why"] = "nothing was chunked: no request's prefill ran in two steps on P"
    return decide(t.exact > 0 and not t.other, t.chunked > 0 and not t.exact and not t.other,
                  evidence)


def every_layer(by_layer: dict[str, set[int]], layers: dict, want: set[int], n: int) -> bool:
    """The signature: every layer differs, at exactly the lost positions."""
    return bool(want) and set(by_layer) == set(layers) and all(
        ps == want for ps in by_layer.values())


FINDING = Finding(
    id="host-buffer-chunk-boundary",
    severity="changes tokens",
    title="With a host staging buffer, KV a later prefill chunk writes into an already "
    "allocated block never reaches D",
    where="vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_scheduler.py, "
    "NixlBaseConnectorScheduler._build_save_meta: each step lists for the device-to-host copy "
    "(NixlBaseConnectorWorker.save_kv_to_host in wait_for_save) only the blocks newly "
    "allocated in that step; Scheduler.schedule allocates a chunk's blocks plus "
    "num_lookahead_tokens slots past it. The same code runs on GPUs with kv_buffer_device=cpu",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain", "kv_probe": True, "concurrency": 1,
                "max_num_batched_tokens": {"p": BUDGET, "d": BUDGET},
                "knobs": {"transfer": "host-staged"}},
    detect=detect,
    positive=None,
    negative={"knobs": {"transfer": "host-staged", "prefill_lookahead": "0"}},
    measured=("per request, the positions and layers where D's KV differs from P's (KV probe "
              "digests), against the positions written into a block after the step that "
              "allocated it",
              "the same with P's lookahead off (chunk boundaries on block multiples then lose "
              "nothing)"),
    inferred=("the lost slots are those _build_save_meta never lists again after a block's "
              "first step (read in the source); the workbench's CPU host staging changes only "
              "the copy op (knobs/transfer.py), not which blocks are copied",),
    fix="patches/vllm-0.32.0/host-buffer-chunk-boundary.patch",
    **KV_PROBE_READER,
    symptom="tokens",
    explains=DIFFERENCES,  # KV lost in every layer on D: every comparison downstream of it
    claims=claims,
)
