"""Knob ``transfer``: NIXL reads the KV memory directly, or through a host staging buffer.

Restart-time: read from env ``WORKBENCH_TRANSFER`` when the plugin registers, because the
staging buffer is allocated and registered with NIXL when the connector is built.

host-staged on the CPU (NIXL sets ``use_host_buffer = False`` when the device is the CPU):
* ``NixlBaseConnectorScheduler.__init__`` and ``NixlBaseConnectorWorker.__init__`` set
  ``use_host_buffer = True`` after the original ``__init__`` (before ``register_kv_caches``,
  which then allocates and registers the host buffers);
* ``NixlBaseConnectorWorker.set_host_xfer_buffer_ops`` keeps the copy op it is given
  (``copy_kv_blocks``; the original returns early on a CPU device);
* the CPU platform class gets ``insert_blocks_to_device`` / ``swap_out_blocks_to_host``
  (``dst[dst_idx] = src[src_idx]``, as the CUDA platform does), which ``copy_kv_blocks`` calls.
On a GPU, host staging is vLLM's own ``kv_buffer_device: cpu``: the plugin changes nothing.

Observe-only (an old release run natively, ``observe.py``), the same patches are the release's
port of host staging, made where ``TARGETS`` and ``SOURCE`` hold in its own source
(:func:`observe`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import _patch, spec
from .component import Component, running

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
TARGETS = (
    (f"{NIXL}.base_scheduler", "NixlBaseConnectorScheduler", "__init__", None),
    (f"{NIXL}.base_worker", "NixlBaseConnectorWorker", "__init__", None),
    (f"{NIXL}.base_worker", "NixlBaseConnectorWorker", "set_host_xfer_buffer_ops",
     ["self", "copy_operation"]),
    (f"{NIXL}.base_worker", "NixlBaseConnectorWorker", "save_kv_to_host", ["self", "metadata"]),
    (f"{NIXL}.base_worker", "NixlBaseConnectorWorker", "sync_recved_kv_to_device",
     ["self", "req_id", "meta"]),
    ("vllm.distributed.kv_transfer.kv_connector.utils", None, "copy_kv_blocks",
     ["src_kv_caches", "dst_kv_caches", "src_block_ids", "dst_block_ids", "direction"]),
)
# Why the plugin keeps the copy op itself on a CPU device, and the platform methods the
# copy calls (which the plugin gives the CPU platform).
SOURCE = (
    (f"{NIXL}.base_worker", "NixlBaseConnectorWorker.set_host_xfer_buffer_ops",
     ('if self.device_type == "cpu":',)),
    ("vllm.distributed.kv_transfer.kv_connector.utils", "copy_kv_blocks",
     ("current_platform.insert_blocks_to_device", "current_platform.swap_out_blocks_to_host")),
)

_counts = {"d2h_copies": 0, "h2d_copies": 0}
REPORT_GLOB = "transfer-*.json"  # observe-only: each worker's read-back


def requested() -> str:
    return os.environ.get(spec.ENV_TRANSFER, spec.KNOBS["transfer"].default)


def install() -> None:
    """Install host staging if the environment asks for it and the device is the CPU
    (``register`` hook: it must run before vLLM builds the connector)."""
    if requested() != "host-staged":
        return
    from vllm.platforms import current_platform

    if current_platform.device_type != "cpu":
        return  # native: kv_buffer_device=cpu gives a host buffer on accelerators
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_scheduler import (
        NixlBaseConnectorScheduler,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
        NixlBaseConnectorWorker,
    )

    _patch.patch(NixlBaseConnectorScheduler, "__init__", _with_host_buffer)
    _patch.patch(NixlBaseConnectorWorker, "__init__", _with_host_buffer)
    _patch.patch(NixlBaseConnectorWorker, "set_host_xfer_buffer_ops", _keeping_copy_op)
    _patch.patch(NixlBaseConnectorWorker, "save_kv_to_host", _counting_saves)
    _patch.patch(NixlBaseConnectorWorker, "sync_recved_kv_to_device", _recording_syncs)
    # What the CUDA platform does for kv_buffer_device=cpu, which copy_kv_blocks calls.
    for name in ("insert_blocks_to_device", "swap_out_blocks_to_host"):
        _patch.add_classmethod(type(current_platform), name, _copy_blocks)


def observe(report_dir: str, version: str) -> tuple[dict[str, Any], Any]:
    """Observe-only: host staging on a release run natively, where ``TARGETS`` and ``SOURCE``
    hold in its own source (checked here, in each process). Not an instrument: it moves KV
    through NIXL's host buffer, the path vLLM takes for ``kv_buffer_device: cpu`` on a GPU,
    and changes only the copy op, never which blocks NIXL stages, so a finding of that path
    can be measured on the release. Returns the report and the worker's hook, which writes
    what the NIXL worker holds (``use_host_buffer``, the copy op) for the run to check."""
    from .patch_checks import failures_installed

    if failed := failures_installed(TARGETS, SOURCE, version):
        return {"installed": False, "failed": failed}, None
    install()
    return ({"installed": True, "value": requested()},
            lambda _worker: write_read_back(Path(report_dir)))


def write_read_back(report_dir: Path) -> None:
    from ..provenance import atomic_write_json

    value, ev = _read_back(connector_worker()[1])
    atomic_write_json(report_dir / f"transfer-{os.getpid()}.json",
                      {"pid": os.getpid(), "role": os.environ.get(spec.ENV_ROLE),
                       "value": value, "evidence": ev})


def _copy_blocks(cls, src_cache, dst_cache, src_block_indices, dst_block_indices) -> None:
    dst_cache[dst_block_indices] = src_cache[src_block_indices].to(dst_cache.device)


def _with_host_buffer(orig):
    def __init__(self, *args, **kwargs):
        orig(self, *args, **kwargs)
        self.use_host_buffer = True

    return __init__


def _keeping_copy_op(orig):
    def set_host_xfer_buffer_ops(self, copy_operation):
        orig(self, copy_operation)
        if self.use_host_buffer and self.copy_blocks is None:
            self.copy_blocks = copy_operation

    return set_host_xfer_buffer_ops


def _counting_saves(orig):
    def save_kv_to_host(self, metadata):
        n = len(getattr(metadata, "reqs_to_save", {}) or {})
        c = running("worker")
        if n and c is not None:
            c.bump("transfer", "d2h_requests_staged", n)
        return orig(self, metadata)

    return save_kv_to_host


def _recording_syncs(orig):
    def sync_recved_kv_to_device(self, req_id, meta):
        out = orig(self, req_id, meta)
        c = running("worker")
        if c is not None:
            c.bump("transfer", "h2d_requests_synced")
            try:
                _record_received(c, self, meta)
            except Exception as e:  # noqa: BLE001 - diagnostics only
                c.note("transfer", "received_rms_error", f"{type(e).__name__}: {e}")
        return out

    return sync_recved_kv_to_device


def _record_received(comp: Component, worker, meta) -> None:
    """RMS of the KV just copied in from the staging buffer, target vs drafter layers.

    Real K/V of the small models is O(0.3); blocks P staged before its drafter wrote them
    (finalize=eager) carry whatever P's blocks held before (zeros, or the dirty/poisoned
    noise), which shows here as a drafter RMS of 0 or of the noise scale.
    """
    import torch

    from .blocks import drafter_layers

    ids = [b for g in (meta.local_physical_block_ids or []) for b in g]
    if not ids:
        return
    runner = getattr(comp.obj, "model_runner", None)
    drafter = drafter_layers(runner)

    def rms_of(block_ids):
        sums = {"target": [0.0, 0], "drafter": [0.0, 0]}
        idx = torch.tensor(block_ids, dtype=torch.long)
        with torch.no_grad():
            for name, kv in worker.device_kv_caches.items():
                x = kv.index_select(0, idx.to(kv.device)).float()
                key = "drafter" if name in drafter else "target"
                sums[key][0] += float(x.pow(2).sum())
                sums[key][1] += x.numel()
        return {k: (round((s / n) ** 0.5, 4) if n else None) for k, (s, n) in sums.items()}

    # The first block is always fully written by P's prompt (a partial last block holds
    # never-written slots whatever the knobs, so it is reported apart).
    comp.append("transfer", "received_rms", {
        "blocks": len(ids), "first_block": rms_of(ids[:1]), "all_blocks": rms_of(ids),
    }, keep=50)


def _read_back(obj) -> tuple[str, dict[str, Any]]:
    ev: dict[str, Any] = {"requested_at_start": requested()}
    if obj is None:
        ev["note"] = "no NIXL connector in this server"
        return "direct", ev
    use = bool(getattr(obj, "use_host_buffer", False))
    ev["use_host_buffer"] = use
    if hasattr(obj, "copy_blocks"):
        ev["copy_op"] = getattr(obj.copy_blocks, "__name__", repr(obj.copy_blocks))
        ev["host_buffers"] = len(getattr(obj, "host_xfer_buffers", {}) or {})
    return ("host-staged" if use else "direct"), ev


def apply_engine(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    conn = getattr(comp.obj, "connector", None)
    cs = getattr(conn, "connector_scheduler", None) if conn is not None else None
    value, ev = _read_back(cs)
    if cs is None and conn is not None:
        ev["note"] = f"KV connector {type(conn).__name__} has no NIXL scheduler side"
    return value, ev


def connector_worker() -> tuple[bool, Any]:
    """(whether this worker has a KV connector, its NIXL worker side or None)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return False, None
    return True, getattr(get_kv_transfer_group(), "connector_worker", None)


def apply_worker(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    try:
        w = connector_worker()[1]
    except Exception:  # noqa: BLE001 - read-back only: no connector is reported as direct
        w = None
    value, ev = _read_back(w)
    ev.setdefault("d2h_requests_staged", 0)
    ev.setdefault("h2d_requests_synced", 0)
    return value, ev
