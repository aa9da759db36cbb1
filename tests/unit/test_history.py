"""``releases --check``: what a native run can feed, its verdicts, and the matrix it writes
(the live two-release run: tests/servers/test_history_live.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from workbench.config import ConfigError
from workbench.findings import FINDINGS, check
from workbench.findings.finding import NOT_APPLICABLE, PRESENT, VERDICTS
from workbench.paths import DATA
from workbench.releases import history, matrix, native

BASE = check.connector_base("cpu", "nixl")


def test_a_native_run_feeds_only_findings_whose_own_run_sets_no_knob():
    """The findings read from per-request counts run natively with every control that needs
    no knob; those reading the KV probe or the workers' threads, or another connector's, are
    not-applicable with the reason."""
    padded = history.plan_finding(FINDINGS["padded-load-step"], BASE)
    assert set(padded.runs) == {"main"} and padded.why_not is None
    assert set(padded.not_run) == {"negative", "load_step=gated (vLLM PR #50173 as written)"}
    assert "load_step" in padded.not_run["negative"]
    prefix = history.plan_finding(FINDINGS["prefix-cache-drafter-kv"], BASE)
    assert prefix.why_not and "KV probe" in prefix.why_not and "kv_probe_source" in prefix.why_not
    thread = history.plan_finding(FINDINGS["nixl-cpu-forward-thread"], BASE)
    assert "sched_getaffinity" in thread.why_not and "affinity_source" in thread.why_not
    example = history.plan_finding(FINDINGS["example-chunked-store"], BASE)
    assert "connector example only" in example.why_not
    assert not native.knobs_needed(padded.runs["main"])


def test_where_the_probes_targets_hold_the_findings_that_read_it_alone_run_natively():
    """The KV probe is an instrument: where its targets hold in a release's source, the
    findings whose runs set no knob but the probe run with every control; those that also
    need host staging (a knob) stay not-applicable for that reason."""
    probe = frozenset({"kv_probe"})
    for fid in ("chunked-prefill-drafter-kv", "prefix-cache-drafter-kv"):
        p = history.plan_finding(FINDINGS[fid], BASE, probe)
        assert p.why_not is None and p.runs["main"].kv_probe and not p.not_run, (fid, p)
        assert set(p.runs) == {"main", "negative"}
    host = history.plan_finding(FINDINGS["host-buffer-chunk-boundary"], BASE, probe)
    assert "transfer" in host.why_not
    thread = history.plan_finding(FINDINGS["nixl-cpu-forward-thread"], BASE, probe)
    assert "sched_getaffinity" in thread.why_not


def test_where_cpu_pins_targets_hold_the_forward_thread_runs_natively_without_its_restore():
    """The forward thread's cores are read observe-only where ``cpu_pin``'s targets hold; its
    negative control reads them after the CPU profile's restore, which observe-only never
    makes, so it is not run, with that reason."""
    p = history.plan_finding(FINDINGS["nixl-cpu-forward-thread"], BASE, frozenset({"affinity"}))
    assert p.why_not is None and set(p.runs) == {"main"} and not p.runs["main"].kv_probe
    assert "cpu_pin.restore" in p.not_run["negative"]
    assert not native.knobs_needed(p.runs["main"])
    sources = {"kv_probe": {"held": 6, "checks": 6}, "affinity": {"held": 3, "checks": 4}}
    plans = history.plans_for([FINDINGS["nixl-cpu-forward-thread"]], sources)
    assert "affinity_source" in plans["nixl-cpu-forward-thread"].why_not


def test_where_host_stagings_port_holds_the_host_staged_findings_run_their_own_run():
    """Host staging is ported (``transfer.observe``) where its targets hold: the two
    host-staged findings run their own run with ``transfer=host-staged`` and the KV probe,
    each control that sets another knob is ``not run``; where it does not hold, the reason
    names the port's source check."""
    ported = frozenset({"kv_probe", "transfer"})
    host = history.plan_finding(FINDINGS["host-buffer-chunk-boundary"], BASE, ported)
    assert host.why_not is None and set(host.runs) == {"main"}
    assert host.runs["main"].knobs["transfer"] == "host-staged" and host.runs["main"].kv_probe
    assert "prefill_lookahead" in host.not_run["negative"]
    eager = history.plan_finding(FINDINGS["eager-finalize-host-staged"], BASE, ported)
    assert set(eager.runs) == {"main"} and set(eager.not_run) == {"positive", "negative"}
    assert all("finalize" in why for why in eager.not_run.values())
    assert native.knobs_needed(host.runs["main"], frozenset({"transfer"})) == {}
    assert native.knobs_needed(host.runs["main"]) == {"transfer": "host-staged"}
    unported = history.plan_finding(FINDINGS["host-buffer-chunk-boundary"], BASE,
                                    frozenset({"kv_probe"}))
    assert "transfer=host-staged" in unported.why_not and "transfer_source" in unported.why_not


