"""Knob ``connector``: which of vLLM's KV connectors moves P's KV to D (restart-time, P and D).

The one table of the connectors the workbench drives: the ``--kv-transfer-config`` each role
gets, how the proxy drives it, whether it runs on a CPU (and, where not, the vLLM source that
says why), and which knobs act through it. The plugin changes nothing here: its engine-core
hook only reads back the connector class vLLM built, so a result names what really ran.

Pure Python apart from the read-back hook (vLLM is imported only inside functions), so the
CLI, ``plan`` and the config checks read it without vLLM.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import spec

V1 = "vllm/distributed/kv_transfer/kv_connector/v1"
STORAGE_DIR = "kv-storage"  # ExampleConnector's shared_storage_path, under the servers' log dir
OFFLOAD_CPU_BYTES = 4 * 2**30  # OffloadingConnector's cpu_bytes_to_use in the GPU profiles

# How the proxy drives a connector.
PARAMS = "params"  # D gets the kv_transfer_params P returned, under P's request id (NIXL)
SAME_PROMPT = "same-prompt"  # D gets the prompt again and finds P's KV in storage (Example)

NOT_NIXL = "no NIXL connector: host staging is NixlConnector's use_host_buffer"
# A native run of an old release (``releases --check``) may start P and D with ExampleConnector:
# a command-line flag, no patch; its session empties ``storage_dir`` before each run, as
# ``apply`` does through the knob channel.
EXAMPLE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.example_connector"
NATIVE_TARGETS = ((EXAMPLE_MODULE, "ExampleConnector", "build_connector_meta", None),)
NATIVE_SOURCE = ((EXAMPLE_MODULE, "ExampleConnector.__init__", ('"shared_storage_path"',)),)
NATIVE = ("example",)  # the values a native run may take besides NIXL pull

EXAMPLE_HANDOFF = ("ExampleConnector hands no block ids over: it stores in "
                   "build_connector_meta from scheduled_new_reqs' block_ids and its "
                   "request_finished (the base class's) ignores the ids the scheduler passes")


@dataclass(frozen=True)
class Connector:
    """One value of the knob: the vLLM classes it builds (outer first), how the proxy drives
    it, why it cannot run on a CPU (``""``: it runs), why the workbench cannot drive it on
    any device (``""``: it can), and the knobs that cannot act through it (knob -> why, from
    vLLM's source)."""

    name: str
    classes: tuple[str, ...]
    flow: str = PARAMS
    nixl: bool = True  # NIXL's side channel: a port per server, UCX kept on loopback
    cpu_refusal: str = ""
    unsupported: str = ""
    not_applicable: dict[str, str] = field(default_factory=dict)

    def kv_config(self, kv_role: str, kv_buffer_device: str | None,
                  storage: str | Path) -> dict[str, Any]:
        """The ``--kv-transfer-config`` of a server with ``kv_role`` (``kv_producer`` on P,
        ``kv_consumer`` on D)."""
        parts = [_part(c, kv_role, kv_buffer_device, storage) for c in self.classes[1:]]
        if self.classes[0] == "MultiConnector":
            return {"kv_connector": "MultiConnector", "kv_role": kv_role,
                    "kv_connector_extra_config": {"connectors": parts}}
        return _part(self.classes[0], kv_role, kv_buffer_device, storage)


def _part(cls: str, kv_role: str, kv_buffer_device: str | None,
          storage: str | Path) -> dict[str, Any]:
    """One connector's config, as vLLM's docs and examples write it."""
    if cls == "ExampleConnector":  # vLLM's disaggregated-prefill-v1 example: kv_both on both
        return {"kv_connector": cls, "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    if cls == "OffloadingConnector":
        return {"kv_connector": cls, "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_bytes_to_use": OFFLOAD_CPU_BYTES}}
    cfg: dict[str, Any] = {"kv_connector": cls, "kv_role": kv_role}
    if cls == "MooncakeConnector":
        cfg["kv_connector_extra_config"] = {"mooncake_protocol": "tcp"}
    # "cuda" is vLLM's default on a GPU (KVTransferConfig.kv_buffer_device), and vLLM's PD
    # test leaves it unset there.
    if cls.startswith("Nixl") and kv_buffer_device not in (None, "cuda"):
        cfg["kv_buffer_device"] = kv_buffer_device
    return cfg


CONNECTORS: dict[str, Connector] = {c.name: c for c in (
    Connector("nixl", ("NixlConnector",)),
    Connector("nixl-push", ("NixlPushConnector",)),
    Connector("example", ("ExampleConnector",), flow=SAME_PROMPT, nixl=False,
              not_applicable={"block_handoff": EXAMPLE_HANDOFF, "transfer": NOT_NIXL}),
    Connector("multi", ("MultiConnector", "NixlConnector", "ExampleConnector")),
    Connector("mooncake", ("MooncakeConnector",), nixl=False, cpu_refusal=(
        f"{V1}/mooncake/mooncake_connector.py: MooncakeConnectorWorker.__init__ calls "
        "torch.accelerator.current_device_index(), which the CPU has no accelerator for, and "
        "its bootstrap server binds every interface (MooncakeBootstrapServer(\"0.0.0.0\", "
        "port)), which the workbench's servers on 127.0.0.1 must not"), unsupported=(
        "its proxy flow is not built: the router assigns a transfer_id to both legs and gives "
        "D P's remote_bootstrap_addr and remote_engine_id, since P returns no "
        "kv_transfer_params (MooncakeConnectorScheduler.request_finished returns None)"),
        not_applicable={"transfer": NOT_NIXL}),
    Connector("offloading", ("MultiConnector", "NixlConnector", "OffloadingConnector"),
              cpu_refusal=(
        "vllm/v1/kv_offload/cpu/spec.py: CPUOffloadingSpec.get_worker raises \"CPU "
        "Offloading is currently only supported on CUDA-alike and XPU GPUs\"")),
    # LMCache's PD example: P then D with the same prompt; its own PD mode (LMCACHE_CONFIG_FILE
    # per role) is LMCache's configuration, which the workbench does not write: plan only.
    Connector("lmcache", ("LMCacheConnectorV1",), flow=SAME_PROMPT, nixl=False, cpu_refusal=(
        f"{V1}/lmcache_integration/vllm_v1_adapter.py: the adapter puts its KV on "
        "torch.device(f\"cuda:{device_index}\")"), not_applicable={"transfer": NOT_NIXL}),
)}


DEFAULT = spec.KNOBS["connector"].default


def get(name: str) -> Connector:
    return CONNECTORS[name]


def of(knobs: dict[str, str]) -> Connector:
    """The connector ``knobs`` name (the default where they name none)."""
    return CONNECTORS[knobs.get("connector", DEFAULT)]


def check(knobs: dict[str, str], device: str) -> None:
    """Raise ValueError, naming the connector and the reason from vLLM's source, when it
    cannot run on ``device`` or a knob set away from its default cannot act through it."""
    conn = of(knobs)
    if conn.unsupported:
        raise ValueError(f"connector={conn.name!r} is not supported by the workbench: "
                         f"{conn.unsupported}")
    if device == "cpu" and conn.cpu_refusal:
        raise ValueError(f"connector={conn.name!r} cannot run on the CPU: {conn.cpu_refusal}; "
                         f"connectors that run here: {', '.join(runs_on_cpu())}")
    for knob, why in conn.not_applicable.items():
        if knobs.get(knob, spec.KNOBS[knob].default) != spec.KNOBS[knob].default:
            raise ValueError(f"knob {knob}={knobs[knob]!r} does not act through "
                             f"connector={conn.name!r}: {why}")


def flow(knobs: dict[str, str]) -> str:
    """How the proxy drives the connector ``knobs`` name."""
    return of(knobs).flow


def with_nixl() -> tuple[str, ...]:
    """The connectors that build a NIXL connector worker (alone or under MultiConnector)."""
    return tuple(n for n, c in CONNECTORS.items() if c.nixl)


def runs_on_cpu() -> tuple[str, ...]:
    return tuple(n for n, c in CONNECTORS.items() if not c.cpu_refusal and not c.unsupported)


def storage_dir(log_dir: str | Path) -> Path:
    return Path(log_dir) / STORAGE_DIR


# ------------------------------------------------------------------ read-back (engine core) --
def requested() -> str:
    return os.environ.get(spec.ENV_CONNECTOR, DEFAULT)


def classes_of(conn: Any) -> tuple[str, ...]:
    """The connector classes vLLM built: the outer one, then a MultiConnector's children."""
    if conn is None:
        return ()
    return (type(conn).__name__, *(type(c).__name__ for c in getattr(conn, "_connectors", [])))


# The classes vLLM builds for a name in --kv-transfer-config that is an alias (nixl/connector.py:
# ``NixlConnector`` is the backward-compatible alias of ``NixlPullConnector``).
ALIASES = {"NixlConnector": "NixlPullConnector"}


def named(classes: tuple[str, ...]) -> str | None:
    """The knob value whose classes these are; None for a connector the table lacks."""
    return next((n for n, c in CONNECTORS.items()
                 if tuple(ALIASES.get(x, x) for x in c.classes) == classes), None)


def apply(comp, knobs: dict, seed: int) -> tuple[str | None, dict[str, Any]]:
    """Read back the scheduler's connector; a new version also empties ExampleConnector's
    storage, so a run never loads what an earlier run (under other knobs) stored."""
    conn = getattr(comp.obj, "connector", None)
    found = classes_of(conn)
    ev: dict[str, Any] = {"classes": list(found), "requested_at_start": requested(),
                          "kv_transfer_config": transfer_config(comp.obj)}
    storage = [getattr(c, "_storage_path", None)
               for c in (conn, *getattr(conn, "_connectors", []))] if conn is not None else []
    for path in filter(None, storage):
        ev["storage_entries_cleared"] = clear_storage(Path(path))
    if not found:
        ev["note"] = "no KV connector in this server"
        return None, ev
    return named(found) or "+".join(found), ev


def transfer_config(scheduler: Any) -> dict[str, Any] | None:
    """The ``KVTransferConfig`` vLLM parsed from ``--kv-transfer-config`` (its fields the
    command line sets), as the scheduler's ``vllm_config`` holds it."""
    cfg = getattr(getattr(scheduler, "vllm_config", None), "kv_transfer_config", None)
    if cfg is None:
        return None
    return {k: getattr(cfg, k, None) for k in ("kv_connector", "kv_role", "kv_buffer_device",
                                               "kv_connector_extra_config")}


def clear_storage(path: Path) -> int:
    """Remove every stored prompt folder under ``path``; how many there were."""
    entries = [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
    for p in entries:
        shutil.rmtree(p, ignore_errors=True)
    return len(entries)
