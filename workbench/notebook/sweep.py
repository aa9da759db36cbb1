"""Grids of knob settings, run through papermill, resumable, aggregated into a table + figures.

The driver owns the servers (one ``Session``): each grid point is one execution of
``notebooks/sweep.ipynb`` that attaches to them, so servers start only when a restart-time
knob changes, and the executed notebook stays on disk as the record of that run. A point whose
``result.json`` is complete is skipped on the next invocation (resume after a crash or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from .. import paths
from ..config import ConfigError, ExperimentConfig
from ..inputs import modelfiles, prompts
from ..knobs import spec as knob_spec
from ..knobs.release import vllm_version
from ..measuring.results import Result
from ..provenance import atomic_write_json, atomic_write_text, portable_text
from ..serving import rundir
from .kernels import KernelStarter

if TYPE_CHECKING:
    from jupyter_client.manager import AsyncKernelManager

    from ..experiment import Session

SWEEP_NOTEBOOK = paths.REPO / "notebooks" / "sweep.ipynb"


LOAD_LEVELS = (1, 2, 4, 8, 16, 32)  # the `load` grid's requests in flight


@dataclass(frozen=True)
class Point:
    name: str
    prompt_set: str
    knobs: dict[str, str] = field(default_factory=dict)
    why: str = ""
    overrides: dict = field(default_factory=dict)  # other ExperimentConfig fields of the point

    @property
    def slug(self) -> str:
        """The point's directory name under ``points/``; a name with no letter or digit gets
        one made from its hash (an empty slug would write into ``points/`` itself)."""
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return slug or "point-" + hashlib.sha256(self.name.encode()).hexdigest()[:10]


# The default sweep behind `make figures`: each knob's effect, plus the settings that show
# none (and say why). Host-staged points come last: `transfer` is the one knob that restarts.
GRIDS: dict[str, list[Point]] = {
    "default": [
        Point("fixed", "indomain", {}, "every fix in place: parity expected"),
        Point("eager, direct", "indomain", {"finalize": "eager"},
              "NIXL reads P's CPU KV directly: eager finalize has nothing to break"),
        Point("legacy hand-off", "badcase", {"block_handoff": "legacy"},
              "P hands its lookahead block too: requests with N % bs == 0 shift by a block"),
        Point("legacy, P lookahead 0", "badcase",
              {"block_handoff": "legacy", "prefill_lookahead": "0"},
              "no lookahead block on P, nothing extra to hand over"),
        *(Point(f"legacy, last block, {blocks}", "lastblock",
                {"block_handoff": "legacy", "blocks": blocks}, why)
          for blocks, why in (
              ("zeroed", "D loads only the tail: P's never-written block holds zeros"),
              ("dirty", "D loads only the tail: P's never-written block holds stale KV "
                        "(noise, std 1)"),
              ("poisoned", "the same with noise at std 100: how much the damage depends on "
                           "the staleness"))),
        # Host staging loses KV where P splits a prefill into chunks (finding
        # host-buffer-chunk-boundary, present in 0.32.0): 12 in-domain prompts in flight fit
        # P's 2048-token step budget whole (input_checks.chunking_note), so none is split.
        *(Point(name, "indomain", {"transfer": "host-staged", **knobs}, why,
                {"concurrency": 12})
          for name, knobs, why in (
              ("host-staged, deferred, dirty", {"blocks": "dirty"},
               "today's order: parity expected"),
              ("host-staged, eager, dirty", {"finalize": "eager", "blocks": "dirty"},
               "P stages the drafter's blocks before the drafter wrote them"),
              ("host-staged, eager, zeroed", {"finalize": "eager", "blocks": "zeroed"},
               "the same, with zeroed blocks: zeros can hide the damage"))),
    ],
    # Acceptance under load: the fixed pipeline and one bug at each concurrency (the baseline
    # is measured at the same concurrency; host-staged comes last: it restarts the servers).
    "load": [
        *(Point(f"fixed, {c} in flight", "indomain", {}, "every fix in place",
                {"concurrency": c}) for c in LOAD_LEVELS),
        *(Point(f"host-staged, eager, dirty, {c} in flight", "indomain",
                {"transfer": "host-staged", "finalize": "eager", "blocks": "dirty"},
                "P stages the drafter's blocks before the drafter wrote them",
                {"concurrency": c}) for c in LOAD_LEVELS),
    ],
    # Upstream's open fix (vLLM PR #50173) on D's load step: as released, as written, and
    # extended to the asynchronous (NIXL) load.
    "upstream": [
        Point(f"load step {v}", "indomain", {"load_step": v}, why) for v, why in (
            ("as-released", "D pads its first step after the load: one all-rejected draft"),
            ("gated", "the PR gates synchronous loads only; NIXL loads asynchronously"),
            ("gated-async", "the padding gated after the asynchronous load: D = baseline"))
    ],
    # Every KV connector that runs on the CPU (knobs/connector.py), with every fix in place,
    # one request at a time and 32 in flight, each with the KV probe (docs/connectors.md).
    "connectors": [
        Point(f"{name}, {c} in flight", "indomain", {"connector": name}, why,
              {"concurrency": c, "kv_probe": True})
        for name, why in (
            ("nixl", "NIXL pull: D reads P's blocks (the reference)"),
            ("nixl-push", "NIXL push: P writes its blocks into D's"),
            ("example", "shared storage: P saves every layer, D loads by the prompt"),
            ("multi", "MultiConnector: NIXL pull, and ExampleConnector saving beside it"))
        for c in (1, 32)
    ],
    # The same settings on each model runner (docs/runners.md): the V1 runner's points, then
    # Model Runner V2's (a change of runner restarts every server, the baseline too).
    "runners": [
        Point(f"{name}, {runner}", prompt_set, {**knobs, "runner": runner}, why)
        for runner in ("v1", "v2")
        for name, prompt_set, knobs, why in (
            ("fixed", "indomain", {}, "every fix in place: parity expected on either runner"),
            ("legacy hand-off", "badcase", {"block_handoff": "legacy"},
             "P hands its lookahead block too, whichever runner computes the KV"),
            ("legacy, last block, as-is", "lastblock", {"block_handoff": "legacy"},
             "P's never-written block holds what this runner's start-up and earlier points "
             "left"))
    ],
    "smoke": [
        Point("fixed", "indomain", {}),
        Point("legacy hand-off", "badcase", {"block_handoff": "legacy"}),
    ],
}


def grid_points(name: str) -> list[Point]:
    if name not in GRIDS:
        raise ConfigError(f"grid {name!r} is unknown; allowed: {', '.join(GRIDS)}")
    return GRIDS[name]


def check_slugs(points: list[Point]) -> None:
    """Two points with one slug would share a directory, each overwriting the other's run."""
    seen: dict[str, str] = {}
    for pt in points:
        if pt.slug in seen:
            raise ConfigError(f"points {seen[pt.slug]!r} and {pt.name!r} share the directory "
                              f"name {pt.slug!r}: rename one")
        seen[pt.slug] = pt.name