def test_where_example_connectors_port_holds_its_finding_runs_through_it():
    """ExampleConnector is a flag: where the release holds its targets, the finding on it runs
    its own run and its negative control through it; elsewhere it says which check failed.
    A NIXL-only value the table has no port for stays refused."""
    ported = frozenset({"kv_probe", "connector"})
    ex = history.plan_finding(FINDINGS["example-chunked-store"], BASE, ported)
    assert ex.why_not is None and set(ex.runs) == {"main", "negative"}
    assert {c.knobs["connector"] for c in ex.runs.values()} == {"example"}
    no = history.plan_finding(FINDINGS["example-chunked-store"], BASE, frozenset({"kv_probe"}))
    assert "connector_source" in no.why_not
    cfg = check.config_for(FINDINGS["padded-load-step"], {"knobs": {"connector": "nixl-push"}},
                           BASE)
    assert native.knobs_needed(cfg, frozenset({"connector"})) == {"connector": "nixl-push"}


def test_a_native_session_checks_host_staging_in_every_pd_worker_and_empties_the_store(tmp_path):
    """Before a host-staged run, each live P and D worker's read-back (``transfer.observe``'s
    hook) must say host-staged, else the run is refused; an earlier server's worker does not
    count. Each run starts with ExampleConnector's store empty, as the knob channel leaves it."""
    import os
    import subprocess

    from workbench.config import ExperimentConfig
    from workbench.knobs import connector as kv_connector
    from workbench.provenance import atomic_write_json
    from workbench.releases.native import NativeRelease, NativeSession

    rel = NativeRelease("0.28.0", tmp_path / "python", False, tmp_path / "obs",
                        ported=frozenset({"transfer"}))
    staged = ExperimentConfig.for_profile("cpu", knobs={"transfer": "host-staged"})

    def worker(role: str, value: str, pid: int = os.getpid()) -> None:
        atomic_write_json(tmp_path / "obs" / f"observe-{role}" / f"transfer-{pid}.json",
                          {"pid": pid, "role": role, "value": value, "evidence": {}})

    worker("p", "host-staged")
    with pytest.raises(RuntimeError, match="'d': \\[\\]"):
        rel.staged(staged)  # D wrote nothing: not in force
    worker("d", "direct")
    with pytest.raises(RuntimeError, match="'direct'"):
        rel.staged(staged)
    gone = subprocess.Popen(["true"])
    gone.wait()
    worker("d", "host-staged")
    worker("d", "direct", gone.pid)  # an earlier server's worker, gone
    assert set(rel.staged(staged)) == {"p", "d"}
    with NativeSession(rel, tmp_path / "logs") as s:
        s.check_build(staged)  # ported: no refusal
        with pytest.raises(ConfigError, match="transfer"):
            s.channel.apply(staged, {})  # the channel alone sets no knob
        assert "client" in s.apply_knobs(staged)  # in the servers from their start
        stored = kv_connector.storage_dir(s.log_dir) / "prompt-hash"
        stored.mkdir(parents=True)
        s.reset_prefix_caches()
        assert not stored.exists()


def test_a_rerun_replaces_only_the_findings_it_ran():
    old = {"release": "0.28.0", "command": "first", "seconds": 300.0, "why": None,
           "findings": [{"id": "a", "verdict": "absent"}, {"id": "b", "verdict": NOT_APPLICABLE}],
           "plugin": {"p": [{"pid": 1}]}, "kv_probe_source": {"held": 6, "checks": 6}}
    new = {"release": "0.28.0", "command": "again", "seconds": 120.0, "why": None,
           "findings": [{"id": "b", "verdict": PRESENT}], "plugin": {"p": [{"pid": 2}]},
           "kv_probe_source": {"held": 6, "checks": 6}}
    got = history.merged(old, new)
    assert [(f["id"], f["verdict"]) for f in got["findings"]] == [("a", "absent"),
                                                                   ("b", PRESENT)]
    assert got["command"] == "first" and got["plugin"]["p"] == [{"pid": 1}, {"pid": 2}]
    assert got["reruns"] == [{"command": "again", "findings": ["b"], "seconds": 120.0,
                              "why": None}]


