"""How knob values reach the servers' plugin, and how what is in force comes back.

Three channels, one interface, chosen once per ``Session``:

* ``FileChannel``: the control file and state directory that servers on this machine share
  with the workbench (``WORKBENCH_KNOBS_FILE`` / ``WORKBENCH_KNOBS_STATE_DIR``);
* ``HttpChannel``: servers elsewhere; the plugin's worker method ``workbench_knobs`` writes the
  control file on the server's own machine and returns its state files, reached through vLLM's
  dev-mode ``POST /collective_rpc`` (``knobs/http_channel.py``);
* ``NoChannel``: servers without the plugin's channel: vLLM untouched, only defaults can run;
  ``ProbeChannel``, the same plus the KV probe of the plugin's observe-only mode (old releases
  run natively), reached through request files as ``FileChannel``'s.

In every case a new version is acknowledged by every component of every role before a run
starts (``knobs.channel.wait_for_version``), and the values reported are read back from the
servers' processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from ..config import ConfigError, ExperimentConfig
from ..knobs import channel, http_channel
from ..knobs import spec as knob_spec
from ..provenance import atomic_write_json
from . import rundir

ACK_TIMEOUT_S = 180.0


class KnobChannel:
    """The interface; subclasses say how to write a version and read the states back."""

    name = "none"
    where = ""  # where the states are read, for error messages

    def __init__(self) -> None:
        self.version = 0

    def prepare(self, cfg: ExperimentConfig) -> None:
        """Before servers this session owns start (they read the control file at start-up)."""

    def write(self, cfg: ExperimentConfig, servers: dict[str, Any]) -> None:
        raise NotImplementedError

    def read_states(self, servers: dict[str, Any]) -> list[dict]:
        raise NotImplementedError

    def apply(self, cfg: ExperimentConfig, servers: dict[str, Any],
              timeout: float = ACK_TIMEOUT_S) -> dict[str, Any]:
        """Write the knob values, wait until every server process acks, return what's in
        force: ``{role: {knob: value}}`` read back from the servers, the client-side knobs,
        each process's full state under ``detail``, and the channel's name."""
        self.write(cfg, servers)
        logs = {role: str(s.spec.log_path) for role, s in servers.items()}
        merged = channel.wait_for_version(self.where, self.version, tuple(servers), timeout,
                                          logs=logs, read=lambda: self.read_states(servers))
        out: dict[str, Any] = {role: m["knobs"] for role, m in merged.items()}
        out["client"] = client_knobs(cfg)
        out["detail"] = merged
        out["channel"] = self.name
        return out

    def kv_probe(self, servers: dict[str, Any], request: dict) -> list[dict]:
        """A KV probe request (``knobs/kv_probe.serve``) to every worker; their replies."""
        raise ConfigError(f"the KV probe needs the plugin's knob channel; this session has "
                          f"{self.name!r}")

    def in_force(self, servers: dict[str, Any]) -> dict[str, Any]:
        """Every plugin process's state now (events counted during the last run included)."""
        states = self.read_states(servers)
        return {role: channel.merge_role([s for s in states if s.get("role") == role])
                for role in servers}


def client_knobs(cfg: ExperimentConfig) -> dict[str, str]:
    return {n: cfg.knobs[n] for n in knob_spec.client_side()}


