"""Knob ``kv_probe`` (an instrument, not a bug): what KV each server holds for each request.

Worker side, in every server's model-runner process. When on, the worker captures a request's
blocks in *every* KV cache layer (the target's and the EAGLE3 drafter's) at the one moment
they mean something, and reduces them where they live to one digest per (layer, slot):

* D (``kv_transfer_params.do_remote_prefill``): at the request's first scheduled step, before
  ``Worker.execute_model`` runs the forward. The scheduler schedules it only once NIXL's
  asynchronous load finished (``Scheduler._update_waiting_for_remote_kv``), so the blocks hold
  exactly what D loaded (or found in its prefix cache), and nothing of D's own yet;
* P (``do_remote_decode``) and the baseline: after ``Worker.sample_tokens`` of the step that
  completed the prompt's prefill, i.e. after the EAGLE3 drafter wrote its prompt KV
  (``propose_draft_token_ids``) and before D pulled the blocks (P holds them until then).

A digest is two exact integer dot products of the slot's raw bits (16-bit halves) with fixed
random weights, computed on the KV tensor's own device: only the digests leave the device, and
the slots themselves stay in a bounded snapshot there until the workbench fetches the blocks
whose digests differ (``serve``: ``records`` / ``fetch`` / ``clear``). Requests reach
``serve`` through a request file in the state directory (servers on this machine) or the worker
method ``workbench_kvprobe`` behind vLLM's dev-mode ``POST /collective_rpc`` (attach mode).
Off (the default), the two hooks cost one attribute test per step and nothing else.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib
import importlib.util
import json
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from . import _patch, connector, spec
from .component import Component, log
from .http_channel import KV_PROBE_METHOD as METHOD

ENV_KEEP_MB = "WORKBENCH_KV_PROBE_KEEP_MB"  # snapshot budget per worker (default 2048 MB)
REQUEST_GLOB = "kvprobe-req-*.json"
POLL_S = 0.05
WEIGHT_SEED = 20261201
WEIGHT_MAX = 1 << 20  # 16-bit halves x 20-bit weights, summed over < 2^12 terms: < 2^48

WORKER_TARGETS = (
    ("vllm.v1.worker.gpu_worker", "Worker", "execute_model", ["self", "scheduler_output"]),
    ("vllm.v1.worker.gpu_worker", "Worker", "sample_tokens", ["self", "grammar_output"]),
    ("vllm._custom_ops", None, "cpu_attn_reshape_and_cache", None),
)
# What the capture points rely on, either runner: D schedules a loaded request only after
# NIXL's load finished; CPU_ATTN writes through cpu_attn_reshape_and_cache on a [B, H, 2N, D]
# view (slot_order learns the packing from that kernel).
_COMMON_SOURCE = (
    ("vllm.v1.core.sched.scheduler", "Scheduler._update_waiting_for_remote_kv",
     ("self.finished_recving_kv_req_ids.remove(request.request_id)",)),
    ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl.do_kv_cache_update",
     ("kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1))",
      "cpu_attn_reshape_and_cache(")),
)
# The V1 runner drafts inside sample_tokens, so P's and the baseline's capture after it sees
# the drafter's prompt KV.
SOURCE = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens",
     ("def propose_draft_token_ids(", "propose_draft_token_ids(sampled_token_ids)")),
    *_COMMON_SOURCE,
)
# Model Runner V2 drafts inside sample_tokens too, so the same capture points serve it.
_V2_DRAFTS = ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens",
              ("self.speculator.propose(",))
V2_SOURCE = (_V2_DRAFTS, *_COMMON_SOURCE)
# 0.34.0 moved the CPU ops to vllm._cpu_ops (CPU_ATTN imports it as ``ops``): same kernel,
# same call (``cpu_ops`` picks the module).
V2_CPU_OPS_TARGETS = (*WORKER_TARGETS[:2], ("vllm._cpu_ops", None, "cpu_attn_reshape_and_cache",
                                            None))
V2_CPU_OPS_SOURCE = (_V2_DRAFTS, _COMMON_SOURCE[0],
                     ("vllm.v1.attention.backends.cpu_attn",
                      "CPUAttentionBackendImpl.do_kv_cache_update",
                      ("kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1))",
                       "ops.cpu_attn_reshape_and_cache(")))


def prompt_key(token_ids: list[int]) -> str:
    """The key a request's records share on P, D and the baseline: its prompt token ids."""
    import hashlib

    return hashlib.sha1(json.dumps(list(token_ids)).encode()).hexdigest()[:16]


