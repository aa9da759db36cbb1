"""Every vLLM symbol the plugin patches, pinned against the installed vLLM's source.

Each test imports the installed vLLM and checks, for the installed release's entry in
``workbench/knobs/release.RELEASES``, that the methods a mechanism's ``*_TARGETS`` tuple names
exist with the parameters the wrappers expect and that the source facts of its ``*_SOURCE``
tuple (call orders included) hold, through vLLM's own imports (``tests/pins/test_compat.py``
runs the same table through ``compat``'s static reader); every patch set of the entry is
pinned (``test_every_patch_set_of_the_installed_release_is_pinned``). The Model Runner V2 ones
(``..._stand_in_for_gpu_no_gpu``) check source and run wrappers on fake connectors; the live
tests run MRV2 on the CPU through Triton's interpreter (knob ``runner``,
``tests/servers/test_runners.py``); 0.33.0's, not installed, runs on a stand-in checked
against 0.33.0's wheel where ``make compat`` cached it.
"""

from __future__ import annotations

import importlib
import inspect
import re

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


def _source(facts):
    """Each snippet in the function's source, each after the one before it."""
    for module, qual, snippets in facts:
        owner = importlib.import_module(module)
        for part in qual.split("."):
            owner = getattr(owner, part)
        owner = owner.fget if isinstance(owner, property) else owner
        src, at = inspect.getsource(owner), 0
        for snippet in snippets:
            at = src.find(snippet, at)
            assert at >= 0, f"{module}:{qual}: {snippet!r} not found after the one before it"
            at += len(snippet)


def _pin(mechanism: str, runner: str | None = None):
    """The installed release's patch set: its targets and its source facts."""
    from workbench.knobs import release
    from workbench.knobs.component import resolve

    ps = release.current().patch_set(mechanism, runner)
    _check(resolve(ps.targets))
    if ps.source:
        _source(resolve(ps.source))
    return ps


def test_installed_vllm_is_supported():
    from workbench.knobs import release

    release.check_version()


def test_v1_finalize_targets():
    _pin("finalize", "v1")
    from vllm.v1.worker.kv_connector_model_runner_mixin import (
        KVConnectorModelRunnerMixin as M,
    )

    # both are static methods the runner calls through self
    for name in ("maybe_get_kv_connector_output", "finalize_kv_connector"):
        assert isinstance(M.__dict__[name], staticmethod)
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert issubclass(CPUModelRunner, M)
    for name in ("maybe_get_kv_connector_output", "finalize_kv_connector"):
        assert all(name not in k.__dict__ for k in CPUModelRunner.__mro__ if k is not M)


def test_mrv2_finalize_targets_stand_in_for_gpu_no_gpu():
    """Model Runner V2 (GPU): the installed release's mechanism. 0.32.0's post_forward has no
    defer_finalize and there is no finalize_step, so the plugin moves post_forward to
    finish_forward; 0.33.0 has both, and the plugin forces defer_finalize off instead."""
    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

    from workbench.knobs import finalize
    from workbench.knobs.component import resolve

    ps = _pin("finalize", "v2")
    has_defer = "defer_finalize" in inspect.signature(ActiveKVConnector.post_forward).parameters
    assert has_defer == hasattr(ActiveKVConnector, "finalize_step")
    want = finalize.install_v2_defer if has_defer else finalize.install_v2_stash
    assert resolve(ps.install) is want


def test_lookahead_and_handoff_targets():
    _pin("lookahead")
    _pin("handoff")


def test_blocks_targets():
    # engine: the gated zeroing; D skips blocks an async connector load writes
    _pin("blocks", "engine")
    _pin("blocks", "v1")


def test_mrv2_blocks_targets_stand_in_for_gpu_no_gpu():
    _pin("blocks", "v2")


def test_transfer_targets():
    _pin("transfer")


def _patch_set_keys() -> list[str]:
    from workbench.knobs import release

    return sorted(release.current().patches)


