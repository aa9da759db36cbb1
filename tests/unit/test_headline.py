"""What one run tells its user: D's padded load step attributed per request (never in a
request whose output diverged), the headline verdict named beside the raw one, and the
printout's verdicts, intervals, divergence and too-small line. Typed-in numbers and the
committed reference sweep's per-request counts; no server."""

from __future__ import annotations

import pytest

from workbench import paths
from workbench.measuring import metrics, readout, results


def side(steps: list[int], k: int = 3) -> dict:
    return metrics.counts_from_steps({"num_spec_tokens": k, "num_spec_steps": len(steps),
                                      "per_step_accepted": steps,
                                      "per_step_drafted": [k] * len(steps)})


def request(i: int, base_steps: list[int], pd_steps: list[int], same: bool) -> dict:
    toks = list(range(10))
    return {"id": f"r{i}", "baseline": side(base_steps), "pd": side(pd_steps),
            "pd_spec": {"per_step_accepted": pd_steps}, "baseline_tokens": toks,
            "pd_tokens": toks if same else [*toks[:3], 99, *toks[4:]]}


def run_of(rows: list[dict]) -> results.Result:
    r = results.Result(config={}, command="", vllm_version="", git_commit="", created="",
                       prompt_set="", num_prompts=len(rows), wall_seconds=0, engine_seconds=0,
                       knobs={}, pd=None, baseline=None, token_agreement=None, requests=rows)
    results.aggregate(r, rows)
    return r


# The fixed pipeline at 4 prompts: D is the baseline plus its padded first step.
BASE = [[2, 1, 3, 0, 2], [1, 1, 2], [3, 2, 0, 1], [0, 2, 2, 1]]
FIXED = [request(i, b, [0, *b], True) for i, b in enumerate(BASE)]
# A bug: request 0 diverged with two more drafts, 1 diverged with one more (not rejected at
# the first step), 2 diverged with two fewer, 3 is the padding: extra [2, 1, -2, 1].
LEGACY = [request(0, BASE[0], [1, 0, 1, 0, 1, 2, 0], False),
          request(1, BASE[1], [1, 0, 0, 1], False),
          request(2, BASE[2], [3, 1], False),
          request(3, BASE[3], [0, *BASE[3]], True)]


def test_the_fixed_pipeline_reads_within_with_the_raw_verdict_beside_it():
    r = run_of([dict(x) for x in FIXED])
    head = r.effect["headline"]
    assert all(x["padded_load_step"] for x in r.requests)
    assert head["verdict"] == ["within"] * 3 and head["attributed"] == ["padded-load-step"]
    assert head["raw_verdict"] != head["verdict"]  # the padding alone pushes raw off
    assert head["says"][0] == ("within, once D's padded load step (known vLLM behaviour, "
                               f"finding padded-load-step) is set aside; raw: "
                               f"{head['raw_verdict'][0]}")
    assert r.pd["padded_load_step_drafts"] == 4 == r.pd["extra_drafts_vs_baseline"]


def test_a_diverged_requests_draft_difference_is_never_taken_for_the_padding():
    r = run_of([dict(x) for x in LEGACY])
    assert [x["extra_pd_drafts"] for x in r.requests] == [2, 1, -2, 1]
    assert [x["padded_load_step"] for x in r.requests] == [False, False, False, True]
    assert r.pd["extra_drafts_vs_baseline"] == 2 and r.pd["padded_load_step_drafts"] == 1
    denom = r.pd["num_drafts"] - 1  # only request 3's padding, not the net 2
    assert r.pd["per_position_without_extra_drafts"] == [a / denom
                                                         for a in r.pd["accepted_per_pos"]]
    note = next(n for n in r.notes if "more drafts" in n)
    assert "1 of them are D's padded load step" in note and "r0, r1, r2" in note


