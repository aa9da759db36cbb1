"""Which known findings explain a request's differences: each finding's own detector, asked
about a result narrowed to that one request (the detectors read ``result.json`` rows, so
one row is a result they can judge)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ..findings import FINDINGS
from ..findings.finding import PRESENT, Finding


def applies(f: Finding, config: dict[str, Any]) -> bool:
    knobs = config.get("knobs") or {}
    return ((not f.profiles or config.get("profile") in f.profiles)
            and (not f.connectors or knobs.get("connector") in f.connectors))


# What the other requests keep in a one-request result: who they are and what they sent, for
# a detector that asks what came before (a shared prefix), never what they measured.
CONTEXT = ("id", "prompt_token_ids", "prompt_len", "prime_d")


def narrowed(result: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """``result`` judged on ``row`` alone: the other requests keep only ``CONTEXT``, in order."""
    agree = row.get("agree")
    reqs = [r if r is row else {k: r[k] for k in CONTEXT if k in r}
            for r in result.get("requests") or []]
    return {**result, "requests": reqs if any(r is row for r in reqs) else [row],
            "token_agreement": None if agree is None else float(agree)}


def present_in(result: dict[str, Any], row: dict[str, Any],
               only: Collection[str] | None = None) -> dict[str, tuple[str, ...]]:
    """{finding id: the kinds it explains} for the findings (those in ``only``, when given)
    present in ``row``. A detector that cannot read a one-request result (raises) explains
    nothing there."""
    one = narrowed(result, row)
    out = {}
    for f in FINDINGS.values():
        if only is not None and f.id not in only:
            continue
        if not f.explains or not applies(f, result.get("config") or {}):
            continue
        try:
            verdict, _ = f.detect(one)
        except Exception:  # noqa: BLE001 - a detector's blind spot, not the trial's failure
            continue
        if verdict == PRESENT:
            out[f.id] = f.explains
    return out
