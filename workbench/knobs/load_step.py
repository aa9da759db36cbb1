"""Knob ``load_step``: the scheduler's spec-decode padding on a request's external-KV-load step
(engine core, D). Upstream's open fix, as a knob, so its effect is seen before it merges.

as-released: vLLM untouched. ``Scheduler.schedule`` pads a new request whose next step computes
             one token to ``1 + num_spec_tokens`` rows of placeholder drafts (``pad_spec_decode``,
             for a uniform CUDA-graph shape). On D that is the first step after NIXL's
             asynchronous load lands (``Scheduler._update_waiting_for_remote_kv`` leaves
             ``num_computed_tokens = num_tokens - 1``): D counts ``num_spec_tokens`` drafts, all
             rejected, that the baseline never makes.
gated:       vLLM PR #50173 (open, "Skip spec-decode block reservation on the external-KV-load
             step (P/D)"), as written: on a scheduling pass where the connector reports a
             *synchronous* external hit (``get_num_new_matched_tokens`` -> ``(n > 0, False)``),
             no ``pad_spec_decode`` and no lookahead reservation (``allocate_slots`` with
             ``num_external_computed_tokens > 0`` gets ``num_lookahead_tokens=0``). NIXL loads
             asynchronously, where the pass that issues the load schedules no token and already
             reserves no lookahead (``limit_lookahead_tokens``), so on this pipeline the PR's
             gate never fires: ``events.load_step.gated_passes`` stays 0, and D's extra drafts
             stay.
gated-async: the same padding gate, also on the first pass after an asynchronous load has landed
             (marked in ``_update_waiting_for_remote_kv``): D's padded step. The lookahead
             reservation stays there (the drafter of that step writes its proposals into it).
             This is the workbench's extension of the PR to the connector the PR leaves out.

How the gate is held: the padding condition reads ``self.num_sampled_tokens_per_step > 0``; for a
gated request the wrapper sets it to 0 from the moment the request is marked (same loop
iteration, before the padding test) until that iteration's ``_reserve_prefill_lookahead`` call
(after it), and ``_update_after_schedule`` (the end of every ``schedule`` pass) restores it
whatever happened in between (``Scheduler.schedule`` itself is the ``prefill_lookahead`` knob's
patch). The order is
pinned in :data:`SOURCE`. Every mode counts, per version, the load steps seen and how many were
scheduled padded (``scheduled_spec_decode_tokens`` all ``-1``), so the read-back shows the
padding vanish, or not.
"""

from __future__ import annotations

from typing import Any

from . import _patch
from .component import Component, running

_SCHED = "vllm.v1.core.sched.scheduler"
TARGETS = (
    (_SCHED, "Scheduler", "_update_after_schedule", ["self", "scheduler_output"]),
    (_SCHED, "Scheduler", "_update_waiting_for_remote_kv", ["self", "request"]),
    (_SCHED, "Scheduler", "_reserve_prefill_lookahead", None),
    ("vllm.v1.core.kv_cache_manager", "KVCacheManager", "allocate_slots", None),
)
# In one waiting-request iteration of Scheduler.schedule: the connector's answer, then the
# padding test, then _reserve_prefill_lookahead, then the slots; the async landing comes from
# _handle_blocked_waiting_request, before all of them; _update_after_schedule ends the pass.
SOURCE = (
    (_SCHED, "Scheduler.schedule",
     ("self._handle_blocked_waiting_request(", "self.connector.get_num_new_matched_tokens(",
      "and self.num_sampled_tokens_per_step > 0", "pad_spec_decode = True",
      "num_new_tokens = self._reserve_prefill_lookahead(",
      "num_lookahead_tokens=effective_lookahead_tokens",
      "num_external_computed_tokens=num_external_computed_tokens",
      "self._update_after_schedule(scheduler_output)")),
    (_SCHED, "Scheduler._handle_blocked_waiting_request",
     ("self._update_waiting_for_remote_kv(request)",)),
)
SECTION = "load_step"


