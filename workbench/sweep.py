"""Grids of knob settings, run through papermill, resumable, aggregated into a table + figures.

The driver owns the servers (one ``Session``): each grid point is one execution of
``notebooks/sweep.ipynb`` that attaches to them, so servers start only when a restart-time
knob changes, and the executed notebook stays on disk as the record of that run. A point whose
``result.json`` is complete is skipped on the next invocation (resume after a crash or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from . import paths
from .config import ConfigError, ExperimentConfig
from .knobs import spec as knob_spec
from .provenance import atomic_write_json
from .results import Result

if TYPE_CHECKING:
    from .experiment import Session

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
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")


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
        # Host staging on the CPU is exact only one request at a time (README, "How a run is
        # measured"): these points run sequentially, on 16 prompts to keep the sweep short.
        *(Point(name, "indomain", {"transfer": "host-staged", **knobs}, why,
                {"concurrency": 1, "num_prompts": 16})
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
    "smoke": [
        Point("fixed", "indomain", {}),
        Point("legacy hand-off", "badcase", {"block_handoff": "legacy"}),
    ],
}


def grid_points(name: str) -> list[Point]:
    if name not in GRIDS:
        raise ConfigError(f"grid {name!r} is unknown; allowed: {', '.join(GRIDS)}")
    return GRIDS[name]


def point_config(base: ExperimentConfig, pt: Point) -> ExperimentConfig:
    knobs = dict(base.knobs)
    knobs.update(pt.knobs)
    cfg = replace(base, prompt_set=pt.prompt_set, knobs=knob_spec.validate(knobs), label=pt.name,
                  **pt.overrides)
    cfg.validate()
    return cfg


def is_complete(point_dir: Path) -> bool:
    p = point_dir / "result.json"
    if not p.is_file():
        return False
    try:
        return bool(json.loads(p.read_text()).get("complete"))
    except json.JSONDecodeError:
        return False


def execute_point(cfg: ExperimentConfig, attach: dict, point_dir: Path, record: Path) -> None:
    """Run one grid point as a papermill execution of the sweep notebook (attached)."""
    import papermill as pm

    point_dir.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(
        str(SWEEP_NOTEBOOK), str(record),
        parameters={"config": cfg.to_dict(), "attach": attach, "out_dir": str(point_dir),
                    "grid": ""},
        kernel_name="python3", progress_bar=False, cwd=str(SWEEP_NOTEBOOK.parent),
    )


def run_sweep(
    grid: str | list[Point],
    out: str | Path,
    base: ExperimentConfig,
    *,
    use_papermill: bool = True,
    resume: bool = True,
    on_point: Callable[[Point, str], None] | None = None,
    session: Session | None = None,
) -> pd.DataFrame:
    """Run every point not yet complete, then aggregate everything under ``out``.

    With ``session`` the sweep runs on servers someone else owns (a notebook's, a test's)
    and leaves them running; otherwise it starts its own and stops them at the end."""
    from .experiment import Session

    points = grid_points(grid) if isinstance(grid, str) else list(grid)
    out = Path(out).resolve()  # each point's notebook runs with cwd notebooks/
    (out / "points").mkdir(parents=True, exist_ok=True)
    todo = [pt for pt in points if not (resume and is_complete(out / "points" / pt.slug))]
    # Where the wall time goes: server starts, and each point's run (its notebook included).
    timing = {"started": time.time(), "points_run": len(todo),
              "points_skipped": len(points) - len(todo), "start_seconds": [], "points": {}}
    owned = session is None
    if owned:
        session = Session(out / "logs", baseline_cache=out / "baseline-cache")
    with session if owned else contextlib.nullcontext(session):
        for pt in points:
            if pt not in todo:
                if on_point:
                    on_point(pt, "skipped (complete)")
                continue
            if on_point:
                on_point(pt, "running")
            _run_one(session, point_config(base, pt), out, pt.slug, use_papermill, timing)
        timing["startup_seconds"] = session.startup_seconds
    timing["wall_seconds"] = time.time() - timing["started"]
    atomic_write_json(out / "sweep-timing.json", timing, indent=2, sort_keys=False)
    return aggregate(out, [pt.slug for pt in points])


def _run_one(session: Session, cfg: ExperimentConfig, out: Path, slug: str,
             use_papermill: bool, timing: dict) -> None:
    """One point: as a papermill execution of the sweep notebook attached to the session's
    servers (started or restarted first if the point's shape needs it), or in this process."""
    point_dir = out / "points" / slug
    t0 = time.monotonic()
    if not use_papermill:
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
    execute_point(cfg, attach, point_dir, out / "points" / f"{slug}.ipynb")
    timing["points"][slug] = time.monotonic() - t0


def run_point(config: dict, attach: dict | None, out_dir: str | Path,
              results_store: str | Path | None = None) -> Result:
    """One grid point, as the sweep notebook runs it: attached to the driver's servers, or
    with servers of its own when ``attach`` is empty."""
    from .experiment import Session
    from .results import append_to_store

    cfg = ExperimentConfig.from_dict(dict(config)) if config else ExperimentConfig()
    with Session.from_attach(attach) as session:
        result = session.run(cfg, out_dir=out_dir, command=f"papermill notebooks/sweep.ipynb "
                             f"(config={json.dumps(cfg.to_dict(), sort_keys=True)})")
    if results_store:
        append_to_store(result, results_store)
    return result


def load_results(out: str | Path, slugs: list[str] | None = None) -> list[Result]:
    pdir = Path(out) / "points"
    dirs = [pdir / s for s in slugs] if slugs else sorted(d for d in pdir.iterdir() if d.is_dir())
    return [Result.load(d) for d in dirs if (d / "result.json").is_file()]


def aggregate(out: str | Path, slugs: list[str] | None = None) -> pd.DataFrame:
    """Write ``results.csv`` (one row per run), ``requests.csv`` and the figures."""
    from . import plots

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