def point_config(base: ExperimentConfig, pt: Point) -> ExperimentConfig:
    knobs = dict(base.knobs)
    knobs.update(pt.knobs)
    cfg = replace(base, prompt_set=pt.prompt_set, knobs=knob_spec.validate(knobs), label=pt.name,
                  **pt.overrides)
    cfg.validate()
    return cfg


POINT_RECORD = "point.json"  # beside result.json: what the point ran with, and its digest


class PointIdentity:
    """What a point's result depends on: its full config, the vLLM version and the model
    files' identity (``modelfiles.identity``, computed once per directory per sweep)."""

    def __init__(self) -> None:
        self._models: dict[str, dict] = {}
        self.vllm_version = vllm_version()

    def record(self, cfg: ExperimentConfig) -> dict:
        models = {}
        for role in ("target", "drafter"):
            path = getattr(cfg, role)
            if path not in self._models:
                self._models[path] = modelfiles.identity(path)
            models[role] = self._models[path]["sha256"]
        rec = {"config": cfg.to_dict(), "vllm_version": self.vllm_version, "models": models}
        return {"digest": _digest(rec), **rec}


def _digest(rec: dict) -> str:
    body = {k: rec[k] for k in ("config", "vllm_version", "models")}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def recorded(point_dir: Path) -> dict | None:
    """What a complete point ran with: its ``point.json`` when that agrees with its
    ``result.json``; else (a point from before digests) the result's own config and vLLM
    version, models "not recorded". None when the point has no complete result."""
    result = _read(point_dir / "result.json")
    if not (result and result.get("complete")):
        return None
    rec = _read(point_dir / POINT_RECORD)
    if rec and rec.get("config") == result.get("config"):
        return rec
    return {"config": result.get("config") or {}, "vllm_version": result.get("vllm_version"),
            "models": "not recorded"}


