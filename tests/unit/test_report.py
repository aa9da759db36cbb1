"""``check --report``'s writers on the committed records: pages and standalone reproductions
that name no machine path, say what a platform needs, and print each finding's own symptom."""

from __future__ import annotations

import json
import runpy
from types import SimpleNamespace

import pytest

from workbench import paths
from workbench.config import ExperimentConfig
from workbench.findings import FINDINGS, check, report

RELEASE = paths.DATA / "findings" / "host-buffer-chunk-boundary" / "check-release"
DEVBUILD = paths.DATA / "findings" / "host-buffer-chunk-boundary" / "check-devbuild"


def result(d, name: str) -> dict:
    return json.loads((d / "runs" / name / "result.json").read_text())


def script_namespace(text: str, tmp_path) -> dict:
    path = tmp_path / "repro.py"
    path.write_text(text)
    return runpy.run_path(str(path))  # defines everything, runs nothing (__name__ differs)


@pytest.mark.parametrize(("fid", "d"), [("host-buffer-chunk-boundary", RELEASE),
                                        ("chunked-prefill-drafter-kv", RELEASE),
                                        ("padded-load-step", DEVBUILD)])
def test_a_repro_names_no_machine_path_and_picks_its_ports_at_start(fid, d, tmp_path):
    res = result(d, f"{fid}-main")
    cfg = ExperimentConfig.from_dict(res["config"])
    text = report.standalone(FINDINGS[fid], cfg, res)
    assert str(paths.REPO) not in text and "/tmp/" not in text
    ns = script_namespace(text, tmp_path)
    assert ns["FINDING"] == fid and ns["SYMPTOM"] == FINDINGS[fid].symptom
    ports = {s["argv"][s["argv"].index("--port") + 1] for s in ns["SERVERS"]}
    assert ports == {"{port}"}
    assert all(s["env"].get("VLLM_NIXL_SIDE_CHANNEL_PORT", "{side_channel_port}")
               == "{side_channel_port}" for s in ns["SERVERS"])
    assert all("{target}" in s["argv"] for s in ns["SERVERS"])
    assert ns["PROMPTS"] == [r["prompt_token_ids"] for r in res["requests"]]


def functions(path, names=("free_port", "wait")) -> dict:
    import ast

    tree = ast.parse(path.read_text())
    return {n.name: ast.unparse(n) for n in tree.body
            if isinstance(n, ast.FunctionDef) and n.name in names}


@pytest.mark.parametrize("path", sorted(paths.DATA.rglob("*.repro.py")),
                         ids=lambda p: str(p.relative_to(paths.DATA)))
def test_a_committed_repro_picks_ports_and_waits_as_the_template_does(path):
    """The committed scripts were written by older templates; their port picking and their
    wait for the servers are the template's (a port from bind(0) was taken before D bound it)."""
    assert functions(path) == functions(report.TEMPLATE)


def test_a_repros_ports_lie_outside_the_kernels_ephemeral_range(tmp_path):
    from workbench.serving import ports

    ns = script_namespace(report.TEMPLATE.read_text(), tmp_path)
    picked = [ns["free_port"]() for _ in range(30)]
    assert all(p not in ports.ephemeral_range() and p >= 20000 for p in picked), picked


def test_a_repro_server_that_lost_its_port_fails_the_script_at_once(tmp_path, monkeypatch):
    """vLLM's NIXL handshake listener dies of a taken side-channel port in its own thread and
    the server never answers: the script says so instead of waiting out its 600 s."""
    import subprocess
    import sys
    import time

    ns = script_namespace(report.TEMPLATE.read_text(), tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repro-d.log").write_text(
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:50423')\n")
    hanging = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    t = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="taken before the server bound it"):
            ns["wait"]("d", "http://127.0.0.1:9", hanging, timeout=60)
    finally:
        hanging.kill()
        hanging.wait()
    assert time.monotonic() - t < 10


