"""Native old-release runs beside the knob settings that re-create them: ``results.csv``.

What is compared: for one native run (``trial.py``: an old release, observe-only, P then D one
request at a time) and the knob settings run on the installed release on the same prompts
(``compare.py``), every *series* (a release, a setting, a side) is summarised over its
requests, for all of them and split into the requests in the bad case (affected: P's
allocation ``ceil((N + k_p) / bs)`` is a block longer than the prompt's ``ceil(N / bs)``) and
the rest: drafts, per-position acceptance and acceptance length with their 95% bootstrap
intervals (``workbench.measuring.stats``, whole requests resampled), and token agreement (D's tokens
equal the same release's baseline's) with its interval.

Then each PD series against the native PD series, paired by request: how many requests give
D the same tokens and the same per-position counts, the paired differences of every
per-position rate and of token agreement with their intervals, and ``signature_agrees``:
every one of those intervals contains 0 (the issue's criterion: agreement within the
intervals, on the same prompts, group by group).

Layout read (``python -m workbench releases`` writes it)::

    DIR/<release>/<tag>/result.json                            the native run (native_result.py)
    DIR/knobs-<installed>/<tag>/<slug>/result.json             each setting (compare.py)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..measuring import stats
from .compare import SETTINGS, slug

GROUPS = ("all", "unaffected", "affected")
NATIVE = "as released"  # the native series' setting


@dataclass(frozen=True)
class Request:
    """One request of one series: what the summary needs of it."""

    id: str
    affected: bool
    drafts: int
    accepted_per_pos: tuple[int, ...]
    tokens: tuple[int, ...]
    agrees: bool  # D's tokens (or the baseline's own) equal the same release's baseline


@dataclass(frozen=True)
class Series:
    """One release x setting x side, request by request."""

    label: str
    kind: str  # "native", "knob" (a bug re-created), "fixed" (every fix in place)
    vllm: str
    setting: str
    side: str  # "pd" or "baseline"
    requests: tuple[Request, ...]


def series_of(result: dict[str, Any], name: str, kind: str) -> list[Series]:
    """A run's PD and baseline series from its ``result.json`` (native or on the installed
    release: the same shape)."""
    v = result["vllm_version"]
    out = []
    for side, tok in (("pd", "pd_tokens"), ("baseline", "baseline_tokens")):
        out.append(Series(f"{v} {name}", kind, v, name, side, tuple(Request(
            id=q["id"], affected=bool(q["affected"]), drafts=q[side]["num_drafts"],
            accepted_per_pos=tuple(q[side]["accepted_per_pos"]), tokens=tuple(q[tok]),
            agrees=q[tok] == q["baseline_tokens"]) for q in result["requests"])))
    return out


def load(releases_dir: Path, release: str, tag: str, installed: str) -> list[Series]:
    """The native series and every setting's series (settings not run are skipped)."""
    def read(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text())

    series = series_of(read(releases_dir / release / tag / "result.json"), NATIVE, "native")
    knobs = releases_dir / f"knobs-{installed}" / tag
    for name, setting in SETTINGS.items():
        path = knobs / slug(name) / "result.json"
        if path.is_file():
            series += series_of(read(path), name, setting.kind)
    return regroup(series)


def regroup(series: list[Series]) -> list[Series]:
    """Every series split as the native one is: by the prompt's geometry at P's k
    (``ceil((N + k_p) / bs) > ceil(N / bs)``). A run's own ``affected`` uses the lookahead in
    force on P, which ``prefill_lookahead=0`` makes 0, and the groups must hold the same
    prompts in every series to be compared."""
    native = next(s for s in series if s.kind == "native")
    affected = {q.id: q.affected for q in native.requests}
    return [replace(s, requests=tuple(replace(q, affected=affected[q.id]) for q in s.requests))
            for s in series]


