"""The knob ``runner`` without servers: its table entry, the environment each value gives a
server, the Triton backend Model Runner V2 needs on the CPU (through Triton's own entry-point
group, in a fresh interpreter), refusals by runner, and the read-back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from workbench.knobs import build, runner, spec, triton_cpu
from workbench.measuring import readout
from workbench.measuring.results import runner_by_role


def test_runner_is_a_restart_time_knob_of_every_role():
    k = spec.KNOBS["runner"]
    assert (k.values, k.default, k.roles, k.restart, k.env) == (
        ("v1", "v2"), "v1", spec.ROLES, True, "WORKBENCH_RUNNER")
    assert "runner" in spec.restart_knobs("baseline")  # the baseline runs D's runner
    assert spec.restart_env({**spec.defaults(), "runner": "v2"})["WORKBENCH_RUNNER"] == "v2"


def test_cpu_v1_leaves_the_server_environment_as_it_was():
    assert runner.server_env("v1", "cpu") == {}


def test_cpu_v2_puts_the_backend_first_and_keeps_the_users_pythonpath():
    env = runner.server_env("v2", "cpu", {"PYTHONPATH": "/my/vllm-build"})
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1" and env["TRITON_INTERPRET"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(triton_cpu.ENTRY_POINT_DIR),
                                                   "/my/vllm-build"]


def test_gpu_v2_is_vllms_default_and_v1_is_asked_for():
    assert runner.server_env("v2", "cuda") == {}
    assert runner.server_env("v1", "cuda") == {"VLLM_USE_V2_MODEL_RUNNER": "0"}


_PROBE = """
import json, os
from triton.backends import backends
from vllm.triton_utils import importing
import torch, triton, triton.language as tl

b = backends["cpu"]
out = {"has_triton": importing.HAS_TRITON,
       "classes": [b.compiler.__module__, b.driver.__module__]}


def add(x, y, out, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, tl.load(x + i, mask=i < n) + tl.load(y + i, mask=i < n), mask=i < n)


x, y, z = torch.arange(10.0), torch.full((10,), 0.5), torch.empty(10)
triton.jit(add)[(3,)](x, y, z, 10, BLOCK=4)  # TRITON_INTERPRET=1: the interpreter runs it
out["sum"] = z.tolist()
os.environ["TRITON_INTERPRET"] = "0"  # read when a kernel is made: this one is compiled
try:
    triton.jit(add)[(3,)](x, y, z, 10, BLOCK=4)
except Exception as e:
    out["compiled"] = str(e)