def test_a_planned_reason_follows_todays_plan_and_a_measured_outcome_stays():
    """A record made before a port keeps its measurements; the reasons it gave for findings
    it never ran are those the plan gives now (the record's instruments' source checks), or
    that a rerun would measure it."""
    stale = "reads the KV probe: observe-only installs none of it"

    def rec(started: bool, held: int) -> dict:
        return {"started": started, "kv_probe_source": {"held": held, "checks": 6},
                "affinity_source": {"held": 1, "checks": 4}, "findings": [
            {"id": "chunked-prefill-drafter-kv", "verdict": NOT_APPLICABLE, "evidence":
             {"why": stale}, "results": []},
            {"id": "host-buffer-chunk-boundary", "verdict": NOT_APPLICABLE, "evidence":
             {"why": stale}, "results": []},
            {"id": "stale-last-block", "verdict": PRESENT, "evidence": {}, "results": ["r"]}]}

    old = rec(True, 5)
    assert history.replanned(old)
    got = {o["id"]: o["evidence"].get("why") for o in old["findings"]}
    assert "kv_probe_source" in got["chunked-prefill-drafter-kv"]
    assert "kv_probe_source" in got["host-buffer-chunk-boundary"]
    assert got["stale-last-block"] is None and not history.replanned(old)
    ported = rec(True, 6)  # the plan would run the first now: it says a rerun measures it
    assert history.replanned(ported)
    got = {o["id"]: o["evidence"].get("why") for o in ported["findings"]}
    assert "--rerun --only chunked-prefill-drafter-kv" in got["chunked-prefill-drafter-kv"]
    assert "'transfer': 'host-staged'" in got["host-buffer-chunk-boundary"]
    broke = rec(True, 6)  # a rerun whose servers did not start: the release's reason stays
    broke["findings"][0]["evidence"]["why"] = "servers did not start: baseline: TypeError: x"
    history.replanned(broke)
    assert broke["findings"][0]["evidence"]["why"].startswith("servers did not start")
    unstarted = rec(False, 5)
    assert not history.replanned(unstarted) and unstarted["findings"][0]["evidence"]["why"] == stale


def _rows(extra: int, d_first: int | None, same_accepts: bool = True) -> list[dict]:
    acc = [3, 2, 1]
    return [{"id": f"r{i}", "prompt_len": 40, "extra_pd_drafts": extra,
             "pd_spec": None if d_first is None else {"per_step_accepted": [d_first, 2]},
             "pd": {"accepted_per_pos": acc if same_accepts else [2, 2, 1]},
             "baseline": {"accepted_per_pos": acc}} for i in range(4)]


def test_a_left_out_control_decides_nothing_and_says_why():
    """The padded load step on a release with per-step counts and one without: present
    either way when the extra draft is all rejected; a control a native run cannot make is
    ``not run`` with its reason, never ``run failed`` (which would make it inconclusive)."""
    f = FINDINGS["padded-load-step"]
    p = history.plan_finding(f, BASE)
    for d_first in (0, None):
        o = history.judge(f, p, {"main": {"requests": _rows(1, d_first)}}, {}, 1.0, [])
        assert o.verdict == PRESENT, (d_first, o.evidence)
        assert o.controls["negative"]["status"] == history.NOT_RUN
        assert o.controls["positive"]["status"] == "own run"
        assert "load_step" in o.evidence["also"][next(iter(f.also))]["why"]
    scraped = history.judge(f, p, {"main": {"requests": _rows(1, None, False)}}, {}, 1.0, [])
    assert scraped.verdict == "inconclusive"  # an accepted extra draft is not the padding
    assert scraped.evidence["d_accepted_as_baseline"] == 0
    failed = history.judge(f, p, {"main": None}, {"main": "ServerError: gone"}, 1.0, [])
    assert failed.verdict == "run-failed" and "gone" in failed.evidence["why"]


def _record(release: str, verdicts: dict[str, str], why: str | None = None) -> dict:
    return {"release": release, "vllm_version": release, "started": why is None, "why": why,
            "findings": [{"id": fid, "verdict": v, "seconds": 2.5, "results": [],
                          "evidence": ({"why": why or f"reason of {fid}"}
                                       if v == NOT_APPLICABLE else {"requests": 8}),
                          "controls": {}} for fid, v in verdicts.items()]}


