"""NIXL's CPU core reservation moves the worker's forward thread (CPU profile only)."""

from __future__ import annotations

from ..knobs import connector
from .finding import ABSENT, INCONCLUSIVE, PRESENT, Detection, Finding

ROLES = ("p", "d")  # the servers with a NIXL connector


def _workers(result: dict, role: str) -> list[dict]:
    w = (((result.get("knobs") or {}).get("detail") or {}).get(role) or {}).get(
        "components", {}).get("worker")
    return w if isinstance(w, list) else [w] if w else []


def _detect(result: dict, key: str) -> Detection:
    """Each P and D worker's forward-thread affinity (``key``: as vLLM left it, or as the run
    ran it) against the cores ``VLLM_CPU_OMP_THREADS_BIND`` gave the server."""
    seen = {}
    for role in ROLES:
        for w in _workers(result, role):
            info = w.get("info") or {}
            seen[f"{role} pid {w.get('pid')}"] = {"thread": info.get(key),
                                                  "bound": info.get("omp_threads_bind")}
    moved = [k for k, v in seen.items() if v["thread"] is not None and v["bound"] is not None
             and sorted(v["thread"]) != sorted(v["bound"])]
    known = [k for k, v in seen.items() if v["thread"] is not None and v["bound"] is not None]
    evidence = {"workers": seen, "moved": moved}
    if known and moved:
        return PRESENT, evidence
    if known and not moved:
        return ABSENT, evidence
    return INCONCLUSIVE, evidence


def detect(result: dict) -> Detection:
    return _detect(result, "main_thread_cpus_vllm")


def detect_restored(result: dict) -> Detection:
    return _detect(result, "main_thread_cpus")


FINDING = Finding(
    id="nixl-cpu-forward-thread",
    severity="performance only (where the forward runs; outputs unchanged)",
    title="On CPU, NIXL's core reservation moves the worker's forward thread off its cores",
    where="vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py, "
    "NixlBaseConnectorWorker.__init__: os.sched_setaffinity(0, rsv_cores_for_kv); pid 0 is "
    "the calling thread, the worker's main thread, which runs every forward",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain"},
    detect=detect,
    positive=None,
    negative={},  # the same run, read after the CPU profile's restore (cpu_pin.restore)
    negative_detect=detect_restored,
    profiles=("cpu",),
    connectors=connector.with_nixl(),
    reads="each P and D worker's forward-thread affinity (os.sched_getaffinity in the worker)",
    standalone=False,
    observes="affinity",
    native_not_run={"negative": "reads the thread after the CPU profile's restore "
                                "(cpu_pin.restore), which observe-only never makes"},
    measured=("each P and D worker's forward-thread affinity right after vLLM built the "
              "connector, and after the CPU profile's restore, against "
              "VLLM_CPU_OMP_THREADS_BIND",),
    inferred=("the move comes from NixlBaseConnectorWorker.__init__'s "
              "os.sched_setaffinity(0, ...) (read in the source)",),
    symptom="inside",
    explains=(),  # where a thread runs: no request's output
)
