"""vLLM general plugin: the workbench's knobs inside vLLM's processes.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It does nothing unless ``WORKBENCH_KNOBS_FILE`` (or ``WORKBENCH_NIXL_PROGRESS_DELAY_US``,
see ``nixl_progress.py``) is set. Otherwise it checks the vLLM version and installs
class-level patches in this process:

* always: hooks that start a *component* once the object it controls exists:
  ``Scheduler.__init__`` -> the ``engine_core`` component (scheduler-side knobs:
  prefill_lookahead, block_handoff, blocks=zeroed's scheduler half, transfer read-back);
  ``Worker.initialize_from_config`` (after the KV cache and the connector exist) -> the
  ``worker`` component (finalize, blocks, dirty_source, transfer read-back). The API
  server process builds neither, so it runs no component and writes no state file.
* ``Worker.workbench_knobs``: the knob channel over HTTP (``http_channel.py``), reached
  through vLLM's dev-mode ``POST /collective_rpc`` when the workbench shares no files with
  the server;
* the mechanism patches (``finalize``, ``handoff``, ``lookahead``, ``blocks``) are inert
  until a component switches them on; ``transfer`` (restart-time) installs only when
  ``WORKBENCH_TRANSFER=host-staged``.

Each component applies the control file at start-up (version 0 with defaults if there is
none yet), writes its state file, and then polls the file (see ``control.py``).
"""

from __future__ import annotations

import os
import threading

from . import spec

SUPPORTED_VLLM = ("0.32.0",)

_lock = threading.Lock()
_installed = False


def vllm_version() -> str:
    import vllm

    v = getattr(vllm, "__version__", None)
    if not v:
        from vllm.version import __version__ as v  # type: ignore
    return str(v)


def check_version(version: str | None = None) -> str:
    """Return the vLLM version; raise RuntimeError if the plugin was not written for it."""
    v = version if version is not None else vllm_version()
    base = v.split("+", 1)[0]
    if base not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"workbench knobs plugin: vLLM {v} is not supported; it was written for vLLM "
            f"{', '.join(SUPPORTED_VLLM)} (its patches target those versions' source). "
            f"Install a supported vLLM, or unset {spec.ENV_CONTROL_FILE} to run vLLM without "
            "the knobs."
        )
    return v


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Cheap and idempotent."""
    global _installed
    if _installed:
        return
    from . import nixl_progress

    delay_us = nixl_progress.requested_delay_us()
    knobs_on = bool(os.environ.get(spec.ENV_CONTROL_FILE))
    if not (knobs_on or delay_us):
        return
    with _lock:
        if _installed:
            return
        check_version()
        if delay_us:
            nixl_progress.install(delay_us)
        if not knobs_on:
            _installed = True
            return
        from . import transfer

        _install_engine_hook()
        _install_worker_hook()
        transfer.install()
        _installed = True


# ----------------------------------------------------------------------- engine core --
def _install_engine_hook() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from . import _patch, blocks, handoff, lookahead

    lookahead.install()
    handoff.install()
    blocks.install_engine()

    def make_init(orig):
        def __init__(self, *args, **kwargs):
            orig(self, *args, **kwargs)
            try:
                _start_engine_core(self)
            except Exception as e:  # fail loudly: a server without its knobs would mislead
                from .control import log

                log(f"engine_core component failed to start: {type(e).__name__}: {e}")
                raise

        return __init__

    _patch.patch(Scheduler, "__init__", make_init)


def _start_engine_core(sched) -> None:
    from . import blocks, control, handoff, lookahead, transfer

    kv_role = None
    ktc = getattr(sched.vllm_config, "kv_transfer_config", None)
    if ktc is not None:
        kv_role = getattr(ktc, "kv_role", None)
    info = {
        "scheduler_class": f"{type(sched).__module__}:{type(sched).__qualname__}",
        "kv_role": kv_role,
        "connector": type(sched.connector).__name__ if getattr(sched, "connector", None) else None,
        "num_lookahead_tokens_at_start": sched.num_lookahead_tokens,
        "num_spec_tokens": getattr(sched, "num_spec_tokens", None),
        "transfer_env": transfer.requested(),
    }
    runner = "v2" if getattr(sched, "use_v2_model_runner", False) else "v1"
    control.start_component(
        "engine_core", sched,
        [("prefill_lookahead", lookahead.apply), ("block_handoff", handoff.apply),
         ("blocks", blocks.apply_engine), ("transfer", transfer.apply_engine)],
        runner=runner, info=info,
    )


# ---------------------------------------------------------------------------- worker --
def _install_worker_hook() -> None:
    from vllm.v1.worker.gpu_worker import Worker

    from . import _patch

    def make(orig):
        def initialize_from_config(self, kv_cache_config):
            out = orig(self, kv_cache_config)
            try:
                _start_worker(self)
            except Exception as e:
                from .control import log

                log(f"worker component failed to start: {type(e).__name__}: {e}")
                raise
            return out

        return initialize_from_config

    _patch.patch(Worker, "initialize_from_config", make)

    from .http_channel import METHOD, worker_method

    _patch.patch(Worker, METHOD, lambda _orig: worker_method, allow_missing=True)


def runner_kind(model_runner) -> str:
    """'v1' for GPUModelRunner/CPUModelRunner (vllm.v1.worker.*_model_runner), 'v2' for
    Model Runner V2 (vllm.v1.worker.gpu.* / vllm.v1.worker.cpu.*)."""
    for k in type(model_runner).__mro__:
        mod = k.__module__
        if mod.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")):
            return "v2"
    return "v1"


def _start_worker(worker) -> None:
    from . import blocks, control, finalize, nixl_progress, transfer

    mr = worker.model_runner
    runner = runner_kind(mr)
    finalize.install(runner)
    blocks.install_worker(mr)
    info = {
        "worker_class": f"{type(worker).__module__}:{type(worker).__qualname__}",
        "model_runner_class": f"{type(mr).__module__}:{type(mr).__qualname__}",
        "num_blocks": getattr(getattr(mr, "kv_cache_config", None), "num_blocks", None),
        "speculative": getattr(mr, "speculative_config", None) is not None,
        "transfer_env": transfer.requested(),
        "nixl_progress_delay_us": nixl_progress.requested_delay_us(),
    }
    control.start_component(
        "worker", worker,
        [("finalize", finalize.apply), ("blocks", blocks.apply_worker),
         ("transfer", transfer.apply_worker)],
        runner=runner, info=info,
    )