class FileChannel(KnobChannel):
    name = "file"

    def __init__(self, knobs_file: str | Path, state_dir: str | Path) -> None:
        super().__init__()
        # Absolute: servers, notebook kernels (cwd notebooks/) and this process share them.
        # Not resolved: a symlink planted at the state directory must be seen (and refused).
        self.knobs_file = Path(knobs_file).absolute()
        self.state_dir = Path(state_dir).absolute()
        self.where = str(self.state_dir)

    @classmethod
    def in_dir(cls, log_dir: str | Path) -> FileChannel:
        """The channel of servers a session starts with ``log_dir`` for their logs."""
        return cls(Path(log_dir) / "knobs.json", Path(log_dir) / "knob-state")

    def prepare(self, cfg: ExperimentConfig) -> None:
        """Clear the state files of earlier servers and write version 1. The state directory
        must be private (a planted symlink would make the clear-out delete files elsewhere)."""
        rundir.private_dir(self.state_dir)
        for f in self.state_dir.glob("*.json"):
            f.unlink()
        self.version += 1
        channel.write_control(self.knobs_file, self.version, cfg.knobs, cfg.seed)

    def write(self, cfg: ExperimentConfig, servers: dict[str, Any]) -> None:
        current = channel.read_control(self.knobs_file) or {}
        self.version = max(self.version, int(current.get("version", 0))) + 1
        channel.write_control(self.knobs_file, self.version, cfg.knobs, cfg.seed)

    def read_states(self, servers: dict[str, Any]) -> list[dict]:
        return channel.read_states(self.state_dir)

    def in_force(self, servers: dict[str, Any], timeout: float = ACK_TIMEOUT_S
                 ) -> dict[str, Any]:
        """Every plugin process's state once each has written it again after this call (a
        flush request with a nonce): a busy machine may starve the thread that writes a
        process's events, and counts read before it ran would be short."""
        nonce = f"{os.getpid()}-{time.monotonic_ns()}"
        atomic_write_json(self.state_dir / channel.FLUSH_REQUEST, {"nonce": nonce})
        deadline = time.monotonic() + timeout
        while True:
            states = [s for s in self.read_states(servers) if s.get("role") in servers]
            stale = [f"{s['role']} {s['component']} pid {s['pid']}" for s in states
                     if s.get("flushed_for") != nonce]
            if not stale:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"in force: {', '.join(stale)} did not write their state "
                                   f"within {timeout:.0f} s of the flush request")
            time.sleep(0.05)
        return {role: channel.merge_role([s for s in states if s.get("role") == role])
                for role in servers}

    def kv_probe(self, servers: dict[str, Any], request: dict,
                 timeout: float = ACK_TIMEOUT_S) -> list[dict]:
        """A request file in the state directory; each worker answers with a file of its own."""
        workers = {(s["role"], s["pid"]) for s in self.read_states(servers)
                   if s.get("component") == "worker" and s.get("role") in servers}
        self._probe_id = getattr(self, "_probe_id", 0) + 1
        rid = f"{os.getpid()}-{self._probe_id}"
        req = self.state_dir / f"kvprobe-req-{rid}.json"
        atomic_write_json(req, {**request, "id": rid, "roles": sorted(servers)})
        deadline = time.monotonic() + timeout
        try:
            while True:
                got = sorted(self.state_dir.glob(f"kvprobe-resp-{rid}-*.json"))
                if len(got) >= len(workers):
                    return [json.loads(f.read_text()) for f in got]
                if time.monotonic() > deadline:
                    raise TimeoutError(f"KV probe: {len(got)} of {len(workers)} workers "
                                       f"answered {req} within {timeout:.0f} s")
                time.sleep(0.05)
        finally:
            for f in [req, *self.state_dir.glob(f"kvprobe-resp-{rid}-*.json")]:
                f.unlink(missing_ok=True)


class HttpChannel(KnobChannel):
    name = "http"
    where = "(over HTTP: POST /collective_rpc)"

    def write(self, cfg: ExperimentConfig, servers: dict[str, Any]) -> None:
        """Each server's control file, written by its own worker (one version for all)."""
        current = [int((reply.get("control") or {}).get("version", 0))
                   for s in servers.values() for reply in http_channel.call(s.url)]
        self.version = max([self.version, *current]) + 1
        request = {"version": self.version, "knobs": knob_spec.validate(dict(cfg.knobs)),
                   "seed": cfg.seed}
        for s in servers.values():
            http_channel.call(s.url, request)

    def read_states(self, servers: dict[str, Any]) -> list[dict]:
        return [st for role, s in servers.items() for st in http_channel.states(s.url, role)]

    def kv_probe(self, servers: dict[str, Any], request: dict) -> list[dict]:
        """The worker method ``workbench_kvprobe`` through ``POST /collective_rpc``."""
        return [{**reply, "role": role} for role, s in servers.items()
                for reply in http_channel.call(s.url, request,
                                               method=http_channel.KV_PROBE_METHOD)]