def test_the_matrix_has_a_row_per_release_and_finding_and_a_numbered_reason_per_blank(tmp_path):
    recs = [_record("0.19.1", {"a": NOT_APPLICABLE, "b": NOT_APPLICABLE}, "servers did not "
                    "start: AssertionError: spec decode is not supported."),
            _record("0.24.0", {"a": PRESENT, "b": NOT_APPLICABLE}),
            _record("0.25.1", {"a": "absent", "b": "inconclusive"})]
    recs[2]["command"] = "python -m workbench releases --check --vllm 0.25.1"
    df = matrix.write(tmp_path, recs, "python -m workbench releases --check --vllm X")
    text = (tmp_path / matrix.CSV_NAME).read_text().splitlines()
    assert text[0].split(",")[:5] == ["release", "finding", "verdict", "evidence", "seconds"]
    plain = pd.read_csv(tmp_path / matrix.CSV_NAME)  # no comment line to skip
    assert list(plain[plain["release"] == "0.25.1"]["command"].unique()) == [
        "python -m workbench releases --check --vllm 0.25.1"]
    assert list(df.columns) == list(matrix.COLUMNS) and len(df) == 6
    assert json.loads(df.iloc[0]["evidence"])["why"].startswith("servers did not start")
    releases, findings, codes, reasons = matrix.grid(df)
    assert releases == ["0.19.1", "0.24.0", "0.25.1"] and findings == ["a", "b"]
    assert codes.loc["a", "0.24.0"] == PRESENT and len(reasons) == 2  # one per distinct why
    png = tmp_path / "figures" / f"{matrix.FIGURE_STEM}.png"
    meta = json.loads(Image.open(png).info["Description"])
    assert meta["csv"] == matrix.CSV_NAME and meta["command"].endswith("--vllm X")
    with pytest.raises(ValueError, match="maybe"):
        matrix.frame([_record("0.30.0", {"a": "maybe"})])


def test_releases_are_given_by_number_or_all():
    assert history.releases_arg("0.24.0,0.22.1", False) == ["0.22.1", "0.24.0"]
    assert history.releases_arg(None, True) == list(history.ALL_RELEASES)
    with pytest.raises(ConfigError, match="0.24"):
        history.releases_arg("0.24", False)
    with pytest.raises(ConfigError, match="--all"):
        history.releases_arg("", False)
    with pytest.raises(ConfigError, match="--vllm 0.24.0 and --all both given"):
        history.releases_arg("0.24.0", True)


def test_releases_check_exits_1_on_a_broken_detector_and_names_it():
    """A ``detector-broken`` outcome (a control that did not behave) is not a pass."""
    recs = [_record("0.24.0", {"a": "absent", "b": "detector-broken"}),
            _record("0.25.1", {"a": PRESENT, "b": "absent"})]
    assert history.broken(recs) == ["0.24.0 b"]
    assert history.broken(recs[1:]) == []


def test_the_committed_matrix_covers_every_minor_release_with_known_verdicts():
    """``data/releases/findings-matrix.csv``: every finding on every release of the history,
    verdicts of the checked vocabulary, and the installed release's as its expectations."""
    df = matrix.frame([history.with_knob_positives(r)
                       for r in history.records_under(DATA / "releases")])
    assert set(df["release"]) == set(history.ALL_RELEASES)
    assert set(df["finding"]) == set(FINDINGS) and set(df["verdict"]) <= set(matrix.MATRIX_VERDICTS)
    committed = (DATA / "releases" / matrix.CSV_NAME).read_text().splitlines()
    assert committed == df.to_csv(index=False).splitlines()
    assert pd.read_csv(DATA / "releases" / matrix.CSV_NAME)["command"].str.startswith(
        "python -m workbench releases --check").all()  # a plain CSV: no comment line
    doc = (history.HISTORY_DOC).read_text()
    assert f"{matrix.DOC_BEGIN}\n{matrix.markdown(df)}\n{matrix.DOC_END}" in doc
    on_032 = df[df["release"] == "0.32.0"].set_index("finding")["verdict"]
    for fid, v in on_032.items():  # a finding of another connector: that connector's
        conn = (FINDINGS[fid].connectors or (history.CONNECTOR,))[0]
        expected = check.expectations(None, "0.32.0", conn)[1]["findings"]
        if v not in (NOT_APPLICABLE, matrix.UNCHECKED):
            assert v == expected[fid], (fid, conn, v)
    absent = df[df["verdict"] == "absent"]
    assert len(absent) and absent["controls"].str.startswith("positive ok").all()


