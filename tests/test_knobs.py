"""Pure, fast tests of the knob vocabulary, the control channel and the plugin's patch targets.

The patch-target tests read the installed vLLM's source (import + signature): they check
that every method the plugin patches exists with the parameters the plugin's wrappers
expect. The Model Runner V2 ones (``..._stands_in_for_gpu`` / ``test_mrv2_..._no_gpu``)
check source only: that runner needs a GPU (Triton) and cannot run here.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import threading
import time

import pytest

from workbench.knobs import control, spec

# --------------------------------------------------------------------------- vocabulary --


def test_validate_fills_defaults():
    assert spec.validate({}) == spec.defaults()
    assert spec.validate({"finalize": "eager"})["finalize"] == "eager"


def test_bad_value_names_value_and_allowed():
    with pytest.raises(ValueError) as e:
        spec.validate({"blocks": "filthy"})
    msg = str(e.value)
    assert "'filthy'" in msg and "blocks" in msg
    for v in spec.KNOBS["blocks"].values:
        assert v in msg


def test_warmup_dirty_source_needs_dirty_blocks():
    assert spec.validate({"blocks": "dirty", "dirty_source": "warmup"})["dirty_source"] == "warmup"
    for blocks in ("as-is", "zeroed", "poisoned"):
        with pytest.raises(ValueError, match=f"needs blocks='dirty', not '{blocks}'"):
            spec.validate({"blocks": blocks, "dirty_source": "warmup"})


def test_warmup_observation_on_mrv2_layout_stand_in_for_gpu_no_gpu():
    """Model Runner V2's start-up warm-up (GPU only) leaves KV in blocks 1 upward and zeroes
    block 0: the observation must see it and name the runner. A torch tensor in vLLM's
    layout stands in for the GPU runner's cache."""
    import types

    import torch

    from workbench.knobs import blocks, plugin

    MRV2 = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})
    runner = MRV2()
    kv = torch.zeros(2, 16, 32, 2, 8)  # (K/V, num_blocks, block_size, heads, head_dim)
    kv[:, 1:5].normal_()
    ns = types.SimpleNamespace
    runner.kv_cache_config = ns(num_blocks=16, kv_cache_groups=[ns(layer_names=["layers.0.attn"])])
    runner.compilation_config = ns(static_forward_context={"layers.0.attn": ns(kv_cache=[kv])})
    assert plugin.runner_kind(runner) == "v2"
    seen = blocks.observe(runner)
    assert seen["tensors"] == 1 and seen["diag_blocks"] == 15
    assert seen["nonzero_fraction"] == pytest.approx(4 / 15)
    note = blocks.warmup_note("v2", seen)
    assert "26.7%" in note and "Model Runner V2's start-up warm-up" in note
    kv.zero_()
    assert "hold zeros" in blocks.warmup_note("v2", blocks.observe(runner))


def test_bad_name_lists_knobs():
    with pytest.raises(ValueError) as e:
        spec.validate({"finalise": "eager"})
    assert "'finalise'" in str(e.value)
    for name in spec.KNOBS:
        assert name in str(e.value)


def test_parse_assignment():
    assert spec.parse_assignment("prefill_lookahead=0") == ("prefill_lookahead", "0")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        spec.parse_assignment("prefill_lookahead")
    with pytest.raises(ValueError, match="allowed values: default, 0"):
        spec.parse_assignment("prefill_lookahead=2")


def test_spec_names_and_env_unchanged():
    assert spec.ENV_CONTROL_FILE == "WORKBENCH_KNOBS_FILE"
    assert spec.ENV_STATE_DIR == "WORKBENCH_KNOBS_STATE_DIR"
    assert spec.ENV_ROLE == "WORKBENCH_ROLE"
    assert spec.ENV_TRANSFER == "WORKBENCH_TRANSFER"
    assert spec.restart_knobs() == ("transfer",)
    # every knob the server reports is owned by some component; double_bos is client-side
    owned = {k for ks in control.OWNED.values() for k in ks}
    assert owned | set(control.CLIENT_SIDE) == set(spec.KNOBS)


# ---------------------------------------------------------------------- control channel --


def test_control_round_trip(tmp_path):
    path = tmp_path / "knobs.json"
    doc = control.write_control(path, 3, {"finalize": "eager"}, seed=11)
    assert doc == {"version": 3, "knobs": {**spec.defaults(), "finalize": "eager"}, "seed": 11}
    assert control.read_control(path) == doc
    assert json.loads(path.read_text()) == doc
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was replaced, not left


