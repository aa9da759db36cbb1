"""``python -m workbench check`` end to end on the installed build, through the CLI, and the
standalone reproduction its report writes, run as written (vLLM untouched, no workbench)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from workbench import ipc_dir, paths
from workbench.knobs import spec

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    p = subprocess.run([sys.executable, "-m", "workbench", "check", "--only",
                        "padded-load-step,nixl-cpu-forward-thread", "--out",
                        str(out / "o"), "--junit", str(out / "j.xml"), "--report",
                        str(out / "r")], capture_output=True, text=True, timeout=1500)
    return out, p


@pytest.mark.timeout(1800)  # the module's check runs in this test's set-up
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
    assert got["padded-load-step"]["controls"]["positive"]["status"] == "own run"
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
    assert (suite.get("tests"), suite.get("failures")) == ("2", "0")
    assert re.search(r"^padded-load-step\s+present\s+present\s+positive own run, negative ok",
                     p.stdout, re.M), p.stdout


@pytest.fixture
def own_ipc_dir():
    """vLLM's IPC socket files of a reproduction's servers go to a directory of the test's,
    removed after (``VLLM_RPC_BASE_PATH``, vLLM's own variable): as written, a script keeps
    vLLM's default, the temporary directory, where vLLM leaves them (docs/troubleshooting.md)."""
    path = ipc_dir.make()
    yield {ipc_dir.ENV: path}
    ipc_dir.remove(path)


@pytest.mark.timeout(1200)
def test_the_report_of_a_present_finding_reproduces_without_the_workbench(checked, own_ipc_dir):
    out, _ = checked
    page = (out / "r" / "padded-load-step.md").read_text()
    for part in ("## Environment", "## Where in vLLM", "pad_spec_decode", "Measured:",
                 "Inferred from source:", "--kv-transfer-config", "## Proposed fix",
                 "padded-load-step.png"):
        assert part in page, part
    assert (out / "r" / "padded-load-step.png").is_file()
    assert "padded-load-step | present" in (out / "r" / "summary.md").read_text()
    script = out / "r" / "padded-load-step.repro.py"
    assert "workbench" not in "".join(
        line for line in script.read_text().splitlines() if line.startswith(("import", "from")))
    # NIXL's progress thread sleeps 1 ms between polls, as on the CPU profile's own servers
    # (the workbench's plugin reads the variable and installs that, no knob): as vLLM ships it,
    # idle P and D poll without pause, spin both cores, and the servers' start takes ~70 s
    # longer here. The script, its command lines and what vLLM schedules are as written.
    env = {**os.environ, spec.ENV_NIXL_PROGRESS_DELAY_US: "1000", **FORKED, **own_ipc_dir}
    p = subprocess.run([sys.executable, str(script), "--target", str(paths.DEFAULT_TARGET),
                        "--drafter", str(paths.DEFAULT_DRAFTER)], capture_output=True,
                       text=True, timeout=1100, cwd=out / "r", env=env)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:] + server_logs(out / "r")
    m = re.search(r"D counted (\d+) more drafts than the baseline over (\d+) requests", p.stdout)
    assert m and int(m.group(1)) == int(m.group(2)) > 0, p.stdout[-2000:]
    result = json.loads(p.stdout[:p.stdout.rindex("}") + 1])
    assert all(r["d"]["per_step_accepted"][0] == 0 for r in result["requests"])


# vLLM forks each server's engine core and worker, as off the CPU (``knobs/fork_start.py``,
# read by the plugin: no knob), instead of two more interpreters importing torch and vLLM:
# test_server_start.py shows forked and spawned servers give the same tokens, counts and KV.
FORKED = {spec.ENV_FORK_START: "1"}


def server_logs(d: Path) -> str:
    """The tail of each server log a reproduction wrote: why a start failed or took long."""
    return "".join(f"\n--- {log.name}\n" + log.read_text()[-1500:]
                   for log in sorted(d.glob("repro-*.log")))


@pytest.mark.timeout(1500)  # three servers start together on the machine's cores
def test_the_committed_host_staged_repro_shows_the_bug_on_the_cpu_as_written(tmp_path,
                                                                            own_ipc_dir):
    """The reproduction committed with the host-buffer finding, run as a maintainer would (its
    models found from its own location, its ports picked at start, the plugin doing host
    staging): D's tokens part from the baseline's in every request, as the record says."""
    reports = paths.DATA / "findings" / "host-buffer-chunk-boundary" / "check-release" / "reports"
    run = json.loads((reports.parent / "runs" / "host-buffer-chunk-boundary-main" /
                      "result.json").read_text())
    assert run["token_agreement"] == 0.0
    p = subprocess.run([sys.executable, str(reports / "host-buffer-chunk-boundary.repro.py")],
                       capture_output=True, text=True, timeout=1400, cwd=tmp_path,
                       env={**os.environ, **FORKED, **own_ipc_dir})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:] + server_logs(tmp_path)
    n = len(run["requests"])
    assert f"D's tokens differ from the baseline's in {n} of {n} requests" in p.stdout, p.stdout


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