def test_a_report_says_since_and_until_when_a_finding_is_present(tmp_path):
    """``timeline.since`` from a matrix: one span per run of verdicts, and the head names the
    first present release and the newest checked, a span that ended and what followed it, or
    that nothing was measurable natively; an absence no positive control checked is no end."""
    from workbench.findings import timeline

    seen = {"positive": {"status": "ok", "verdict": PRESENT}}
    recs = [_record("0.19.1", {"a": NOT_APPLICABLE, "b": NOT_APPLICABLE, "c": NOT_APPLICABLE},
                    "servers did not start"),
            _record("0.23.0", {"a": "absent", "b": PRESENT, "c": NOT_APPLICABLE}),
            _record("0.24.0", {"a": "absent", "b": PRESENT, "c": NOT_APPLICABLE}),
            _record("0.25.1", {"a": PRESENT, "b": "absent", "c": NOT_APPLICABLE}),
            _record("0.30.0", {"a": NOT_APPLICABLE, "b": "absent", "c": NOT_APPLICABLE}),
            _record("0.32.0", {"a": PRESENT, "b": "absent", "c": NOT_APPLICABLE}),
            _record("0.34.0", {"a": "absent", "b": "absent", "c": NOT_APPLICABLE})]
    for rec in recs[3:5]:
        next(f for f in rec["findings"] if f["id"] == "b")["controls"] = seen
    matrix.write(tmp_path, recs, "python -m workbench releases --check")
    csv = tmp_path / matrix.CSV_NAME
    assert timeline.since("a", csv) == (
        "present natively since 0.25.1, still on 0.32.0 (the newest release checked) (0.19.1 "
        "not-applicable; 0.23.0-0.24.0 unchecked; 0.25.1 present; 0.30.0 not-applicable; "
        "0.32.0 present; 0.34.0 unchecked; findings-matrix.csv)")
    assert timeline.since("b", csv).startswith(
        "present natively on 0.23.0-0.24.0 only, until 0.24.0 (absent on 0.25.1)")
    assert timeline.since("c", csv).startswith("not measurable natively on any release")
    assert timeline.since("z", csv) is None


def test_an_absence_counts_only_where_a_positive_control_saw_the_bug_on_that_release(tmp_path):
    """``absent`` in the matrix needs the finding's positive control to have detected the bug
    on that release, natively or in a knob ``check`` of the same release and runner
    (``history.with_knob_positives``); else ``unchecked`` with why, its own colour."""
    own = {"positive": {"status": "own run", "verdict": None}}
    not_run = {"positive": {"status": "not run", "verdict": None, "why": "sets knobs x"}}
    seen = {"positive": {"status": "ok", "verdict": PRESENT}}
    rows = {c["finding"]: c for c in matrix.rows([_record("0.32.0", {
        "own": "absent", "none": "absent", "seen": "absent", "nr": "absent", "p": PRESENT})])}
    assert rows["none"]["verdict"] == matrix.UNCHECKED
    assert "no positive control" in json.loads(rows["none"]["evidence"])["why"]
    rec = _record("0.32.0", {"own": "absent", "seen": "absent", "nr": "absent"})
    for f, c in zip(rec["findings"], (own, seen, not_run), strict=True):
        f["controls"] = c
    got = {r["finding"]: (r["verdict"], json.loads(r["evidence"]).get("why", ""))
           for r in matrix.rows([rec])}
    assert got["own"][0] == matrix.UNCHECKED and "its own run" in got["own"][1]
    assert got["seen"] == ("absent", "")
    assert got["nr"][0] == matrix.UNCHECKED and "sets knobs x" in got["nr"][1]
    assert matrix.COLORS[matrix.UNCHECKED] not in {matrix.COLORS[v] for v in VERDICTS}
    # a knob check of 0.34.0 on MRV2 lends its positive control to the native 0.34.0 cell
    native = history.records_under(DATA / "releases")
    on_034 = next(r for r in native if r["release"] == "0.34.0")
    lent = {f["id"]: f for f in history.with_knob_positives(on_034)["findings"]}
    assert "check with the knobs" in lent["unclipped-handoff"]["controls"]["positive"]["why"]
    assert lent["prefix-cache-drafter-kv"]["controls"]["positive"]["status"] == "own run"
    assert {f["id"]: f for f in on_034["findings"]}["unclipped-handoff"]["controls"][
        "positive"]["status"] == "not run"  # the record itself stays as measured