def test_with_no_padding_the_headline_is_the_raw_verdict_and_says_so():
    rows = [request(i, b, b, True) for i, b in enumerate(BASE)]
    head = run_of(rows).effect["headline"]
    assert head["verdict"] == head["raw_verdict"] and head["attributed"] == []
    assert "no request has D's padded load step" in head["says"][0]


def test_the_printout_answers_did_the_bug_show():
    text = "\n".join(readout.lines(run_of([dict(x) for x in LEGACY])))
    assert "position 0 (padded step set aside): D " in text and "(95%, paired)" in text
    assert "token agreement: 0.250 (3 of 4 requests diverged; the earliest at token" in text
    assert "too small to decide: every position is inconclusive with 4 prompts" in text


def test_the_committed_reference_sweep_rows_keep_their_headline_verdicts():
    """The README's headline column, recomputed from the committed per-request counts."""
    want = {"fixed": "within", "legacy-hand-off": "inconclusive",
            "legacy-last-block-zeroed": "outside", "legacy-last-block-dirty": "outside",
            "host-staged-eager-dirty": "outside"}
    for slug, verdict in want.items():
        r = results.Result.load(paths.DATA / "reference-sweep" / "points" / slug /
                                "result.json")
        r.notes = []
        results.aggregate(r, r.requests)
        assert r.effect["headline"]["verdict"][0] == verdict, slug
    # where outputs diverged the old correction subtracted their drafts: zeroed read
    # "inconclusive" corrected, "outside" raw; the headline keeps "outside"
    assert r.effect["verdict"][0] == "outside"


def test_the_bottom_line_names_the_affected_requests_and_what_n_would_decide():
    """The legacy hand-off on the bad-case set: the diverged requests are the affected ones."""
    rows = [dict(x) for x in LEGACY]
    for x, hit in zip(rows, (True, True, True, False), strict=True):
        x["affected"] = hit
    r = run_of(rows)
    r.prompt_set = "badcase"
    results.aggregate(r, rows)
    line = r.bottom_line
    assert line.startswith("bug visible: 3 of 3 affected requests diverged, 0 of 1 unaffected; "
                           "acceptance vs baseline (D's padded load step set aside, n=4): "
                           "position 0 ")
    assert "prompts would decide" in line
    assert r.to_dict()["bottom_line"] == line
    fixed = run_of([dict(x) for x in FIXED]).bottom_line
    assert fixed.startswith("no token differs: all 4 requests equal the baseline's; ")


def test_the_printout_starts_with_the_bottom_line_and_keeps_notes_short():
    from workbench.cli import _report

    r = run_of([dict(x) for x in LEGACY])
    r.notes = ["First sentence. Second sentence with detail."]
    text = _report(r).splitlines()
    assert text[0] == f"bottom line: {r.bottom_line}"
    assert text[-1] == "note: First sentence. (more: --verbose)"
    assert _report(r, verbose=True).splitlines()[-1].endswith("Second sentence with detail.")


@pytest.mark.parametrize(("diff", "ci", "rate", "n", "want"), [
    (-0.045, [-0.079, -0.010], 0.582, 64, 302),  # the legacy hand-off's, rounded
    (0.0, [-0.05, 0.05], 0.5, 4, 16),            # half-width 0.05 to fit inside 0.025
    (-0.025, [-0.05, 0.0], 0.5, 4, None),        # on the band's edge: no count decides
])
def test_prompts_needed_scales_the_interval_as_one_over_root_n(diff, ci, rate, n, want):
    assert readout.prompts_needed(diff, ci, rate, n) == want


def test_the_notebooks_acceptance_table_names_both_verdicts():
    from workbench.notebook.widgets import acceptance_frame

    r = run_of([dict(x) for x in FIXED])
    r.config = {"label": "fixed"}
    df = acceptance_frame([r])
    assert list(df["verdict (headline)"]) == ["within"] * 3
    assert list(df["verdict (raw)"]) == r.effect["verdict"]
