"""Which known findings explain a request's differences: each finding's own detector, asked
about a result narrowed to that one request (the detectors read ``result.json`` rows, so
one row is a result they can judge).

Only the findings the build has may explain (its expectations say ``present``; a dev build's
patched findings are ``absent``), and a regression the build must not have (``absent``) only
where the knob that re-creates it (its positive control's) is in force: a regression's
detector that fires anywhere else is news, not an explanation (two detectors can read the
same shape of difference). A finding never explains in its negative control's shape, and a
build with no expectations lets none explain. Where several findings hit one request at once
(P's chunks, its host buffer and a shared prefix), no single detector sees only its own
shape; their claims, per KV position, are read together (``composed``).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..findings import FINDINGS, check
from ..findings.finding import ABSENT, PRESENT, Claims, Finding, observed


def applies(f: Finding, config: dict[str, Any]) -> bool:
    """``f``'s profile and connector, and not its negative control's shape: where that
    control's settings are all in force the finding must be absent, so it explains nothing."""
    knobs = config.get("knobs") or {}
    return ((not f.profiles or config.get("profile") in f.profiles)
            and (not f.connectors or knobs.get("connector") in f.connectors)
            and not in_negative_shape(f, config))


def in_negative_shape(f: Finding, config: dict[str, Any]) -> bool:
    """Every setting of ``f``'s negative control in force in ``config`` (a run's config)."""
    neg = f.negative or {}
    if not neg:
        return False
    knobs = config.get("knobs") or {}
    return (all(knobs.get(k) == v for k, v in (neg.get("knobs") or {}).items())
            and all(config.get(k) == v for k, v in neg.items() if k != "knobs"))


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


@functools.cache
def expected(entry: str | None) -> dict[str, str]:
    """The committed verdicts of a build's table entry (none without one: no finding may
    explain). A table entry without its expectations file stops the run (ConfigError)."""
    return check.expectations(None, entry)[1].get("findings", {}) if entry else {}


def re_created(f: Finding, knobs: dict[str, str]) -> bool:
    """Whether the knobs of ``f``'s positive control are all in force."""
    want = (f.positive or {}).get("knobs") or {}
    return bool(want) and all(knobs.get(k) == v for k, v in want.items())


def may_explain(result: dict[str, Any]) -> set[str]:
    """The findings that may explain a difference in ``result`` (see the module's doc): on a
    build that fixed a finding (a dev build's ``patches``), that finding is absent."""
    fixed = {Path(p).stem for p in (result.get("vllm_build") or {}).get("patches") or ()}
    verdicts = {**expected(result.get("vllm_release")), **dict.fromkeys(fixed, ABSENT)}
    knobs = (result.get("config") or {}).get("knobs") or {}
    return {f.id for f in FINDINGS.values() if verdicts.get(f.id) == PRESENT
            or (verdicts.get(f.id) == ABSENT and re_created(f, knobs))}


def present_in(result: dict[str, Any], row: dict[str, Any],
               only: Collection[str] | None = None) -> dict[str, tuple[str, ...]]:
    """{finding id: the kinds it explains} for the findings (those in ``only``, else
    ``may_explain``) present in ``row``: each whose detector says so on the request alone,
    and, where several findings hit it at once, those whose claims cover its KV together
    (``composed``). A detector that cannot read a one-request result (raises) explains
    nothing there."""
    only = may_explain(result) if only is None else only
    one = narrowed(result, row)
    usable = [f for f in FINDINGS.values() if f.id in only and f.explains
              and applies(f, result.get("config") or {})]
    out = {}
    for f in usable:
        try:
            verdict, _ = f.detect(one)
        except Exception:  # noqa: BLE001 - a detector's blind spot, not the trial's failure
            continue
        if verdict == PRESENT:
            out[f.id] = f.explains
    for fid, kinds in composed(result, row, usable).items():
        out[fid] = tuple(sorted({*out.get(fid, ()), *kinds}))
    return out


KV_KIND = {"vs_p": "kv_vs_p", "vs_baseline": "kv_vs_baseline"}


def composed(result: dict[str, Any], row: dict[str, Any],
             findings: list[Finding]) -> dict[str, tuple[str, ...]]:
    """The findings whose claims (``Finding.claims``) together cover every position where
    ``row``'s KV differs, against P and against the baseline, per layer group; each explains
    the KV comparisons it claimed in and the downstream kinds it names (``explains``). None
    where one differing position is claimed by none: what is left may be news."""
    diff = {f"{c}:{g}": ps for c in KV_KIND for g, ps in observed(row, c).items() if ps}
    if not diff:
        return {}
    claims: dict[str, Claims] = {}
    for f in findings:
        if f.claims is not None:
            try:
                claims[f.id] = f.claims(result, row)
            except Exception:  # noqa: BLE001 - a claim that cannot be read claims nothing
                continue
    if any(ps - set().union(*(c.get(k, set()) for c in claims.values()))
           for k, ps in diff.items()):
        return {}
    out = {}
    for fid, c in claims.items():
        hit = {KV_KIND[k.split(":")[0]] for k, ps in diff.items() if c.get(k, set()) & ps}
        if hit:
            rest = {k for k in FINDINGS[fid].explains if not k.startswith("kv_")}
            out[fid] = tuple(sorted(hit | rest))
    return out
