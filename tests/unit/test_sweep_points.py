"""A sweep keeps a point only when it ran with the very same config, vLLM and model files;
slugs never collide; aggregation reads complete results only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from workbench.config import ConfigError, ExperimentConfig
from workbench.measuring.results import Result
from workbench.notebook import sweep
from workbench.serving import rundir, servers


@pytest.fixture
def pair(tiny_pair, tmp_path):
    """A private copy of the tiny pair (tests below change its files)."""
    t, d = tmp_path / "target", tmp_path / "drafter"
    shutil.copytree(tiny_pair[0], t)
    shutil.copytree(tiny_pair[1], d)
    return str(t), str(d)


def _complete_point(point_dir: Path, cfg: ExperimentConfig, ident: sweep.PointIdentity,
                    record: bool = True) -> dict:
    point_dir.mkdir(parents=True, exist_ok=True)
    (point_dir / "result.json").write_text(json.dumps(
        {"complete": True, "config": cfg.to_dict(), "vllm_version": ident.vllm_version}))
    rec = ident.record(cfg)
    if record:
        (point_dir / sweep.POINT_RECORD).write_text(json.dumps(rec))
    return rec


# The first sweep, in a process of its own (another hash seed): its point's config, record and
# complete result written as ``sweep._sweep`` writes them.
FIRST_SWEEP = """
import json, sys
from pathlib import Path
from workbench.notebook import sweep
from workbench.config import ExperimentConfig
from workbench.provenance import atomic_write_json
target, drafter, point_dir = sys.argv[1:4]
base = ExperimentConfig(target=target, drafter=drafter, num_prompts=16,
                        knobs={"blocks": "dirty", "finalize": "eager"})
