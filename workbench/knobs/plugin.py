"""vLLM general plugin: the workbench's knobs inside vLLM's processes.

vLLM calls :func:`register` in every process it starts (API server, engine core, workers).
It does nothing unless ``WORKBENCH_KNOBS_FILE`` (or ``WORKBENCH_NIXL_PROGRESS_DELAY_US``,
see ``nixl_progress.py``) is set; with ``WORKBENCH_DIE_WITH_PID`` an in-process engine's core
dies with the process that built it (``parent_death.py``). With ``WORKBENCH_OBSERVE_ONLY``
instead (an old release run natively) it installs no knob, only the release's compatibility
fixes (``observe.py``), on any release. Otherwise it checks the vLLM version and installs, in
this process:

* the ``register`` hook of every knob that has one (``transfer``: restart-time patches that
  must exist before vLLM builds the KV connector);
* ``Scheduler.__init__`` -> the ``engine_core`` component, and
  ``Worker.initialize_from_config`` (after the KV cache and the connector exist) -> the
  ``worker`` component. Each component installs and applies the hooks the knob table
  (``spec.KNOBS``) gives it, writes its state file and polls the control file
  (``component.py``). The API server process builds neither, so it runs no component and
  writes no state file;
* each new control version resets the engine core's prefix cache (``reset_prefix_cache``),
  so runs never share cached KV and servers need no dev mode for it;
* ``Worker.workbench_knobs``: the knob channel over HTTP (``http_channel.py``), reached
  through vLLM's dev-mode ``POST /collective_rpc`` when the workbench shares no files with
  the server.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from . import _patch, cpu_pin, fork_start, nixl_progress, parent_death, spec
from .component import log, refuse, resolve, start_component
from .http_channel import METHOD, worker_method
from .release import check_version, runner_kind
from .triton_cpu import profile as triton_profile
from .triton_cpu import standins as triton_standins

# What register() patches to start the components (and the knob channel over HTTP).
TARGETS = (
    ("vllm.v1.core.sched.scheduler", "Scheduler", "__init__", None),
    ("vllm.v1.worker.gpu_worker", "Worker", "initialize_from_config", ["self", "kv_cache_config"]),
)
# The worker component starts once the KV cache (and with it the connector) exists.
SOURCE = (
    ("vllm.v1.worker.gpu_worker", "Worker.initialize_from_config",
     ("self.model_runner.initialize_kv_cache(",)),
)

_lock = threading.Lock()
_installed = False
_build = None  # build.Build of this process, once registered with the knobs on


def set_build(b) -> None:
    """Record the build's verdict: components leave the knobs it refuses uninstalled."""
    global _build
    _build = b
    refuse(b.refused(_runner_asked()))


def _runner_asked() -> str:
    """The runner this server was started for (the restart-time knob ``runner``)."""
    from .runner import requested

    return requested()


def register() -> None:
    """The ``vllm.general_plugins`` entry point. Cheap and idempotent."""
    global _installed
    if _installed:
        return
    if parent := parent_death.requested():
        parent_death.install(parent)
    if fork_start.requested():
        _fork_start()
    if standins_mode := triton_standins.requested():
        triton_standins.install(standins_mode)  # before the profile, which then times it
    delay_us = nixl_progress.requested_delay_us()
    knobs_on = bool(os.environ.get(spec.ENV_CONTROL_FILE))
    observe_dir = os.environ.get(spec.ENV_OBSERVE_ONLY)
    if not (knobs_on or delay_us or observe_dir):
        return
    with _lock:
        if _installed:
            return
        if observe_dir:
            _observe_only(observe_dir, knobs_on or delay_us)
            _installed = True
            return
        check_version()
        _verdict()
        if delay_us:
            nixl_progress.install(delay_us)
        if knobs_on:
            _install_knobs()
        if profile_dir := triton_profile.requested():
            triton_profile.install(profile_dir, os.environ.get(spec.ENV_ROLE, "unknown"))
        _installed = True


def _fork_start() -> None:
    """Before any knob: a server started without knobs (``serve``) forks its processes too."""
    from .release import vllm_version

    if failed := fork_start.install(vllm_version()):
        log(f"fork_start: not installed, the server's processes are spawned: {failed}")


def _observe_only(report_dir: str, knobs_asked: bool) -> None:
    if knobs_asked:
        raise RuntimeError(f"{spec.ENV_OBSERVE_ONLY} is set, and so is {spec.ENV_CONTROL_FILE} "
                           f"or {spec.ENV_NIXL_PROGRESS_DELAY_US}: observe-only installs no "
                           "knob; unset one of them")
    from . import observe

    observe.install(report_dir)


