"""ExampleConnector stores a prompt that P prefilled in chunks from its first chunk only."""

from __future__ import annotations

from .finding import DIFFERENCES, KV_PROBE_READER, Detection, Finding, decide, tally_vs_p
from .host_buffer_chunk_boundary import lookahead

BUDGET = 96  # P's token budget: the indomain prompts of 129-160 tokens store 128 positions
WHOLE = 128  # a budget that still chunks them, and whose first chunk is all P stores


def aligned(n: int, block_size: int) -> int:
    """``example_connector.align_to_block_size``: the stored (and loaded) prompt length."""
    return (n - 1) // block_size * block_size


def never_computed(chunks: list[int] | None, n: int, block_size: int, ahead: int) -> set[int]:
    """The stored positions P had not computed when it saved them: the store runs in the step
    of the first chunk only (``build_connector_meta`` lists ``scheduled_new_reqs``), over the
    blocks that step allocated (its chunk plus ``ahead`` lookahead slots), cut to the aligned
    prompt. Empty when the prompt was not chunked, when D finds no folder (the lookup aligns
    ``n - 1`` tokens, the store ``n``: they name different folders when ``n - 1`` is a block
    multiple) or when the first step's blocks hold fewer slots than the store's length (then
    D's load fails on the shapes instead: loud, not silent)."""
    if not chunks or len(chunks) < 2 or aligned(n - 1, block_size) != aligned(n, block_size):
        return set()
    first, stored = chunks[0], aligned(n, block_size)
    slots = -(-(first + ahead) // block_size) * block_size
    return set(range(first, stored)) if slots >= stored > first else set()


def matches(by_layer: dict[str, set[int]], layers: dict, want: set[int], n: int) -> bool:
    """The signature: every layer differs at every never-computed position; the first layer
    there only (its KV is computed from the tokens alone), the later ones also at most at
    the positions past the stored ones, which D computed itself, attending to them."""
    if not want or set(by_layer) != set(layers):
        return False
    tail = set(range(max(want) + 1, n))
    first = by_layer.get(next(iter(layers)), set())
    return first == want and all(want <= ps <= want | tail for ps in by_layer.values())


def detect(result: dict) -> Detection:
    """D's KV against P's (the KV probe's ``vs_p``), per request. ``matches`` in some
    request and no other difference in any: ``present``. D equal to P in every request, at
    least one of them chunked on P: ``absent``. Otherwise ``inconclusive``."""
    config = result.get("config") or {}
    bs, ahead = int(config.get("block_size", 32)), lookahead(config)
    t = tally_vs_p(result, lambda chunks, n: never_computed(chunks, n, bs, ahead), matches)
    agree = [r.get("agree") for r in result.get("requests") or [] if r.get("agree") is not None]
    evidence = {"requests_probed": t.probed, "requests_chunked_on_p": t.chunked,
                "requests_predicted_never_computed": t.predicted,
                "requests_differing_exactly_there": t.exact,
                "requests_differing_otherwise": t.other,
                "requests_tokens_differ": agree.count(False)}
    return decide(t.exact > 0 and not t.other, t.chunked > 0 and not t.exact and not t.other,
                  evidence)


FINDING = Finding(
    id="example-chunked-store",
    severity="changes tokens (the silent half); the engine dies (the loud half)",
    title="ExampleConnector stores a prompt chunked on P from its first chunk: D loads KV P "
    "never computed",
    where="vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py, "
    "ExampleConnector.build_connector_meta: a store is added only for a step's "
    "scheduled_new_reqs, with that step's block_ids[0]; ReqMeta.make_meta cuts the slots to "
    "align_to_block_size(len(prompt)), and save_kv_layer saves them during that step's forward",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain", "kv_probe": True, "concurrency": 1,
                "max_num_batched_tokens": {"p": BUDGET}},
    detect=detect,
    positive=None,
    negative={"max_num_batched_tokens": {"p": WHOLE}},
    connectors=("example",),
    measured=("per request, the positions and layers where D's KV differs from P's (KV probe "
              "digests), against the stored positions P had not computed when it saved them",
              "D's output tokens against the baseline's",
              f"the same with a budget of {WHOLE} tokens (the prompts still chunked, each "
              "first chunk all P stores)"),
    inferred=("the store covers the first chunk's step only (read in the source); where the "
              "first step's blocks hold fewer slots than the aligned prompt, D's "
              "inject_kv_into_layer fails on the shapes instead and D's engine dies (seen "
              "under load, 32 in flight, with vLLM's default budget)",),
    **KV_PROBE_READER,
    symptom="tokens",
    # 96 tokens and one lookahead slot allocate 4 blocks of 32 in the first step, short of a
    # 192-token prompt's 6: D's inject_kv_into_layer fails on the shapes (issue #16928)
    loud_prompt_tokens=2 * BUDGET,
    explains=DIFFERENCES,  # D loads KV P never computed: every comparison downstream of it
)
