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
