"""One run end to end: servers, knobs, prompts, baseline then PD, counters, Result.

A ``Session`` keeps servers alive between runs and switches the knobs that need no restart
through its knob channel (``channels.py``); what the servers are is in ``plan.py``, how the
requests are sent and counted in ``measure.py``, how rows add up in ``results.py``.
"""

from __future__ import annotations

import datetime as dt
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from .config import ConfigError, ExperimentConfig, exposure_notes
from .inputs import models, profiles
from .inputs import prompts as prompt_sets
from .inputs.input_checks import check_prompt_lengths, chunking_note
from .knobs import build
from .knobs.kv_probe import prompt_key
from .knobs.notes import knob_notes
from .knobs.release import vllm_version
from .measuring import kv_compare
from .measuring.baseline_cache import BaselineCache
from .measuring.measure import Progress, Requests, measure, run_coro
from .measuring.results import Result, aggregate, runner_by_role, runner_in_force
from .provenance import git_commit
from .serving import channels, rundir
from .serving.server_set import ServerSet, check_vllm_release
from .serving.servers import RemoteServer, no_prefix_reset

FLUSH_WAIT_S = 0.5  # the plugin flushes its event counters every 0.2 s


def client_limits(concurrency: int) -> httpx.Limits:
    """The measurement client's connections: enough for both sides at ``concurrency``, and
    none kept idle for reuse. vLLM's uvicorn closes an idle connection after
    VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s, vllm/envs.py); a connection the client reuses at that
    edge is closed under the request, which fails with httpx.ReadError. A 2 s client expiry
    made it rarer (2 of 6 runs failed with httpx's 5 s, 0 of 8 with 2 s: 32 lastblock
    prompts, 32 in flight), not impossible: the edge is between the server writing a
    response and the client reading it, and a busy client reads late (one such failure at
    32 in flight while other servers started). A fresh loopback connection per request
    costs well under a millisecond and has no edge to race."""
    return httpx.Limits(max_connections=2 * concurrency + 4, max_keepalive_connections=0)