@pytest.mark.parametrize("key", _patch_set_keys())
def test_every_patch_set_of_the_installed_release_is_pinned(key):
    """The table's every entry for the installed release, the ones named above and any added
    later: its targets and source facts hold through vLLM's own imports."""
    mechanism, _, runner = key.partition("/")
    _pin(mechanism, runner or None)


def test_worker_and_runner_hooks():
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.gpu_worker import Worker

    from workbench.knobs import release

    _pin("plugin")
    assert "initialize_from_config" not in CPUWorker.__dict__
    assert Worker.initialize_from_config is CPUWorker.initialize_from_config
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert release.runner_kind(object.__new__(CPUModelRunner)) == "v1"


def test_observe_only_instruments_targets():
    """What the observe-only instruments check in each process before they patch
    (``cpu_pin.observe``, ``kv_probe.observe``) holds on the installed release."""
    from workbench.knobs import cpu_pin, kv_probe

    _check(cpu_pin.OBSERVE_TARGETS + cpu_pin.TARGETS + kv_probe.WORKER_TARGETS)
    _source(cpu_pin.OBSERVE_SOURCE + cpu_pin.SOURCE + kv_probe.SOURCE)


def test_fork_start_targets():
    """What the forked start patches (``knobs/fork_start.py``: the CPU platform's spawn, and
    the OpenMP variables vLLM sets around a worker's start) holds on the installed release."""
    from workbench.knobs import fork_start

    _check(fork_start.TARGETS)
    _source(fork_start.SOURCE)


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

    finalize.install_v2_stash()

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


class _Mrv2Connector033:
    """A stand-in with 0.33.0's ``ActiveKVConnector`` finalize API (vllm/v1/worker/gpu/
    kv_connector.py; the compat record pins the real one): post_forward finalizes unless it
    defers, finalize_step finalizes."""

    def __init__(self, calls):
        self.calls = calls

    def post_forward(self, finished_req_ids, defer_finalize=False):
        if not defer_finalize:
            self.calls += ["wait_for_save", "clear_connector_metadata"]
        return {"finished": finished_req_ids}

    def finalize_step(self):
        self.calls += ["wait_for_save", "clear_connector_metadata"]


def _step_033(conn, calls):
    """0.33.0's GPUModelRunner.sample_tokens order, with a speculator."""
    out = conn.post_forward({"r1"}, defer_finalize=True)
    calls.append("speculator.propose")
    conn.finalize_step()
    return out


def test_mrv2_033_eager_forces_defer_off_and_skips_finalize_step_no_gpu(unpatch):
    """0.33.0's Model Runner V2: eager finalizes in post_forward, before the speculator, and
    skips that step's finalize_step; deferred leaves vLLM's order alone."""
    from workbench.knobs import finalize

    finalize.install_v2_defer(_Mrv2Connector033)
    for eager, want in ((False, ["speculator.propose", "wait_for_save",
                                 "clear_connector_metadata"]),
                        (True, ["wait_for_save", "clear_connector_metadata",
                                "speculator.propose"])):
        finalize._state.update(eager=eager, pending_skips=0)
        calls: list[str] = []
        conn = _Mrv2Connector033(calls)
        assert _step_033(conn, calls) == {"finished": {"r1"}}
        assert calls == want
        assert finalize._state["pending_skips"] == 0
    calls = []
    _Mrv2Connector033(calls).post_forward({"r1"})  # no_forward's call: nothing forced
    assert calls == ["wait_for_save", "clear_connector_metadata"]


def _calls_of(text: str, guard: str = "") -> list[str]:
    """The ``self.kv_connector.<method>(`` calls in a function's text (those right under
    ``guard`` when given), in order."""
    return re.findall(re.escape(guard) + r"\s*self\.kv_connector\.(\w+)\(", text)


def _in_order(text: str, snippets: list[str]) -> bool:
    at = 0
    for snippet in snippets:
        at = text.find(snippet, at)
        if at < 0:
            return False
        at += len(snippet)
    return True


