"""Baseline results kept across runs, keyed by everything that determines them.

The baseline does not depend on the PD knobs, so a sweep measures it once per prompt set:
the key is the baseline server's shape, the prompts' token ids, the new-token budget, the
vLLM release and the model runner (knob ``runner``: the baseline runs D's).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

from ..config import ExperimentConfig
from ..knobs.release import vllm_version
from ..provenance import atomic_write_json

ROW_KEYS = ("baseline", "baseline_tokens", "baseline_seconds", "baseline_spec")  # a row's baseline


class BaselineCache:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory).resolve()

    def path(self, cfg: ExperimentConfig, token_ids: list[list[int]]) -> Path:
        shape = [cfg.target, cfg.drafter, cfg.k_d, cfg.block_size, cfg.kv_cache_bytes,
                 cfg.max_model_len, cfg.seed, cfg.profile, cfg.max_tokens, cfg.concurrency,
                 vllm_version(), token_ids]
        if cfg.budget("baseline") is not None or not cfg.padded_drafter_batch:
            shape += [cfg.budget("baseline"), cfg.padded_drafter_batch]  # old keys stay
        if cfg.knobs.get("runner", "v1") != "v1":
            shape += [cfg.knobs["runner"]]  # old (V1) keys stay
        digest = hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:24]
        return self.directory / f"baseline-{digest}.json"

    def load(self, cfg: ExperimentConfig, token_ids: list[list[int]]) -> dict | None:
        """``{"measured_at", "rows", "phase"}`` for these prompts (``phase``: how they were
        measured, its ``/metrics`` deltas included), or None if never measured."""
        path = self.path(cfg, token_ids)
        return json.loads(path.read_text()) if path.is_file() else None

    def store(self, cfg: ExperimentConfig, token_ids: list[list[int]], rows: list[dict],
              phase: dict) -> None:
        data = {"measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "rows": [{k: r.get(k) for k in ROW_KEYS} for r in rows], "phase": phase}
        atomic_write_json(self.path(cfg, token_ids), data, indent=None, sort_keys=False)

    def __str__(self) -> str:
        return str(self.directory)