class NoChannel(KnobChannel):
    """Attach mode without the plugin's control channel: only vLLM's own behaviour."""

    def __init__(self, problem: str | None = None) -> None:
        super().__init__()
        self.problem = problem  # why HTTP was tried and failed, if it was

    def apply(self, cfg: ExperimentConfig, servers: dict[str, Any],
              timeout: float = ACK_TIMEOUT_S) -> dict[str, Any]:
        changed = {n: v for n, v in knob_spec.changed(cfg.knobs).items()
                   if not knob_spec.KNOBS[n].client_side}
        if changed:
            why = f" (over HTTP: {self.problem})" if self.problem else ""
            raise ConfigError(
                f"knobs {changed} need the workbench plugin's control channel on the attached "
                "servers (pass knobs_file and state_dir, or run the plugin in servers with "
                f"VLLM_SERVER_DEV_MODE=1 for the HTTP channel){why}; without it only the "
                "defaults (vLLM untouched) can run"
            )
        unknown = {n: "unknown (no plugin channel)" for n, k in knob_spec.KNOBS.items()
                   if not k.client_side}
        out: dict[str, Any] = {role: dict(unknown) for role in servers}
        out["client"] = client_knobs(cfg)
        return out

    def in_force(self, servers: dict[str, Any]) -> dict[str, Any]:
        return {}


class ProbeChannel(NoChannel):
    """No knob, only the KV probe that observe-only servers carry (``kv_probe.observe``):
    each run switches it on or off in every worker and clears it, as a new knob version does,
    and ``kv_probe`` in force is what the workers answer."""

    name = "observe-kv-probe"

    def __init__(self, state_dir: str | Path) -> None:
        super().__init__()
        self.files = FileChannel(Path(state_dir) / "unused-knobs.json", state_dir)
        self.state_dir = self.files.state_dir
        self.where = self.files.where

    def apply(self, cfg: ExperimentConfig, servers: dict[str, Any],
              timeout: float = ACK_TIMEOUT_S) -> dict[str, Any]:
        plain = dataclasses.replace(cfg, kv_probe=False, knobs=dict(cfg.knobs))  # its own dict
        out = super().apply(plain, servers, timeout)
        replies = self.kv_probe(servers, {"op": "switch", "on": cfg.kv_probe})
        for role in servers:
            got = {r.get("enabled") for r in replies if r.get("role") == role}
            out[role]["kv_probe"] = {frozenset({True}): "on", frozenset({False}): "off"}.get(
                frozenset(got), f"workers disagree: {sorted(got, key=str)}")
        out["channel"] = self.name
        self.version += 1
        return out

    def in_force(self, servers: dict[str, Any]) -> dict[str, Any]:
        states = self.files.read_states(servers)
        return {role: channel.merge_role([s for s in states if s.get("role") == role])
                for role in servers if any(s.get("role") == role for s in states)}

    def kv_probe(self, servers: dict[str, Any], request: dict) -> list[dict]:
        workers = {s["role"] for s in self.files.read_states(servers)
                   if s.get("component") == "worker"}
        if missing := sorted(set(servers) - workers):
            raise ConfigError(f"the KV probe is not running in {missing}'s workers (no state "
                              f"file in {self.state_dir}): its server log says why")
        return self.files.kv_probe(servers, request)


def for_attach(urls: dict[str, str], knobs_file: str | Path | None,
               state_dir: str | Path | None, knobs_over_http: bool | None) -> KnobChannel:
    """The channel to servers someone else started: the shared files when both are given;
    else HTTP when every server answers it (``knobs_over_http=None`` tries it and records why
    not, ``True`` requires it, ``False`` never tries)."""
    if knobs_file and state_dir:
        # What is read there is reported as read back from the servers: refuse a place that
        # others could write (when it exists; `serve` makes both private).
        for d in (Path(state_dir), Path(knobs_file).parent):
            if d.exists() or d.is_symlink():
                rundir.check_private(d)
        return FileChannel(knobs_file, state_dir)
    if knobs_file or state_dir or knobs_over_http is False:
        return NoChannel()
    problems = {r: why for r, url in urls.items() if (why := http_channel.probe(url))}
    if not problems:
        return HttpChannel()
    problem = "; ".join(f"{r}: {why}" for r, why in problems.items())
    if knobs_over_http:
        raise ConfigError(f"attach: no knob channel over HTTP: {problem}")
    return NoChannel(problem)
