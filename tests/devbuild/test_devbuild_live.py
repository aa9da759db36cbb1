"""A vLLM that is not a release, for real (``make check-devbuild``): the installed 0.32.0 laid
out as the next dev version of its release (0.32.1.dev1+g0000000) with one source change, put
first on the servers' PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from vllm_edits import PATCHES, rename_param_patch

from workbench import devbuild
from workbench.knobs import build
from workbench.knobs.source import DirSource

pytestmark = [pytest.mark.vllm, pytest.mark.devbuild]


def workbench(dev: Path, *argv: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(dev)}
    return subprocess.run([sys.executable, "-m", "workbench", *argv], capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_the_fix_in_a_dev_build_makes_padded_load_step_absent(tmp_path):
    dev = devbuild.make(tmp_path / "dev", patches=[PATCHES / "padded-load-step.patch"])
    version = devbuild.default_version()
    b = build.check(version, DirSource(dev, "dev"))
    assert b.checks_passed == b.checks_total > 40 and not b.failures
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"findings": {"padded-load-step": "absent"}}))
    p = workbench(dev, "check", "--only", "padded-load-step", "--out", str(tmp_path / "o"),
                  "--expect", str(expect))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # the line the run says about its build (knobs/build.say_once), word for word
    assert (f"workbench: vLLM {version} (commit 0000000) is not a release in the workbench's "
            f"table; it uses the 0.32.0 entry: all {b.checks_total} patch checks of that entry "
            "pass on the installed source") in p.stderr, p.stderr[-3000:]
    doc = json.loads((tmp_path / "o" / "check.json").read_text())
    assert doc["build"]["version"] == version
    assert doc["build"]["source"] == "installed-source" and doc["build"]["commit"] == "0000000"
    assert doc["build"]["checks_passed"] == doc["build"]["checks_total"]
    f = doc["findings"][0]
    assert f["verdict"] == "absent" and f["evidence"]["extra_drafts"] == 0, f
    assert f["controls"]["negative"]["ok"] is True
    run = json.loads(Path(next(r for r in f["results"] if "padded-load-step-main" in r))
                     .read_text())
    assert run["vllm_build"]["version"] == version
    # the fix leaves the padding alone (the step keeps its CUDA graph) and counts no draft for
    # it: D's load steps are still padded, and D's counts are the baseline's request by request
    d_load = run["knobs"]["after_run"]["d"]["components"]["engine_core"]["events"]["load_step"]
    assert d_load["load_steps_padded"] == d_load["load_steps"] == len(run["requests"]) > 0
    for r in run["requests"]:
        assert r["agree"] and r["pd_spec"]["per_step_accepted"] == r["baseline_spec"][
            "per_step_accepted"] and r["pd_spec"]["num_spec_steps"] == r["baseline_spec"][
            "num_spec_steps"], r["id"]


def test_a_build_missing_a_patch_target_refuses_that_knob_and_runs_without_it(tmp_path):
    dev = devbuild.make(tmp_path / "dev", patches=[rename_param_patch(tmp_path)])
    t0 = time.monotonic()
    p = workbench(dev, "run", "--knob", "block_handoff=legacy", "--prompts", "2", "--out",
                  str(tmp_path / "refused"), timeout=300)
    assert p.returncode == 2 and time.monotonic() - t0 < 120, p.stderr[-2000:]
    assert "block_handoff=legacy refused" in p.stderr
    assert "get_block_ids_for_computed_tokens" in p.stderr and "Traceback" not in p.stderr
    p = workbench(dev, "run", "--prompts", "2", "--max-tokens", "8", "--out",
                  str(tmp_path / "ran"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    r = json.loads((tmp_path / "ran" / "result.json").read_text())
    b = r["vllm_build"]
    assert (b["source"], b["table_entry"]) == ("installed-source", "0.32.0")
    assert b["checks_passed"] == b["checks_total"] - 2 and r["token_agreement"] == 1.0
    assert r["knobs"]["p"]["block_handoff"] == "clipped"  # left uninstalled, vLLM's own