def test_write_control_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="allowed values"):
        control.write_control(tmp_path / "k.json", 1, {"transfer": "rdma"}, 0)
    with pytest.raises(ValueError, match="version"):
        control.write_control(tmp_path / "k.json", 0, {}, 0)
    assert control.read_control(tmp_path / "k.json") is None


def _state(tmp_path, role, comp, version, pid=None, **kw):
    st = {"version": version, "role": role, "component": comp, "pid": pid or os.getpid(),
          "knobs": kw.pop("knobs", {}), "errors": kw.pop("errors", []), **kw}
    control.atomic_write_json(tmp_path / f"{role}-{comp}-{st['pid']}-{time.time_ns()}.json", st)


def test_wait_for_version_merges_roles(tmp_path):
    _state(tmp_path, "p", "engine_core", 2, knobs={"block_handoff": "legacy", "blocks": "zeroed",
                                                   "prefill_lookahead": "0", "transfer": "direct"})
    _state(tmp_path, "p", "worker", 2, knobs={"finalize": "eager", "blocks": "zeroed",
                                              "dirty_source": "noise", "transfer": "direct"})
    got = control.wait_for_version(tmp_path, 2, ["p"], timeout=1)
    assert got["p"]["knobs"] == {"finalize": "eager", "prefill_lookahead": "0",
                                 "block_handoff": "legacy", "blocks": "zeroed",
                                 "dirty_source": "noise", "transfer": "direct"}
    assert got["p"]["version"] == 2 and not got["p"]["disagreements"]
    assert set(got["p"]["components"]) == {"engine_core", "worker"}


def test_wait_for_version_timeout_names_missing(tmp_path):
    _state(tmp_path, "d", "engine_core", 5)
    _state(tmp_path, "d", "worker", 4)
    with pytest.raises(TimeoutError) as e:
        control.wait_for_version(tmp_path, 5, ["d", "p"], timeout=0.2, logs={"d": "/x/d.log"})
    msg = str(e.value)
    assert "d/worker" in msg and "version 4" in msg
    assert "p/engine_core" in msg and "p/worker" in msg
    assert "/x/d.log" in msg and "No state file at all for ['p']" in msg


def test_wait_for_version_ignores_dead_processes(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _state(tmp_path, "p", "engine_core", 1, pid=dead.pid)
    _state(tmp_path, "p", "worker", 1, pid=dead.pid)
    with pytest.raises(TimeoutError):
        control.wait_for_version(tmp_path, 1, ["p"], timeout=0.2)
    assert len(control.read_states(tmp_path, include_dead=True)) == 2


def test_wait_for_version_reports_apply_errors(tmp_path):
    _state(tmp_path, "d", "engine_core", 1)
    _state(tmp_path, "d", "worker", 1, errors=["blocks: RuntimeError: boom"])
    with pytest.raises(RuntimeError, match="boom"):
        control.wait_for_version(tmp_path, 1, ["d"], timeout=1)


def test_component_polls_and_acks(tmp_path, monkeypatch):
    """The plugin side without vLLM: a component with a fake applier picks up a new version."""
    ctl, sdir = tmp_path / "knobs.json", tmp_path / "state"
    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(ctl))
    monkeypatch.setenv(spec.ENV_STATE_DIR, str(sdir))
    monkeypatch.setenv(spec.ENV_ROLE, "d")
    monkeypatch.setattr("workbench.knobs.plugin.vllm_version", lambda: "0.32.0")
    seen: list[tuple[str, int]] = []

    def applier(comp, knobs, seed):
        seen.append((knobs["finalize"], seed))
        return {"finalize": knobs["finalize"]}, {"applied": True}

    comp = control.Component("worker", object(), [("finalize", applier)])
    comp.start()
    try:
        st = control.read_states(sdir)
        assert [(s["version"], s["knobs"]["finalize"]) for s in st] == [(0, "deferred")]
        control.write_control(ctl, 1, {"finalize": "eager"}, seed=5)
        got = control.wait_for_version(sdir, 1, ["d"], timeout=5, components=("worker",))
        assert got["d"]["knobs"]["finalize"] == "eager"
        assert seen[-1] == ("eager", 5)
        comp.bump("finalize", "eager_steps", 3)
        time.sleep(control.EVENT_FLUSH_S + 4 * control.POLL_S)
        (st,) = control.read_states(sdir)
        assert st["events"]["finalize"]["eager_steps"] == 3
    finally:
        comp._stop.set()
        comp._thread.join(2)