def test_every_committed_report_says_what_the_committed_matrix_says():
    """A report's "Across releases" line is ``timeline.since`` of the committed matrix: when
    the matrix changes, the reports are written again (``check.rejudge``)."""
    from workbench.findings import timeline

    reports = [r for r in DATA.rglob("*.md") if r.stem in FINDINGS
               and "Across releases: " in r.read_text()]
    assert reports
    for r in reports:
        line = next(ln for ln in r.read_text().splitlines() if ln.startswith("Across releases"))
        assert line == f"Across releases: {timeline.since(r.stem)}.", r


def test_a_release_that_cannot_start_is_recorded_with_its_root_cause(tmp_path):
    """The first raised exception of each log, not the warnings before it nor the API
    server's report of the engine's failure after it; roles with one cause share a line."""
    warn = ("(APIServer pid=1) WARNING 12-03 [system_utils.py:289] Found ulimit ... fd limit "
            "errors like `OSError: [Errno 24] Too many open files`")
    root = "(EngineCore pid=2) ERROR 12-03 [core.py:1108] AssertionError: spec decode is not " \
           "supported."
    after = "(APIServer pid=1) RuntimeError: Engine core initialization failed."
    for role in ("p", "d"):
        (tmp_path / f"{role}.log").write_text("\n".join((warn, root, after)) + "\n")
    (tmp_path / "baseline.log").write_text("\n".join((
        warn, "[workbench.serving.reaper] stopping server tree: SIGTERM",
        "(APIServer pid=4) BrokenPipeError: [Errno 32] Broken pipe")) + "\n")
    assert history.start_failure(tmp_path) == "d, p: AssertionError: spec decode is not supported."
    assert history.start_failure(tmp_path / "none") is None  # a timeout: no vLLM exception


def test_a_native_server_runs_the_release_python_observe_only_without_flags_it_lacks(tmp_path):
    """Each spec as the release runs it: its Python first on the command line, no knob
    control file and no NIXL progress delay (both workbench patches), the observe-only
    report directory per role, and no --per-request-spec-decode-metrics before 0.29.0."""
    from workbench.config import ExperimentConfig
    from workbench.knobs import observe
    from workbench.releases.native import NativeRelease
    from workbench.serving.plan import server_specs

    rel = NativeRelease("0.28.0", tmp_path / "py" / "bin" / "python", False, tmp_path / "obs")
    cfg = ExperimentConfig.for_profile("cpu")
    for spec in server_specs(cfg, tmp_path, knobs_file=tmp_path / "k.json"):
        out = rel.adapt(spec)
        cmd = out.command()
        assert cmd[0] == str(rel.python) and "--per-request-spec-decode-metrics" not in cmd
        env = out.env()
        assert "WORKBENCH_KNOBS_FILE" not in env and out.nixl_progress_delay_us == 0
        assert env[observe.ENV] == str(tmp_path / "obs" / f"observe-{spec.role}")
        assert (out.port, out.auto_ports) == (spec.port, spec.auto_ports)
        assert env["VLLM_CACHE_ROOT"] == str(native.cache_root("0.28.0"))


def test_each_release_keeps_vllms_cache_under_a_root_of_its_own(tmp_path, monkeypatch):
    """vLLM's inspection of a model class is cached under the class's name alone with one
    module hash: releases sharing a root would overwrite each other's entry."""
    cache_root = native.cache_root
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root("0.28.0") == tmp_path / "xdg" / "vllm" / "releases" / "0.28.0"
    assert cache_root("0.28.0") != cache_root("0.29.0")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mine"))
    assert cache_root("0.28.0") == tmp_path / "mine" / "releases" / "0.28.0"


def test_a_native_session_refuses_a_knob_or_the_kv_probe_before_any_server_starts(tmp_path):
    from workbench.config import ExperimentConfig
    from workbench.releases.native import NativeRelease, NativeSession

    rel = NativeRelease("0.28.0", tmp_path / "python", False, tmp_path / "obs")
    with NativeSession(rel, tmp_path / "logs") as s:
        with pytest.raises(ConfigError, match="block_handoff"):
            s.check_build(ExperimentConfig.for_profile("cpu", knobs={"block_handoff": "legacy"}))
        with pytest.raises(ConfigError, match="KV probe"):
            s.check_build(ExperimentConfig.for_profile("cpu", kv_probe=True))
        assert not s.servers


