"""Every finding's detector on real records: the committed ``check`` runs (vLLM 0.32.0 as
released, and a dev build with both chunked-prefill patches), the findings' own runs under
``data/findings/<id>/runs*/``, a crafted record per finding that must be ``inconclusive``, and
``check.judge`` on those records: a failed control run, a control that said the wrong thing,
controls that are the finding's own run. The records are read in place (they are committed);
no server runs here."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path

import pytest

from workbench.findings import FINDINGS, check
from workbench.findings.finding import (
    ABSENT,
    BROKEN,
    CONTROL_BAD,
    CONTROL_OK,
    FAILED,
    INCONCLUSIVE,
    OWN_RUN,
    PRESENT,
    RUN_FAILED,
    Finding,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "findings"
CHECKS = {"release": DATA / "host-buffer-chunk-boundary" / "check-release",
          "devbuild": DATA / "host-buffer-chunk-boundary" / "check-devbuild",
          "example": ROOT / "data" / "connectors" / "check-example",
          "prefix": DATA / "prefix-cache-drafter-kv" / "check-release"}
# Findings found after the full checks above were committed: their own check holds them.
OWN_CHECK = {"prefix-cache-drafter-kv": "prefix"}
NIXL_CHECKS = ("release", "devbuild")  # on the default connector, NIXL pull
# The committed check whose runs stand for each finding's controls: the dev build's, or, for
# a finding of another connector, that connector's check.
HOME = {f.id: OWN_CHECK.get(f.id) or (f.connectors[0] if f.connectors and "nixl" not in
                                      f.connectors else "devbuild") for f in FINDINGS.values()}
CHUNKED, HOST = "chunked-prefill-drafter-kv", "host-buffer-chunk-boundary"
# In the committed records, no longer a finding (the client's own prompt building).
GONE = {"double-bos": "double-bos is no longer a finding: it is the client's own prompt "
                      "building, pinned by its unit tests"}


@cache
def load(path: Path) -> dict:
    """A committed JSON file, parsed once; callers that alter a record deep-copy it first."""
    return json.loads(path.read_text())


def check_doc(name: str) -> dict:
    return load(CHECKS[name] / "check.json")


def entry(name: str, fid: str) -> dict:
    return next(f for f in check_doc(name)["findings"] if f["id"] == fid)


def run_path(name: str, fid: str, which: str) -> Path:
    """The ``result.json`` of ``which`` (main, a control, an ``also`` label) of ``fid`` in the
    committed check ``name``: its own ``<finding>-<which>`` directory where the finding lists
    it, else the one run the finding's results list (a run shared with an earlier finding)."""
    e = entry(name, fid)
    listed = {Path(p).parent.name for p in e["results"]}
    own = check.run_names({fid: {which: "k"}})["k"]
    if own not in listed:
        assert len(listed) == 1, f"{name} {fid} {which}: no run {own} among {sorted(listed)}"
        (own,) = listed
    path = CHECKS[name] / "runs" / own / "result.json"
    assert path.is_file(), path
    return path


def result(name: str, fid: str, which: str = "main") -> dict:
    return load(run_path(name, fid, which))


def detector(f: Finding, which: str):
    return f.negative_detect if which == "negative" and f.negative_detect else f.detect


def own_run(f: Finding, which: str) -> bool:
    return which in check.CONTROLS and getattr(f, which) is None


def recorded(e: dict, which: str) -> tuple[str | None, dict]:
    """What the committed check recorded for ``which``: (verdict, evidence)."""
    if which == "main":
        return e["verdict"], {k: v for k, v in e["evidence"].items() if k != "also"}
    if which in e["controls"]:
        c = e["controls"][which]
        return c["verdict"], c.get("evidence") or {}
    a = e["evidence"]["also"][which]
    return a["verdict"], a["evidence"]


def judged(e: dict) -> bool:
    """Whether a committed verdict came from its runs: not ``not-applicable`` (no run), not
    ``run-failed`` (or, in older records, ``inconclusive``) because a run failed (a dead
    server: its partial result says nothing)."""
    return e["verdict"] != "not-applicable" and "run failed" not in str(
        e["evidence"].get("why", ""))