def install(comp: Component) -> None:
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.scheduler import Scheduler

    sched = comp.obj
    sched._wb_load_step = "as-released"
    sched._wb_load_marks = {}  # request id -> "sync" | "async", this pass
    _patch.patch(Scheduler, "_update_after_schedule", _make_end_of_pass)
    _patch.patch(Scheduler, "_update_waiting_for_remote_kv", _make_landed)
    _patch.patch(Scheduler, "_reserve_prefill_lookahead", _make_reserve)
    _patch.patch(KVCacheManager, "allocate_slots", _make_allocate)
    if sched.connector is not None:
        _wrap_connector(sched)


def apply(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    value = knobs["load_step"]
    comp.obj._wb_load_step = value
    return value, {"mode": value, "load_steps": 0, "load_steps_padded": 0, "gated_passes": 0,
                   "lookahead_gated": 0}


# --------------------------------------------------------------------------- the gate --
def _gates(sched, kind: str) -> bool:
    mode = getattr(sched, "_wb_load_step", "as-released")
    return mode == "gated-async" or (mode == "gated" and kind == "sync")


def _mark(sched, request_id: str, kind: str) -> None:
    """A load step of ``kind`` for this request in this pass; hold the gate if the mode says."""
    sched._wb_load_marks[request_id] = kind
    if _gates(sched, kind):
        if getattr(sched, "_wb_sampled_saved", None) is None:
            sched._wb_sampled_saved = sched.num_sampled_tokens_per_step
        sched.num_sampled_tokens_per_step = 0
        _bump("gated_passes")


def _release(sched) -> None:
    saved = getattr(sched, "_wb_sampled_saved", None)
    if saved is not None:
        sched.num_sampled_tokens_per_step = saved
        sched._wb_sampled_saved = None


def _make_end_of_pass(orig):
    def _update_after_schedule(self, scheduler_output):
        _release(self)
        _count(self, scheduler_output)
        self._wb_load_marks = {}
        return orig(self, scheduler_output)

    return _update_after_schedule


def _make_landed(orig):
    def _update_waiting_for_remote_kv(self, request):
        orig(self, request)
        _mark(self, request.request_id, "async")

    return _update_waiting_for_remote_kv


def _make_reserve(orig):
    def _reserve_prefill_lookahead(self, *args, **kwargs):
        _release(self)  # the padding test of this request is behind us
        return orig(self, *args, **kwargs)

    return _reserve_prefill_lookahead


def _make_allocate(orig):
    def allocate_slots(self, request, num_new_tokens, *args, **kwargs):
        sched = getattr(self, "_wb_scheduler", None)
        if (sched is not None and kwargs.get("num_lookahead_tokens")
                and kwargs.get("num_external_computed_tokens", 0) > 0
                and sched._wb_load_step in ("gated", "gated-async")):
            kwargs["num_lookahead_tokens"] = 0  # PR #50173's lookahead gate (sync loads)
            _bump("lookahead_gated")
        return orig(self, request, num_new_tokens, *args, **kwargs)

    return allocate_slots


def _wrap_connector(sched) -> None:
    """The scheduler's own connector object: a synchronous external hit marks the request."""
    sched.kv_cache_manager._wb_scheduler = sched
    conn, orig = sched.connector, sched.connector.get_num_new_matched_tokens

    def get_num_new_matched_tokens(request, num_computed_tokens, *args, **kwargs):
        ext, is_async = orig(request, num_computed_tokens, *args, **kwargs)
        if ext and not is_async:
            _mark(sched, request.request_id, "sync")
        return ext, is_async

    conn.get_num_new_matched_tokens = get_num_new_matched_tokens


def _count(sched, out) -> None:
    """Load steps scheduled in this pass, and how many of them vLLM padded."""
    spec = getattr(out, "scheduled_spec_decode_tokens", None) or {}
    for rid in sched._wb_load_marks:
        if rid in out.num_scheduled_tokens:
            _bump("load_steps")
            drafts = spec.get(rid)
            if drafts and all(t == -1 for t in drafts):
                _bump("load_steps_padded")


def _bump(key: str) -> None:
    comp = running("engine_core")
    if comp is not None:
        comp.bump(SECTION, key)
