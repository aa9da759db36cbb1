"""The findings' verdict logic: detectors on result rows, controls that make a verdict
``detector-broken``, one run per distinct config, JUnit and the CLI's refusals. No server: the
runs themselves are in tests/servers/test_check.py."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from workbench.config import ConfigError
from workbench.findings import FINDINGS, check
from workbench.findings.finding import ABSENT, BROKEN, NOT_APPLICABLE, PRESENT
from workbench.findings.padded_load_step import detect as padded


def pd_row(extra: int, first: int) -> dict:
    return {"extra_pd_drafts": extra, "pd_spec": {"per_step_accepted": [first, 2, 1]}}


def test_padded_load_step_needs_one_rejected_extra_draft_in_every_request():
    assert padded({"requests": [pd_row(1, 0)] * 4})[0] == PRESENT
    assert padded({"requests": [pd_row(0, 2)] * 4})[0] == ABSENT
    assert padded({"requests": [pd_row(1, 0), pd_row(0, 2)]})[0] == "inconclusive"
    assert padded({"requests": [pd_row(1, 1)] * 4})[0] == "inconclusive"  # it was accepted


def test_a_control_that_does_not_behave_makes_the_verdict_detector_broken():
    f = FINDINGS["padded-load-step"]
    present, absent = {"requests": [pd_row(1, 0)] * 2}, {"requests": [pd_row(0, 2)] * 2}
    good = check.judge(f, {"main": present, "negative": absent}, PRESENT, 1.0, [])
    assert good.verdict == PRESENT and good.controls["negative"]["ok"] is True
    assert good.controls["positive"] == {"verdict": PRESENT, "ok": True, "run": "main"}
    broken = check.judge(f, {"main": present, "negative": present}, PRESENT, 1.0, [])
    assert broken.verdict == BROKEN and not broken.ok
    # a fixed build: its own run says absent, and no knob re-creates the padding there
    fixed = check.judge(f, {"main": absent, "negative": absent}, ABSENT, 1.0, [])
    assert fixed.verdict == ABSENT and fixed.controls["positive"]["ok"] is None and fixed.ok


def test_identical_configs_run_once_and_runs_are_grouped_by_server_shape():
    order, uses, skipped = check.plan(list(FINDINGS.values()), {}, attached=False)
    keys = [k for k, _ in order]
    assert len(keys) == len(set(keys)) < sum(len(u) for u in uses.values())
    # the forward-thread finding reads the padded-load-step's own run, twice
    assert uses["nixl-cpu-forward-thread"]["main"] == uses["padded-load-step"]["main"]
    shapes = [check.shape(c) for _, c in order]
    changes = sum(a != b for a, b in zip(shapes, shapes[1:], strict=False))
    assert changes == len(set(shapes)) - 1  # each server shape comes up once
    assert skipped == {}


def test_attach_mode_says_not_applicable_where_a_finding_needs_other_servers():
    _, uses, skipped = check.plan(list(FINDINGS.values()), {}, attached=True)
    assert set(skipped) == {"chunked-prefill-drafter-kv", "eager-finalize-host-staged",
                            "host-buffer-chunk-boundary"}
    assert "max_num_batched_tokens" in skipped["chunked-prefill-drafter-kv"]
    assert "knob transfer" in skipped["eager-finalize-host-staged"]
    assert "padded-load-step" in uses
    _, _, gpu = check.plan([FINDINGS["nixl-cpu-forward-thread"]], {"profile": "gpu"}, False)
    assert "cpu profile only" in gpu["nixl-cpu-forward-thread"]


def test_a_refused_knob_makes_its_findings_not_applicable():
    _, uses, skipped = check.plan(list(FINDINGS.values()), {}, attached=False, refused=lambda c: (
        "block_handoff refused" if c.knobs["block_handoff"] != "clipped" else None))
    assert set(skipped) == {"unclipped-handoff", "stale-last-block"}


def test_junit_has_a_failure_per_differing_verdict_and_skips_what_does_not_apply(tmp_path):
    outs = [check.Outcome("a", PRESENT, PRESENT, {}, {}, 1.0),
            check.Outcome("b", ABSENT, PRESENT, {"x": 1}, {}, 2.0),
            check.Outcome("c", NOT_APPLICABLE, PRESENT, {"why": "gpu only"}, {}, 0.0)]
    check.write_junit(tmp_path / "j.xml", {"version": "0.32.0"}, outs)
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite}
    assert cases["b"].find("failure").get("message") == "verdict absent, expected present"
    assert cases["c"].find("skipped") is not None and cases["a"].find("failure") is None


def test_every_finding_has_an_expectation_for_each_committed_entry():
    for entry in ("0.32.0", "0.33.0"):
        _, doc = check.expectations(None, entry)
        assert set(doc["findings"]) == set(FINDINGS), entry
    assert check.expectations(None, "0.33.0")[1]["verified"] is False


@pytest.mark.parametrize(("argv", "says"), [
    (["--only", "nope"], "no such finding"),
    (["--expect", "/nonexistent.json"], "no such file"),
])
def test_check_refuses_bad_input_with_rc_2_before_any_server(tmp_path, argv, says):
    p = subprocess.run([sys.executable, "-m", "workbench", "check", "--out", str(tmp_path / "o"),
                        *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and says in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_select_names_the_unknown_id():
    with pytest.raises(ConfigError, match="padded-load-step"):
        check.select("padded-load-step,bogus")
    assert [f.id for f in check.select("double-bos")] == ["double-bos"]
    assert json.dumps(check.select(None)[0].experiment)
