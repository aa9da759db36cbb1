"""One finding: what vLLM does and where, the experiment that shows it, and its detector.

A detector is a function of one run's ``result.json`` (as a dict) that answers ``present``,
``absent`` or ``inconclusive`` with the numbers it looked at. Controls prove it can see both
answers: under the positive control it must say ``present``, under the negative one
``absent``; a control that does not behave makes the verdict ``detector-broken``. A control
given as None is the finding's own run (no knob re-creates the bug independently of the
build); it is then shown only when that run's verdict is the control's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PRESENT, ABSENT, INCONCLUSIVE = "present", "absent", "inconclusive"
BROKEN, NOT_APPLICABLE = "detector-broken", "not-applicable"
VERDICTS = (PRESENT, ABSENT, INCONCLUSIVE, BROKEN, NOT_APPLICABLE)

Detection = tuple[str, dict[str, Any]]  # (verdict, evidence)
Detector = Callable[[dict[str, Any]], Detection]


@dataclass(frozen=True)
class Finding:
    """A known acceptance bug (or a regression that must stay away), as a re-runnable check.

    ``experiment``: ``ExperimentConfig`` fields over the check's base (knobs at their
    as-released values: vLLM untouched). ``positive`` / ``negative`` / each of ``also``:
    overrides of it (fields, and ``knobs``). ``profiles``: the profiles it applies to (empty:
    all). ``measured`` / ``inferred``: the statements a report makes, split by how they are
    known. ``fix``: a patch against the release (``patches/vllm-<release>/<id>.patch``)."""

    id: str
    title: str
    where: str
    found_on: str
    experiment: dict[str, Any]
    detect: Detector
    positive: dict[str, Any] | None
    negative: dict[str, Any] | None
    also: dict[str, dict[str, Any]] = field(default_factory=dict)
    profiles: tuple[str, ...] = ()
    measured: tuple[str, ...] = ()
    inferred: tuple[str, ...] = ()
    fix: str | None = None
    figure: str = "per_position"  # or "kv_probe": what a report draws
    # The negative control read another way from its run (the same run, when ``negative`` is
    # empty): the CPU forward thread after the profile's restore.
    negative_detect: Detector | None = None
    # What the detector reads; ``standalone``: whether a script with vLLM alone shows it too
    # (the per-request spec-decode counts do; the KV probe and thread affinities need the
    # plugin inside vLLM's processes).
    reads: str = "each response's metrics.speculative_decoding"
    standalone: bool = True


def rows(result: dict[str, Any], *keys: str) -> list[dict[str, Any]]:
    """The request rows that carry every one of ``keys``."""
    return [r for r in result.get("requests") or [] if all(r.get(k) is not None for k in keys)]


def share(n: int, total: int) -> str:
    return f"{n}/{total}"
