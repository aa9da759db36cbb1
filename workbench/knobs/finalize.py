"""Knob ``finalize``: when the KV connector is finalized (worker process).

deferred: vLLM untouched (wait_for_save + clear_connector_metadata run after the drafter).
eager:    the old order: finalize right after the target forward, before the drafter, and
          the later finalize is a no-op for that step.

V1 model runner (``GPUModelRunner``/``CPUModelRunner``, both releases):
  ``KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(scheduler_output,
  defer_finalize)`` is forced to ``defer_finalize=False`` and the next
  ``KVConnectorModelRunnerMixin.finalize_kv_connector()`` is skipped.
Model Runner V2 in 0.33.0 (``vllm/v1/worker/gpu/kv_connector.py``): the same, in its own
  API: ``ActiveKVConnector.post_forward(finished_req_ids, defer_finalize)`` (called right
  after the target forward with ``defer_finalize=self.speculator is not None``) is forced to
  ``defer_finalize=False``, and that step's ``ActiveKVConnector.finalize_step()`` (called
  after the speculator proposed) is skipped.
Model Runner V2 in 0.32.0 (``post_forward(finished_req_ids)`` has no ``defer_finalize`` and
  there is no ``finalize_step``: it finalizes once per step, after the speculator proposed):
  ``pre_forward`` remembers the step's finished ids, ``finish_forward`` (right after the
  target forward) runs the whole ``post_forward`` when eager and keeps its output, and the
  later ``post_forward`` returns that output instead of finalizing again.

Which of these a release gets is its ``"finalize/<runner>"`` entry in ``release.RELEASES``;
only the patches for the runner vLLM chose are installed (decided in the worker once the
runner exists).
"""

from __future__ import annotations

from typing import Any

from . import _patch
from .component import Component, resolve, running
from .release import current
from .transfer import connector_worker

# pending_skips: steps whose deferral was forced off and whose later finalize is still due
_state = {"eager": False, "pending_skips": 0}
_NOTHING = object()

_MIXIN = "vllm.v1.worker.kv_connector_model_runner_mixin"
_MRV2 = "vllm.v1.worker.gpu.kv_connector"
V1_TARGETS = (
    (_MIXIN, "KVConnectorModelRunnerMixin", "maybe_get_kv_connector_output",
     ["scheduler_output", "defer_finalize"]),
    (_MIXIN, "KVConnectorModelRunnerMixin", "finalize_kv_connector", []),
    (_MIXIN, "KVConnectorModelRunnerMixin", "_get_kv_connector_output",
     ["scheduler_output", "defer_finalize"]),
)
# The order eager breaks: the runner defers finalize at the target forward and finalizes
# after drafting (GPUModelRunner.sample_tokens calls propose_draft_token_ids first).
V1_SOURCE = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.execute_model",
     ("defer_finalize=defer_kv_connector_finalize",)),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.sample_tokens",
     ("self.propose_draft_token_ids(", "self.finalize_kv_connector()")),
)
# 0.32.0: finish_forward right after the target forward, post_forward after the speculator.
V2_STASH_TARGETS = (
    (_MRV2, "ActiveKVConnector", "pre_forward",
     ["self", "scheduler_output", "input_batch", "attn_metadata"]),
    (_MRV2, "ActiveKVConnector", "finish_forward", ["self"]),
    (_MRV2, "ActiveKVConnector", "post_forward", ["self", "finished_req_ids"]),
)
V2_STASH_SOURCE = (
    (_MRV2, "ActiveKVConnector.post_forward", ("wait_for_save()", "clear_connector_metadata()")),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.execute_model",
     ("self.kv_connector.finish_forward()",)),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens",
     ("self.speculator.propose(",
      "kv_connector_output = self.kv_connector.post_forward(finished_req_ids)")),
)
# 0.33.0: post_forward(..., defer_finalize) after the target forward, finalize_step() after
# the speculator, only when post_forward deferred.
V2_DEFER_TARGETS = (
    (_MRV2, "ActiveKVConnector", "post_forward", ["self", "finished_req_ids", "defer_finalize"]),
    (_MRV2, "ActiveKVConnector", "finalize_step", ["self"]),
)
V2_DEFER_SOURCE = (
    (_MRV2, "ActiveKVConnector.post_forward",
     ("if not defer_finalize:", "wait_for_save()", "if not defer_finalize:",
      "clear_connector_metadata()")),
    (_MRV2, "ActiveKVConnector.finalize_step",
     ("wait_for_save()", "clear_connector_metadata()")),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner.sample_tokens",
     ("defer_kv_finalize = self.speculator is not None",
      "self.kv_connector.post_forward(", "defer_finalize=defer_kv_finalize",
      "self.speculator.propose(", "if defer_kv_finalize:",
      "self.kv_connector.finalize_step()")),
)