def test_a_release_that_holds_the_probes_targets_carries_it_in_every_server(tmp_path):
    """Its servers get the probe's state directory, its session the probe's channel (no
    knob), and a run with the probe passes the build check."""
    from workbench.config import ExperimentConfig
    from workbench.knobs import spec as knob_spec
    from workbench.releases.native import NativeRelease, NativeSession
    from workbench.serving import channels
    from workbench.serving.plan import server_specs

    rel = NativeRelease("0.28.0", tmp_path / "python", False, tmp_path / "obs", kv_probe=True)
    cfg = ExperimentConfig.for_profile("cpu", kv_probe=True)
    for spec in server_specs(cfg, tmp_path):
        assert rel.adapt(spec).env()[knob_spec.ENV_OBSERVE_KV_PROBE] == str(rel.probe_dir)
    with NativeSession(rel, tmp_path / "logs") as s:
        assert isinstance(s.channel, channels.ProbeChannel)
        with pytest.raises(ConfigError, match="block_handoff"):
            s.check_build(ExperimentConfig.for_profile("cpu", knobs={"block_handoff": "legacy"},
                                                       kv_probe=True))
        with pytest.raises(ConfigError, match="not running"):
            s.channel.kv_probe({"p": None}, {"op": "records"})


def test_the_forward_threads_cores_reach_the_detector_from_the_live_workers_only(tmp_path):
    """Servers asked for it get ``WORKBENCH_OBSERVE_AFFINITY``; each worker's file (the hook
    ``cpu_pin.observe`` installs on the installed release, run here) reaches the result under
    ``knobs.detail`` as the knob channel's does, an earlier server's worker's does not, and
    the finding's detector reads it."""
    import os
    import subprocess

    from workbench.config import ExperimentConfig
    from workbench.findings import nixl_cpu_forward_thread as thread
    from workbench.knobs import cpu_pin, release
    from workbench.knobs import spec as knob_spec
    from workbench.provenance import atomic_write_json
    from workbench.releases.native import NativeRelease
    from workbench.serving.plan import server_specs

    rel = NativeRelease("0.28.0", tmp_path / "python", False, tmp_path / "obs", affinity=True)
    for spec in server_specs(ExperimentConfig.for_profile("cpu"), tmp_path):
        assert rel.adapt(spec).env()[knob_spec.ENV_OBSERVE_AFFINITY] == "1"
    report, hook = cpu_pin.observe(str(tmp_path / "obs" / "observe-p"),
                                   release.vllm_version())
    assert report["installed"], report
    (tmp_path / "obs" / "observe-p").mkdir(parents=True)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    try:
        hook(None)
    finally:
        del os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    gone = subprocess.Popen(["true"])  # a pid no process holds once reaped
    gone.wait()
    atomic_write_json(tmp_path / "obs" / "observe-d" / f"affinity-{gone.pid}.json",
                      {"pid": gone.pid, "role": "d", "info": {}})
    detail = rel.workers()
    assert set(detail) == {"p"}
    [w] = detail["p"]["components"]["worker"]
    assert w["pid"] == os.getpid() and w["info"]["omp_threads_bind"] == [0]
    mine = sorted(os.sched_getaffinity(0))
    verdict, ev = thread.detect({"knobs": {"detail": detail}})
    assert verdict == ("absent" if mine == [0] else "present"), ev