# ---------------------------------------------------------------------------- the plugin --


def test_register_does_nothing_without_control_file(monkeypatch):
    from workbench.knobs import _patch, plugin

    monkeypatch.delenv(spec.ENV_CONTROL_FILE, raising=False)
    before = list(_patch.PATCHED)
    plugin.register()
    assert _patch.PATCHED == before


def test_plugin_refuses_unsupported_vllm(monkeypatch, tmp_path):
    from workbench.knobs import plugin

    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(tmp_path / "k.json"))
    monkeypatch.setattr(plugin, "_installed", False)
    monkeypatch.setattr(plugin, "vllm_version", lambda: "0.31.2")
    with pytest.raises(RuntimeError) as e:
        plugin.register()
    msg = str(e.value)
    assert "0.31.2" in msg
    for v in plugin.SUPPORTED_VLLM:
        assert v in msg


def test_supported_versions():
    from workbench.knobs import plugin

    assert plugin.SUPPORTED_VLLM == ("0.32.0",)
    assert plugin.check_version("0.32.0") == "0.32.0"
    assert plugin.check_version("0.32.0+cpu") == "0.32.0+cpu"
    with pytest.raises(RuntimeError, match="0.32.0"):
        plugin.check_version("0.33.0")


# ----------------------------------------------------------------- patch targets (source) --

vllm = pytest.importorskip("vllm")


def _resolve(module: str, cls: str | None, name: str):
    mod = importlib.import_module(module)
    owner = getattr(mod, cls) if cls else mod
    assert name in (owner.__dict__ if cls else vars(mod)), f"{module}:{cls}.{name} is missing"
    return getattr(owner, name)


def _check(targets):
    for module, cls, name, expected in targets:
        fn = _resolve(module, cls, name)
        if expected is not None:
            got = list(inspect.signature(fn).parameters)
            assert got == expected, f"{module}:{cls}.{name} takes {got}, plugin expects {expected}"


def test_installed_vllm_is_supported():
    from workbench.knobs import plugin

    plugin.check_version()


def test_v1_finalize_targets():
    from workbench.knobs import finalize

    _check(finalize.V1_TARGETS)
    from vllm.v1.worker.kv_connector_model_runner_mixin import (
        KVConnectorModelRunnerMixin as M,
    )

    # both are static methods the runner calls through self
    for name in ("maybe_get_kv_connector_output", "finalize_kv_connector"):
        assert isinstance(M.__dict__[name], staticmethod)
    src = inspect.getsource(importlib.import_module("vllm.v1.worker.gpu_model_runner"))
    assert "defer_finalize=defer_kv_connector_finalize" in src
    assert "self.finalize_kv_connector()" in src
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert issubclass(CPUModelRunner, M)
    for name in ("maybe_get_kv_connector_output", "finalize_kv_connector"):
        assert all(name not in k.__dict__ for k in CPUModelRunner.__mro__ if k is not M)


def test_mrv2_finalize_targets_stand_in_for_gpu_no_gpu():
    """Model Runner V2 (GPU): 0.32.0's post_forward has no defer_finalize and there is no
    finalize_step; the plugin moves post_forward to finish_forward instead."""
    from workbench.knobs import finalize

    _check(finalize.V2_TARGETS)
    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

    assert not hasattr(ActiveKVConnector, "finalize_step")
    assert "defer_finalize" not in inspect.signature(ActiveKVConnector.post_forward).parameters
    src = inspect.getsource(ActiveKVConnector.post_forward)
    assert "wait_for_save()" in src and "clear_connector_metadata()" in src
    runner_src = inspect.getsource(importlib.import_module("vllm.v1.worker.gpu.model_runner"))
    # finish_forward right after the target forward; post_forward after the speculator
    assert "self.kv_connector.finish_forward()" in runner_src
    assert runner_src.index("self.speculator.propose(") < runner_src.rindex(
        "kv_connector_output = self.kv_connector.post_forward(finished_req_ids)")


def test_lookahead_and_handoff_targets():
    from workbench.knobs import handoff, lookahead

    _check(lookahead.TARGETS)
    _check(handoff.TARGETS)
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    assert "self.num_lookahead_tokens = vllm_config.num_lookahead_tokens" in inspect.getsource(
        Scheduler.__init__)
    src = inspect.getsource(KVCacheManager.get_block_ids_for_computed_tokens)
    assert "self.get_block_ids(request_id)" in src and "cdiv(num_computed_tokens" in src
    assert "get_block_ids_for_computed_tokens(" in inspect.getsource(Scheduler)


