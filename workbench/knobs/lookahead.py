"""Knob ``prefill_lookahead``: the prefill server's scheduler lookahead (engine core, P).

default: the scheduler's own ``num_lookahead_tokens`` (P's ``num_speculative_tokens`` for
         EAGLE), stored when the scheduler is built.
0:       ``Scheduler.num_lookahead_tokens = 0`` on P, so P allocates ``ceil(N / bs)`` blocks
         for an N-token prompt instead of ``ceil((N + L) / bs)``.

Applied by the control thread (engine idle) and re-asserted at the start of every
``Scheduler.schedule`` so a value set here always holds for a whole step. The knob table
makes it act on role ``p`` only: on D and the baseline the lookahead is what the drafter needs
to decode, so the component applies ``default`` there (with a note).

Caution: with lookahead 0 on P, only prefill-only requests (``max_tokens=1``, the PD
proxy's) are safe there; decoding on P would let the drafter write past the allocation.
"""

from __future__ import annotations

from typing import Any

from . import _patch
from .component import Component

TARGETS = (
    ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule", ["self", "throttle_prefills"]),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "__init__", None),
)
# The attribute the knob overrides is set from the config once, in Scheduler.__init__.
SOURCE = (
    ("vllm.v1.core.sched.scheduler", "Scheduler.__init__",
     ("self.num_lookahead_tokens = vllm_config.num_lookahead_tokens",)),
)


def install(comp: Component) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    def make_schedule(orig):
        def schedule(self, *args, **kwargs):
            want = getattr(self, "_wb_lookahead", None)
            if want is not None and self.num_lookahead_tokens != want:
                self.num_lookahead_tokens = want
            return orig(self, *args, **kwargs)

        return schedule

    _patch.patch(Scheduler, "schedule", make_schedule)


def apply(comp: Component, knobs: dict, seed: int) -> tuple[str, dict[str, Any]]:
    sched = comp.obj
    if not hasattr(sched, "_wb_lookahead_original"):
        sched._wb_lookahead_original = sched.num_lookahead_tokens
    original = sched._wb_lookahead_original
    value = knobs["prefill_lookahead"]
    events: dict[str, Any] = {"original": original}
    want = original if value == "default" else 0
    sched._wb_lookahead = want
    sched.num_lookahead_tokens = want
    events["in_force"] = sched.num_lookahead_tokens
    # Read back: report what the scheduler holds now.
    in_force = "0" if sched.num_lookahead_tokens == 0 and original != 0 else "default"
    if original == 0:
        events["note"] = "this scheduler's lookahead is 0 already (no speculative decoding?)"
        in_force = value
    return in_force, events
