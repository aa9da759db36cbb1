"""vLLM's engine core and worker forked from the API server, as vLLM starts them off the CPU.

``CpuPlatform.check_and_update_config`` (``vllm/platforms/cpu.py``) ends by setting
``VLLM_WORKER_MULTIPROC_METHOD=spawn``, so a CPU server's engine core and its worker each start a
fresh interpreter and import torch and vLLM again: two of a start's three imports, 12 s each
here (docs/performance.md). Everywhere else vLLM's default is ``fork`` (``envs.py``; forced
to spawn only where CUDA is initialised, ``system_utils._maybe_force_spawn``). The reason is
OpenMP's binding: ``MultiprocExecutor._init_executor`` starts each worker inside
``OMPProcessManager.configure_omp_envs``, which sets ``OMP_NUM_THREADS`` and ``OMP_PLACES``
(from ``VLLM_CPU_OMP_THREADS_BIND``) for the new process's OpenMP runtime to read when it loads.
A forked worker's runtime was loaded before (with torch, in its parent), so at the start of
``CPUWorker.__init__``, before any OpenMP region, this module applies those two variables as the
runtime would have: the thread count (``torch.set_num_threads``) and the places' cores (the
thread's affinity, which the OpenMP threads it creates inherit). A test compares tokens, counts
and KV digests with spawned servers. Not a knob: part of how the workbench starts a server,
asked for with ``WORKBENCH_FORK_START=1``. Where the source pinned here changed, nothing is
patched and the server starts as vLLM starts it.
"""

from __future__ import annotations

import os
import sys

from . import _patch
from .spec import ENV_FORK_START as ENV

TARGETS = (
    ("vllm.platforms.cpu", "CpuPlatform", "check_and_update_config", None),
    ("vllm.v1.worker.cpu_worker", "CPUWorker", "__init__", None),
)
SOURCE = (
    ("vllm.platforms.cpu", "CpuPlatform.check_and_update_config",
     ('os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"',)),
    ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor._init_executor",
     ("cpu_omp_manager.configure_omp_envs(", "WorkerProc.make_worker_process(")),
    ("vllm.utils.ompmultiprocessing", "OMPProcessManager.configure_omp_envs",
     ('envs_dict["OMP_NUM_THREADS"] = str(len(cpu_list))',
      'envs_dict["OMP_PLACES"] = f"{{{cpu_list_str}}}"')),
)
METHOD = "fork"
APPLIED: dict | None = None  # what apply_openmp_env set in this process


def observed() -> dict:
    """The OpenMP threads this worker's forwards run on, and what was applied after the fork
    (None: the worker was spawned and its runtime read the variables itself)."""
    import torch

    return {"omp_threads": torch.get_num_threads(), "openmp_applied_after_fork": APPLIED}


def requested() -> bool:
    return os.environ.get(ENV) == "1"


def install(version: str) -> dict[str, str]:
    """Patch the platform where its source is the one pinned; the failed checks otherwise."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.worker.cpu_worker import CPUWorker

    from .patch_checks import failures_installed

    if failed := failures_installed(TARGETS, SOURCE, version):
        return failed
    _patch.patch(CpuPlatform, "check_and_update_config", _keep_fork)
    _patch.patch(CPUWorker, "__init__", _openmp_first)
    if (port := api_port(sys.argv)) is not None:
        os.register_at_fork(after_in_child=lambda: drop_listener(port))
    return {}


def api_port(argv: list[str]) -> int | None:
    """The API server's ``--port`` in its command line."""
    for i, a in enumerate(argv):
        value = argv[i + 1] if a == "--port" and i + 1 < len(argv) else (
            a.split("=", 1)[1] if a.startswith("--port=") else None)
        if value is not None and value.isdigit():
            return int(value)
    return None


def drop_listener(port: int) -> None:
    """In a process forked from the API server: /dev/null in place of the inherited socket
    bound to ``port`` (bound before the fork, listening after it; a spawned engine core never
    had it). Otherwise the worker holds the
    port after the API server stopped, and vLLM's shutdown (``serve_http``:
    ``find_process_using_port``) fails reading that worker's command line once it is a
    zombie. The fd number stays open, so the socket object that still names it closes
    /dev/null, never another file."""
    import psutil

    for conn in psutil.Process().net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.fd >= 0:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, conn.fd)
            os.close(null)


def _keep_fork(orig):
    def check_and_update_config(cls, vllm_config):
        orig(cls, vllm_config)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = METHOD
    return check_and_update_config


def _openmp_first(orig):
    def __init__(self, *args, **kwargs):
        apply_openmp_env(os.environ)
        orig(self, *args, **kwargs)
    return __init__


def openmp_cores(env) -> set[int] | None:
    """The cores ``configure_omp_envs`` named, in whichever of its three forms it wrote them
    (``OMP_PLACES={0,1}``; ``GOMP_CPU_AFFINITY=0 1`` with libgomp preloaded;
    ``KMP_AFFINITY=...proclist=[0,1]`` with Intel's), or None."""
    if (places := env.get("OMP_PLACES", "").strip()).startswith("{"):
        ids = places.strip("{}").split(",")
    elif gomp := env.get("GOMP_CPU_AFFINITY", "").strip():
        ids = gomp.split()
    elif "proclist=[" in (kmp := env.get("KMP_AFFINITY", "")):
        ids = kmp.split("proclist=[", 1)[1].split("]", 1)[0].split(",")
    else:
        return None
    ids = [i.strip() for i in ids]
    return {int(i) for i in ids} if ids and all(i.isdigit() for i in ids) else None


def apply_openmp_env(env) -> None:
    """What the OpenMP runtime reads from these variables when it loads, for one that loaded
    before they were set: the number of threads, and the cores they run on."""
    import torch

    global APPLIED
    APPLIED = {}
    if cores := openmp_cores(env):
        os.sched_setaffinity(0, cores)
        APPLIED["cores"] = sorted(cores)
    if (n := env.get("OMP_NUM_THREADS", "")).isdigit():
        torch.set_num_threads(int(n))
        APPLIED["threads"] = int(n)