def test_blocks_targets():
    from workbench.knobs import blocks

    _check(blocks.ENGINE_TARGETS)
    _check(blocks.WORKER_TARGETS)
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    assert "self.needs_kv_cache_zeroing = " in inspect.getsource(Scheduler.__init__)
    assert "if not self.needs_kv_cache_zeroing" in inspect.getsource(
        Scheduler._get_new_block_ids_to_zero)
    assert "self._record_new_block_ids = " in inspect.getsource(SingleTypeKVCacheManager.__init__)
    # D: blocks an async connector load writes are not recorded for zeroing
    assert "skip_zeroing_group_ids=" in inspect.getsource(Scheduler)


def test_mrv2_blocks_targets_stand_in_for_gpu_no_gpu():
    from workbench.knobs import blocks

    _check(blocks.V2_WORKER_TARGETS)


def test_transfer_targets():
    from workbench.knobs import transfer

    _check(transfer.TARGETS)
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
        NixlBaseConnectorWorker,
    )

    src = inspect.getsource(NixlBaseConnectorWorker.set_host_xfer_buffer_ops)
    assert 'if self.device_type == "cpu":' in src  # why the plugin keeps the op itself
    from vllm.distributed.kv_transfer.kv_connector import utils

    src = inspect.getsource(utils.copy_kv_blocks)
    assert "current_platform.insert_blocks_to_device" in src
    assert "current_platform.swap_out_blocks_to_host" in src


def test_worker_and_runner_hooks():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    from workbench.knobs import plugin

    fn = Worker.initialize_from_config
    assert list(inspect.signature(fn).parameters) == ["self", "kv_cache_config"]
    assert "initialize_from_config" not in CPUWorker.__dict__
    assert "self.model_runner.initialize_kv_cache(" in inspect.getsource(fn)
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert plugin.runner_kind(object.__new__(CPUModelRunner)) == "v1"


def test_patch_helper_is_idempotent_and_reversible():
    from workbench.knobs import _patch

    class C:
        @staticmethod
        def s(x):
            return x

        def m(self, x):
            return x

    calls = []

    def make(orig):
        def w(*a):
            calls.append(a)
            return orig(*a)

        return w

    _patch.patch(C, "s", make)
    _patch.patch(C, "s", make)  # second time: no-op
    _patch.patch(C, "m", make)
    assert C.s(1) == 1 and C().m(2) == 2 and len(calls) == 2
    assert isinstance(C.__dict__["s"], staticmethod)
    assert _patch.PATCHED[-2:] == [_patch.target_name(C, "s"), _patch.target_name(C, "m")]
    for key in [(C, "s"), (C, "m")]:
        setattr(C, key[1], _patch._ORIGINALS.pop(key))
        _patch.PATCHED.remove(_patch.target_name(*key))
    assert not hasattr(C.s, "__workbench_patch__")


def test_control_thread_is_daemon(tmp_path, monkeypatch):
    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(tmp_path / "none.json"))
    monkeypatch.setenv(spec.ENV_STATE_DIR, str(tmp_path))
    monkeypatch.setattr("workbench.knobs.plugin.vllm_version", lambda: "0.32.0")
    comp = control.Component("engine_core", object(), [])
    comp.start()
    try:
        assert comp._thread.daemon and comp._thread in threading.enumerate()
        (st,) = control.read_states(tmp_path)
        assert st["version"] == 0 and st["component"] == "engine_core"
    finally:
        comp._stop.set()
        comp._thread.join(2)


@pytest.fixture()
def unpatch():
    from workbench.knobs import _patch, finalize

    yield
    _patch.unpatch_all()
    finalize._state.update(eager=False, pending_skips=0)


