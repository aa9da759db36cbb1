"""``python -m workbench check`` end to end on the installed build, through the CLI, and the
standalone reproduction its report writes, run as written (vLLM untouched, no workbench)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    p = subprocess.run([sys.executable, "-m", "workbench", "check", "--only",
                        "padded-load-step,double-bos,nixl-cpu-forward-thread", "--out",
                        str(out / "o"), "--junit", str(out / "j.xml"), "--report",
                        str(out / "r")], capture_output=True, text=True, timeout=1500)
    return out, p


def test_check_prints_the_table_and_exits_0_on_the_expected_verdicts(checked):
    out, p = checked
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    doc = json.loads((out / "o" / "check.json").read_text())
    got = {f["id"]: f for f in doc["findings"]}
    assert got["padded-load-step"]["verdict"] == "present"
    assert got["padded-load-step"]["evidence"]["also"][
        "load_step=gated (vLLM PR #50173 as written)"]["verdict"] == "present"
    assert got["padded-load-step"]["controls"]["negative"] == {
        **got["padded-load-step"]["controls"]["negative"], "verdict": "absent", "ok": True}
    assert got["double-bos"]["verdict"] == "absent"
    assert got["double-bos"]["controls"]["positive"]["verdict"] == "present"
    assert got["nixl-cpu-forward-thread"]["verdict"] == "present"
    assert got["nixl-cpu-forward-thread"]["controls"]["negative"]["ok"] is True
    assert doc["build"]["source"] == "table" and doc["build"]["checks_passed"] == doc[
        "build"]["checks_total"]
    for f in got.values():
        assert all(c["ok"] is not False for c in f["controls"].values()), f
        assert f["results"] and all((out / "o").as_posix() in r for r in f["results"])
    for fid in got:
        assert re.search(rf"^{fid}\s+\S+", p.stdout, re.M), p.stdout
    suite = ET.parse(out / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("3", "0")


def test_the_report_of_a_present_finding_reproduces_without_the_workbench(checked):
    out, _ = checked
    page = (out / "r" / "padded-load-step.md").read_text()
    for part in ("## Environment", "## Where in vLLM", "pad_spec_decode", "Measured:",
                 "Inferred from source:", "--kv-transfer-config", "## Proposed fix",
                 "padded-load-step.png"):
        assert part in page, part
    assert (out / "r" / "padded-load-step.png").is_file()
    assert not (out / "r" / "double-bos.md").exists()  # absent: no report
    assert "padded-load-step | present" in (out / "r" / "summary.md").read_text()
    script = out / "r" / "padded-load-step.repro.py"
    assert "workbench" not in "".join(
        line for line in script.read_text().splitlines() if line.startswith(("import", "from")))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=900, cwd=out / "r")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    m = re.search(r"D counted (\d+) more drafts than the baseline over (\d+) requests", p.stdout)
    assert m and int(m.group(1)) == int(m.group(2)) > 0, p.stdout[-2000:]
    result = json.loads(p.stdout[:p.stdout.rindex("}") + 1])
    assert all(r["d"]["per_step_accepted"][0] == 0 for r in result["requests"])


def test_the_findings_notebook_shows_a_check_headless(checked, tmp_path):
    """notebooks/findings.ipynb with papermill parameters, showing the check this module ran
    (``show_dir``; its own ``check.run`` is the one ``main`` calls above)."""
    import papermill as pm

    out_dir, _ = checked
    nb = Path(__file__).resolve().parents[2] / "notebooks"
    out = tmp_path / "findings.out.ipynb"
    pm.execute_notebook(str(nb / "findings.ipynb"), str(out), kernel_name="python3",
                        progress_bar=False, cwd=str(nb), parameters={
                            "show_dir": str(out_dir / "o"), "report_dir": str(out_dir / "r")})
    text = out.read_text()
    assert "injected-parameters" in text and "padded-load-step" in text
    assert "D counts one all-rejected draft" in text  # the present finding's section
    assert "padded-load-step.png" in text or "image/png" in text
