"""Every vLLM symbol the plugin patches, pinned against the installed vLLM's source.

Each test imports the installed vLLM and checks that the methods a mechanism's ``*_TARGETS``
tuple names exist with the parameters the wrappers expect, and the source lines the mechanism
relies on. The Model Runner V2 ones (``..._stand_in_for_gpu_no_gpu``) check source and run
wrappers on fake connectors only: that runner needs a GPU (Triton) and cannot run here.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

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
    from workbench.knobs import release

    release.check_version()


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

    from workbench.knobs import release

    fn = Worker.initialize_from_config
    assert list(inspect.signature(fn).parameters) == ["self", "kv_cache_config"]
    assert "initialize_from_config" not in CPUWorker.__dict__
    assert "self.model_runner.initialize_kv_cache(" in inspect.getsource(fn)
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert release.runner_kind(object.__new__(CPUModelRunner)) == "v1"


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
    M._get_kv_connector_output = staticmethod(
        lambda so, defer_finalize=False: seen.append(defer_finalize))
    try:
        import vllm.v1.worker.kv_connector_model_runner_mixin as mixin

        mp = pytest.MonkeyPatch()
        mp.setattr(mixin, "has_kv_transfer_group", lambda: True)
        finalized = []
        connector = type("C", (), {"wait_for_save": lambda s: finalized.append("save"),
                                   "clear_connector_metadata": lambda s: finalized.append("clear")})
        mp.setattr(mixin, "get_kv_transfer_group", lambda: connector())
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