def test_the_host_staged_repro_needs_the_plugin_and_says_so(tmp_path):
    fid = "host-buffer-chunk-boundary"
    res = result(RELEASE, f"{fid}-main")
    cfg = ExperimentConfig.from_dict(res["config"])
    ns = script_namespace(report.standalone(FINDINGS[fid], cfg, res), tmp_path)
    # with the CPU profile's NIXL progress delay: idle host-staged workers otherwise spin
    assert ns["PLUGIN_ENV"] == {"WORKBENCH_TRANSFER": "host-staged",
                                "WORKBENCH_NIXL_PROGRESS_DELAY_US": "1000"}
    assert ns["PLUGIN_KNOBS"]["transfer"] == "host-staged"
    o = check.load(RELEASE).outcomes[0]
    page = report.page(FINDINGS[fid], o, SimpleNamespace(version="0.32.0", commit=None,
                                                         table_entry="0.32.0", source="table"),
                       res, "python -m workbench check", None)
    assert "vLLM alone cannot run this on the cpu profile" in page
    assert "WORKBENCH_TRANSFER=host-staged" in page
    gpu = page[page.index("On a GPU"):]
    assert '"kv_buffer_device": "cpu"' in gpu and "WORKBENCH" not in gpu.split("```")[1]
    assert "controls: positive: own run; negative: ok (absent)" in page
    assert str(paths.REPO) not in page


def test_an_untouched_vllm_repro_needs_no_plugin(tmp_path):
    res = result(DEVBUILD, "padded-load-step-main")
    cfg = ExperimentConfig.from_dict(res["config"])
    ns = script_namespace(report.standalone(FINDINGS["padded-load-step"], cfg, res), tmp_path)
    assert ns["PLUGIN_ENV"] == {} and ns["PLUGIN_KNOBS"] == {}
    assert "Without the workbench (vLLM untouched)" in "\n".join(report.reproduce(
        FINDINGS["padded-load-step"], cfg))


def row(d_drafts: int, b_drafts: int, same: bool, accepted: int = 5) -> dict:
    return {"d": {"drafts": d_drafts, "accepted": accepted}, "same_tokens": same,
            "baseline": {"drafts": b_drafts, "accepted": accepted}}


@pytest.mark.parametrize(("fid", "line"), [
    ("padded-load-step", "D counted 2 more drafts than the baseline over 2 requests"),
    ("host-buffer-chunk-boundary", "D's tokens differ from the baseline's in 1 of 2 requests"),
    ("chunked-prefill-drafter-kv", "its symptom is read inside vLLM's processes"),
])
def test_each_repro_prints_its_own_findings_symptom(fid, line, tmp_path):
    res = result(RELEASE if fid != "padded-load-step" else DEVBUILD, f"{fid}-main")
    cfg = ExperimentConfig.from_dict(res["config"])
    ns = script_namespace(report.standalone(FINDINGS[fid], cfg, res), tmp_path)
    got = ns["summary"]([row(10, 9, True), row(8, 7, False)])
    assert line in got
    assert ("more drafts than the baseline over" in got) == (fid == "padded-load-step")


def test_the_repro_finds_the_repositorys_models_from_its_own_location(tmp_path, monkeypatch):
    res = result(DEVBUILD, "padded-load-step-main")
    cfg = ExperimentConfig.from_dict(res["config"])
    text = report.standalone(FINDINGS["padded-load-step"], cfg, res)
    monkeypatch.delenv("WORKBENCH_MODELS", raising=False)
    inside = paths.DATA / "findings" / ".repro-test.py"
    try:
        inside.write_text(text)
        assert runpy.run_path(str(inside))["default_models"]() == paths.MODELS
    finally:
        inside.unlink(missing_ok=True)
    monkeypatch.setenv("WORKBENCH_MODELS", str(tmp_path))
    assert script_namespace(text, tmp_path)["default_models"]() == tmp_path


