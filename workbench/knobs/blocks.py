"""Knobs ``blocks`` and ``dirty_source``: what KV blocks hold before a request writes them.

as-is:    untouched (vLLM allocates the KV cache with ``torch.zeros``; blocks then hold
          whatever earlier requests left).
zeroed:   vLLM's own gated zeroing, switched on at runtime.
          Engine core: ``Scheduler.needs_kv_cache_zeroing = True`` and every attention
          ``SingleTypeKVCacheManager`` records new block ids (``_record_new_block_ids``,
          what ``KVCacheConfig.needs_kv_cache_zeroing`` would have set at build time), so
          ``SchedulerOutput.new_block_ids_to_zero`` carries them to the worker, whose
          ``_zero_block_ids`` zeroes them in ``_update_states`` before the forward.
          Blocks a KV connector loads asynchronously are never recorded (vLLM passes
          ``skip_zeroing_group_ids=connector.get_loaded_kv_cache_group_ids(request)`` for
          them), so D never zeroes what NIXL wrote; blocks allocated later (lookahead,
          decode) are zeroed at the step that allocates them, before the forward.
          Worker: ``CPUModelRunner._zero_block_ids`` needs no set-up; the GPU runners'
          zeroer (``_init_kv_zero_meta``) is built at runtime if the config flag was off.
dirty /   with ``dirty_source=noise``: when a version arrives, the worker fills every KV
poisoned: cache tensor (target and drafter layers) except block 0 (vLLM's null block) with
          seeded normal noise, std 1.0 (dirty) or 100.0 (poisoned); the engine core resets
          the prefix cache (cached blocks no longer hold what their hashes say).
          With ``dirty_source=warmup`` (dirty only) nothing is written: the blocks keep
          what Model Runner V2's start-up warm-up (block ids 1 upward, only block 0
          zeroed after it; skipped under --enforce-eager) and earlier requests left.
          The worker measures the first blocks vLLM will hand out and records that,
          with the runner vLLM chose, so a run says whether its "dirty" was dirty.
"""

from __future__ import annotations

import math
from typing import Any

from . import _patch
from .component import Component, running

NOISE_STD = {"dirty": 1.0, "poisoned": 100.0}
DIAG_BLOCKS = 128  # blocks sampled to report the magnitude the cache held before a fill

ENGINE_TARGETS = (
    ("vllm.v1.core.sched.scheduler", "Scheduler", "_get_new_block_ids_to_zero", ["self"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "reset_prefix_cache", None),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager",
     "take_new_block_ids", ["self"]),
)
WORKER_TARGETS = (
    ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner", "_zero_block_ids",
     ["self", "block_ids"]),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_zero_block_ids",
     ["self", "block_ids"]),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_init_kv_zero_meta", ["self"]),
)
# vLLM's gated zeroing the knob switches on; D skips blocks an async connector load writes.
ENGINE_SOURCE = (
    ("vllm.v1.core.sched.scheduler", "Scheduler.__init__", ("self.needs_kv_cache_zeroing = ",)),
    ("vllm.v1.core.sched.scheduler", "Scheduler._get_new_block_ids_to_zero",
     ("if not self.needs_kv_cache_zeroing",)),
    ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager.__init__",
     ("self._record_new_block_ids = ",)),
    ("vllm.v1.core.sched.scheduler", "Scheduler", ("skip_zeroing_group_ids=",)),
)
V2_WORKER_TARGETS = (
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner", "_init_kv_zero_meta", ["self"]),
    ("vllm.v1.worker.utils", "KVBlockZeroer", "zero_block_ids", ["self", "block_ids"]),
)


# ------------------------------------------------------------------------ engine core --
def install_engine(comp: Component) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    def make(orig):
        def _get_new_block_ids_to_zero(self):
            ids = orig(self)
            if ids:
                c = running("engine_core")
                if c is not None:
                    c.bump("blocks", "block_ids_sent_for_zeroing", len(ids))
            return ids

        return _get_new_block_ids_to_zero

    _patch.patch(Scheduler, "_get_new_block_ids_to_zero", make)


def _attention_manager(mgr) -> bool:
    from vllm.v1.kv_cache_interface import AttentionSpec

    try:
        from vllm.v1.kv_cache_interface import CircularBufferSpec
    except ImportError:  # pragma: no cover
        CircularBufferSpec = ()  # type: ignore
    spec = mgr.kv_cache_spec
    return isinstance(spec, AttentionSpec) and not (
        CircularBufferSpec and isinstance(spec, CircularBufferSpec))