def committed_runs():
    for name in CHECKS:
        for e in check_doc(name)["findings"]:
            if not judged(e):
                continue
            for which in ("main", *e["controls"], *(e["evidence"].get("also") or {})):
                marks = [pytest.mark.skip(reason=GONE[e["id"]])] if e["id"] in GONE else []
                yield pytest.param(name, e["id"], which, id=f"{name}:{e['id']}:{which}",
                                   marks=marks)


def test_the_committed_checks_cover_every_finding_and_only_what_was_one():
    dev = {e["id"] for e in check_doc("devbuild")["findings"]}
    assert {f for f, home in HOME.items() if home == "devbuild"} <= dev, (
        "every NIXL detector is tested on the dev build's record")
    for fid, home in HOME.items():  # another connector's finding: on its connector's check
        assert any(e["id"] == fid and e["verdict"] != "not-applicable"
                   for e in check_doc(home)["findings"]), fid
    assert dev - set(FINDINGS) <= set(GONE)  # older records still hold double-bos
    for name in CHECKS:
        doc = check_doc(name)
        assert doc["ok"] is True, name  # every verdict as expected, every control ok
        for e in doc["findings"]:
            if e["id"] in FINDINGS and e["verdict"] != "not-applicable":  # runs as today
                f = FINDINGS[e["id"]]
                assert set(e["controls"]) == set(check.CONTROLS), (name, f.id)
                assert set(e["evidence"].get("also") or {}) == set(f.also), (name, f.id)
                for which in check.CONTROLS:  # own run then and now
                    assert (e["controls"][which].get("run") == "main") == own_run(f, which)


@pytest.mark.parametrize(("name", "fid", "which"), list(committed_runs()))
def test_the_detector_gives_the_recorded_verdict_on_the_committed_run(name, fid, which):
    f, e = FINDINGS[fid], entry(name, fid)
    if own_run(f, which):
        # Recorded as ``present``/``ok`` (or null) when the own run stood in for the control;
        # now it proves nothing: what stands is what the detector says of the main run.
        assert f.detect(result(name, fid))[0] == e["verdict"]
        c = check.judge(f, {"main": result(name, fid)}, e["expected"], 0.0, [])
        assert c.controls[which]["status"] == OWN_RUN
        return
    verdict, evidence = detector(f, which)(result(name, fid, which))
    want, was = recorded(e, which)
    assert verdict == want, f"{name} {fid} {which}: detector says {verdict}, recorded {want}"
    # the numbers it looked at, too: every one the record has and the detector still reports
    common = set(evidence) & set(was)
    assert common, (name, fid, which)
    assert {k: evidence[k] for k in common} == {k: was[k] for k in common}


@pytest.mark.parametrize("name", NIXL_CHECKS)
def test_the_chunked_detectors_read_the_measured_chunks_of_the_committed_runs(name):
    """The check runs chunk every request on P (64 tokens a step); the detectors now take
    chunk ends from ``kv_probe.prefill_chunks["p"]`` and still reach the recorded verdicts."""
    for fid, count in ((CHUNKED, "requests_chunked"), (HOST, "requests_chunked_on_p")):
        for which in ("main", "negative"):
            r = result(name, fid, which)
            chunks = [q["kv_probe"]["prefill_chunks"]["p"] for q in r["requests"]]
            assert all(len(c) > 1 and c[0] == 64 for c in chunks), (name, fid, which)
            v, ev = detector(FINDINGS[fid], which)(r)
            assert ev[count] == len(chunks) == 8 and "why" not in ev
            assert v == recorded(entry(name, fid), which)[0]
    # on the release the drafter differs exactly at the last position of each non-final
    # chunk (64 tokens a step); on the dev build nowhere
    v, ev = FINDINGS[CHUNKED].detect(result(name, CHUNKED))
    assert (v, ev["positions"]) == ((PRESENT, [63, 127]) if name == "release" else (ABSENT, []))


