"""``python -m workbench releases --check`` live on a small grid: two releases, one finding. The
old release runs from its own uv environment (built here when missing), counted by ``/metrics``
scrapes; the installed release's committed record is kept, as a rerun of ``make history``
keeps every release already recorded. The live verdict must be the committed matrix's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from workbench.knobs.release import base_version, vllm_version
from workbench.paths import DATA
from workbench.releases import matrix
from workbench.releases.history import records_under

pytestmark = pytest.mark.vllm

OLD = "0.28.0"  # pins torch 2.13.0+cpu, the local wheel: its environment downloads least
FINDING = "padded-load-step"


def committed(release: str) -> dict:
    df = matrix.frame([json.loads((DATA / "releases" / "history" / release / "check.json")
                                  .read_text())])
    return df.set_index("finding").loc[FINDING].to_dict()


@pytest.mark.timeout(1800)  # an old release's environment may be built first
def test_two_releases_give_the_committed_matrix_rows_live(tmp_path):
    installed = base_version(vllm_version())
    out = tmp_path / "releases"
    shutil.copytree(DATA / "releases" / "history" / installed, out / "history" / installed)
    p = subprocess.run([sys.executable, "-m", "workbench", "releases", "--check", "--vllm",
                        f"{OLD},{installed}", "--only", FINDING, "--out", str(out),
                        "--log-dir", str(tmp_path / "logs")],
                       capture_output=True, text=True, timeout=1700)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"{installed} is not run again" in p.stdout
    df = matrix.frame(records_under(out))
    written = pd.read_csv(out / matrix.CSV_NAME).set_index(["release", "finding"])
    assert written.loc[(OLD, FINDING), "command"] == (
        f"python -m workbench releases --check --vllm {OLD},{installed} "
        f"--only {FINDING} --out {out} --log-dir {tmp_path / 'logs'}")
    got = df[df["finding"] == FINDING].set_index("release")
    assert list(got.index) == [OLD, installed]
    want = committed(OLD)
    assert (got.loc[OLD, "verdict"], got.loc[OLD, "source"]) == (want["verdict"],
                                                                 "metrics-scrape")
    assert got.loc[installed, "source"] == "per-request"
    assert "negative not run" in got.loc[OLD, "controls"]
    old = json.loads((out / "history" / OLD / "check.json").read_text())
    assert old["vllm_version"].startswith(OLD) and old["started"]
    assert old["kv_probe_source"]["held"] == old["kv_probe_source"]["checks"]
    reports = [r for procs in old["plugin"].values() for r in procs]
    assert reports and all(r["workbench_patches"] == [] for r in reports)
    run = json.loads(next((out / "history" / OLD / "runs").glob("*/result.json")).read_text())
    assert run["vllm_version"].startswith(OLD) and run["vllm_build"]["mode"] == "observe-only"
    assert run["measurement"]["source"] == "metrics-scrape"
    assert (out / "figures" / f"{matrix.FIGURE_STEM}.png").is_file()
    assert OLD in p.stdout and want["verdict"] in p.stdout