class Session:
    """Owns servers (``ServerSet``: each role restarted only when its shape changes) and runs
    experiments on them.

    Use as a context manager (or call ``close``); servers are also stopped at exit, on
    SIGTERM/SIGHUP, and by their reaper if this process dies.
    """

    def __init__(self, log_dir: str | Path | None = None,
                 baseline_cache: str | Path | None = None,
                 channel: channels.KnobChannel | None = None, dev_mode: bool = False):
        self._tmp = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="workbench-")
            log_dir = self._tmp.name
        # Absolute: servers, notebook kernels (cwd notebooks/) and this process share the paths.
        # Private and locked: its control and state files are what results report as read back.
        self.log_dir = rundir.private_dir(log_dir).resolve()
        self._lock = rundir.DirLock(self.log_dir, "a Session's servers and knob channel")
        self.fleet = ServerSet(self.log_dir, channel or channels.FileChannel.in_dir(self.log_dir),
                               dev_mode)
        self.attached = False
        self.prefix_reset_checked: set[str] = set()  # attach mode: roles that answer it
        self.failed = False  # a run failed: close() keeps a temporary log directory
        # The baseline does not depend on PD knobs: a sweep measures it once per prompt set.
        self.baseline_cache = Path(baseline_cache).resolve() if baseline_cache else None

    @classmethod
    def attach(cls, urls: dict[str, str], *, knobs_file: str | Path | None = None,
               state_dir: str | Path | None = None, log_dir: str | Path | None = None,
               baseline_cache: str | Path | None = None,
               knobs_over_http: bool | None = None) -> Session:
        """Use servers that are already running (started by a sweep driver, or by hand); the
        knob channel is chosen by ``channels.for_attach``."""
        unknown = set(urls) - {"p", "d", "baseline"}
        if unknown:
            raise ConfigError(f"attach: unknown roles {sorted(unknown)}; allowed: p, d, baseline")
        channel = channels.for_attach(urls, knobs_file, state_dir, knobs_over_http)
        s = cls(log_dir, baseline_cache=baseline_cache, channel=channel)
        s.fleet.servers = {role: RemoteServer(role, url) for role, url in urls.items()}
        s.attached = True
        return s

    @classmethod
    def from_attach(cls, attach: dict | None, **kw) -> Session:
        """``attach`` as a sweep passes it ({"urls", "knobs_file", "state_dir",
        "baseline_cache"}), or empty for a session that starts its own servers."""
        if not attach:
            return cls(**kw)
        kw.setdefault("baseline_cache", attach.get("baseline_cache"))
        return cls.attach(attach["urls"], knobs_file=attach.get("knobs_file"),
                          state_dir=attach.get("state_dir"), **kw)

    # --- the servers and their knob channel (server_set.ServerSet) ------------------------
    @property
    def servers(self) -> dict[str, Any]:
        return self.fleet.servers

    @property
    def channel(self) -> channels.KnobChannel:
        return self.fleet.channel

    @property
    def startup_seconds(self) -> dict[str, float]:
        return self.fleet.startup_seconds

    @property
    def knobs_file(self) -> Path | None:
        return getattr(self.channel, "knobs_file", None)

    @property
    def state_dir(self) -> Path | None:
        return getattr(self.channel, "state_dir", None)

    @property
    def knobs_over_http(self) -> bool:
        return self.channel.name == "http"

    @property
    def knobs_channel_problem(self) -> str | None:
        return getattr(self.channel, "problem", None)

    def needs_start(self, cfg: ExperimentConfig) -> bool:
        """Whether running ``cfg`` will start (or restart, or stop) servers first."""
        return not self.attached and self.fleet.needs_start(cfg)

    def ensure(self, cfg: ExperimentConfig) -> None:
        """Start the servers this config needs; a server whose shape did not change keeps
        running (``ServerSet.ensure``)."""
        if not self.attached:
            self.fleet.ensure(cfg)
            return
        missing = [r for r in cfg.roles() if r not in self.servers]
        if missing:
            raise ConfigError(f"attach mode: no URL given for role(s) {missing}")
        for r in cfg.roles():
            self.servers[r].wait_ready(30)
        check_prefix_reset(self, cfg.roles())

    def stop(self) -> None:
        self.fleet.stop()

    def close(self) -> None:
        self.stop()
        self._lock.release()
        if self._tmp is not None and self.failed:  # the evidence an error message names
            print(f"server logs of the failed run kept in {self.log_dir}", file=sys.stderr)
        elif self._tmp is not None:
            self._tmp.cleanup()
        self._tmp = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- knobs ---------------------------------------------------------------------------
    def apply_knobs(self, cfg: ExperimentConfig) -> dict[str, Any]:
        """Write the knob values, wait until every server process acks, return what's in
        force (``KnobChannel.apply``)."""
        return self.channel.apply(cfg, self.servers)

    def in_force(self) -> dict[str, Any]:
        return self.channel.in_force(self.servers)

    def reset_prefix_caches(self) -> None:
        """Through the knob channel each new version resets every engine core's prefix cache
        (``knobs/plugin.py``); without the channel, vLLM's dev-mode endpoint."""
        if isinstance(self.channel, channels.NoChannel):
            for s in self.servers.values():
                s.reset_prefix_cache()

    # --- one run -------------------------------------------------------------------------
    def check_build(self, cfg: ExperimentConfig) -> None:
        """Before anything starts: a knob this build refuses; Hub ids before the tokenizer."""
        if not self.attached:
            check_vllm_release(cfg.knobs, cfg)
            models.fetch([cfg.target, cfg.drafter])

    def describe(self, result: Result) -> Result:
        """The run's result as its servers make it (another environment's vLLM: its own)."""
        return result

    def run(self, cfg: ExperimentConfig, progress: Progress | None = None,
            command: str | None = None, out_dir: str | Path | None = None) -> Result:
        cfg.validate()
        t0 = time.monotonic()
        self.check_build(cfg)
        plist = prompt_sets.for_config(cfg)
        check_prompt_lengths(cfg, plist)  # a notebook's run too, before servers start
        if progress and self.needs_start(cfg):
            progress("start", 0, 1)
        self.ensure(cfg)
        self.reset_prefix_caches()
        if progress:
            progress("knobs", 0, 1)
        result = self.describe(new_result(cfg, command, len(plist), self.apply_knobs(cfg),
                                          self.startup_seconds))
        result.requests = rows = [_row(p, cfg) for p in plist]
        if note := chunking_note(cfg, plist):
            result.notes.append(note)
        cache = BaselineCache(self.baseline_cache) if self.baseline_cache else None
        if cache is not None and cfg.kv_probe:
            cache = None  # the probe compares D with this run's baseline KV
            result.notes.append("baseline measured again, not reused: the KV probe compares "
                                "D with the baseline's KV of this run")
        result.measurement = {"concurrency": cfg.concurrency, "sides": {}}

        async def requests() -> None:
            async with httpx.AsyncClient(timeout=cfg.request_timeout_s,
                                         limits=client_limits(cfg.concurrency)) as client:
                req = Requests(client, {r: s.url for r, s in self.servers.items()}, cfg,
                               f"wb{self.channel.version}", progress,
                               phases=result.measurement["sides"])
                try:
                    await measure(req, plist, rows, cache, result.notes)
                finally:
                    result.engine_seconds = req.engine_seconds

        try:
            run_coro(requests())
            if cfg.kv_probe:
                probe_kv(self.channel, self.servers, result, rows, plist)
        except BaseException as e:
            self.failed, died = True, died_note(self.servers)
            result.complete, result.error = False, died + f"{type(e).__name__}: {e}"
            if died and isinstance(e, Exception):  # say first what happened, not the symptom
                raise RuntimeError(result.error) from e
            raise
        finally:
            result.wall_seconds = time.monotonic() - t0
            finish(result, rows, self.in_force, out_dir, failing=not result.complete)
        return result