pt = sweep.Point("fixed", "indomain", {"block_handoff": "legacy"})
cfg = sweep.point_config(base, pt)
d = Path(point_dir)
d.mkdir(parents=True)
(d / "result.json").write_text(json.dumps({"complete": True, "config": cfg.to_dict()}))
atomic_write_json(d / sweep.POINT_RECORD, sweep.PointIdentity().record(cfg), indent=2)
"""


class _NoRuns:
    """A session a kept point must never reach."""

    startup_seconds: dict = {}

    def run(self, cfg, **kw):
        raise AssertionError(f"point {cfg.label} was run again")


def test_a_point_of_the_same_config_is_kept(pair, tmp_path, monkeypatch):
    """A point a first sweep completed (another process) is skipped by a second sweep of the
    same config, built anew (its knobs given in another order, a default spelled out), and
    its result is left as it was."""
    out = rundir.private_dir(tmp_path / "out")
    point_dir = out / "points" / "fixed"
    env = {**os.environ, "PYTHONHASHSEED": "1"}
    subprocess.run([sys.executable, "-c", FIRST_SWEEP, pair[0], pair[1], str(point_dir)],
                   check=True, env=env, timeout=120)
    mtime = (point_dir / "result.json").stat().st_mtime_ns

    base = ExperimentConfig(target=pair[0], drafter=pair[1], num_prompts=16,
                            knobs={"finalize": "eager", "transfer": "direct", "blocks": "dirty"})
    seen = []
    monkeypatch.setattr(sweep, "aggregate", lambda out, slugs: pd.DataFrame())  # no figures
    sweep.run_sweep([sweep.Point("fixed", "indomain", {"block_handoff": "legacy"})], out, base,
                    use_papermill=False, session=_NoRuns(), on_point=lambda pt, s: seen.append(s))
    assert seen == ["skipped (complete)"]
    assert (point_dir / "result.json").stat().st_mtime_ns == mtime


def test_a_point_of_another_config_is_refused_naming_the_fields(pair, tmp_path):
    ident = sweep.PointIdentity()
    old = ExperimentConfig(target=pair[0], drafter=pair[1], num_prompts=16)
    _complete_point(tmp_path / "p", old, ident)
    new = ExperimentConfig(target=pair[0], drafter=pair[1], num_prompts=2, max_tokens=4, k_d=2,
                           knobs={"finalize": "eager"})
    with pytest.raises(ConfigError) as e:
        sweep.is_complete(tmp_path / "p", ident.record(new))
    msg = str(e.value)
    for text in ("num_prompts: 16 -> 2", "max_tokens: 64 -> 4", "k_d: 3 -> 2",
                 "knobs.finalize: 'deferred' -> 'eager'", "--restart", "--out"):
        assert text in msg, msg


def test_changed_model_files_or_vllm_are_refused(pair, tmp_path, monkeypatch):
    cfg = ExperimentConfig(target=pair[0], drafter=pair[1])
    _complete_point(tmp_path / "p", cfg, sweep.PointIdentity())
    cfg_file = Path(pair[1]) / "config.json"
    cfg_file.write_text(cfg_file.read_text() + "\n")  # the drafter's files changed
    with pytest.raises(ConfigError, match="model files of the drafter"):
        sweep.is_complete(tmp_path / "p", sweep.PointIdentity().record(cfg))
    monkeypatch.setattr(sweep, "vllm_version", lambda: "0.33.0")
    with pytest.raises(ConfigError, match="vllm_version: .* -> '0.33.0'"):
        sweep.is_complete(tmp_path / "p", sweep.PointIdentity().record(cfg))


def test_a_point_from_before_digests_is_refused_not_kept(pair, tmp_path):
    cfg = ExperimentConfig(target=pair[0], drafter=pair[1])
    ident = sweep.PointIdentity()
    _complete_point(tmp_path / "p", cfg, ident, record=False)
    with pytest.raises(ConfigError, match="not recorded"):
        sweep.is_complete(tmp_path / "p", ident.record(cfg))


def test_an_incomplete_point_is_rerun(pair, tmp_path):
    cfg = ExperimentConfig(target=pair[0], drafter=pair[1])
    d = tmp_path / "p"
    d.mkdir()
    (d / "result.json").write_text(json.dumps({"complete": False, "config": {}}))
    assert not sweep.is_complete(d, sweep.PointIdentity().record(cfg))
    assert not sweep.is_complete(tmp_path / "absent", sweep.PointIdentity().record(cfg))


def test_slugs_are_never_empty_and_never_shared():
    odd = sweep.Point("!!!", "indomain")
    assert odd.slug and odd.slug not in ("", ".", "points")
    assert sweep.Point("???", "indomain").slug != odd.slug
    with pytest.raises(ConfigError, match="'a b' and 'a-b'"):
        sweep.check_slugs([sweep.Point("a b", "indomain"), sweep.Point("a-b", "indomain")])
    for name in sweep.GRIDS:
        sweep.check_slugs(sweep.grid_points(name))


def _result(complete: bool) -> Result:
    return Result(config={}, command="c", vllm_version="0.32.0", git_commit="g", created="t",
                  prompt_set="indomain", num_prompts=1, wall_seconds=1.0, engine_seconds=1.0,
                  knobs={}, pd=None, baseline=None, token_agreement=None, complete=complete)


def test_aggregation_reads_complete_results_only(tmp_path):
    _result(True).save(tmp_path / "points" / "done")
    _result(False).save(tmp_path / "points" / "failed")
    assert [r.complete for r in sweep.load_results(tmp_path)] == [True]
    assert len(sweep.load_results(tmp_path, ["done", "failed"])) == 1


def test_a_second_sweep_on_one_out_is_refused(tmp_path, tiny_pair, monkeypatch):
    def no_server(self):
        raise AssertionError("a server was started")

    monkeypatch.setattr(servers.VllmServer, "start", no_server)
    base = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1])
    out = rundir.private_dir(tmp_path / "out")
    with rundir.DirLock(out, "the first sweep"), \
            pytest.raises(rundir.RunDirError, match="the first sweep"):
        sweep.run_sweep("smoke", out, base)
    assert not (out / "logs").exists()  # refused before its Session (and servers)


class FlakySession:
    """Runs each point in this process: the point named ``dies`` fails as a dead server does."""

    startup_seconds: dict = {}

    def __init__(self):
        self.ran = []

    def run(self, cfg, out_dir):
        self.ran.append(cfg.label)
        if cfg.label == "dies":
            raise RuntimeError("the d server died during the run\nmore lines")
        _result(True).save(out_dir)


@pytest.mark.parametrize("keep_going", [False, True])
def test_keep_going_runs_the_points_after_a_failed_one_and_names_it(tmp_path, tiny_pair,
                                                                    monkeypatch, keep_going):
    monkeypatch.setattr(sweep, "aggregate", lambda out, slugs: pd.DataFrame())
    base = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1])
    points = [sweep.Point("dies", "random"), sweep.Point("after", "random")]
    session = FlakySession()
    if not keep_going:
        with pytest.raises(RuntimeError, match="died"):
            sweep.run_sweep(points, tmp_path / "out", base, use_papermill=False,
                            session=session)
        assert session.ran == ["dies"]
        return
    table = sweep.run_sweep(points, tmp_path / "out", base, use_papermill=False,
                            session=session, keep_going=True)
    assert session.ran == ["dies", "after"]
    assert table.attrs["failed"] == {"dies": "RuntimeError: the d server died during the run"}
    timing = json.loads((tmp_path / "out" / "sweep-timing.json").read_text())
    assert timing["failed"] == table.attrs["failed"]