def _verdict():
    """The build's verdict (``knobs/build.py``): the one the workbench handed this server, or
    computed here for a server started by hand. Patches whose checks failed are never made."""
    from . import build

    b = build.from_env() or build.installed()
    if (why := build.refusal(b, {"runner": _runner_asked()})) is not None:
        raise RuntimeError(why)
    set_build(b)


def _install_knobs() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.worker.gpu_worker import Worker

    refused = _build.refused(_runner_asked()) if _build is not None else {}
    refs = [k.register for n, k in spec.KNOBS.items() if k.register and n not in refused]
    for ref in dict.fromkeys(refs):
        resolve(ref)()
    _patch.patch(Scheduler, "__init__", _starting("engine_core", _start_engine_core))
    _patch.patch(Worker, "initialize_from_config", _starting("worker", _start_worker))
    _patch.patch(Worker, METHOD, lambda _orig: worker_method, allow_missing=True)


def _starting(name: str, start: Callable[[Any], None]):
    """A patch maker: run the original method, then start the component on its object."""
    def make(orig):
        def wrapper(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            try:
                start(self)
            except Exception as e:  # fail loudly: a server without its knobs would mislead
                log(f"{name} component failed to start: {type(e).__name__}: {e}")
                raise
            return out

        return wrapper

    return make


def _restart_env() -> dict[str, str]:
    """What each restart-time knob's variable asked for (``transfer_env``: the transfer mode)."""
    return {f"{n}_env": os.environ.get(k.env, k.default)
            for n, k in spec.KNOBS.items() if k.restart and k.env}


def _start_engine_core(sched) -> None:
    ktc = getattr(sched.vllm_config, "kv_transfer_config", None)
    connector = getattr(sched, "connector", None)
    info = {
        "scheduler_class": f"{type(sched).__module__}:{type(sched).__qualname__}",
        "kv_role": getattr(ktc, "kv_role", None),
        "connector": type(connector).__name__ if connector else None,
        "num_lookahead_tokens_at_start": sched.num_lookahead_tokens,
        "num_spec_tokens": getattr(sched, "num_spec_tokens", None),
        **_restart_env(),
    }
    runner = "v2" if getattr(sched, "use_v2_model_runner", False) else "v1"
    start_component("engine_core", sched, runner=runner, info=info,
                    on_version=reset_prefix_cache)


RESET_WAIT_S = 30.0  # how long a new version waits for blocks still held to be freed


def reset_prefix_cache(comp) -> dict:
    """Each control version starts a run that must not read an earlier run's KV: reset the
    scheduler's prefix cache here (``Scheduler.reset_prefix_cache``, what vLLM's dev-mode
    ``POST /reset_prefix_cache`` reaches), so the workbench's servers need no dev mode.

    vLLM refuses the reset while any block is held, and P holds a finished request's blocks
    until D has read them (``Scheduler._free_request(delay_free_blocks=...)``, freed in
    ``Scheduler._update_from_kv_xfer_finished``): a moment after the client has D's answer, so
    a new version can arrive first. This (control) thread waits up to ``RESET_WAIT_S`` for the
    engine thread to free them; no request of the new run is sent before the version is acked.
    """
    sched, t0 = comp.obj, time.monotonic()
    while _blocks_held(sched) and time.monotonic() - t0 < RESET_WAIT_S:
        time.sleep(0.05)
    return {"prefix_cache_reset": bool(sched.reset_prefix_cache()),
            "prefix_cache_reset_wait_s": round(time.monotonic() - t0, 3)}


def _blocks_held(sched) -> int:
    """Blocks some request holds (``BlockPool.reset_prefix_cache``'s own test: the null block
    is always in use)."""
    pool = sched.kv_cache_manager.block_pool
    return pool.num_gpu_blocks - pool.get_num_free_blocks() - 1


def _start_worker(worker) -> None:
    mr = worker.model_runner
    info = {
        "worker_class": f"{type(worker).__module__}:{type(worker).__qualname__}",
        "model_runner_class": f"{type(mr).__module__}:{type(mr).__qualname__}",
        "num_blocks": getattr(getattr(mr, "kv_cache_config", None), "num_blocks", None),
        "speculative": getattr(mr, "speculative_config", None) is not None,
        **_restart_env(),
        "nixl_progress_delay_us": nixl_progress.requested_delay_us(),
        **fork_start.observed(),
        # NIXL's worker moved this thread; the CPU profile moves it back (unless its checks
        # failed on this build)
        **({} if _build is not None and _build.skipped("cpu_pin") else cpu_pin.restore()),
    }
    start_component("worker", worker, runner=runner_kind(mr), info=info)