def _count(key: str) -> None:
    c = running("worker")
    if c is not None:
        c.bump("finalize", key)


def install_v1() -> None:
    from vllm.v1.worker.kv_connector_model_runner_mixin import (
        KVConnectorModelRunnerMixin as M,
    )

    def make_maybe(orig):
        def maybe_get_kv_connector_output(scheduler_output, defer_finalize: bool = False):
            if _state["eager"] and defer_finalize:
                defer_finalize = False
                _state["pending_skips"] += 1
                _count("eager_steps")
            return orig(scheduler_output, defer_finalize=defer_finalize)

        return maybe_get_kv_connector_output

    def make_finalize(orig):
        def finalize_kv_connector() -> None:
            if _state["pending_skips"] > 0:
                _state["pending_skips"] -= 1
                _count("finalize_skipped")
                return None
            return orig()

        return finalize_kv_connector

    _patch.patch(M, "maybe_get_kv_connector_output", make_maybe)
    _patch.patch(M, "finalize_kv_connector", make_finalize)


def install_v2_stash() -> None:
    """0.32.0's Model Runner V2: move the whole post_forward to finish_forward when eager."""
    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector as A

    def make_pre(orig):
        def pre_forward(self, scheduler_output, input_batch=None, attn_metadata=None):
            self._wb_finished_req_ids = getattr(scheduler_output, "finished_req_ids", set())
            return orig(self, scheduler_output, input_batch, attn_metadata)

        return pre_forward

    def make_finish(orig):
        def finish_forward(self):
            out = orig(self)
            if _state["eager"]:
                finished = getattr(self, "_wb_finished_req_ids", set())
                # The old order: finalize (save, results, clear metadata) before drafting.
                self._wb_eager_output = _patch.original(A, "post_forward")(self, finished)
                _count("eager_steps")
            return out

        return finish_forward

    def make_post(orig):
        def post_forward(self, finished_req_ids):
            stashed = getattr(self, "_wb_eager_output", _NOTHING)
            if stashed is not _NOTHING:
                del self._wb_eager_output
                _count("finalize_skipped")
                return stashed
            return orig(self, finished_req_ids)

        return post_forward

    _patch.patch(A, "pre_forward", make_pre)
    _patch.patch(A, "finish_forward", make_finish)
    _patch.patch(A, "post_forward", make_post)


def install_v2_defer(cls: type | None = None) -> None:
    """0.33.0's Model Runner V2: force ``defer_finalize`` off at ``post_forward`` and skip
    that step's ``finalize_step``, as the V1 patches do with the mixin's methods. ``cls``:
    ``ActiveKVConnector`` unless given (a test's stand-in where 0.33.0 is not installed)."""
    if cls is None:
        from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

        cls = ActiveKVConnector

    def make_post(orig):
        def post_forward(self, finished_req_ids, defer_finalize: bool = False):
            if _state["eager"] and defer_finalize:
                defer_finalize = False
                _state["pending_skips"] += 1
                _count("eager_steps")
            return orig(self, finished_req_ids, defer_finalize=defer_finalize)

        return post_forward

    def make_finalize_step(orig):
        def finalize_step(self) -> None:
            if _state["pending_skips"] > 0:
                _state["pending_skips"] -= 1
                _count("finalize_skipped")
                return None
            return orig(self)

        return finalize_step

    _patch.patch(cls, "post_forward", make_post)
    _patch.patch(cls, "finalize_step", make_finalize_step)


def install(comp: Component) -> None:
    """Only the patches for the runner vLLM chose (known once the worker has its runner),
    as this release's ``"finalize/<runner>"`` entry in ``release.RELEASES`` names them."""
    resolve(current().patch_set("finalize", comp.runner).install)()


def apply(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    value = knobs["finalize"]
    _state["eager"] = value == "eager"
    _state["pending_skips"] = 0
    events: dict[str, Any] = {"mode": value, "runner": comp.runner,
                              "eager_steps": 0, "finalize_skipped": 0}
    try:
        has_connector, w = connector_worker()
        if not has_connector:
            events["note"] = "no KV connector in this server: finalize timing has no effect"
        elif w is not None and not getattr(w, "use_host_buffer", False):
            events["note"] = ("NIXL without host staging reads the KV memory directly: "
                              "finalize timing changes nothing the transfer sees")
    except Exception as e:  # noqa: BLE001 - informational only
        events["note"] = f"could not inspect the KV connector: {e}"
    return value, events