def test_replaying_a_committed_check_gives_its_verdicts_with_todays_control_statuses():
    for name in CHECKS:
        for e in check_doc(name)["findings"]:
            if e["id"] in GONE or not judged(e):
                continue
            f = FINDINGS[e["id"]]
            whiches = ["main", *(w for w in check.CONTROLS if not own_run(f, w)), *f.also]
            o = check.judge(f, {w: result(name, f.id, w) for w in whiches}, e["expected"],
                            0.0, [])
            assert (o.verdict, o.ok) == (e["verdict"], True), (name, f.id)
            for which, c in o.controls.items():
                assert c["status"] == (OWN_RUN if own_run(f, which) else CONTROL_OK)
                # what the record shows (old records: read from ``ok`` and ``run``)
                assert check.control_status(e["controls"][which]) == c["status"]
            for label in f.also:
                assert o.evidence["also"][label]["verdict"] == recorded(e, label)[0]


# The findings' own runs (each directory's README.md says what each run is). Runs at 32 in
# flight chunk the unchunked baseline too on some prompts, which the chunked-prefill detector
# (made for the check's one-at-a-time runs, against an unchunked baseline) cannot call.
OWN_RUNS = [
    (CHUNKED, "runs", "unchunked-c1", INCONCLUSIVE),  # nothing chunked
    (CHUNKED, "runs", "unchunked-unpadded-c1", INCONCLUSIVE),
    (CHUNKED, "runs", "p32-padded-c1", PRESENT),
    (CHUNKED, "runs", "p64-padded-c1", PRESENT),  # the check's shape, 64 prompts
    (CHUNKED, "runs", "p128-padded-c1", PRESENT),
    (CHUNKED, "runs", "p32-unpadded-c1", ABSENT),
    (CHUNKED, "runs", "p64-unpadded-c1", ABSENT),  # the negative control's shape
    (CHUNKED, "runs", "p64-unpadded-c32", ABSENT),
    (CHUNKED, "runs", "unchunked-c32", INCONCLUSIVE),  # P chunked 1, the baseline another
    (CHUNKED, "runs", "p64-padded-c32", INCONCLUSIVE),  # the baseline chunked one too
    (CHUNKED, "runs-devbuild", "unchunked-c1", INCONCLUSIVE),
    *((CHUNKED, "runs-devbuild", r, ABSENT) for r in (
        "p32-padded-c1", "p64-padded-c1", "p128-padded-c1", "p32-padded-c32",
        "p64-padded-c32", "p128-padded-c32", "p256-padded-c32")),
    (HOST, "runs", "hs-unchunked-c1", INCONCLUSIVE),  # nothing chunked
    *((HOST, "runs", f"hs-p{n}-c1", PRESENT) for n in (32, 40, 48, 64, 80, 128)),
    # without P's lookahead, boundaries on block multiples lose nothing (the negative
    # control's shape), boundaries inside a block still do
    (HOST, "runs", "hs-p32-la0-c1", ABSENT),
    (HOST, "runs", "hs-p64-la0-c1", ABSENT),
    (HOST, "runs", "hs-p40-la0-c1", PRESENT),
    (HOST, "runs", "hs-p48-la0-c1", PRESENT),
    (HOST, "runs", "hs-unchunked-c32", PRESENT),  # 1 of 32 chunked mid-block at 32 in flight
    (HOST, "runs", "hs-p48-c32", PRESENT),
    (HOST, "runs", "hs-p64-c32", PRESENT),
    *((HOST, "runs-devbuild", r, ABSENT) for r in (
        "hs-p32-c1", "hs-p40-c1", "hs-p48-c1", "hs-p64-c1", "hs-p48-c32", "hs-unchunked-c32")),
]


@pytest.mark.parametrize(("fid", "runs", "run", "want"), OWN_RUNS,
                         ids=[f"{f}:{d}/{r}" for f, d, r, _ in OWN_RUNS])
def test_the_detector_on_the_findings_own_runs(fid, runs, run, want):
    v, ev = FINDINGS[fid].detect(load(DATA / fid / runs / run / "result.json"))
    assert v == want, ev


@pytest.mark.parametrize(("fid", "runs"), [(CHUNKED, "runs"), (CHUNKED, "runs-devbuild"),
                                           (HOST, "runs")])