def test_a_missed_nixl_handshake_is_retried_before_the_run_and_a_lasting_one_named():
    """D's first PD request (its NIXL handshake with P, 5 s in vLLM) goes before the run's,
    retried: a D that fails it once then answers is ready; one that always fails is named."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from types import SimpleNamespace

    from workbench.config import ExperimentConfig
    from workbench.releases.native import HANDSHAKE_TRIES, NativeSession

    seen = {"d": 0}

    def serve(role: str, fail_first: int):
        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                seen[role] = seen.get(role, 0) + 1
                bad = role == "d" and seen["d"] <= fail_first
                body = json.dumps({"kv_transfer_params": {"remote_block_ids": [[1]]}}).encode()
                self.send_response(500 if bad else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    cfg = ExperimentConfig.for_profile("cpu")
    for fails, ok in ((1, True), (HANDSHAKE_TRIES, False)):
        seen["d"] = 0
        p, d = serve("p", 0), serve("d", fails)
        fake = SimpleNamespace(servers={r: SimpleNamespace(url=f"http://127.0.0.1:{s.server_port}")
                                        for r, s in (("p", p), ("d", d))})
        try:
            if ok:
                NativeSession.handshake(fake, cfg)
                assert seen["d"] == 2
            else:
                with pytest.raises(RuntimeError, match="NIXL handshake"):
                    NativeSession.handshake(fake, cfg)
                assert seen["d"] == HANDSHAKE_TRIES
        finally:
            p.shutdown()
            d.shutdown()


def test_a_run_that_dies_in_vllm_stops_the_release_and_names_the_root_cause(tmp_path):
    """The runs after one that failed with an exception in a server log are not tried (the
    release cannot run the pipeline; each would restart the servers to fail again); a failure
    with no such exception (a timeout) lets the next run go."""
    class Dying:
        log_dir = tmp_path / "logs"

        def __init__(self):
            self.ran = []

        def run(self, cfg, out_dir=None, command=None):
            self.ran.append(out_dir.name)
            raise RuntimeError("the baseline server died during the run")

    f = FINDINGS["padded-load-step"]
    order = [(k, c) for k, c in ((check.key(c), c) for c in
                                 (history.plan_finding(FINDINGS[i], BASE).runs["main"]
                                  for i in ("padded-load-step", "unclipped-handoff")))]
    uses = {i: {"main": k} for i, (k, _) in zip(("padded-load-step", "unclipped-handoff"),
                                                order, strict=True)}
    Dying.log_dir.mkdir()
    s = Dying()
    done, broken = history.execute(s, order, uses, tmp_path / "out", "cmd", lambda m: None)
    assert broken is None and len(s.ran) == 2  # no exception in the logs: both tried
    (Dying.log_dir / "baseline.log").write_text(
        "(Worker pid=3) ERROR [x.py:1] TypeError: Cannot inspect kernel parameters for function\n")
    s = Dying()
    done, broken = history.execute(s, order, uses, tmp_path / "out", "cmd", lambda m: None)
    assert s.ran == [f"{f.id}-main"] and "TypeError: Cannot inspect kernel" in broken
    assert done.failed and not any(done.results.values())


def test_the_probe_channel_switches_the_observe_only_probe_per_run_and_reads_it_back(tmp_path):
    """The request-file protocol against the worker side's own ``kv_probe.serve`` (answered
    here by a loop as ``kv_probe._poll`` answers in a worker): a run with the probe switches
    it on and clears it, one without switches it off, and ``kv_probe`` in force is what the
    worker answered."""
    import os
    import threading

    from workbench.config import ExperimentConfig
    from workbench.knobs import kv_probe
    from workbench.provenance import atomic_write_json
    from workbench.serving import channels

    probe = kv_probe.PROBE
    saved = (probe.role, probe.observing, probe.enabled)
    stop = threading.Event()
    try:
        probe.role, probe.observing, probe.enabled = "p", True, False
        probe.records.append({"stale": True})
        atomic_write_json(tmp_path / f"p-worker-{os.getpid()}.json",
                          {"role": "p", "component": "worker", "pid": os.getpid()})

        def poll():
            while not stop.is_set():
                for path in tmp_path.glob(kv_probe.REQUEST_GLOB):
                    req = json.loads(path.read_text())
                    out = tmp_path / f"kvprobe-resp-{req['id']}-p-{os.getpid()}.json"
                    if not out.exists():
                        atomic_write_json(out, kv_probe.serve(req))
                stop.wait(0.02)

        threading.Thread(target=poll, daemon=True).start()
        ch = channels.ProbeChannel(tmp_path)
        on = ch.apply(ExperimentConfig.for_profile("cpu", kv_probe=True), {"p": None})
        assert on["p"]["kv_probe"] == "on" and probe.enabled and not probe.records
        assert on["p"]["block_handoff"].startswith("unknown") and on["channel"] == ch.name
        off = ch.apply(ExperimentConfig.for_profile("cpu"), {"p": None})
        assert off["p"]["kv_probe"] == "off" and not probe.enabled
    finally:
        stop.set()
        probe.role, probe.observing, probe.enabled = saved
        probe.records.clear()


def test_a_native_run_reads_back_only_live_workers_and_a_zombie_is_not_one(tmp_path):
    """One process check for the knob channel and native runs (``channel.pid_alive``): a
    worker that exited and was not reaped yet (a zombie) no longer counts."""
    import subprocess
    import time

    from workbench.knobs.channel import pid_alive
    from workbench.provenance import atomic_write_json
    from workbench.releases.native import NativeRelease

    child = subprocess.Popen(["true"])
    for _ in range(100):  # exited, not reaped: a zombie
        if Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    assert not pid_alive(child.pid)
    rel = NativeRelease("0.28.0", tmp_path / "python", False, tmp_path / "obs")
    atomic_write_json(tmp_path / "obs" / "observe-d" / "runner-1.json",
                      {"pid": child.pid, "runner": "v2"})
    assert rel.live_reports("runner-*.json") == {}
    child.wait()
