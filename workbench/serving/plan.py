"""The servers a config needs: one ``ServerSpec`` per role, from the config and its profile.

Kept apart from ``Session`` so that ``python -m workbench plan`` prints the very command lines
a run would start, without building anything that owns processes.
"""

from __future__ import annotations

from pathlib import Path

from ..config import ExperimentConfig
from ..inputs import profiles
from ..knobs import spec as knob_spec
from .servers import ServerSpec

# role -> its NixlConnector kv_role; None: no connector
KV_ROLE = {"p": "kv_producer", "d": "kv_consumer", "baseline": None}


def kv_buffer_device(cfg: ExperimentConfig) -> str:
    """On a GPU, host staging is vLLM's own ``kv_buffer_device=cpu``; on the CPU the plugin
    emulates it through the same connector code path (``WORKBENCH_TRANSFER``)."""
    prof = profiles.get(cfg.profile)
    if prof.device != "cpu" and cfg.knobs["transfer"] == "host-staged":
        return "cpu"
    return prof.kv_buffer_device


def server_specs(cfg: ExperimentConfig, log_dir: str | Path, *,
                 knobs_file: Path | None = None, state_dir: Path | None = None,
                 dev_mode: bool = False, roles: list[str] | None = None) -> list[ServerSpec]:
    """One spec per role ``cfg`` runs, or per role of ``roles`` (checks ports the user asked
    for before anything starts)."""
    prof = profiles.get(cfg.profile)
    common = dict(
        target=cfg.target, drafter=cfg.drafter, log_dir=Path(log_dir),
        block_size=cfg.block_size, kv_cache_bytes=cfg.kv_cache_bytes,
        max_model_len=cfg.max_model_len, host=cfg.host, device=prof.device, dtype=prof.dtype,
        seed=cfg.seed, enforce_eager=cfg.enforce_eager_in_force(), knobs_file=knobs_file,
        knobs_state_dir=state_dir, kv_buffer_device=kv_buffer_device(cfg),
        nixl_progress_delay_us=prof.nixl_progress_delay_us, hf_offline=prof.hf_offline,
        draft_max_model_len=cfg.max_model_len if prof.speculative_max_model_len else None,
        padded_drafter_batch=cfg.padded_drafter_batch,
        extra_args=list(prof.server_args), extra_env=dict(prof.server_env), dev_mode=dev_mode,
    )
    return [
        ServerSpec(role=r, num_speculative_tokens=cfg.k(r),
                   kv_role=KV_ROLE[r], cpus=prof.cpus.get(r), gpus=prof.gpus.get(r),
                   gpu_memory_utilization=prof.gpu_memory_utilization.get(r),
                   port=cfg.ports.get(r), max_num_batched_tokens=cfg.budget(r),
                   restart_knobs={n: cfg.knobs[n] for n in knob_spec.restart_knobs(r)}, **common)
        for r in (cfg.roles() if roles is None else roles)
    ]