def test_the_summary_shows_own_run_controls_as_such(tmp_path):
    c = check.load(RELEASE)
    report.write_reports(tmp_path, c.outcomes, c.build, {}, {}, "python -m workbench check")
    summary = (tmp_path / "summary.md").read_text()
    assert "positive own run, negative ok" in summary and "positive ok" not in summary


def test_a_killed_repro_leaves_no_server_behind(tmp_path):
    """A reproduction SIGKILLed (a test's timeout, a closed terminal) has no clean-up of its
    own to run: each server it started gets SIGTERM from the kernel when it is gone."""
    import subprocess
    import sys

    import psutil

    res = result(DEVBUILD, "padded-load-step-main")
    text = report.standalone(FINDINGS["padded-load-step"], ExperimentConfig.from_dict(
        res["config"]), res)
    (tmp_path / "repro.py").write_text(text)
    (tmp_path / "owner.py").write_text(
        "import runpy, sys, time\n"
        "ns = runpy.run_path(sys.argv[1])\n"
        "server = {'role': 'p', 'argv': ['python', '-c', 'import time; time.sleep(300)'],"
        " 'env': {}}\n"
        "print(ns['start'](server, {}, {}).pid, flush=True)\n"
        "time.sleep(300)\n")
    owner = subprocess.Popen([sys.executable, "owner.py", "repro.py"], cwd=tmp_path,
                             stdout=subprocess.PIPE, text=True)
    server = psutil.Process(int(owner.stdout.readline()))
    assert server.is_running() and server.ppid() == owner.pid
    owner.kill()
    owner.wait()
    gone, alive = psutil.wait_procs([server], timeout=20)
    for p in alive:
        p.kill()
    assert gone and not alive


def test_a_repro_primes_d_with_the_prompts_the_run_primed_it_with(tmp_path):
    """``prefix-cache-drafter-kv`` needs D to have computed the short prompts itself before
    the PD requests (the run's ``prime_d``); a repro that skipped it showed nothing."""
    d = paths.DATA / "findings" / "prefix-cache-drafter-kv" / "check-release"
    res = result(d, "prefix-cache-drafter-kv-main")
    cfg = ExperimentConfig.from_dict(res["config"])
    ns = script_namespace(report.standalone(FINDINGS["prefix-cache-drafter-kv"], cfg, res),
                          tmp_path)
    primed = [i for i, r in enumerate(res["requests"]) if r.get("prime_d")]
    assert primed and ns["PRIME_D"] == primed
    host = result(RELEASE, "host-buffer-chunk-boundary-main")  # a run that primed nothing
    ns = script_namespace(report.standalone(FINDINGS["host-buffer-chunk-boundary"],
                                            ExperimentConfig.from_dict(host["config"]), host),
                          tmp_path)
    assert ns["PRIME_D"] == []


def test_a_report_says_its_severity_and_tabulates_acceptance_only_where_it_is_the_proof():
    """A finding read inside vLLM's processes (the KV probe) gets no acceptance table beside
    its evidence; one whose symptom is in the responses keeps it; each says its severity."""
    o = check.load(RELEASE).outcomes[0]
    build = SimpleNamespace(version="0.32.0", commit=None, table_entry="0.32.0", source="table")
    pages = {}
    for fid in ("chunked-prefill-drafter-kv", "host-buffer-chunk-boundary"):
        res = result(RELEASE, f"{fid}-main")
        pages[fid] = report.page(FINDINGS[fid], o, build, res, "python -m workbench check",
                                 None)
    inside, tokens = pages["chunked-prefill-drafter-kv"], pages["host-buffer-chunk-boundary"]
    assert "Severity: **acceptance only" in inside and "Severity: **changes tokens**" in tokens
    assert "is not tabulated" in inside
    assert "per-position acceptance" not in inside.split("## What")[0]
    assert "Expected: D's per-position acceptance" in tokens
    assert all(FINDINGS[f].severity for f in FINDINGS)