def test_the_033_stand_in_is_vllm_033s_class_no_gpu():
    """``_Mrv2Connector033`` and ``_step_033`` model 0.33.0's ActiveKVConnector and
    GPUModelRunner.sample_tokens; checked here against 0.33.0's own source, read from the
    wheel ``make compat`` caches (skipped where it has not run): the same parameters, the same
    connector calls with and without defer_finalize, and the runner's call order."""
    from workbench.compat import CACHE
    from workbench.knobs.source import WheelSource, def_text, find_def, params

    wheels = sorted(CACHE.glob("vllm-0.33.0-*.whl"))
    if not wheels:
        pytest.skip(f"no vLLM 0.33.0 wheel in {CACHE}: `make compat` downloads it")
    src = WheelSource(wheels[-1])

    def real(module: str, qual: str):
        found = find_def(src, module, qual)
        assert found is not None, f"0.33.0 has no {module}:{qual}"
        return found[0], def_text(src, *found)

    kv = "vllm.v1.worker.gpu.kv_connector"
    for name in ("post_forward", "finalize_step"):
        node, _ = real(kv, f"ActiveKVConnector.{name}")
        model = list(inspect.signature(getattr(_Mrv2Connector033, name)).parameters)
        assert params(node) == model, f"{name}: vLLM {params(node)}, stand-in {model}"
    _, post = real(kv, "ActiveKVConnector.post_forward")
    _, fin = real(kv, "ActiveKVConnector.finalize_step")
    for defer in (False, True):
        calls: list[str] = []
        _Mrv2Connector033(calls).post_forward({"r1"}, defer_finalize=defer)
        assert calls == ([] if defer else _calls_of(post, "if not defer_finalize:")), defer
    calls = []
    _Mrv2Connector033(calls).finalize_step()
    assert calls == _calls_of(fin)

    _, step = real("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens")
    assert _in_order(step, ["defer_kv_finalize = self.speculator is not None",
                            "self.kv_connector.post_forward(",
                            "defer_finalize=defer_kv_finalize", "self.speculator.propose(",
                            "if defer_kv_finalize:", "self.kv_connector.finalize_step()"])
    assert _in_order(inspect.getsource(_step_033), [
        "conn.post_forward(", "defer_finalize=True", "speculator.propose",
        "conn.finalize_step()"])


def test_mrv2_defer_wrappers_on_the_installed_active_kv_connector_no_gpu(unpatch):
    """Where the installed release's MRV2 has finalize_step (0.33.0): the real
    ActiveKVConnector.post_forward / finalize_step under the wrappers, on a fake connector.
    Eager: wait_for_save and clear_connector_metadata run in post_forward (before the
    speculator), and finalize_step does nothing that step."""
    from unittest import mock

    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

    from workbench.knobs import finalize

    if not hasattr(ActiveKVConnector, "finalize_step"):
        pytest.skip("this release's MRV2 has no finalize_step (0.32.0): the stand-in covers it")
    finalize.install_v2_defer()
    for eager in (False, True):
        finalize._state.update(eager=eager, pending_skips=0)
        a = object.__new__(ActiveKVConnector)
        a.kv_connector, a._disabled, a._pending_load_kwargs = mock.MagicMock(), False, None
        a.post_forward({"r1"}, defer_finalize=True)
        at_post = [c[0] for c in a.kv_connector.method_calls]
        a.finalize_step()
        after = [c[0] for c in a.kv_connector.method_calls][len(at_post):]
        finalizing = {"wait_for_save", "clear_connector_metadata"}
        assert finalizing <= set(at_post) if eager else not finalizing & set(at_post)
        assert not finalizing & set(after) if eager else finalizing <= set(after)


def test_each_triton_stand_in_mirrors_the_installed_kernel_text():
    """A stand-in (``knobs/triton_cpu/kernels.py``) is used only for the kernel text it was
    checked against; a vLLM whose kernel or helper text changed fails here first."""
    from workbench.knobs.triton_cpu import kernels

    for name, entry in kernels.STANDINS.items():
        module, kernel = name.split(":")
        fn = getattr(importlib.import_module(module), kernel)
        assert kernels.source_sha256(getattr(fn, "fn", fn), entry.helpers) == entry.sha256, name
