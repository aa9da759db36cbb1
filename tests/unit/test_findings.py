"""The findings' verdict logic: detectors on result rows, controls that make a verdict
``detector-broken``, one run per distinct config, JUnit and the CLI's refusals. No server: the
runs themselves are in tests/servers/test_check.py."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from workbench.config import ConfigError
from workbench.findings import FINDINGS, check
from workbench.findings.finding import (
    ABSENT,
    BROKEN,
    CONTROL_OK,
    NOT_APPLICABLE,
    OWN_RUN,
    PRESENT,
    Finding,
)
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
    assert good.verdict == PRESENT and good.ok
    assert (good.controls["negative"]["ok"], good.controls["negative"]["status"]) == (
        True, CONTROL_OK)
    # the positive control is the finding's own run: it proves nothing, and says so
    own = {"verdict": None, "ok": None, "status": OWN_RUN, "run": "main"}
    assert {k: good.controls["positive"][k] for k in own} == own
    assert "own run" in good.controls["positive"]["why"]
    broken = check.judge(f, {"main": present, "negative": present}, PRESENT, 1.0, [])
    assert broken.verdict == BROKEN and not broken.ok
    assert broken.controls["negative"]["status"] == "BAD"
    # a fixed build: its own run says absent, and no knob re-creates the padding there
    fixed = check.judge(f, {"main": absent, "negative": absent}, ABSENT, 1.0, [])
    assert fixed.verdict == ABSENT and fixed.ok
    assert {k: fixed.controls["positive"][k] for k in own} == own
    assert check.controls_line(fixed.controls) == "positive own run, negative ok"


# The findings a check on the default connector (NIXL pull) runs; the others are another
# connector's (``Finding.connectors``).
ON_NIXL = [f for f in FINDINGS.values() if not f.connectors or "nixl" in f.connectors]


def test_identical_configs_run_once_and_runs_are_grouped_by_server_shape():
    order, uses, skipped = check.plan(ON_NIXL, {}, attached=False)
    planned = dict(order)
    # every (finding, run) is one planned run, and one planned run is every config equal to it
    cfgs = {(f.id, w): c for f in ON_NIXL for w, c in check.runs_of(f, {}).items()}
    assert set(cfgs) == {(fid, w) for fid, u in uses.items() for w in u}
    assert set(planned) == {k for u in uses.values() for k in u.values()}
    assert len(planned) < len(cfgs)  # some runs are shared
    for (a, ca), (b, cb) in itertools.combinations(cfgs.items(), 2):
        same = dataclasses.replace(ca, label="") == dataclasses.replace(cb, label="")
        assert (uses[a[0]][a[1]] == uses[b[0]][b[1]]) == same, (a, b)
    for (fid, w), c in cfgs.items():  # what runs under a key is that config, label aside
        assert dataclasses.replace(planned[uses[fid][w]], label="") == dataclasses.replace(
            c, label="")
    # the forward-thread finding reads the padded-load-step's own run, twice
    assert (uses["nixl-cpu-forward-thread"]["main"] == uses["nixl-cpu-forward-thread"]["negative"]
            == uses["padded-load-step"]["main"])
    # the two chunked-prefill findings share the budget but not the transfer: two runs
    assert uses["chunked-prefill-drafter-kv"]["main"] != uses["host-buffer-chunk-boundary"]["main"]
    shapes = [check.shape(c) for _, c in order]
    changes = sum(a != b for a, b in zip(shapes, shapes[1:], strict=False))
    assert changes == len(set(shapes)) - 1  # each server shape comes up once
    assert skipped == {}


def test_attach_mode_says_not_applicable_where_a_finding_needs_other_servers():
    _, uses, skipped = check.plan(list(FINDINGS.values()), {}, attached=True)
    assert set(skipped) == {"chunked-prefill-drafter-kv", "eager-finalize-host-staged",
                            "host-buffer-chunk-boundary", "example-chunked-store"}
    assert {cause for cause, _ in skipped.values()} == {"run"}  # this invocation, not the build
    assert "max_num_batched_tokens" in skipped["chunked-prefill-drafter-kv"][1]
    assert "knob transfer" in skipped["eager-finalize-host-staged"][1]
    assert "padded-load-step" in uses
    _, _, gpu = check.plan([FINDINGS["nixl-cpu-forward-thread"]], {"profile": "gpu"}, False)
    assert gpu["nixl-cpu-forward-thread"][0] == "run"
    assert "cpu profile only" in gpu["nixl-cpu-forward-thread"][1]


def test_a_refused_knob_makes_its_findings_not_applicable():
    _, uses, skipped = check.plan(list(FINDINGS.values()), {}, attached=False, refused=lambda c: (
        "block_handoff refused" if c.knobs["block_handoff"] != "clipped" else None))
    assert skipped == {**{f: ("build", "block_handoff refused")
                          for f in ("unclipped-handoff", "stale-last-block")},
                       "example-chunked-store": (
                           "run", "applies to connector example only, not nixl")}
    assert not set(skipped) & set(uses)


def test_junit_has_a_failure_per_differing_verdict_and_skips_what_does_not_apply(tmp_path):
    outs = [check.Outcome("a", PRESENT, PRESENT, {}, {}, 1.0),
            check.Outcome("b", ABSENT, PRESENT, {"x": 1}, {}, 2.0),
            check.Outcome("c", NOT_APPLICABLE, PRESENT, {"why": "gpu only"}, {}, 0.0,
                          cause="run")]
    check.write_junit(tmp_path / "j.xml", {"version": "0.32.0"}, outs)
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite}
    assert cases["b"].find("failure").get("message") == "verdict absent, expected present"
    assert cases["c"].find("skipped") is not None and cases["a"].find("failure") is None


def test_junit_fails_a_knob_the_build_refused_unless_optional(tmp_path):
    why = {"why": "block_handoff=legacy refused: KVCacheManager.get_block_ids_for_computed_"
                  "tokens has no parameter num_computed_tokens"}
    outs = [check.Outcome("refused", NOT_APPLICABLE, ABSENT, why, {}, 0.0, cause="build"),
            check.Outcome("optional", NOT_APPLICABLE, ABSENT, why, {}, 0.0, cause="build",
                          optional=True),
            check.Outcome("unexpected", NOT_APPLICABLE, None, why, {}, 0.0, cause="build")]
    assert [o.ok for o in outs] == [False, True, True]
    check.write_junit(tmp_path / "j.xml", {"version": "0.32.1.dev1"}, outs)
    suite = ET.parse(tmp_path / "j.xml").getroot()
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "2")
    cases = {c.get("name"): c for c in suite}
    failure = cases["refused"].find("failure")
    assert failure.get("message") == "verdict not-applicable, expected absent"
    assert "get_block_ids_for_computed_tokens" in failure.text
    assert cases["refused"].find("skipped") is None
    for name in ("optional", "unexpected"):
        assert cases[name].find("skipped").get("message") == why["why"]
        assert cases[name].find("failure") is None


def test_junit_shows_each_controls_status_as_a_property(tmp_path):
    f = FINDINGS["padded-load-step"]
    o = check.judge(f, {"main": {"requests": [pd_row(1, 0)] * 2},
                        "negative": {"requests": [pd_row(0, 2)] * 2}}, PRESENT, 1.0, [])
    failed = check.judge(f, {"main": {"requests": [pd_row(1, 0)] * 2}, "negative": None},
                         PRESENT, 1.0, [], {"negative": "RuntimeError: D exited"})
    check.write_junit(tmp_path / "j.xml", {"version": "0.32.0"}, [o, failed])
    cases = ET.parse(tmp_path / "j.xml").getroot().findall("testcase")
    props = [{p.get("name"): p.get("value") for p in c.find("properties")} for c in cases]
    assert props[0] == {"control.positive": "own run", "control.negative": "ok"}
    assert props[1] == {"control.positive": "own run", "control.negative": "run failed"}
    assert cases[0].find("failure") is None
    assert "control run failed: RuntimeError: D exited" in cases[1].find("failure").text


def test_every_finding_has_an_expectation_for_each_committed_entry():
    for entry in ("0.32.0", "0.33.0"):
        _, doc = check.expectations(None, entry)
        assert set(doc["findings"]) == {f.id for f in ON_NIXL}, entry
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
    # double-bos is the client's own prompt building, no longer a finding of a vLLM build
    with pytest.raises(ConfigError, match=r"--only double-bos: no such finding"):
        check.select("double-bos")
    assert "double-bos" not in FINDINGS
    # all of them, in the registry's order (the order check runs and shows them)
    every = check.select(None)
    assert [f.id for f in every] == list(FINDINGS) and check.select("") == every
    assert all(isinstance(f, Finding) for f in every) and len(every) == 9
    assert [f.id for f in check.select(" stale-last-block , padded-load-step,")] == [
        "stale-last-block", "padded-load-step"]