def with_new_knobs(rec: dict) -> dict:
    """``rec`` with each knob added since it was recorded at its default: a knob's default is
    vLLM as released (or as fixed), which is what a run from before the knob existed ran."""
    cfg = rec.get("config") or {}
    if "knobs" not in cfg:
        return rec
    return {**rec, "config": {**cfg, "knobs": {**knob_spec.defaults(), **cfg["knobs"]}}}


def differences(old: dict, new: dict) -> list[str]:
    """The fields in which two point records differ, as ``name: old -> new``."""
    out = []
    old = with_new_knobs(old)
    oc, nc = old.get("config") or {}, new["config"]
    for k in sorted(set(oc) | set(nc)):
        if k == "knobs":
            ok, nk = oc.get(k) or {}, nc.get(k) or {}
            out += [f"knobs.{n}: {ok.get(n)!r} -> {nk.get(n)!r}"
                    for n in sorted(set(ok) | set(nk)) if ok.get(n) != nk.get(n)]
        elif oc.get(k) != nc.get(k):
            out.append(f"{k}: {oc.get(k)!r} -> {nc.get(k)!r}")
    if old.get("vllm_version") != new["vllm_version"]:
        out.append(f"vllm_version: {old.get('vllm_version')!r} -> {new['vllm_version']!r}")
    om, nm = old.get("models"), new["models"]
    for role in ("target", "drafter"):
        was = om.get(role) if isinstance(om, dict) else om
        if was != nm[role]:
            out.append(f"model files of the {role}: {_short(was)} -> {_short(nm[role])}")
    return out


def _short(v: object) -> str:
    return f"sha256 {v[:12]}" if isinstance(v, str) and len(v) == 64 else repr(v)


def is_complete(point_dir: Path, record: dict) -> bool:
    """Whether the point's run can be kept: complete, and run with ``record`` exactly. A
    complete point run with anything else is refused (ConfigError naming the fields that
    differ), never silently kept nor silently overwritten."""
    old = recorded(point_dir)
    if old is None:
        return False
    if _digest(with_new_knobs(old)) == record["digest"]:
        return True
    diffs = differences(old, record) or ["digest"]
    raise ConfigError(
        f"{point_dir} holds a complete run of another configuration ({'; '.join(diffs)}): "
        "pass --restart to rerun the sweep's points here, or another --out")


def execute_point(cfg: ExperimentConfig, attach: dict, point_dir: Path, record: Path,
                  km: AsyncKernelManager | None = None) -> None:
    """Run one grid point as a papermill execution of the sweep notebook (attached), on the
    kernel ``km`` when given (``kernels.KernelStarter``; it is left running)."""
    import papermill as pm

    point_dir.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(
        str(SWEEP_NOTEBOOK), str(record),
        parameters={"config": cfg.to_dict(), "attach": attach, "out_dir": str(point_dir),
                    "grid": ""},
        kernel_name="python3", progress_bar=False, cwd=str(SWEEP_NOTEBOOK.parent), km=km,
    )
    atomic_write_text(record, portable_text(Path(record).read_text()))  # a record: no local path


