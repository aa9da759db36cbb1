"""Knob ``finalize``: when the KV connector is finalized (worker process).

deferred: vLLM untouched (wait_for_save + clear_connector_metadata run after the drafter).
eager:    the old order: finalize right after the target forward, before the drafter, and
          the later finalize is a no-op for that step.

V1 model runner (``GPUModelRunner``/``CPUModelRunner``):
  ``KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(scheduler_output,
  defer_finalize)`` is forced to ``defer_finalize=False`` and the next
  ``KVConnectorModelRunnerMixin.finalize_kv_connector()`` is skipped.
Model Runner V2 (GPU only; 0.32.0's ``ActiveKVConnector.post_forward(finished_req_ids)``
  has no ``defer_finalize`` and no ``finalize_step``: it finalizes once per step, after the
  speculator proposed): ``pre_forward`` remembers the step's finished ids,
  ``finish_forward`` (right after the target forward) runs the whole ``post_forward`` when
  eager and keeps its output, and the later ``post_forward`` returns that output instead
  of finalizing again.

Only the patches for the runner vLLM chose are installed (decided in the worker once the
runner exists).
"""

from __future__ import annotations

from typing import Any

from . import _patch
from .component import Component, running
from .transfer import connector_worker

# pending_skips: steps whose deferral was forced off and whose later finalize is still due
_state = {"eager": False, "pending_skips": 0}
_NOTHING = object()

V1_TARGETS = (
    ("vllm.v1.worker.kv_connector_model_runner_mixin", "KVConnectorModelRunnerMixin",
     "maybe_get_kv_connector_output", ["scheduler_output", "defer_finalize"]),
    ("vllm.v1.worker.kv_connector_model_runner_mixin", "KVConnectorModelRunnerMixin",
     "finalize_kv_connector", []),
    ("vllm.v1.worker.kv_connector_model_runner_mixin", "KVConnectorModelRunnerMixin",
     "_get_kv_connector_output", ["scheduler_output", "defer_finalize"]),
)
V2_TARGETS = (
    ("vllm.v1.worker.gpu.kv_connector", "ActiveKVConnector", "pre_forward",
     ["self", "scheduler_output", "input_batch", "attn_metadata"]),
    ("vllm.v1.worker.gpu.kv_connector", "ActiveKVConnector", "finish_forward", ["self"]),
    ("vllm.v1.worker.gpu.kv_connector", "ActiveKVConnector", "post_forward",
     ["self", "finished_req_ids"]),
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


def install_v2() -> None:
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


def install(comp: Component) -> None:
    """Only the patches for the runner vLLM chose (known once the worker has its runner)."""
    if comp.runner == "v2":
        install_v2()
    else:
        install_v1()


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