class Probe:
    """This worker's probe: layer layouts, pending captures, records and snapshots."""

    def __init__(self) -> None:
        self.enabled = False
        self.observing = False  # observe-only: the workbench switches it per run (``serve``)
        self.lock = threading.RLock()
        self.role = os.environ.get(spec.ENV_ROLE, "unknown")
        self.runner: Any = None
        self.layers: list[dict] = []  # name, group, tensor, block_dim, slot_dim, kv cache group
        self.reqs: dict[str, dict] = {}  # req_id -> what the scheduler told the worker
        self.pending: list[str] = []  # P / baseline: prefilled this step, capture after sampling
        self.records: list[dict] = []
        self.snapshots: OrderedDict[str, dict] = OrderedDict()  # req_id -> layer -> slots
        self.snapshot_bytes = 0
        self.keep_bytes = int(float(os.environ.get(ENV_KEEP_MB, "2048")) * 2**20)
        self.capture_s = 0.0
        self.weights: dict[tuple, Any] = {}
        self.thread: threading.Thread | None = None

    # -- layout ------------------------------------------------------------------------
    def bind(self, runner) -> None:
        from .blocks import drafter_layers, kv_tensors

        self.runner = runner
        cfg = runner.kv_cache_config
        drafter = drafter_layers(runner)
        group_of = {n: g for g, grp in enumerate(cfg.kv_cache_groups) for n in grp.layer_names}
        bs = {g: grp.kv_cache_spec.block_size for g, grp in enumerate(cfg.kv_cache_groups)}
        self.layers = []
        for name, kv in kv_tensors(runner):
            g = group_of[name]
            dims = layout(tuple(kv.shape), cfg.num_blocks, bs[g])
            if dims is None:
                continue
            self.layers.append({"name": name, "group": "drafter" if name in drafter else
                                "target", "tensor": kv, "block_dim": dims[0],
                                "slot_dim": dims[1], "kv_group": g, "block_size": bs[g],
                                "backend": _backend(runner, name),
                                "module": runner.compilation_config.static_forward_context[
                                    name]})

    def describe(self) -> dict:
        return {"layers": [{k: v for k, v in layer.items()
                            if k not in ("tensor", "module", "order")}
                           | {"shape": list(layer["tensor"].shape),
                              "dtype": str(layer["tensor"].dtype),
                              "device": str(layer["tensor"].device)}
                           for layer in self.layers],
                "keep_mb": self.keep_bytes / 2**20}


def layout(shape: tuple[int, ...], num_blocks: int, block_size: int) -> tuple[int, int] | None:
    """(block dim, slot dim) of a layer's KV tensor. vLLM's per-layer view is logically
    ``[B, H, N, C]`` (``vllm/v1/kv_cache_layout.py``: ``KVCacheLayout``, RFC #42082); older
    backends put K/V first (``[2, B, N, H, D]``). The slot dim is the first dim of size
    ``block_size`` after the block dim, two after it when that fits ``[B, H, N, C]``."""
    if num_blocks not in shape:
        return None
    b = shape.index(num_blocks)
    if len(shape) == 4 and b == 0 and shape[2] == block_size:
        return b, 2
    cands = [d for d, n in enumerate(shape) if n == block_size and d != b]
    return (b, cands[0]) if cands else None


PROBE = Probe()


def _backend(runner, name: str) -> str:
    layer = runner.compilation_config.static_forward_context.get(name)
    backend = getattr(layer, "attn_backend", None)
    try:
        return backend.get_name() if backend is not None else "unknown"
    except Exception:  # noqa: BLE001 - informational
        return type(getattr(layer, "impl", None)).__name__


# ------------------------------------------------------------------------- digests --
def slots(layer: dict, block_ids: list[int]):
    """The request's blocks of one layer as ``[blocks, block_size, values]`` (a copy), one
    row per token slot: its K and V in every head."""
    import torch

    kv = layer["tensor"]
    idx = torch.as_tensor(block_ids, device=kv.device, dtype=torch.long)
    x = kv.movedim(layer["block_dim"], 0).index_select(0, idx)
    n, bs = len(block_ids), layer["block_size"]
    order = slot_order(layer)
    if order is not None:
        return x.reshape(n, -1).index_select(1, order).reshape(n, bs, -1)
    slot = layer["slot_dim"] if layer["slot_dim"] > layer["block_dim"] else layer["slot_dim"] + 1
    return x.movedim(slot, 1).reshape(n, bs, -1).contiguous()