def apply_engine(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    sched = comp.obj
    value = knobs["blocks"]
    managers = list(sched.kv_cache_manager.coordinator.single_type_managers)
    if not hasattr(sched, "_wb_zeroing_original"):
        sched._wb_zeroing_original = bool(sched.needs_kv_cache_zeroing)
        for m in managers:
            m._wb_record_original = bool(m._record_new_block_ids)
    events: dict[str, Any] = {"mode": value, "block_ids_sent_for_zeroing": 0}
    if value == "zeroed":
        sched.needs_kv_cache_zeroing = True
        for m in managers:
            m._record_new_block_ids = m._wb_record_original or _attention_manager(m)
            m.take_new_block_ids()  # start clean
    else:
        sched.needs_kv_cache_zeroing = sched._wb_zeroing_original
        for m in managers:
            m._record_new_block_ids = m._wb_record_original
    events["scheduler_needs_kv_cache_zeroing"] = bool(sched.needs_kv_cache_zeroing)
    events["managers_recording"] = sum(bool(m._record_new_block_ids) for m in managers)
    events["managers"] = len(managers)
    if sched._wb_zeroing_original and value != "zeroed":
        comp.unreachable["blocks"] = ("this model's KV cache needs zeroing (Mamba or mixed "
                                      "precision): vLLM zeroes new blocks whatever the knob")
    if value in ("dirty", "poisoned") and knobs["dirty_source"] == "noise":
        # Cached blocks are about to be overwritten with noise: forget their hashes.
        try:
            events["prefix_cache_reset"] = bool(sched.reset_prefix_cache())
        except Exception as e:  # noqa: BLE001
            events["prefix_cache_reset"] = f"failed: {type(e).__name__}: {e}"
    return ("zeroed" if sched.needs_kv_cache_zeroing else value), events


# ----------------------------------------------------------------------------- worker --
def install_worker(comp: Component) -> None:
    """Count zeroed blocks on the class that implements ``_zero_block_ids`` for the runner."""
    runner = comp.obj.model_runner
    cls = next((k for k in type(runner).__mro__ if "_zero_block_ids" in k.__dict__), None)
    if cls is not None:
        _patch.patch(cls, "_zero_block_ids", _counting_zeroes)
        return
    try:  # Model Runner V2: it calls self.kv_block_zeroer.zero_block_ids
        from vllm.v1.worker.utils import KVBlockZeroer

        _patch.patch(KVBlockZeroer, "zero_block_ids", _counting_zeroes)
    except Exception:  # noqa: BLE001 - informational counter only
        pass


def _counting_zeroes(orig):
    def zero_block_ids(self, block_ids):
        _count_zeroed(len(block_ids))
        return orig(self, block_ids)

    return zero_block_ids


def _count_zeroed(n: int) -> None:
    c = running("worker")
    if c is not None and n:
        c.bump("blocks", "blocks_zeroed", n)
        c.bump("blocks", "zero_calls")


def _ensure_zeroer(runner) -> str:
    """Make the worker able to zero blocks although the config flag was off."""
    if type(runner).__name__ == "CPUModelRunner" and "_zero_block_ids" in type(runner).__dict__:
        return "CPUModelRunner._zero_block_ids (no set-up needed)"
    if hasattr(runner, "kv_block_zeroer"):  # Model Runner V2
        if runner.kv_block_zeroer is None:
            runner._init_kv_zero_meta()
            return "Model Runner V2: kv_block_zeroer built at runtime"
        return "Model Runner V2: kv_block_zeroer present"
    if not hasattr(runner, "_kv_block_zeroer") and hasattr(runner, "_init_kv_zero_meta"):
        runner._init_kv_zero_meta()
        return "V1: _kv_block_zeroer built at runtime"
    return "V1: _kv_block_zeroer present"


def drafter_layers(runner) -> set[str]:
    """The drafter's attention layer names: the V1 runner's
    ``runner.drafter._draft_attn_layer_names`` (``SpecDecodeBaseProposer``), Model Runner V2's
    ``runner.speculator.draft_attn_layer_names`` (``DraftModelSpeculator``); empty without one."""
    v1 = getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", None)
    v2 = getattr(getattr(runner, "speculator", None), "draft_attn_layer_names", None)
    return set(v1 or v2 or ())


def kv_tensors(runner) -> list[tuple[str, Any]]:
    """(layer name, KV cache tensor) for every distinct KV tensor the runner uses."""
    import torch

    cfg = runner.kv_cache_config
    sfc = runner.compilation_config.static_forward_context
    seen: set[int] = set()
    out: list[tuple[str, Any]] = []
    for group in cfg.kv_cache_groups:
        for name in group.layer_names:
            ctx = sfc.get(name)
            kv = getattr(ctx, "kv_cache", None)
            if isinstance(kv, (list, tuple)) and kv:
                kv = kv[0]
            if not isinstance(kv, torch.Tensor) or kv.data_ptr() in seen:
                continue
            seen.add(kv.data_ptr())
            out.append((name, kv))
    return out


def _block_dim(kv, num_blocks: int) -> int | None:
    if kv.ndim and kv.shape[0] == num_blocks:
        return 0
    for d, n in enumerate(kv.shape):
        if n == num_blocks:
            return d
    return None


def observe(runner) -> dict[str, Any]:
    """What blocks 1..DIAG_BLOCKS hold now (the ids a fresh engine hands out first)."""
    import torch

    num_blocks = runner.kv_cache_config.num_blocks
    sq, nz, numel, tensors = 0.0, 0, 0, 0
    with torch.no_grad():
        for _, kv in kv_tensors(runner):
            d = _block_dim(kv, num_blocks) if kv.is_floating_point() else None
            if d is None:
                continue
            sample = kv.narrow(d, 1, min(DIAG_BLOCKS, num_blocks - 1))
            n = int(torch.count_nonzero(sample))
            if n:
                sq += float(torch.linalg.vector_norm(sample.float())) ** 2
                nz += n
            numel += sample.numel()
            tensors += 1
    return {"tensors": tensors, "diag_blocks": min(DIAG_BLOCKS, num_blocks - 1),
            "nonzero_fraction": (nz / numel if numel else None),
            "rms_nonzero": (math.sqrt(sq / nz) if nz else None)}


def warmup_note(runner_kind: str, seen: dict[str, Any]) -> str:
    frac = seen.get("nonzero_fraction")
    if not frac:
        why = ("the V1 model runner runs no KV-writing warm-up" if runner_kind == "v1" else
               "Model Runner V2 skipped its warm-up (--enforce-eager) or zeroed it")
        return (f"blocks 1..{seen.get('diag_blocks')} hold zeros: {why}, and no earlier request "
                "used them. This run's 'dirty' blocks are zero blocks: expect the zeroed result.")
    source = ("Model Runner V2's start-up warm-up and/or earlier requests" if runner_kind == "v2"
              else "earlier requests (the V1 runner has no KV-writing warm-up)")
    return (f"{100 * frac:.1f}% of the values in blocks 1..{seen.get('diag_blocks')} are non-zero "
            f"(rms {seen.get('rms_nonzero'):.3g}), left by {source}; nothing was written.")


def fill_noise(runner, seed: int, std: float) -> dict[str, Any]:
    import torch

    num_blocks = runner.kv_cache_config.num_blocks
    drafter = drafter_layers(runner)
    before = observe(runner)  # the magnitude K/V had in this cache before the fill
    filled: list[str] = []
    skipped: dict[str, str] = {}
    gen = None
    with torch.no_grad():
        for name, kv in kv_tensors(runner):
            if not kv.is_floating_point():
                skipped[name] = f"dtype {kv.dtype} is not floating point"
                continue
            d = _block_dim(kv, num_blocks)
            if d is None:
                skipped[name] = f"no dimension of size num_blocks={num_blocks} in {tuple(kv.shape)}"
                continue
            if gen is None or gen.device != kv.device:
                gen = torch.Generator(device=kv.device)
                gen.manual_seed(int(seed))
            view = kv.narrow(d, 1, num_blocks - 1)
            view.normal_(0.0, std, generator=gen)
            filled.append(name)
    return {
        "kind": "noise",
        "seed": int(seed),
        "scale": std,
        "blocks": num_blocks - 1,
        "first_block": 1,
        "tensors": len(filled),
        "target_layers": sum(1 for n in filled if n not in drafter),
        "drafter_layers": sum(1 for n in filled if n in drafter),
        "drafter_layer_names": sorted(n for n in filled if n in drafter),
        "skipped": skipped,
        # non-zero values of blocks 1..DIAG_BLOCKS before the fill: compare with "scale"
        "observed_rms_nonzero_before": before["rms_nonzero"],
        "nonzero_fraction_before": before["nonzero_fraction"],
        "diag_blocks": before["diag_blocks"],
    }


def apply_worker(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    runner = comp.obj.model_runner
    value = knobs["blocks"]
    source = knobs["dirty_source"]
    events: dict[str, Any] = {"mode": value, "dirty_source": source}
    if value == "zeroed":
        events["zeroer"] = _ensure_zeroer(runner)
        events["blocks_zeroed"] = 0
    elif value in NOISE_STD and source == "noise":
        events["fill"] = fill_noise(runner, seed, NOISE_STD[value])
    elif value in NOISE_STD:
        seen = observe(runner)
        events["fill"] = {"kind": "warmup", "runner": comp.runner, **seen,
                          "note": warmup_note(comp.runner, seen)}
    return value, events


def apply_dirty_source(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    """Read back only: ``apply_worker`` acts on the source (it is part of the fill)."""
    return knobs["dirty_source"], {}