def check_prefix_reset(session: Session, roles: list[str]) -> None:
    """Attach mode without the plugin's channel: each run resets the servers' prefix caches
    over vLLM's ``/reset_prefix_cache`` (``reset_prefix_caches``), which only dev-mode
    servers serve. Probed once per role before the first request, so servers without it
    are refused with one line (``servers.no_prefix_reset``), not a traceback mid-run."""
    if not isinstance(session.channel, channels.NoChannel):
        return
    todo = [r for r in roles if r not in session.prefix_reset_checked]
    missing = [session.servers[r] for r in todo if not session.servers[r].has_reset_prefix_cache()]
    if missing:
        raise no_prefix_reset(missing)
    session.prefix_reset_checked.update(todo)


def died_note(servers: dict[str, Any]) -> str:
    """Which servers are gone (a killed or crashed P or D fails the run's requests)."""
    dead = {role: s for role, s in servers.items() if not s.alive()}
    logs = "; ".join(f"{role}: {getattr(getattr(s, 'spec', None), 'log_path', s.url)}"
                     for role, s in dead.items())
    return f"the {', '.join(dead)} server died during the run (logs: {logs}); " if dead else ""


def finish(result: Result, rows: list[dict], in_force, out_dir: str | Path | None,
           failing: bool) -> None:
    """Aggregate and save what was measured. While a run is failing, nothing here may replace
    its error: a server that died (attach mode) or a save that fails is noted instead."""
    time.sleep(FLUSH_WAIT_S)
    steps = (("knobs read back after the run", lambda: result.knobs.__setitem__(
        "after_run", in_force())), ("aggregation", lambda: aggregate(result, rows)),
        ("saving", lambda: out_dir is not None and result.save(out_dir)))
    for what, step in steps:
        try:
            step()
        except Exception as e:
            if not failing:
                raise
            result.notes.append(f"{what} failed after the run's error: {type(e).__name__}: {e}")
            if what == "saving":
                print(f"could not save the failed run's result: {e}", file=sys.stderr)