def slot_order(layer: dict):
    """CPU_ATTN only: where each (slot, K|V, head, dim) value lives inside one block.

    ``CPUAttentionBackendImpl.do_kv_cache_update`` views the ``[B, H, N, 2D]`` cache as
    ``[B, H, 2N, D]`` and ``ops.cpu_attn_reshape_and_cache`` packs K and V by its ISA
    (:func:`layer_isa`), so a "slot" of the logical view is not a token (the ``vec`` ISA
    stores K column-major: one token's K spans half the block's rows). Learnt once from vLLM's
    own kernel: one scratch block written with every value numbered by its place."""
    if layer["backend"] != "CPU_ATTN" or "order" in layer:
        return layer.get("order")
    import torch

    kv, bs = layer["tensor"], layer["block_size"]
    if kv.dtype != torch.float32 or kv.ndim != 4:
        layer["order"], layer["order_note"] = None, "logical view (not float32)"
        return None
    isa = layer_isa(layer["module"])
    if isa is None:  # a logical slot is not a token here: digests would blame wrong positions
        raise RuntimeError(f"CPU_ATTN layer {layer['name']} has no ISA (layer.isa, "
                           "layer.impl.isa): its slots cannot be mapped to tokens")
    ops = cpu_ops()
    h, d = kv.shape[1], kv.shape[3] // 2
    scratch = torch.zeros((1, h, 2 * bs, d), dtype=torch.float32)
    code = torch.arange(1, 2 * bs * h * d + 1, dtype=torch.float32).view(bs, 2, h, d)
    k_cache, v_cache = scratch.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(code[:, 0].contiguous(), code[:, 1].contiguous(), k_cache,
                                   v_cache, torch.arange(bs, dtype=torch.long), isa)
    where = scratch.flatten().long() - 1  # offset -> value number (slot, K|V, head, dim)
    order = torch.empty_like(where)
    order[where] = torch.arange(where.numel())
    layer["order"], layer["order_note"] = order.to(kv.device), f"learnt from isa {isa!r}"
    return layer["order"]


def cpu_ops():
    """The module CPU_ATTN calls ``cpu_attn_reshape_and_cache`` from: ``vllm._cpu_ops`` from
    0.34.0, ``vllm._custom_ops`` before."""
    name = "vllm._cpu_ops" if importlib.util.find_spec("vllm._cpu_ops") else "vllm._custom_ops"
    return importlib.import_module(name)


def layer_isa(module) -> str | None:
    """The ISA CPU_ATTN packs a layer's KV by: ``layer.isa``, which
    ``CPUAttentionMetadataBuilder._set_isa_to_layers`` sets and ``do_kv_cache_update`` passes
    from 0.29.0, else the backend's own ``CPUAttentionBackendImpl.isa``, which it passes
    before."""
    return getattr(module, "isa", None) or getattr(getattr(module, "impl", None), "isa", None)


def _weights(n: int, device) -> tuple[Any, Any]:
    import torch

    key = (n, str(device))
    if key not in PROBE.weights:
        g = torch.Generator().manual_seed(WEIGHT_SEED)
        w = torch.randint(1, WEIGHT_MAX, (2, n), generator=g, dtype=torch.int64)
        PROBE.weights[key] = (w[0].to(device), w[1].to(device))
    return PROBE.weights[key]


def digest(x, to_host=None) -> list[str]:
    """One 96-bit digest per slot of ``x`` ``[blocks, slots, values]``: two exact integer dot
    products of the raw bits (as 16-bit halves) with fixed weights, on ``x``'s device. Equal
    bits give equal digests; ``to_host`` moves only the ``[blocks, slots, 2]`` digests."""
    import torch

    bits = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[x.element_size()]
    v = x.view(bits).to(torch.int64)
    halves = [v & 0xFFFF, (v >> 16) & 0xFFFF] if x.element_size() == 4 else [v & 0xFFFF]
    v = torch.cat(halves, dim=-1)
    w1, w2 = _weights(v.shape[-1], v.device)
    d = torch.stack([(v * w1).sum(-1), (v * w2).sum(-1)], dim=-1)
    host = (to_host or (lambda t: t.cpu()))(d).tolist()
    return [f"{a:012x}{b:012x}" for blk in host for a, b in blk]