def run_sweep(
    grid: str | list[Point],
    out: str | Path,
    base: ExperimentConfig,
    *,
    use_papermill: bool = True,
    resume: bool = True,
    on_point: Callable[[Point, str], None] | None = None,
    session: Session | None = None,
    keep_going: bool = False,
) -> pd.DataFrame:
    """Run every point not yet complete, then aggregate everything under ``out``.

    A point is kept only when its complete run had this very config, vLLM and model files
    (``is_complete``). ``out`` is private and locked for the sweep. With ``session`` the sweep
    runs on servers someone else owns (a notebook's, a test's) and leaves them running;
    otherwise it starts its own and stops them at the end. ``keep_going``: a point that fails
    (a server dies) keeps its partial result.json, the next point restarts what died, and the
    table's ``attrs["failed"]`` names each failed point and why."""
    points = grid_points(grid) if isinstance(grid, str) else list(grid)
    check_slugs(points)
    out = rundir.private_dir(out).resolve()  # each point's notebook runs with cwd notebooks/
    lock = rundir.DirLock(out, "a sweep")  # one sweep per --out: they would share servers' files
    try:
        return _sweep(points, out, base, use_papermill, resume, on_point, session, keep_going)
    finally:
        lock.release()


def _sweep(points: list[Point], out: Path, base: ExperimentConfig, use_papermill: bool,
           resume: bool, on_point: Callable[[Point, str], None] | None,
           session: Session | None, keep_going: bool = False) -> pd.DataFrame:
    from ..experiment import Session

    (out / "points").mkdir(exist_ok=True)
    ident = PointIdentity()
    configs = {pt.slug: point_config(base, pt) for pt in points}
    records = {slug: ident.record(cfg) for slug, cfg in configs.items()}
    # Every point is checked (and a mismatch refused) before any server starts.
    todo = [pt for pt in points
            if not (resume and is_complete(out / "points" / pt.slug, records[pt.slug]))]
    # Where the wall time goes: server starts, and each point's run (its notebook included).
    timing = {"started": time.time(), "points_run": len(todo),
              "points_skipped": len(points) - len(todo), "start_seconds": [], "points": {},
              "failed": {}}
    owned = session is None
    if owned:
        session = Session(out / "logs", baseline_cache=out / "baseline-cache")
    starter = KernelStarter(SWEEP_NOTEBOOK.parent) if use_papermill else None
    with (session if owned else contextlib.nullcontext(session),
          contextlib.closing(starter) if starter else contextlib.nullcontext()):
        if starter and todo:
            starter.launch_next()  # the first point's kernel boots while its servers start
            threading.Thread(target=_prebuild, args=([configs[pt.slug] for pt in todo],),
                             name="workbench-prompts", daemon=True).start()
        for pt in points:
            if pt not in todo:
                if on_point:
                    on_point(pt, "skipped (complete)")
                continue
            if on_point:
                on_point(pt, "running")
            point_dir = out / "points" / pt.slug
            (point_dir / POINT_RECORD).unlink(missing_ok=True)
            more = pt is not todo[-1]
            try:
                _run_one(session, configs[pt.slug], out, pt.slug, starter, more, timing)
            except Exception as e:
                if not keep_going:
                    raise
                timing["failed"][pt.slug] = failure(e)
                if on_point:
                    on_point(pt, f"failed: {timing['failed'][pt.slug]}")
            if (_read(point_dir / "result.json") or {}).get("complete"):
                atomic_write_json(point_dir / POINT_RECORD, records[pt.slug], indent=2,
                                  portable=True)
        timing["startup_seconds"] = dict(session.startup_seconds)  # stop() clears them
    timing["wall_seconds"] = time.time() - timing["started"]
    atomic_write_json(out / "sweep-timing.json", timing, indent=2, sort_keys=False, portable=True)
    table = aggregate(out, [pt.slug for pt in points])
    table.attrs["failed"] = timing["failed"]
    return table