def probe_kv(channel: channels.KnobChannel, servers: dict[str, Any], result: Result,
             rows: list[dict], plist: list) -> None:
    """Each request's KV against P and the baseline (``kv_compare``), and the probe's cost."""
    probes, cost = kv_compare.collect(lambda req: channel.kv_probe(servers, req),
                                      [(r["id"], prompt_key(p.token_ids))
                                       for r, p in zip(rows, plist, strict=True)])
    for row, pr in zip(rows, probes, strict=True):
        row["kv_probe"] = pr
    result.kv_probe_summary = {**kv_compare.summary(rows), "cost": cost}


def new_result(cfg: ExperimentConfig, command: str | None, n: int, states: dict[str, Any],
               startup_seconds: dict[str, float]) -> Result:
    """A run's result before its requests: config, provenance, knobs read back, notes."""
    device = profiles.get(cfg.profile).device
    b = local_build()
    return Result(
        config=cfg.to_dict(), command=command or _default_command(),
        vllm_version=vllm_version(), git_commit=git_commit(),
        vllm_release=(b.table_entry if b else None), vllm_build=(b.record() if b else None),
        model_runner=runner_in_force(states), runner=runner_by_role(states),
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        prompt_set=cfg.prompt_set if cfg.prompt_file is None else cfg.prompt_file,
        num_prompts=n, wall_seconds=0.0, engine_seconds=0.0,
        knobs={"requested": dict(cfg.knobs), **states,
               "startup_seconds": dict(startup_seconds)},
        pd=None, baseline=None, token_agreement=None,
        notes=exposure_notes(cfg) + reset_notes(states) + knob_notes(
            cfg.knobs, device=device, prompt_set=cfg.prompt_set,
            enforce_eager=cfg.enforce_eager_in_force(), concurrency=cfg.concurrency),
    )


def local_build() -> build.Build | None:
    """This machine's vLLM build (None where attach mode runs without a local vLLM)."""
    try:
        return build.installed()
    except RuntimeError:
        return None


def reset_notes(states: dict[str, Any]) -> list[str]:
    """A server whose engine core could not reset its prefix cache for this run (vLLM's
    ``Scheduler.reset_prefix_cache`` refuses while requests hold blocks) says so."""
    failed = [role for role, m in (states.get("detail") or {}).items()
              if ((m.get("components") or {}).get("engine_core") or {}).get(
                  "events", {}).get("prefix_cache_reset") is False]
    return [f"prefix cache NOT reset on {', '.join(failed)} before this run (requests still "
            "held blocks): it may read KV cached by an earlier run"] if failed else []


def _row(p: prompt_sets.Prompt, cfg: ExperimentConfig) -> dict[str, Any]:
    """A request's row before it is measured: what its prompt is and whether it is affected."""
    n = len(p.token_ids)
    lookahead = cfg.k_p if cfg.knobs["prefill_lookahead"] == "default" else 0
    return {"id": p.id, "prompt_len": n, "prompt_len_mod_block": n % cfg.block_size,
            "affected": prompt_sets.bad_case(n, lookahead, cfg.block_size),
            "prime_d": p.prime_d, "source": p.source,
            "prompt_token_ids": list(p.token_ids)}  # what was sent: reports replay it


def _default_command() -> str:
    return " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])


def run(cfg: ExperimentConfig, *, session: Session | None = None, **kw) -> Result:
    """Run one experiment; with no session, start servers for it and stop them afterwards."""
    if session is not None:
        return session.run(cfg, **kw)
    with Session() as s:
        return s.run(cfg, **kw)


def with_knobs(cfg: ExperimentConfig, **knobs: str) -> ExperimentConfig:
    """A copy of ``cfg`` with some knob values changed (validated)."""
    return replace(cfg, knobs={**cfg.knobs, **knobs})


__all__ = ["ConfigError", "ExperimentConfig", "Result", "Session", "run", "with_knobs"]