def test_nothing_chunked_is_inconclusive_and_says_so(fid, runs):
    run = "hs-unchunked-c1" if fid == HOST else "unchunked-c1"
    r = load(DATA / fid / runs / run / "result.json")
    assert all(len(q["kv_probe"]["prefill_chunks"]["p"]) == 1 for q in r["requests"])
    v, ev = FINDINGS[fid].detect(r)
    assert v == INCONCLUSIVE and ev["why"].startswith("nothing was chunked"), ev
    # and so is the check's verdict, the negative control as committed: nothing shown
    neg = result("release", fid, "negative")
    o = check.judge(FINDINGS[fid], {"main": r, "negative": neg}, PRESENT, 0.0, [])
    assert (o.verdict, o.ok, o.controls["negative"]["status"]) == (INCONCLUSIVE, False,
                                                                  CONTROL_OK)
    # a negative control that chunked nothing is no negative control: not `absent`
    bad = check.judge(FINDINGS[fid], {"main": neg, "negative": r}, ABSENT, 0.0, [])
    assert (bad.verdict, bad.controls["negative"]["verdict"]) == (BROKEN, INCONCLUSIVE)


# A committed record, altered (in a copy) so that the detector cannot tell.
def _mixed_extra_drafts(r):  # one request without the extra draft, the rest with it
    r["requests"][0]["extra_pd_drafts"] = 0


def _no_thread_affinities(r):  # the workers reported no forward-thread affinity
    for role in ("p", "d"):
        w = r["knobs"]["detail"][role]["components"]["worker"]
        for x in w if isinstance(w, list) else [w]:
            x["info"].pop("main_thread_cpus_vllm")
            x["info"].pop("main_thread_cpus")


def _extra_block_output_equal(r):  # the extra block was handed, but nothing it changed shows
    for q in r["requests"]:
        q["agree"] = True
        q["pd"]["accepted_per_pos"] = list(q["baseline"]["accepted_per_pos"])


def _nothing_primed(r):  # D held none of the prompt: not the last-block case
    for q in r["requests"]:
        q["prime_d"] = False


def _target_differs_too(key):
    def alter(r):  # one request differs in a target layer as well: not this bug's shape
        cmp = r["requests"][0]["kv_probe"][key]
        cmp["groups_differing"] = sorted({*cmp["groups_differing"], "target"})
    return alter


def _one_layer_right(r):  # one layer of one request equal to P's: not every layer lost
    pos = next(q["kv_probe"]["vs_p"]["positions_differing"] for q in r["requests"]
               if q["kv_probe"]["vs_p"]["positions_differing"])
    pos.pop(next(iter(pos)))


def _elsewhere_too(r):  # the differing request also differs at its first position
    cmp = next(q["kv_probe"]["vs_p"] for q in r["requests"]
               if q["kv_probe"]["vs_p"]["positions_differing"])
    layer = next(iter(cmp["positions_differing"]))
    cmp["positions_differing"][layer] = [[0, 0], *cmp["positions_differing"][layer]]


CRAFTED = {  # finding -> (committed check, which, alteration); the run is `present` as is
    "padded-load-step": ("devbuild", "main", _mixed_extra_drafts),
    "nixl-cpu-forward-thread": ("devbuild", "main", _no_thread_affinities),
    "unclipped-handoff": ("devbuild", "positive", _extra_block_output_equal),
    "stale-last-block": ("devbuild", "positive", _nothing_primed),
    "chunked-prefill-drafter-kv": ("release", "main", _target_differs_too("vs_baseline")),
    "eager-finalize-host-staged": ("devbuild", "positive", _target_differs_too("vs_p")),
    "host-buffer-chunk-boundary": ("release", "main", _one_layer_right),
    "example-chunked-store": ("example", "main", _one_layer_right),
    "prefix-cache-drafter-kv": ("prefix", "main", _elsewhere_too),
}


def crafted(fid: str) -> dict:
    name, which, alter = CRAFTED[fid]
    r = copy.deepcopy(result(name, fid, which))
    alter(r)
    return r


def test_every_finding_has_a_crafted_inconclusive_record():
    assert set(CRAFTED) == set(FINDINGS)


