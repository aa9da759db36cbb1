"""The servers a ``Session`` owns: one per role, each restarted only when its own shape
changes.

Shape: ``ExperimentConfig.server_key(role)``, the server fields, the restart-time knobs that
act on the role and its port. So a change of ``transfer`` (P and D only) keeps the baseline:
on the 2-core CPU box the default sweep's restart for its host-staged points took 49 s for P
and D, against 79-87 s for all three (``benchmarks/sweep_time.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..config import ConfigError, ExperimentConfig
from ..inputs import models
from ..knobs import build, release
from . import channels, plan
from .servers import ServerSpec, VllmServer, start_all


def check_vllm_release(knobs: dict[str, str] | None = None, cfg=None) -> build.Build:
    """Refuse, before any server starts, a vLLM no table entry serves and knobs whose patch
    checks fail on the installed source (``knobs/build.py``): inside the servers the same
    refusal would come only after all three spent their start-up loading weights."""
    try:
        release.check_version()
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    b = build.installed()
    build.say_once(b)
    if (why := build.refusal(b, knobs or {})) is not None:
        raise ConfigError(why)
    if cfg is not None and (why := build.lacking(b.table_entry, cfg)) is not None:
        raise ConfigError(f"vLLM {b.version}: {why}")
    return b


class ServerSet:
    """One server per role, their shapes, start-up times and the knob channel they read."""

    def __init__(self, log_dir: Path, channel: channels.KnobChannel, dev_mode: bool = False):
        self.log_dir, self.channel = log_dir, channel
        self.dev_mode = dev_mode  # servers it starts get VLLM_SERVER_DEV_MODE (`serve` only)
        self.servers: dict = {}  # role -> VllmServer (RemoteServer when attached)
        self.keys: dict[str, tuple] = {}  # role -> the server_key its server runs
        self.startup_seconds: dict[str, float] = {}
        # Each spec as another environment runs it (``releases/native.py``: an old release's
        # Python, the plugin observe-only); None: this environment's vLLM with the knobs.
        self.adapt: Callable[[ServerSpec], ServerSpec] | None = None

    def stale(self, cfg: ExperimentConfig) -> list[str]:
        """The roles of ``cfg`` whose server is missing, dead or of another shape."""
        return [r for r in cfg.roles() if self.keys.get(r) != cfg.server_key(r)
                or r not in self.servers or not self.servers[r].alive()]

    def needs_start(self, cfg: ExperimentConfig) -> bool:
        return bool(self.stale(cfg)) or set(self.servers) != set(cfg.roles())

    def ensure(self, cfg: ExperimentConfig) -> None:
        """Run the servers ``cfg`` needs, restarting only the roles whose shape changed and
        stopping those it does not need."""
        stale = self.stale(cfg)
        for role in [*stale, *(set(self.servers) - set(cfg.roles()))]:
            self._stop_role(role)
        if stale:
            self._start(cfg, stale)
        self.servers = {r: self.servers[r] for r in cfg.roles()}

    def _start(self, cfg: ExperimentConfig, roles: list[str]) -> None:
        models.fetch([cfg.target, cfg.drafter])  # Hub ids once, not by each server
        knobs_file = getattr(self.channel, "knobs_file", None)
        verdict = (check_vllm_release(cfg.knobs)
                   if knobs_file is not None and self.adapt is None else None)
        specs = plan.server_specs(cfg, self.log_dir, knobs_file=knobs_file,
                                  state_dir=getattr(self.channel, "state_dir", None),
                                  dev_mode=self.dev_mode, roles=roles)
        if self.adapt is not None:
            specs = [self.adapt(s) for s in specs]
        for spec in specs if verdict is not None else ():
            spec.extra_env.update(build.env(verdict))  # the plugin applies the same verdict
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.channel.prepare(cfg)  # servers kept running acknowledge its new version too
        self._add(cfg, start_all(specs, cfg.startup_timeout_s))

    def _add(self, cfg: ExperimentConfig, servers: list[VllmServer]) -> None:
        for s in servers:
            role = s.spec.role
            self.servers[role], self.keys[role] = s, cfg.server_key(role)
            self.startup_seconds[role] = s.ready_seconds

    def _stop_role(self, role: str) -> None:
        server = self.servers.pop(role, None)
        if server is not None:
            server.stop()
        self.keys.pop(role, None)
        self.startup_seconds.pop(role, None)

    def stop(self) -> None:
        for role in list(self.servers):
            self._stop_role(role)
