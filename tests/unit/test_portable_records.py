"""Records that read the same in a clone anywhere: no committed file names a path of the
machine that wrote it, configs record repository paths relative to its root, and the
committed reference sweep is complete for this checkout (a sweep over it skips every point)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from workbench import paths
from workbench.config import SWEEP_NUM_PROMPTS, ExperimentConfig
from workbench.notebook import sweep
from workbench.provenance import atomic_write_json, portable_text

# An absolute path under a home or checkout-like root (the CI's clone lives elsewhere, so the
# checkout's own path is not enough to catch a record written on another machine).
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:home|root|Users|work|builds|runner)/[\w.-]+/")


def tracked_text() -> list[Path]:
    out = subprocess.run(["git", "-C", str(paths.REPO), "ls-files", "data", "docs",
                          "notebooks"], capture_output=True, text=True, check=True).stdout
    return [paths.REPO / p for p in out.split() if not p.endswith((".png", ".pdf"))]


def test_no_committed_record_names_a_machine_path():
    found = []
    for f in tracked_text():
        try:
            text = f.read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        if str(paths.REPO) in text or (m := MACHINE_PATH.search(text)):
            found.append(f"{f.relative_to(paths.REPO)}: {m[0] if m else paths.REPO}")
    assert not found, "machine paths (run scripts/portable_records.py):\n" + "\n".join(found[:20])


def test_the_machine_path_pattern_catches_what_it_is_for():
    assert MACHINE_PATH.search('"target": "/home/ci/clone/data/models/target"')
    assert MACHINE_PATH.search("file:///work/other-clone/.cache/x.whl")
    assert not MACHINE_PATH.search("vllm/v1/core/sched/scheduler.py and /tmp/repro")


def test_a_config_records_repository_paths_relative_to_its_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # another working directory: the record must not depend on it
    d = ExperimentConfig().to_dict()
    assert (d["target"], d["drafter"]) == ("data/models/target", "data/models/drafter")
    back = ExperimentConfig.from_dict(d)
    assert back.target == str(paths.DEFAULT_TARGET) and Path(back.target).is_absolute()
    outside = tmp_path / "prompts.jsonl"
    outside.write_text(json.dumps({"text": "def f(x):\n    return x\n"}) + "\n")
    cfg = ExperimentConfig(prompt_file=str(outside), num_prompts=1)
    assert cfg.to_dict()["prompt_file"] == str(outside)  # outside the repository: as given
    assert ExperimentConfig(prompt_file="prompts.jsonl", num_prompts=1).prompt_file == str(
        outside)  # relative to the working directory where it exists there


def test_records_are_written_without_the_checkout_path(tmp_path):
    doc = {"config": {"target": f"{paths.REPO}/data/models/target"}, "cwd": str(paths.REPO),
           "other": "/opt/models/x"}
    atomic_write_json(tmp_path / "r.json", doc, portable=True)
    back = json.loads((tmp_path / "r.json").read_text())
    assert back == {"config": {"target": "data/models/target"}, "cwd": ".",
                    "other": "/opt/models/x"}
    assert portable_text(f"{paths.REPO}x/y") == f"{paths.REPO}x/y"  # another directory


@pytest.mark.parametrize("pt", sweep.grid_points("default"), ids=lambda p: p.slug)
def test_the_committed_reference_sweep_resumes_here_without_restart(pt, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = sweep.point_config(ExperimentConfig(num_prompts=SWEEP_NUM_PROMPTS), pt)
    point = paths.DATA / "reference-sweep" / "points" / pt.slug
    assert sweep.is_complete(point, sweep.PointIdentity().record(cfg))