@pytest.mark.parametrize("fid", list(CRAFTED))
def test_a_crafted_record_is_inconclusive(fid):
    f = FINDINGS[fid]
    name, which, _ = CRAFTED[fid]
    assert detector(f, which)(result(name, fid, which))[0] == PRESENT  # before the change
    for detect in {f.detect, f.negative_detect or f.detect}:
        assert detect(crafted(fid))[0] == INCONCLUSIVE
        # and a run with nothing in it proves nothing either way
        assert detect({})[0] == detect({"requests": []})[0] == INCONCLUSIVE


# check.judge on the committed records


def records_of(fid: str) -> dict[str, dict]:
    """The committed runs of ``fid`` by which (main and the controls that are runs of their
    own), the dev build's check."""
    f = FINDINGS[fid]
    return {w: result(HOME[fid], fid, w)
            for w in ("main", *(w for w in check.CONTROLS if not own_run(f, w)))}


CONTROLLED = [(f.id, w) for f in FINDINGS.values() for w in check.CONTROLS
              if not own_run(f, w)]


@pytest.mark.parametrize(("fid", "which"), CONTROLLED)
def test_a_failed_control_run_makes_the_verdict_run_failed_not_broken(fid, which):
    f, e = FINDINGS[fid], entry(HOME[fid], fid)
    runs = {**records_of(fid), which: None}
    o = check.judge(f, runs, e["expected"], 1.0, [], {which: "ServerError: D exited (rc -9)"})
    assert o.verdict == FAILED and not o.ok
    assert o.controls[which] == {"verdict": None, "ok": None, "status": RUN_FAILED,
                                 "why": "control run failed: ServerError: D exited (rc -9)"}
    assert o.evidence["why"] == "control run failed: ServerError: D exited (rc -9)"
    for other, c in o.controls.items():  # the rest are judged as ever
        if other != which:
            assert c["status"] == (OWN_RUN if own_run(f, other) else CONTROL_OK)
    # no reason given: it still says the control's run failed
    bare = check.judge(f, runs, e["expected"], 1.0, [])
    assert bare.verdict == FAILED
    assert bare.evidence["why"] == "control run failed: no result"


def test_a_failed_control_run_reaches_check_json_through_the_planned_runs():
    f = FINDINGS[HOST]
    _, uses, _ = check.plan([f], {}, attached=False)
    main, neg = uses[f.id]["main"], uses[f.id]["negative"]
    done = check.Executed(results={main: result("release", f.id), neg: None},
                          seconds={main: 30.0, neg: 5.0},
                          paths={main: "runs/main/result.json", neg: "runs/neg/result.json"},
                          failed={neg: "RuntimeError: NIXL handshake timed out"})
    (o,) = check.outcomes([f], uses, {}, done, {"findings": {f.id: PRESENT}})
    assert (o.verdict, o.ok, o.seconds) == (FAILED, False, 35.0)
    assert "control run failed: RuntimeError: NIXL handshake timed out" in o.evidence["why"]
    assert o.controls["negative"]["status"] == RUN_FAILED
    assert o.controls["positive"]["status"] == OWN_RUN
    assert "negative run failed" in check.controls_line(o.controls)


def test_a_failed_main_run_is_run_failed_with_why_and_no_inconclusive_expectation_passes_it():
    """A dead D measured nothing: an expectation of ``inconclusive`` (the detector's answer
    to data it could not read) must not pass it."""
    f = FINDINGS["unclipped-handoff"]
    o = check.judge(f, {**records_of(f.id), "main": None}, INCONCLUSIVE, 1.0, [],
                    {"main": "TimeoutError: no answer in 300 s"})
    assert o.verdict == FAILED and not o.ok
    assert o.evidence["why"] == "its run failed: TimeoutError: no answer in 300 s"