def test_v1_eager_finalize_wrappers(unpatch):
    """The V1 wrappers: eager forces defer_finalize=False and skips the matching finalize."""
    from vllm.v1.worker.kv_connector_model_runner_mixin import (
        KVConnectorModelRunnerMixin as M,
    )

    from workbench.knobs import finalize

    finalize.install_v1()
    finalize.install_v1()  # idempotent
    seen = []
    orig = M.__dict__["_get_kv_connector_output"]
    M._get_kv_connector_output = staticmethod(lambda so, defer_finalize=False: seen.append(defer_finalize))
    try:
        import vllm.v1.worker.kv_connector_model_runner_mixin as mixin

        mp = pytest.MonkeyPatch()
        mp.setattr(mixin, "has_kv_transfer_group", lambda: True)
        finalized = []
        mp.setattr(mixin, "get_kv_transfer_group",
                   lambda: type("C", (), {"wait_for_save": lambda s: finalized.append("save"),
                                          "clear_connector_metadata": lambda s: finalized.append("clear")})())
        finalize._state["eager"] = False
        M.maybe_get_kv_connector_output(object(), defer_finalize=True)
        M.finalize_kv_connector()
        assert seen == [True] and finalized == ["save", "clear"]
        finalize._state["eager"] = True
        M.maybe_get_kv_connector_output(object(), defer_finalize=True)
        M.finalize_kv_connector()
        assert seen == [True, False] and finalized == ["save", "clear"]  # skipped
        M.finalize_kv_connector()  # nothing pending: runs
        assert finalized == ["save", "clear", "save", "clear"]
        mp.undo()
    finally:
        M._get_kv_connector_output = orig


def test_mrv2_eager_order_on_fake_connector_no_gpu(unpatch):
    """Model Runner V2 wrappers on a fake connector: eager finalizes at finish_forward (before
    the speculator) and post_forward then returns that output without finalizing again."""
    from unittest import mock

    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

    from workbench.knobs import finalize

    finalize.install_v2()

    def make():
        a = object.__new__(ActiveKVConnector)
        a.kv_connector = mock.MagicMock()
        a._disabled = False
        a._pending_load_kwargs = None
        return a

    so = mock.MagicMock(has_sync_kv_loads=False, finished_req_ids={"r1"})
    for eager in (False, True):
        finalize._state["eager"] = eager
        a = make()
        a.pre_forward(so)
        a._pending_load_kwargs = None  # no load this step (avoids a forward context)
        a.finish_forward()
        at_finish = [c[0] for c in a.kv_connector.method_calls]
        out = a.post_forward({"r1"})
        after = [c[0] for c in a.kv_connector.method_calls][len(at_finish):]
        assert out is not None
        if eager:
            assert "wait_for_save" in at_finish and "clear_connector_metadata" in at_finish
            assert "wait_for_save" not in after and "clear_connector_metadata" not in after
            a.kv_connector.get_transfer_results.assert_called_once_with({"r1"})
        else:
            assert "wait_for_save" not in at_finish
            assert "wait_for_save" in after and "clear_connector_metadata" in after


# --- NIXL progress-thread delay (CPU profile) ----------------------------------------------

NIXL_PROBE = """
import json, sys
import nixl._api as api
from workbench.knobs import nixl_progress
assert nixl_progress.install(int(sys.argv[1]), api=api)
cfg = api.nixlBind.nixlAgentConfig()
cfg.pthrDelay = 0              # what nixl_agent.__init__ writes
zero = cfg.pthrDelay
cfg.pthrDelay = 7              # any other value passes through
agent = api.nixl_agent("probe", api.nixl_agent_config(num_threads=1))
print(json.dumps([zero, cfg.pthrDelay]))
"""


def test_nixl_progress_delay_reaches_the_real_agent_config():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NIXL_PROBE, "1000"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [1000, 7]


def test_nixl_progress_delay_env_is_checked(monkeypatch):
    from workbench.knobs import nixl_progress

    monkeypatch.setenv(spec.ENV_NIXL_PROGRESS_DELAY_US, "soon")
    with pytest.raises(ValueError, match="soon"):
        nixl_progress.requested_delay_us()
    monkeypatch.setenv(spec.ENV_NIXL_PROGRESS_DELAY_US, "1000")
    assert nixl_progress.requested_delay_us() == 1000


def test_cpu_profile_servers_get_the_delay_gpu_profiles_do_not(tmp_path):
    from workbench.config import ExperimentConfig
    from workbench.experiment import Session

    s = Session(tmp_path)
    envs = {r.role: r.env() for r in s.specs(ExperimentConfig(require_models=False))}
    assert envs["p"][spec.ENV_NIXL_PROGRESS_DELAY_US] == "1000"
    assert envs["d"][spec.ENV_NIXL_PROGRESS_DELAY_US] == "1000"
    assert spec.ENV_NIXL_PROGRESS_DELAY_US not in envs["baseline"]  # no connector, no NIXL
    gpu = ExperimentConfig.for_profile("gpu", require_models=False)
    assert all(spec.ENV_NIXL_PROGRESS_DELAY_US not in r.env() for r in s.specs(gpu))