# -------------------------------------------------------------------------- capture --
def capture(req_id: str) -> None:
    """Digest every layer's blocks of one request, keep the slots, record the digests."""
    import torch

    info = PROBE.reqs.get(req_id)
    if info is None or info.get("captured"):
        return
    t0 = time.perf_counter()
    layers, snap, nbytes = {}, {}, 0
    with torch.no_grad():
        for layer in PROBE.layers:
            ids = info["block_ids"][layer["kv_group"]]
            if not ids:
                continue
            x = slots(layer, ids)
            layers[layer["name"]] = {"group": layer["group"], "digests": "".join(digest(x))}
            snap[layer["name"]] = x
            nbytes += x.numel() * x.element_size()
    info["captured"] = True
    took = time.perf_counter() - t0
    rec = {"key": prompt_key(info["prompt"]), "req_id": req_id, "role": PROBE.role,
           "pid": os.getpid(), "num_prompt_tokens": len(info["prompt"]),
           "num_computed_tokens": info["num_computed"],
           "block_ids": [list(b) for b in info["block_ids"]],
           "block_size": PROBE.layers[0]["block_size"] if PROBE.layers else None,
           "layers": layers, "capture_s": round(took, 6), "t": time.time(),
           "prefill_chunks": info.get("chunks"),
           "prefill_new_blocks": info.get("new_blocks"),
           "slot_order": sorted({la["order_note"] for la in PROBE.layers if "order_note" in la})}
    with PROBE.lock:
        PROBE.records.append(rec)
        _keep(req_id, snap, nbytes)  # by request: two with one prompt are fetched each
        PROBE.capture_s += took


def _keep(req_id: str, snap: dict, nbytes: int) -> None:
    """Keep the slots for a later fetch, oldest dropped beyond the budget."""
    old = PROBE.snapshots.pop(req_id, None)
    if old is not None:
        PROBE.snapshot_bytes -= old["bytes"]
    PROBE.snapshots[req_id] = {"layers": snap, "bytes": nbytes}
    PROBE.snapshot_bytes += nbytes
    while PROBE.snapshot_bytes > PROBE.keep_bytes and len(PROBE.snapshots) > 1:
        _, dropped = PROBE.snapshots.popitem(last=False)
        PROBE.snapshot_bytes -= dropped["bytes"]


@functools.cache
def _loads_in_forward() -> bool:
    """D's connector loads during the forward (``ExampleConnector.start_load_kv``), not
    before the request is scheduled as NIXL's asynchronous load is: D then captures after
    its first step, as P does after its prefill. Restart-time: read once per process."""
    return connector.flow({"connector": connector.requested()}) == connector.SAME_PROMPT


def _wanted(new_req) -> bool:
    """D: requests whose KV came from P (``kv_transfer_params`` from P's response, which
    ``NixlConnectorScheduler`` marks ``do_remote_prefill=False`` once it queued the load;
    every request where D finds P's KV by the prompt, in shared storage); P: requests D will
    get (every request where P stores by the prompt); the baseline: all."""
    if PROBE.role in ("d", "p") and _loads_in_forward():
        return True
    params = (getattr(new_req.sampling_params, "extra_args", None) or {}).get(
        "kv_transfer_params") or {}
    if PROBE.role == "d":  # NIXL resets do_remote_prefill once it set the load up
        return bool(params.get("do_remote_prefill") or params.get("remote_engine_id"))
    if PROBE.role == "p":
        return bool(params.get("do_remote_decode"))
    return True


