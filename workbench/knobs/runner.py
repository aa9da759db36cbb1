"""Knob ``runner``: which of vLLM's model runners the servers run.

v1: the V1 model runner (``vllm/v1/worker/gpu_model_runner.py``; on the CPU
    ``CPUModelRunner`` of ``vllm/v1/worker/cpu_model_runner.py``). On a GPU it takes
    ``VLLM_USE_V2_MODEL_RUNNER=0``; on the CPU nothing, since without a Triton CPU backend it
    is what vLLM runs (the servers' environment stays as before the knob existed). vLLM
    0.34.0 removed it.
v2: Model Runner V2 (``vllm/v1/worker/gpu/model_runner.py``; on the CPU ``CPUModelRunner`` of
    ``vllm/v1/worker/cpu/model_runner.py``, chosen in ``CPUWorker.init_device`` when
    ``use_v2_model_runner``). What vLLM selects on a GPU by default wherever Triton is present
    (``VllmConfig.use_v2_model_runner``). On the CPU it needs a Triton backend named ``cpu``
    (``vllm/triton_utils/importing.py``); the workbench's (``triton_cpu``) runs each kernel in
    Triton's interpreter.

Restart-time: the runner is built once, when the worker starts. The server's environment
carries the choice (:func:`server_env`); inside vLLM the knob changes nothing and only reads
back the runner class the worker built, so a server whose runner differs from the one asked
for fails its run instead of measuring the wrong runner. The baseline runs D's runner.
"""

from __future__ import annotations

import os
from typing import Any

from . import spec, triton_cpu
from .component import Component
from .release import runner_for, runner_kind
from .triton_cpu import standins

# What runner=v2 relies on: the environment variable decides before Triton does, and the
# CPU worker builds MRV2's CPUModelRunner when it is on.
V2_TARGETS = (
    ("vllm.config.vllm", "VllmConfig", "use_v2_model_runner", None),  # a property
    ("vllm.v1.worker.cpu.model_runner", None, "CPUModelRunner", None),
)
V2_SOURCE = (
    ("vllm.config.vllm", "VllmConfig.use_v2_model_runner",
     ("use_v2_model_runner = envs.VLLM_USE_V2_MODEL_RUNNER",
      "if use_v2_model_runner is not None:", "return use_v2_model_runner")),
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device",
     ("if self.use_v2_model_runner:", "CPUModelRunner as CPUModelRunnerV2")),
)
# 0.34.0 removed the V1 runner: CPUWorker builds MRV2's CPUModelRunner (on x86 the Triton one;
# the standalone no-Triton runner is for other CPUs), and VLLM_USE_V2_MODEL_RUNNER=1 is only
# warned about (Platform.validate_environ).
V2_ONLY_TARGETS = (("vllm.v1.worker.cpu.model_runner", None, "CPUModelRunner", None),)
V2_ONLY_SOURCE = (
    ("vllm.v1.worker.cpu_worker", "CPUWorker.init_device",
     ("if current_platform.uses_standalone_cpu_model_runner():",
      "self.model_runner = CPUModelRunner(self.vllm_config, self.device)")),
)


def requested() -> str:
    """The runner this server was started for; unset, the release's (V1 where it has one)."""
    return os.environ.get(spec.ENV_RUNNER) or runner_for(spec.KNOBS["runner"].default)


def server_env(value: str, device: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a server run ``value`` on ``device``. GPU: v2 is vLLM's
    default, v1 is ``VLLM_USE_V2_MODEL_RUNNER=0``. CPU: v1 is vLLM's fallback and needs
    nothing; v2 needs ``VLLM_USE_V2_MODEL_RUNNER=1``, the Triton backend and its interpreter
    (``triton_cpu.server_env``; ``base``: the environment whose ``PYTHONPATH`` it extends)."""
    if device != "cpu":
        return {"VLLM_USE_V2_MODEL_RUNNER": "0"} if value == "v1" else {}
    if value == "v1":
        return {}
    return {"VLLM_USE_V2_MODEL_RUNNER": "1", **triton_cpu.server_env(base)}


def apply(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    """The runner in force is the class the worker built, whatever was asked."""
    mr = comp.obj.model_runner
    in_force = runner_kind(mr)
    events = {"model_runner_class": f"{type(mr).__module__}:{type(mr).__qualname__}",
              "asked": requested(), "triton_interpret": os.environ.get("TRITON_INTERPRET"),
              "triton_standins": standins.requested()}
    if in_force != requested():
        raise RuntimeError(f"runner={requested()} was asked for, but the worker built "
                           f"{events['model_runner_class']} ({in_force}): see the server log "
                           "for vLLM's reason (Triton backend, unsupported features)")
    return in_force, events
