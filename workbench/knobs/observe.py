"""The plugin's observe-only mode: vLLM as released, plus only the fixes it needs to run here.

Why: ``python -m workbench releases`` runs old releases natively, to compare each historical
bug as it was with the knob that re-creates it on a release the knobs were written for. The
knobs' patches target the source of :data:`release.RELEASES` only, so on any other release the
plugin must patch nothing of the pipeline, yet an old release may need a runtime fix to start
on the CPU at all (``compat_fixes.py``). With ``WORKBENCH_OBSERVE_ONLY`` set to a directory,
``plugin.register`` calls :func:`install` instead of installing any knob: it installs the
compatibility fixes that apply to the running release, and each vLLM process (API server,
engine core, worker) writes ``observe-<pid>.json`` there, so a result can list what was applied
and show that no workbench patch was (``_patch.PATCHED``, every patch this package installs, is
empty). Two instruments may join them, each where its targets hold in the running release's source,
and each reading only: with ``WORKBENCH_OBSERVE_KV_PROBE`` set to a state directory, the KV
probe (``kv_probe.observe``); with ``WORKBENCH_OBSERVE_AFFINITY=1``, each worker's forward-thread
cores once NIXL's worker set them (``cpu_pin.observe``). One knob value may be ported too,
because vLLM takes its path natively on a GPU: with ``WORKBENCH_TRANSFER=host-staged``, NIXL's
host staging buffer (``transfer.observe``), again only where its targets hold; and Model
Runner V2 where vLLM runs it by default (the assembled releases: ``WORKBENCH_RUNNER=v2``), whose
class each worker writes back (``write_runner``). Their patches are then the only ones listed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from ..provenance import atomic_write_json
from . import _patch, compat_fixes, spec, transfer
from .release import RELEASES, SUPPORTED_VLLM, base_version, runner_kind, vllm_version

ENV = spec.ENV_OBSERVE_ONLY


def install(report_dir: str) -> dict[str, Any]:
    """Install the running release's compatibility fixes, and write this process's report."""
    version = vllm_version()
    applied = compat_fixes.install(version)
    probe = affinity = staged = None
    hooks = []
    if state_dir := os.environ.get(spec.ENV_OBSERVE_KV_PROBE):
        from . import kv_probe

        probe, hook = kv_probe.observe(state_dir, version)
        hooks += [hook] if hook else []
    if os.environ.get(spec.ENV_OBSERVE_AFFINITY) == "1":
        from . import cpu_pin

        affinity, hook = cpu_pin.observe(report_dir, version)
        hooks += [hook] if hook else []
    if transfer.requested() != spec.KNOBS["transfer"].default:
        staged, hook = transfer.observe(report_dir, version)
        hooks += [hook] if hook else []
    if os.environ.get(spec.ENV_RUNNER, "v1") != "v1":  # a ported runner (MRV2): read it back
        hooks.append(lambda worker: write_runner(report_dir, worker))
    if hooks:
        at_worker_start(hooks)
    report = {
        "mode": "observe-only",
        "vllm_version": version,
        "written_for": list(SUPPORTED_VLLM),
        "release_supported_by_knobs": base_version(version) in RELEASES,
        "compat_fixes_for_release": [f.name for f in compat_fixes.fixes_for(version)],
        "compat_fixes_applied": applied,
        "workbench_patches": list(_patch.PATCHED),
        "kv_probe": probe,  # None: not asked for
        "affinity": affinity,  # None: not asked for
        "transfer": staged,  # None: not asked for (direct, as released)
        "role": os.environ.get(spec.ENV_ROLE),
        "pid": os.getpid(),
        "argv": sys.argv[:3],
    }
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"observe-{os.getpid()}.json", report)
    return report


RUNNER_GLOB = "runner-*.json"


def write_runner(report_dir: str, worker) -> None:
    """The model runner this worker built, as the runner knob reads it back (``runner_kind``):
    a native run on Model Runner V2 shows it ran there."""
    mr = worker.model_runner
    atomic_write_json(Path(report_dir) / f"runner-{os.getpid()}.json",
                      {"pid": os.getpid(), "runner": runner_kind(mr),
                       "class": f"{type(mr).__module__}:{type(mr).__qualname__}"})


def at_worker_start(hooks: list) -> None:
    """The instruments' hooks, run in each worker once ``Worker.initialize_from_config`` built
    its KV cache and connector (one wrap: a second patch of a method is a no-op)."""
    from vllm.v1.worker.gpu_worker import Worker

    def wrap_init(orig):
        def initialize_from_config(self, *args, **kwargs):
            out = orig(self, *args, **kwargs)
            for hook in hooks:
                try:
                    hook(self)
                except Exception as e:  # noqa: BLE001 - an instrument never takes a worker down
                    print(f"[workbench observe-only] a worker-start hook failed: "
                          f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return out

        return initialize_from_config

    _patch.patch(Worker, "initialize_from_config", wrap_init)


def reports(report_dir: Path) -> list[dict[str, Any]]:
    """Every process's report in ``report_dir``, oldest first."""
    files = sorted(Path(report_dir).glob("observe-*.json"), key=lambda p: p.stat().st_mtime)
    return [json.loads(p.read_text()) for p in files]