def before_step(scheduler_output) -> None:
    """Track the scheduled requests' blocks; D captures its loaded requests now."""
    for req_id in list(PROBE.pending):  # a step that returned without sample_tokens
        capture(req_id)
    PROBE.pending.clear()
    for new in scheduler_output.scheduled_new_reqs:
        if new.prompt_token_ids is None or not _wanted(new):
            continue
        PROBE.reqs[new.req_id] = {"prompt": list(new.prompt_token_ids),
                                  "block_ids": [list(b) for b in new.block_ids],
                                  "num_computed": new.num_computed_tokens,
                                  "listed": list(new.block_ids[0]) if new.block_ids else []}
        if PROBE.role == "d" and not _loads_in_forward():
            capture(new.req_id)
    cached = scheduler_output.scheduled_cached_reqs
    for i, req_id in enumerate(cached.req_ids):
        info = PROBE.reqs.get(req_id)
        if info is not None and cached.new_block_ids[i] is not None:
            for g, ids in enumerate(cached.new_block_ids[i]):
                info["block_ids"][g].extend(ids)
            info["listed"] = list(cached.new_block_ids[i][0]) if cached.new_block_ids[i] else []
    if PROBE.role != "d" or _loads_in_forward():
        _mark_prefilled(scheduler_output)
    for req_id in scheduler_output.finished_req_ids:
        PROBE.reqs.pop(req_id, None)


def _mark_prefilled(scheduler_output) -> None:
    """P / baseline: requests whose prompt is complete after this step."""
    for req_id, n in scheduler_output.num_scheduled_tokens.items():
        info = PROBE.reqs.get(req_id)
        if info is None or info.get("captured"):
            continue
        info["done"] = info.get("done", info["num_computed"]) + n
        info.setdefault("chunks", []).append(n)  # more than one: a chunked prefill
        # the blocks this step handed the request first (what a connector's save meta lists
        # for it: ``yield_req_data``), so a detector reads allocation, not a model of it
        info.setdefault("new_blocks", []).append(info.pop("listed", []))
        if info["done"] >= len(info["prompt"]):
            PROBE.pending.append(req_id)


def after_sample() -> None:
    for req_id in PROBE.pending:
        capture(req_id)
    PROBE.pending.clear()


# --------------------------------------------------------------------------- hooks --
def install(comp: Component) -> None:
    """Wrap ``Worker.execute_model`` / ``sample_tokens`` (a flag test when the probe is off)."""
    install_on(type(comp.obj))


