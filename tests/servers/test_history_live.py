"""``python -m workbench releases --check`` live on two releases and one finding (the small grid):
an old release from its own uv environment, counted by ``/metrics`` scrapes, and the installed
one with per-request counts, both observe-only; the matrix, its figure and each record."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench.knobs.release import base_version, vllm_version
from workbench.releases import matrix

pytestmark = pytest.mark.vllm

OLD = "0.28.0"  # pins torch 2.13.0+cpu, the local wheel: its environment downloads least


def test_two_releases_natively_give_a_matrix_row_each_with_the_padded_load_step(tmp_path):
    installed = base_version(vllm_version())
    out = tmp_path / "releases"
    p = subprocess.run([sys.executable, "-m", "workbench", "releases", "--check", "--vllm",
                        f"{OLD},{installed}", "--only", "padded-load-step", "--out", str(out),
                        "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = (out / matrix.CSV_NAME).read_text().splitlines()
    assert lines[0].startswith("# python -m workbench releases --check")
    df = matrix.frame([json.loads((out / "history" / v / "check.json").read_text())
                       for v in (OLD, installed)], matrix.run_sources(out))
    got = df.set_index("release")
    assert list(got["verdict"]) == ["present", "present"], df.to_string()
    assert got.loc[OLD, "source"] == "metrics-scrape"  # no per-request field before 0.29
    assert got.loc[installed, "source"] == "per-request"
    assert "negative not run" in got.loc[OLD, "controls"]
    old = json.loads((out / "history" / OLD / "check.json").read_text())
    assert old["vllm_version"].startswith(OLD) and old["started"]
    reports = [r for procs in old["plugin"].values() for r in procs]
    assert reports and all(r["workbench_patches"] == [] for r in reports)
    run = json.loads(next((out / "history" / OLD / "runs").glob("*/result.json")).read_text())
    assert run["vllm_version"].startswith(OLD) and run["vllm_build"]["mode"] == "observe-only"
    assert (out / "figures" / f"{matrix.FIGURE_STEM}.png").is_file()
    assert OLD in p.stdout and "present" in p.stdout
