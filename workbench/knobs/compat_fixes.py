"""Runtime fixes that let an old vLLM release run the CPU PD + EAGLE3 pipeline at all.

Why this exists: ``workbench/releases`` compares each historical bug as the old release had it
with the knob that re-creates it on 0.32.0. Some old releases cannot start on the CPU for
reasons that have nothing to do with those bugs; such a release may be fixed only at runtime,
through a vLLM general plugin (entry point group ``vllm.general_plugins``, loaded by vLLM in
every process it starts), never by editing the release's files, and every fix must be listed in
the result and shown to be unrelated to the bug under study. Each :class:`Fix` says which
releases need it, which vLLM symbol it wraps, why, and why it cannot touch the bugs (the block
hand-off in the engine core's scheduler and NIXL connector, and the order of the KV connector's
finalize around the EAGLE3 drafter in the worker).

The workbench plugin's observe-only mode (``observe.py``) is what installs them: the old
release's environment gets the workbench package without its dependencies
(``scripts/build-release-env.sh``), so this module imports the standard library and the
leaf module ``release`` only, and vLLM only inside an install function. :func:`install`
installs the fixes that apply to the running release and returns their names.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .release import version_key, vllm_version

ENV_LOG = "WORKBENCH_RELEASE_FIXES_LOG"  # optional file each process appends its report to


@dataclass(frozen=True)
class Fix:
    """One runtime fix: the releases it applies to (``first`` .. ``last``, inclusive), the vLLM
    symbol it wraps, why the release cannot run without it, why it is unrelated to the bugs
    under study (with the source that shows it), and the function that installs it (returns
    False when the running release turns out not to need it, e.g. not on the CPU)."""

    name: str
    first: str
    last: str
    target: str
    why: str
    unrelated: str
    install: Callable[[], bool]

    def applies(self, version: str) -> bool:
        return version_key(self.first) <= version_key(version) <= version_key(self.last)


# ------------------------------------------------------------ cpu_recovered_kernel_kwarg --
_CALLS = {"sample_recovered_tokens_kernel": 0}


def _install_recovered_kernel_kwarg() -> bool:
    """Accept ``USE_FP64_GUMBEL`` in the CPU recovered-token kernel, as vLLM 0.25.0 does."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    import torch
    import vllm.utils.cpu_triton_utils as tl

    impl = tl._sample_recovered_tokens_kernel_impl
    if getattr(impl, "_workbench_fix", False):
        return True  # idempotent: vLLM may load plugins more than once in a process
    if "USE_FP64_GUMBEL" in inspect.signature(impl).parameters:
        return False  # the release's own kernel takes it already

    @functools.wraps(impl)
    def sample_recovered_tokens_kernel_impl(output_token_ids, cu_num_draft_tokens,
                                            draft_token_ids, draft_probs, target_probs, inv_q,
                                            vocab_size, BLOCK_SIZE=None, NO_DRAFT_PROBS=False,
                                            USE_FP64_GUMBEL=False):
        # vLLM 0.25.0's own fix: the flag only chose inv_q's precision, which the caller has
        # applied already; the C++ kernel reads inv_q as float32.
        _CALLS["sample_recovered_tokens_kernel"] += 1
        _report(f"sample_recovered_tokens_kernel called ({_CALLS['sample_recovered_tokens_kernel']}"
                " so far in this process; greedy requests never reach it)")
        return impl(output_token_ids, cu_num_draft_tokens, draft_token_ids, draft_probs,
                    target_probs, inv_q.to(torch.float32), vocab_size, BLOCK_SIZE,
                    NO_DRAFT_PROBS)

    sample_recovered_tokens_kernel_impl._workbench_fix = True
    tl._sample_recovered_tokens_kernel_impl = sample_recovered_tokens_kernel_impl
    # CPUModelRunner._postprocess_triton installs this _FuncWrapper into the rejection
    # sampler's module; it was built at import with the old function, so swap what it holds.
    tl.sample_recovered_tokens_kernel.func = sample_recovered_tokens_kernel_impl
    return True


# ------------------------------------------------------------- nixl_cpu_attn_packed_kv --
def _packed_kv(topo) -> bool:
    """Whether the topology's attention backend packs K and V into one blocks-first tensor
    ``[num_blocks, num_kv_heads, block_size, 2 * head_size]`` (CPU_ATTN from 0.23.0), probed
    as TransferTopology itself probes a backend (num_blocks=1, block_size=16, 1 head, size 1)."""
    shape = topo.attn_backends[0].get_kv_cache_shape(num_blocks=1, block_size=16,
                                                     num_kv_heads=1, head_size=1)
    return len(shape) == 4 and shape[0] == 1