def install_on(cls: type) -> None:
    owner = next(k for k in cls.__mro__ if "execute_model" in k.__dict__)

    def wrap_execute(orig):
        def execute_model(self, scheduler_output, *args, **kwargs):
            if PROBE.enabled:
                _guarded(before_step, scheduler_output)
            return orig(self, scheduler_output, *args, **kwargs)

        return execute_model

    def wrap_sample(orig):
        def sample_tokens(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            if PROBE.enabled and PROBE.pending:
                _guarded(after_sample)
            return out

        return sample_tokens

    _patch.patch(owner, "execute_model", wrap_execute)
    _patch.patch(next(k for k in cls.__mro__ if "sample_tokens" in k.__dict__),
                 "sample_tokens", wrap_sample)


def _guarded(fn, *args) -> None:
    """The probe must never take a step down with it: log and count instead."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        log(f"kv_probe: {fn.__name__} failed: {type(e).__name__}: {e}")
        with PROBE.lock:
            PROBE.records.append({"error": f"{fn.__name__}: {type(e).__name__}: {e}",
                                  "role": PROBE.role, "pid": os.getpid()})


def apply(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    value = knobs["kv_probe"]
    with PROBE.lock:
        PROBE.role = comp.role
        if value == "on" and PROBE.runner is None:
            PROBE.bind(comp.obj.model_runner)
        PROBE.enabled = value == "on"
        _clear()
    if PROBE.enabled:
        _start_poller(comp.state_dir)
        return value, PROBE.describe()
    return value, {}


def observed_patches(version: str, runner: str | None = None) -> tuple[tuple, tuple]:
    """The probe's targets and source facts on a native run of ``version``: its release-table
    entry's for the runner (``runner.requested()`` by default) where the table has the release,
    else the V1 runner's (the old releases all run V1)."""
    from .patch_checks import table_patches
    from .runner import requested as runner_requested

    return table_patches("kv_probe", version, runner or runner_requested(),
                         (WORKER_TARGETS, SOURCE))


def observe(state_dir: str, version: str) -> tuple[dict[str, Any], Any]:
    """Observe-only (``observe.py``): the probe on from each worker's start, answering request
    files in ``state_dir``, where its targets and source facts hold in the running release's
    own source (checked here, in each process, as ``build`` checks a knob's). It only reads
    KV, so a native run of an old release may carry it. Returns the report and the hook each
    worker runs after ``Worker.initialize_from_config`` (None: not installed)."""
    from .patch_checks import failures_installed

    if failed := failures_installed(*observed_patches(version), version):
        return {"installed": False, "failed": failed}, None
    return ({"installed": True, "state_dir": state_dir,
             "at_worker_start": ["Worker.execute_model", "Worker.sample_tokens"]},
            lambda worker: _guarded(start_observing, worker, state_dir))


def start_observing(worker, state_dir: str) -> None:
    """A worker's probe, bound to its KV cache and answering requests from now on, off until
    a run switches it on; its state file tells the workbench which workers must answer."""
    from ..provenance import atomic_write_json

    with PROBE.lock:  # its role: the server's (``Probe.role``, from the environment)
        PROBE.bind(worker.model_runner)
        PROBE.observing = True
    install_on(type(worker))
    atomic_write_json(Path(state_dir) / f"{PROBE.role}-worker-{os.getpid()}.json",
                      {"role": PROBE.role, "component": "worker", "pid": os.getpid(),
                       "mode": "observe-only", "workbench_patches": list(_patch.PATCHED),
                       "kv_probe": PROBE.describe()})
    _start_poller(state_dir)


def register() -> None:
    """The HTTP path: ``Worker.workbench_kvprobe`` for ``POST /collective_rpc``."""
    from vllm.v1.worker.gpu_worker import Worker

    _patch.patch(Worker, METHOD, lambda _orig: worker_method, allow_missing=True)


def worker_method(self, request: str = "") -> dict[str, Any]:
    return serve(json.loads(request) if request else {"op": "records"})


# ---------------------------------------------------------------------------- serve --
def _clear() -> None:
    PROBE.records.clear()
    PROBE.snapshots.clear()
    PROBE.snapshot_bytes = 0
    PROBE.capture_s = 0.0


def serve(request: dict) -> dict[str, Any]:
    """``records``: every capture since the last ``clear``; ``fetch``: the raw slots of the
    listed blocks (``items``: key = the request id, layer, blocks), base64 float32;
    ``clear``: forget both."""
    op = request.get("op")
    base = {"role": PROBE.role, "pid": os.getpid(), "op": op, "enabled": PROBE.enabled}
    with PROBE.lock:
        if op == "records":
            return {**base, "records": list(PROBE.records),
                    "capture_s": PROBE.capture_s, "snapshot_bytes": PROBE.snapshot_bytes}
        if op == "fetch":
            return {**base, "items": [_fetch(it) for it in request.get("items", [])]}
        if op == "clear":
            _clear()
            return base
        if op == "switch" and PROBE.observing:  # no knob channel there to switch it
            PROBE.enabled = bool(request.get("on"))
            _clear()
            return {**base, "enabled": PROBE.enabled}
    return {**base, "error": f"unknown op {op!r}; allowed: records, fetch, clear (and switch "
                             "in observe-only mode)"}


def _fetch(item: dict) -> dict:
    import numpy as np

    snap = PROBE.snapshots.get(item["key"])
    x = None if snap is None else snap["layers"].get(item["layer"])
    if x is None:
        return {**item, "missing": "not captured or dropped (snapshot budget "
                f"{ENV_KEEP_MB}={PROBE.keep_bytes / 2**20:.0f} MB)"}
    blocks = [b for b in item["blocks"] if b < x.shape[0]]
    a = x[blocks].float().cpu().numpy().astype(np.float32)
    return {**item, "blocks": blocks, "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode()}


def _start_poller(state_dir: str) -> None:
    """Answer request files in the state directory (servers on the workbench's machine)."""
    if PROBE.thread is not None or not state_dir:
        return
    PROBE.thread = threading.Thread(target=_poll, args=(Path(state_dir),),
                                    name="workbench-kvprobe", daemon=True)
    PROBE.thread.start()


def _poll(state_dir: Path) -> None:
    from ..provenance import atomic_write_json

    done: set[str] = set()
    while True:
        time.sleep(POLL_S)
        for path in sorted(state_dir.glob(REQUEST_GLOB)):
            if path.name in done:
                continue
            with contextlib.suppress(OSError, ValueError):
                req = json.loads(path.read_text())
                if req.get("roles") and PROBE.role not in req["roles"]:
                    done.add(path.name)
                    continue
                out = path.with_name(f"kvprobe-resp-{req['id']}-{PROBE.role}-{os.getpid()}.json")
                atomic_write_json(out, serve(req))
                done.add(path.name)