def failure(e: BaseException) -> str:
    """A failed point's why in one line: the run's own error where papermill wraps it."""
    text = getattr(e, "evalue", None) or str(e)
    return f"{getattr(e, 'ename', type(e).__name__)}: {text.splitlines()[0] if text else ''}"


def _prebuild(cfgs: list[ExperimentConfig]) -> None:
    """Build the points' prompt sets into the prompt cache while the servers start, so no
    point's kernel loads the tokenizer (a failure is the point's own to report)."""
    with contextlib.suppress(Exception):
        for cfg in cfgs:
            prompts.for_config(cfg)


def _run_one(session: Session, cfg: ExperimentConfig, out: Path, slug: str,
             starter: KernelStarter | None, more: bool, timing: dict) -> None:
    """One point: as a papermill execution of the sweep notebook attached to the session's
    servers (started or restarted first if the point's shape needs it), on a kernel from
    ``starter`` (which starts the next point's kernel when ``more`` points follow); or in
    this process when ``starter`` is None."""
    point_dir = out / "points" / slug
    t0 = time.monotonic()
    if starter is None:
        session.run(cfg, out_dir=point_dir)
        timing["points"][slug] = time.monotonic() - t0
        return
    if session.needs_start(cfg):
        session.ensure(cfg)
        timing["start_seconds"].append(time.monotonic() - t0)
        t0 = time.monotonic()
    attach = {"urls": {r: s.url for r, s in session.servers.items()},
              "knobs_file": str(session.knobs_file), "state_dir": str(session.state_dir),
              "baseline_cache": str(session.baseline_cache or out / "baseline-cache")}
    km = starter.take()
    if more:
        starter.launch_next()
    try:
        execute_point(cfg, attach, point_dir, out / "points" / f"{slug}.ipynb", km)
    finally:
        starter.stop(km)
    timing["points"][slug] = time.monotonic() - t0


def run_point(config: dict, attach: dict | None, out_dir: str | Path,
              results_store: str | Path | None = None) -> Result:
    """One grid point, as the sweep notebook runs it: attached to the driver's servers, or
    with servers of its own when ``attach`` is empty."""
    from ..experiment import Session
    from ..measuring.results import append_to_store

    cfg = ExperimentConfig.from_dict(dict(config)) if config else ExperimentConfig()
    with Session.from_attach(attach) as session:
        result = session.run(cfg, out_dir=out_dir, command=f"papermill notebooks/sweep.ipynb "
                             f"(config={json.dumps(cfg.to_dict(), sort_keys=True)})")
    if results_store:
        append_to_store(result, results_store)
    return result


def load_results(out: str | Path, slugs: list[str] | None = None) -> list[Result]:
    """The complete results under ``out/points`` (a failed or interrupted run's result.json
    keeps its evidence on disk but is no row of the tables or figures)."""
    pdir = Path(out) / "points"
    dirs = [pdir / s for s in slugs] if slugs else sorted(d for d in pdir.iterdir() if d.is_dir())
    results = [Result.load(d) for d in dirs if (d / "result.json").is_file()]
    return [r for r in results if r.complete]


def aggregate(out: str | Path, slugs: list[str] | None = None) -> pd.DataFrame:
    """Write ``results.csv`` (one row per run), ``requests.csv`` and the figures."""
    from ..figures import plots

    out = Path(out)
    results = load_results(out, slugs)
    if not results:
        raise RuntimeError(f"no completed runs under {out / 'points'}")
    table = pd.DataFrame([{"label": plots.label(r), **r.summary_row()} for r in results])
    table.to_csv(out / "results.csv", index=False)
    reqs = pd.concat(
        [r.requests_frame().assign(label=plots.label(r)) for r in results], ignore_index=True
    )
    reqs.to_csv(out / "requests.csv", index=False)
    plots.all_figures(results, out / "figures")
    return table