print(json.dumps(out))
"""


def test_vllm_in_this_process_sees_triton_as_installed():
    from triton.backends import backends
    from vllm.triton_utils import importing

    assert "cpu" not in backends and importing.HAS_TRITON is False


def test_a_v2_server_sees_the_backend_and_the_interpreter_runs_its_kernels(tmp_path):
    """In a fresh interpreter with a v2 server's environment (from a file: Triton's JIT reads
    the kernel's source): Triton finds the backend through its entry-point group, vLLM sets
    HAS_TRITON, the interpreter runs a kernel, and a compiled launch says what is missing."""
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "TRITON_INTERPRET", "VLLM_USE_V2_MODEL_RUNNER")}
    proc = subprocess.run([sys.executable, str(script)],
                          env={**base, **runner.server_env("v2", "cpu", {})},
                          capture_output=True, text=True, timeout=300, check=True)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["has_triton"] is True
    assert out["classes"] == ["workbench.knobs.triton_cpu.compiler",
                              "workbench.knobs.triton_cpu.driver"]
    assert out["sum"] == [i + 0.5 for i in range(10)]
    assert "TRITON_INTERPRET=1" in out["compiled"]


def _build(failures: dict[str, list[str]]) -> build.Build:
    return build.Build("0.32.0", "0.32.0", "table", 58, 59, None, failures)


def test_a_patch_set_of_one_runner_refuses_its_knob_on_that_runner_only():
    b = _build({"finalize/v2": ["x: missing"]})
    assert b.refused("v1") == {} and list(b.refused("v2")) == ["finalize"]
    eager = {**spec.defaults(), "finalize": "eager"}
    assert build.refusal(b, eager) is None
    why = build.refusal(b, {**eager, "runner": "v2"})
    assert "finalize=eager refused" in why and "x: missing" in why
    # a set for both runners refuses on both
    assert list(_build({"handoff": ["y"]}).refused("v2")) == ["block_handoff"]


def test_runner_v2_is_refused_where_its_targets_fail():
    b = _build({"runner/v2": ["vllm.v1.worker.cpu.model_runner:CPUModelRunner is missing"]})
    why = build.refusal(b, {**spec.defaults(), "runner": "v2"})
    assert "runner=v2 refused" in why and "CPUModelRunner" in why
    assert build.refusal(b, spec.defaults()) is None


def _worker(module: str, asked: str, monkeypatch) -> SimpleNamespace:
    monkeypatch.setenv(spec.ENV_RUNNER, asked)
    cls = type("CPUModelRunner", (), {"__module__": module})
    return SimpleNamespace(obj=SimpleNamespace(model_runner=cls()))


def test_the_runner_in_force_is_the_class_the_worker_built(monkeypatch):
    comp = _worker("vllm.v1.worker.cpu.model_runner", "v2", monkeypatch)
    value, events = runner.apply(comp, {}, 0)
    assert value == "v2"
    assert events["model_runner_class"] == "vllm.v1.worker.cpu.model_runner:CPUModelRunner"


def test_a_worker_that_fell_back_to_v1_fails_the_run(monkeypatch):
    comp = _worker("vllm.v1.worker.cpu_model_runner", "v2", monkeypatch)
    with pytest.raises(RuntimeError, match="runner=v2 was asked for.*cpu_model_runner"):
        runner.apply(comp, {}, 0)


def test_result_and_readout_name_each_roles_runner():
    states = {"p": {"runner": "v2"}, "d": {"runner": "v2"}, "baseline": {"runner": "v2"},
              "requested": {"runner": "v2"}}
    by_role = runner_by_role(states)
    assert by_role == {"p": "v2", "d": "v2", "baseline": "v2"}
    line = readout.runner_line(by_role)
    assert line.strip() == "runner: p v2, d v2, baseline v2 (read back from the workers)"
    assert runner_by_role({"p": {}, "d": None}) is None


# --------------------------------------------- the runner through profiles, check, fuzz --

def test_each_profile_starts_from_the_runner_vllm_runs_there_and_a_knob_wins():
    from workbench.config import ExperimentConfig

    assert ExperimentConfig.for_profile("cpu").knobs["runner"] == "v1"
    gpu = ExperimentConfig.for_profile("gpu", require_models=False)
    assert gpu.knobs["runner"] == "v2"  # vLLM's default wherever Triton is
    v1 = ExperimentConfig.for_profile("gpu", require_models=False, knobs={"runner": "v1"})
    assert v1.knobs["runner"] == "v1" and v1.knobs["connector"] == "nixl"


def test_the_baseline_cache_never_hands_an_mrv2_run_a_v1_baseline(tmp_path):
    from dataclasses import replace

    from workbench.config import ExperimentConfig
    from workbench.measuring.baseline_cache import BaselineCache

    cache, cfg, ids = BaselineCache(tmp_path), ExperimentConfig(), [[1, 2, 3]]
    v2 = replace(cfg, knobs={**cfg.knobs, "runner": "v2"})
    assert cache.path(cfg, ids) != cache.path(v2, ids)


def test_check_runs_every_finding_on_the_runner_asked_for_and_judges_it_by_its_own(tmp_path):
    from workbench.config import ConfigError
    from workbench.findings import check

    order, _, _ = check.plan(check.select(None), check.check_base("cpu", "nixl", "v2"), False)
    assert order and all(cfg.knobs["runner"] == "v2" for _, cfg in order)
    assert check.check_base("cpu", "nixl", None)["knobs"]["runner"] == "v1"
    with pytest.raises(ConfigError, match="--runner: knob runner='v3' is not allowed"):
        check.check_base("cpu", "nixl", "v3")
    f = tmp_path / "e.json"
    f.write_text(json.dumps({"findings": {"a": "present"}, "optional": ["b"],
                             "runners": {"v2": {"findings": {"a": "absent"}}}}))
    assert check.expectations(f, "x", "nixl", "v1")[1]["findings"] == {"a": "present"}
    assert check.expectations(f, "x", "nixl", "v2")[1] == {"optional": ["b"],
                                                          "findings": {"a": "absent"}}


def test_the_runner_table_tells_checks_apart_by_runner(tmp_path):
    from workbench.findings import connector_table

    for name, doc in (("old", {}), ("new", {"runner": "v2"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "check.json").write_text(json.dumps({
            **doc, "command": "c", "created": "t", "build": {"version": "0.32.0"}, "ok": True,
            "findings": [{"id": "padded-load-step", "verdict": "present",
                          "expected": "present", "seconds": 1.0, "evidence": {}}]}))
    docs = connector_table.load([tmp_path / "old", tmp_path / "new"], by="runner")
    assert list(docs) == ["v1", "v2"]  # a check from before the field ran the V1 runner
    page = tmp_path / "check.md"
    page.write_text("# Check\n")
    connector_table.write_into(page, connector_table.markdown(docs), by="runner")
    assert "<!-- check-runners: begin -->" in page.read_text()
    assert connector_table.BEGIN not in page.read_text()


def test_fuzz_shapes_vary_the_runner_and_old_cases_keep_their_hash():
    from workbench.config import ConfigError
    from workbench.fuzz.space import Space

    shapes = Space(runner=("v1", "v2")).shapes(0)
    assert "runner" not in shapes[0]  # the V1 runner: as recorded before the field existed
    assert {s.get("runner", "v1") for s in shapes} == {"v1", "v2"}
    with pytest.raises(ConfigError, match="runner"):
        Space(knobs={"runner": "v2"})
    with pytest.raises(ConfigError, match="allowed: v1, v2"):
        Space(runner=("v3",))


def test_the_runners_grid_runs_each_runner_once_v1_first():
    from workbench.notebook import sweep

    runners = [p.knobs["runner"] for p in sweep.grid_points("runners")]
    assert runners == sorted(runners) and set(runners) == {"v1", "v2"}


def test_a_report_on_mrv2_names_the_runner_and_its_script_finds_the_backend():
    from workbench.config import ExperimentConfig
    from workbench.findings import report

    cfg = ExperimentConfig.for_profile("cpu", knobs={"runner": "v2"})
    assert report.runner_flag(cfg) == " --runner v2"
    assert report.runner_flag(ExperimentConfig.for_profile("cpu")) == ""
    for s in report.servers(cfg):
        assert s["env"]["PYTHONPATH"] == "{triton_cpu}"  # no path of this machine
        assert s["env"]["VLLM_USE_V2_MODEL_RUNNER"] == s["env"]["TRITON_INTERPRET"] == "1"
    assert report.plugin_env(cfg) == {}  # vLLM's own variable: no plugin needed for it
    line = report.runner_line({"p": "v2", "d": "v2", "baseline": "v2"})[0]
    assert "Model Runner V2" in line and "interpreter" in line


def test_the_warmup_note_names_the_runner_that_ran():
    from workbench.knobs import notes

    k = {**spec.defaults(), "blocks": "dirty", "dirty_source": "warmup"}
    v1 = notes.knob_notes(k, device="cpu", prompt_set="indomain", enforce_eager=True)
    v2 = notes.knob_notes({**k, "runner": "v2"}, device="cpu", prompt_set="indomain",
                          enforce_eager=True)
    assert any(notes.WARMUP_CPU in n for n in v1) and not any(notes.WARMUP_CPU in n for n in v2)
    assert any(notes.WARMUP_CPU_V2 in n for n in v2)