@pytest.mark.parametrize(("fid", "which"), CONTROLLED)
def test_a_control_that_ran_and_said_the_wrong_thing_is_detector_broken(fid, which):
    f = FINDINGS[fid]
    want = check.CONTROLS[which]
    detect = detector(f, which)
    # the finding's committed runs whose answer is not the control's, and the crafted one
    wrong = [r for r in (*records_of(fid).values(), crafted(fid)) if detect(r)[0] != want]
    assert wrong and any(detect(r)[0] == INCONCLUSIVE for r in wrong)
    for r in wrong:
        o = check.judge(f, {**records_of(fid), which: r}, entry(HOME[fid], fid)["expected"],
                        1.0, [])
        assert o.verdict == BROKEN and not o.ok
        c = o.controls[which]
        assert (c["status"], c["ok"], c["verdict"]) == (CONTROL_BAD, False, detect(r)[0])
        # a bad control outweighs a failed one: the detector is what is wrong
        others = [w for w in check.CONTROLS if w != which and not own_run(f, w)]
        for other in others:
            both = check.judge(f, {**records_of(fid), which: r, other: None}, None, 1.0, [],
                               {other: "RuntimeError: gone"})
            assert both.verdict == BROKEN
            assert both.controls[other]["status"] == RUN_FAILED


OWN = [(f.id, w) for f in FINDINGS.values() for w in check.CONTROLS if own_run(f, w)]


def test_the_own_run_findings_are_the_expected_ones():
    assert sorted(OWN) == [("chunked-prefill-drafter-kv", "positive"),
                           ("example-chunked-store", "positive"),
                           ("host-buffer-chunk-boundary", "positive"),
                           ("nixl-cpu-forward-thread", "positive"),
                           ("padded-load-step", "positive"),
                           ("prefix-cache-drafter-kv", "positive")]


@pytest.mark.parametrize(("fid", "which"), OWN)
def test_an_own_run_control_is_never_ok(fid, which):
    f = FINDINGS[fid]
    mains = [result(n, fid) for n in CHECKS if any(e["id"] == fid and judged(e)
                                                    for e in check_doc(n)["findings"])]
    mains += [r for w, r in records_of(fid).items() if w != "main"] + [crafted(fid)]
    seen = set()
    for main in mains:  # present, absent (a fixed build's, or the control's run), inconclusive
        runs = {**{w: r for w, r in records_of(fid).items() if w != "main"}, "main": main}
        o = check.judge(f, runs, None, 1.0, [])
        c = o.controls[which]
        assert (c["status"], c["ok"], c["verdict"], c["run"]) == (OWN_RUN, None, None, "main")
        assert "evidence" not in c
        seen.add(f.detect(main)[0])
        assert o.verdict == f.detect(main)[0]  # the own run decides, the control adds nothing
    assert {PRESENT, INCONCLUSIVE} <= seen


def _capture_missing(keys):
    def alter(r):  # the reference server kept no capture of one request's prompt
        for key in keys:
            r["requests"][0]["kv_probe"][key] = {
                "identical": False, "missing": "no capture of this prompt on the reference "
                "server", "groups_differing": [], "positions_differing": {}}
    return alter


@pytest.mark.parametrize(("fid", "name", "which", "keys"), [
    ("chunked-prefill-drafter-kv", "release", "negative", ("vs_baseline",)),
    ("prefix-cache-drafter-kv", "prefix", "negative", ("vs_p",)),
    ("eager-finalize-host-staged", "devbuild", "main", ("vs_p",)),
])
def test_a_missing_capture_is_no_absence(fid, name, which, keys):
    """A KV comparison that could not be made (its reference capture missing) used to read as
    identical, so a record with one came out ``absent``: now ``inconclusive``, saying why."""
    f = FINDINGS[fid]
    r = copy.deepcopy(result(name, fid, which))
    assert detector(f, which)(r)[0] == ABSENT  # as committed
    _capture_missing(keys)(r)
    v, ev = detector(f, which)(r)
    assert v == INCONCLUSIVE and ev["comparisons_missing"] == 1, ev
    assert "could not be made" in ev["why"]


def test_the_tables_evidence_is_cut_between_items_with_an_ellipsis():
    text = "requests_probed=32, requests_chunked=30, requests_drafter_only_at_chunk_ends=29, x=1"
    cut = check.clip(text, 70)
    assert cut == "requests_probed=32, requests_chunked=30…" and len(cut) <= 70
    assert check.clip("short", 70) == "short"


def test_a_reports_headline_sentence_is_said_once_for_the_positions_it_fits():
    from workbench.findings.report import said_once

    same = "inconclusive, with or without D's padded load step"
    assert said_once([same, same, "within"]) == f"positions 0, 1: {same}; position 2: within"