def _install_nixl_packed_kv() -> bool:
    """Register a packed K/V cache as one NIXL region per layer, as vLLM 0.26.0 does."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.distributed.kv_transfer.kv_connector import utils as kv_utils

    topo_cls = kv_utils.TransferTopology
    prop = topo_cls.__dict__.get("split_k_and_v")
    if not isinstance(prop, property):
        return False  # 0.26.0+: no split_k_and_v, every layer is one region already
    if getattr(prop.fget, "_workbench_fix", False):
        return True
    original = prop.fget

    def split_k_and_v(self) -> bool:
        split = original(self)
        if split and not self.is_mla and not self.is_mamba and _packed_kv(self):
            if not getattr(self, "_workbench_reported", False):
                self._workbench_reported = True
                _report("TransferTopology.split_k_and_v: packed K/V cache "
                        f"{self.attn_backends[0].__name__}: one NIXL region per layer")
            return False
        return split

    split_k_and_v._workbench_fix = True
    topo_cls.split_k_and_v = property(split_k_and_v)
    return True


FIXES: tuple[Fix, ...] = (
    Fix(
        name="cpu_recovered_kernel_kwarg",
        first="0.23.0", last="0.24.0",
        target="vllm.utils.cpu_triton_utils:_sample_recovered_tokens_kernel_impl "
               "(and the _FuncWrapper sample_recovered_tokens_kernel holding it)",
        why="vllm/v1/sample/rejection_sampler.py:sample_recovered_tokens passes "
            "USE_FP64_GUMBEL=use_fp64_gumbel to sample_recovered_tokens_kernel, which the CPU "
            "model runner (cpu_model_runner.py:_postprocess_triton) replaces with "
            "cpu_triton_utils._sample_recovered_tokens_kernel_impl, whose signature lacks "
            "that keyword (0.23.0 and 0.24.0, from the survey): a TypeError at start-up "
            "(seen live for 0.24.0; not re-run here without the fix), in "
            "GPUModelRunner._dummy_sampler_run, which warms the rejection sampler up with "
            "non-greedy dummy requests (temperature 0.5, all_greedy=False). vLLM 0.25.0's "
            "kernel takes the keyword and casts inv_q to float32; the wrapper does the same.",
        unrelated="The kernel samples the 'recovered' token of a rejected draft for "
                  "non-greedy requests only: rejection_sample() returns right after "
                  "rejection_greedy_sample_kernel when sampling_metadata.all_greedy, before "
                  "sample_recovered_tokens() is called, and in a mixed batch "
                  "rejection_random_sample_kernel returns early for greedy requests "
                  "(`if is_greedy: return`), so their tokens never read it. Every request "
                  "of the experiment is greedy (temperature 0), so after the start-up "
                  "warm-up the kernel is never called (each call is logged, to show it). "
                  "It runs in the worker's sampler after the forward, and touches neither "
                  "the scheduler's block ids nor the NIXL connector (the hand-off bug) nor "
                  "the KV connector's wait_for_save / clear_connector_metadata around the "
                  "drafter (the finalize bug).",
        install=_install_recovered_kernel_kwarg,
    ),
    Fix(
        name="nixl_cpu_attn_packed_kv",
        first="0.23.0", last="0.25.1",
        target="vllm.distributed.kv_transfer.kv_connector.utils:TransferTopology.split_k_and_v",
        why="From 0.23.0 the CPU attention backend (CPU_ATTN) packs K and V into one "
            "blocks-first tensor [num_blocks, num_kv_heads, block_size, 2 * head_size] "
            "(vllm/v1/attention/backends/cpu_attn.py: get_kv_cache_shape), but until 0.26.0 "
            "NIXL's TransferTopology recognises a blocks-first layout only as 5-D "
            "(len(kv_cache_shape) == 5), so it calls the 4-D cache K/V-first, "
            "split_k_and_v is True, and get_transfer_cache_regions returns the tensor "
            "itself: register_kv_caches (nixl/base_worker.py) iterates it along dim 0 as "
            "if each block were a K or V region and raises 'All kv cache tensors must have "
            "the same number of blocks ... cache_shape=(4, 32, 128)': P and D die at start-up. "
            "vLLM 0.26.0 requires the 4-D layout and registers each layer as one region "
            "([cache]); the wrapper makes split_k_and_v False for exactly that layout.",
        unrelated="It decides only how each layer's KV tensor is registered with NIXL "
                  "(one region of num_blocks x page bytes, a block's K and V together, "
                  "instead of a K and a V region); which block ids P hands D "
                  "(Scheduler._connector_finished -> get_block_ids, unclipped in 0.24.0) and "
                  "which of them D keeps (remote_group[-num_local_blocks:] in "
                  "nixl/base_worker.py) are untouched, as is the finalize order (worker, "
                  "KV connector mixin). Its only other reader, "
                  "post_process_device_kv_on_receive, runs for heterogeneous block sizes or "
                  "layouts only (P and D here are identical). Checked live: PD outputs of "
                  "prompts outside the lookahead bad case equal the baseline token for token, "
                  "which a wrong byte layout could not give.",
        install=_install_nixl_packed_kv,
    ),
)


def fixes_for(version: str) -> list[Fix]:
    """The fixes of :data:`FIXES` whose release range holds ``version``."""
    return [f for f in FIXES if f.applies(version)]


def _report(line: str) -> None:
    msg = f"[workbench release fixes pid={os.getpid()}] {line}"
    print(msg, file=sys.stderr, flush=True)
    path = os.environ.get(ENV_LOG)
    if path:
        with Path(path).open("a") as f:
            f.write(msg + "\n")


def install(version: str | None = None) -> list[str]:
    """Install every fix that applies to the running release (or ``version``); return the
    names of those installed. Idempotent and cheap when none applies."""
    v = version or vllm_version()
    applied = [f.name for f in fixes_for(v) if f.install()]
    _report(f"vLLM {v}: applied {applied or 'no fix'}")
    return applied