def _arrays(reqs: list[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    drafts = np.array([q.drafts for q in reqs], dtype=float)
    k = len(reqs[0].accepted_per_pos) if reqs else 0
    acc = np.array([q.accepted_per_pos for q in reqs], dtype=float).reshape(len(reqs), k)
    agree = np.array([q.agrees for q in reqs], dtype=float)
    return drafts, acc, agree


def _group(s: Series, group: str) -> list[Request]:
    if group == "all":
        return list(s.requests)
    return [q for q in s.requests if q.affected == (group == "affected")]


def summary(s: Series, group: str, seed: int = 0) -> dict[str, Any]:
    """One row: counts, rates and intervals of ``s``'s requests in ``group``."""
    reqs = _group(s, group)
    drafts, acc, agree = _arrays(reqs)
    row: dict[str, Any] = {"series": s.label, "kind": s.kind, "vllm": s.vllm,
                           "setting": s.setting, "side": s.side, "group": group,
                           "requests": len(reqs), "drafts": int(drafts.sum())}
    rates = acc.sum(axis=0) / drafts.sum() if drafts.sum() else [np.nan] * acc.shape[1]
    ci = stats.side_intervals(drafts, acc, acc.sum(axis=1), seed=seed) if len(reqs) else None
    for i, r in enumerate(rates):
        row[f"p{i}"] = float(r)
        row[f"p{i}_ci95"] = ci and ci["per_position_ci95"][i]
    row["acceptance_length"] = float(1 + acc.sum() / drafts.sum()) if drafts.sum() else None
    row["acceptance_length_ci95"] = ci and ci["acceptance_length_ci95"]
    row["token_agreement"] = float(agree.mean()) if len(reqs) else None
    row["token_agreement_ci95"] = stats.mean_ci(agree, seed=seed) if len(reqs) else None
    return row


def against(s: Series, native: Series, group: str, seed: int = 0) -> dict[str, Any]:
    """``s`` minus the native series, paired by request, in ``group``."""
    mine = {q.id: q for q in _group(s, group)}
    theirs = [q for q in _group(native, group) if q.id in mine]
    ours = [mine[q.id] for q in theirs]
    pairs = list(zip(ours, theirs, strict=True))
    out: dict[str, Any] = {
        "same_d_tokens_as_native": sum(a.tokens == b.tokens for a, b in pairs),
        "same_d_counts_as_native": sum((a.drafts, a.accepted_per_pos)
                                       == (b.drafts, b.accepted_per_pos) for a, b in pairs),
    }
    if len(ours) < 2:
        return {**out, "signature_agrees": None}
    d1, a1, g1 = _arrays(ours)
    d0, a0, g0 = _arrays(theirs)
    diff, diff_ci = stats.paired_diff(d1, a1, d0, a0, seed=seed)
    ones = np.ones(len(ours))
    adiff, adiff_ci = stats.paired_diff(ones, g1, ones, g0, seed=seed)
    cis = [*diff_ci, adiff_ci[0]]
    out.update(per_position_diff_vs_native=diff, per_position_diff_vs_native_ci95=diff_ci,
               token_agreement_diff_vs_native=adiff[0],
               token_agreement_diff_vs_native_ci95=adiff_ci[0],
               signature_agrees=all(c is not None and c[0] <= 0 <= c[1] for c in cis))
    return out


def rows(series: list[Series], tag: str, seed: int = 0) -> list[dict[str, Any]]:
    """Every series x group, the PD ones against the native PD series."""
    native = next(s for s in series if s.kind == "native" and s.side == "pd")
    out = []
    for s in series:
        for g in GROUPS:
            row = {"prompts": tag, "native_release": native.vllm, **summary(s, g, seed)}
            if s.side == "pd" and s is not native:
                row.update(against(s, native, g, seed))
            out.append(row)
    return out


def frame(table: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as a DataFrame with intervals as JSON text (one CSV cell each)."""
    df = pd.DataFrame(table)
    for c in df.columns:
        if c.endswith("_ci95") or c.endswith("_vs_native"):
            df[c] = [None if v is None or (isinstance(v, float) and np.isnan(v))
                     else json.dumps(v) for v in df[c]]
    return df
