"""The worker's main thread, put back on its server's cores after vLLM's NIXL worker moved it.

On a CPU platform ``NixlBaseConnectorWorker.__init__`` (``nixl/base_worker.py``) "reserve[s]
different cores for start_load_kv() from model_forward()" with ``os.sched_setaffinity(0,
[the last core of each NUMA node])``. ``0`` is the calling thread: the worker's main thread,
which is also the OpenMP master thread that runs every forward (with one core per server,
``OMP_NUM_THREADS=1``: the only one). On the 2-core box that moved P's forwards onto core 1,
beside D's and the baseline's, and left core 0 idle: measured, P's worker had 52 threads on
core 0 and its main thread on core 1, and a P request waited about 1 s behind D's decode.

With ``WORKBENCH_PIN_MAIN_THREAD=1`` (the CPU profile sets it) the worker component puts the
main thread back on the cores ``VLLM_CPU_OMP_THREADS_BIND`` gave the server, after the connector
exists. NIXL's own threads keep the reserved core they were created on. Not a knob: part of a
profile, like ``nixl_progress.py``; what vLLM set and what was restored are recorded in the
worker's ``info`` (``main_thread_cpus_vllm``, ``main_thread_cpus``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import spec
from .spec import ENV_PIN_MAIN_THREAD as ENV

TARGETS = (
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker", "NixlBaseConnectorWorker",
     "__init__", None),
)
SOURCE = (
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker",
     "NixlBaseConnectorWorker.__init__",
     ('if self.device_type == "cpu":', "os.sched_setaffinity(0, rsv_cores_for_kv)")),
)


def parse_cpus(mask: str) -> set[int] | None:
    """``"0"``, ``"0-3"``, ``"0,2,4-5"`` -> the core ids; None for vLLM's ``auto`` / ``nobind``
    or anything else that names no cores (then nothing is restored)."""
    cores: set[int] = set()
    for part in mask.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return None
        cores.update(range(int(lo), int(hi or lo) + 1))
    return cores or None


def observed() -> dict[str, list[int] | None]:
    """This thread's cores as vLLM left them, and the cores the server was given."""
    want = parse_cpus(os.environ.get("VLLM_CPU_OMP_THREADS_BIND", ""))
    return {"main_thread_cpus_vllm": sorted(os.sched_getaffinity(0)),
            "omp_threads_bind": sorted(want) if want else None}


def restore() -> dict[str, list[int] | None]:
    """Put this thread back on the server's bound cores if asked and if they differ."""
    seen = observed()
    want = seen["omp_threads_bind"]
    if os.environ.get(ENV) == "1" and want and seen["main_thread_cpus_vllm"] != want:
        os.sched_setaffinity(0, want)
    return {**seen, "main_thread_cpus": sorted(os.sched_getaffinity(0))}


# Observe-only: where the worker builds its connector, so whatever the release's NIXL worker
# does to the thread is done by then (a reading: which class does it is not needed for it).
OBSERVE_TARGETS = (
    ("vllm.v1.worker.gpu_worker", "Worker", "initialize_from_config", None),
)
OBSERVE_SOURCE = (
    ("vllm.v1.worker.gpu_worker", "Worker.initialize_from_config",
     ("ensure_kv_transfer_initialized(self.vllm_config",)),
)
REPORT_GLOB = "affinity-*.json"


def observe(report_dir: str, version: str) -> tuple[dict[str, Any], Any]:
    """Observe-only (``observe.py``): each worker writes its forward thread's cores right after
    ``Worker.initialize_from_config`` built the NIXL connector, and moves nothing back, where
    ``OBSERVE_TARGETS`` and ``OBSERVE_SOURCE`` hold in the running release's own source
    (checked here, in each process, as ``build`` checks a knob's). Returns the report and the
    worker's hook."""
    from .patch_checks import failures_installed

    if failed := failures_installed(OBSERVE_TARGETS, OBSERVE_SOURCE, version):
        return {"installed": False, "failed": failed}, None
    return ({"installed": True, "after": "Worker.initialize_from_config"},
            lambda _worker: write_observed(Path(report_dir)))


def write_observed(report_dir: Path) -> None:
    from ..provenance import atomic_write_json

    atomic_write_json(report_dir / f"affinity-{os.getpid()}.json",
                      {"pid": os.getpid(), "role": os.environ.get(spec.ENV_ROLE),
                       "info": observed()})
