"""Figures for PRs and papers: one style, PNG + SVG + PDF, provenance in the file metadata.

Exports are byte-reproducible where the backend allows: no dates in PDF/SVG metadata, a
fixed SVG hash salt, and PNG text chunks holding only the provenance.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from ..measuring.results import Result
from . import kv_plots
from .figstyle import STYLE, label, provenance, save
from .figstyle import changed_knobs as changed_knobs

BASELINE_COLOR = "black"
TOLERANCE = 0.05  # vLLM's PD + spec-decode acceptance test: two-sided 5% relative
SMALL = 0.01  # a bar below this is too thin to see: it gets its value written on the axis
CI_NOTE = "\n(whiskers: 95% bootstrap interval, requests resampled)"


def _positions(results: Sequence[Result]) -> int:
    return max((len((r.pd or r.baseline or {}).get("per_position", [])) for r in results),
               default=0)


def per_position(results: Sequence[Result], out_dir, stem="per_position") -> list[Path]:
    """Per-position acceptance on D, one bar group per setting, the baseline as a marker."""
    results = [r for r in results if r.pd]
    with plt.rc_context(STYLE):
        k = _positions(results)
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(results) + 2), 3.2))
        width = 0.8 / max(1, len(results))
        x = np.arange(k)
        for i, r in enumerate(results):
            xs = x - 0.4 + width * (i + 0.5)
            rates = r.pd["per_position"]
            ax.bar(xs, rates, width, yerr=_side_err(r.pd), capsize=2, label=label(r))
            mark_small(ax, xs, rates)
            if r.baseline:
                _baseline_marker(ax, xs, r.baseline["per_position"], _side_err(r.baseline), width)
        _acceptance_axes(ax, k, CI_NOTE if any(_has_ci(r) for r in results) else "")
        return save(fig, out_dir, stem, provenance(results))


def _acceptance_axes(ax, k: int, title_note: str) -> None:
    """Ticks, labels, legend and title of a per-position acceptance figure."""
    ax.plot([], [], "_", color=BASELINE_COLOR, ms=12, mew=2, label="standalone baseline")
    ax.set_xticks(np.arange(k), [f"position {i}" for i in range(k)])
    ax.set_ylabel("per-position acceptance on D")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("Draft acceptance under PD vs the standalone baseline" + title_note)


def _baseline_marker(ax, xs, rates, err: np.ndarray | None, width: float) -> None:
    """The baseline's rates as horizontal ticks, with its whiskers (when given) a quarter bar
    to the right, so they do not hide the PD bar's own."""
    ax.plot(xs, rates, "_", color=BASELINE_COLOR, ms=12, mew=2)
    if err is not None:
        ax.errorbar(np.asarray(xs) + width / 4, rates, yerr=err, fmt="none",
                    ecolor=BASELINE_COLOR, capsize=2, elinewidth=0.8)


def _side_err(side: dict | None) -> np.ndarray | None:
    """Whiskers for a side's per-position rates from its ``per_position_ci95`` (None: the
    result has no intervals, e.g. an older result.json)."""
    if not side:
        return None
    return error_bars(side.get("per_position"), side.get("per_position_ci95"))


def error_bars(values, ci) -> np.ndarray | None:
    """Asymmetric yerr (2, k) from [low, high] pairs around ``values``; a None pair (an
    undefined interval) draws no whisker."""
    if not ci or values is None or len(ci) != len(values):
        return None
    bounds = np.array([[np.nan, np.nan] if p is None else p for p in ci], dtype=float)
    return _err_from(np.asarray(values, dtype=float), bounds)


def _err_from(values: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    err = np.vstack([values - bounds[:, 0], bounds[:, 1] - values])
    return np.clip(err, 0, None)  # matplotlib refuses negative whiskers; NaN stays NaN


def mark_small(ax, xs, values) -> list:
    """Write the value on the axis for a bar too thin to see (0: "0", below SMALL: e.g.
    "0.001"), and "n/a" where there is no value (NaN), so neither looks like an empty slot."""
    texts, where = [], f"value-label-{ax.figure.axes.index(ax)}"
    for x, v in zip(xs, np.asarray(values, dtype=float), strict=True):
        if np.isnan(v):
            s, style = "n/a", {"color": "dimgray", "style": "italic"}
        elif abs(v) < SMALL:
            s, style = ("0" if v == 0 else f"{v:.2g}"), {"color": "black"}
        else:
            continue
        texts.append(ax.text(x, 0.02, s, transform=ax.get_xaxis_transform(), ha="center",
                             va="bottom", rotation=90, fontsize=6,
                             gid=f"{where}-{len(ax.texts)}", **style))
    return texts


def relative_error(results: Sequence[Result], out_dir, stem="relative_error") -> list[Path]:
    """(PD - baseline) / baseline per position, with vLLM's test tolerance as a band."""
    results = [r for r in results if r.pd and r.baseline]
    with plt.rc_context(STYLE):
        k = _positions(results)
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(results) + 2), 3.2))
        ax.axhspan(-100 * TOLERANCE, 100 * TOLERANCE, color="tab:green", alpha=0.12,
                   label="±5% (vLLM's test tolerance)")
        width = 0.8 / max(1, len(results))
        marked = shown = False
        for i, r in enumerate(results):
            base = np.array(r.baseline["per_position"])
            x = np.arange(k) - 0.4 + width * (i + 0.5)
            effect = getattr(r, "effect", None) or {}
            rel = _rel(r.pd["per_position"], base)
            err = _rel_err(effect.get("per_position_diff_ci95"), base, rel)
            shown = shown or err is not None
            ax.bar(x, rel, width, yerr=err, capsize=2, label=label(r))
            # vLLM's raw rates on D include one all-rejected draft per request that the
            # baseline never counts (see experiment._extra_drafts); show both, hide neither.
            adj = r.pd.get("per_position_without_extra_drafts")
            if adj and r.pd.get("extra_drafts_vs_baseline"):
                adj_rel = _rel(adj, base)
                ax.plot(x, adj_rel, "o", mfc="none", mec="black", ms=5,
                        label=None if marked else "without D's extra drafts")
                marked = True
                adj_ci = (effect.get("without_extra_drafts") or {}).get("per_position_diff_ci95")
                adj_err = _rel_err(adj_ci, base, adj_rel)
                if adj_err is not None:  # beside the bar's own whisker, not over it
                    ax.errorbar(x + width / 4, adj_rel, yerr=adj_err, fmt="none", ecolor="0.3",
                                capsize=2, elinewidth=0.8)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(k), [f"position {i}" for i in range(k)])
        ax.set_ylabel("relative error vs baseline (%)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title("PD acceptance relative to the baseline" + (CI_NOTE if shown else ""))
        return save(fig, out_dir, stem, provenance(results))


def _rel(rates, base: np.ndarray) -> np.ndarray:
    """100 * (rates - base) / base, 0 where the baseline accepted nothing."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(base > 0, 100 * (np.array(rates) - base) / base, 0.0)


def _rel_err(ci, base: np.ndarray, rel: np.ndarray) -> np.ndarray | None:
    """Whiskers for the relative error from the paired interval of PD - baseline (a result's
    ``effect["per_position_diff_ci95"]``), in percent of the baseline's rate; none where the
    baseline accepted nothing or there is no interval (an older result.json has no effect)."""
    if not ci or len(ci) != len(base):
        return None
    diff = np.array([[np.nan, np.nan] if p is None else p for p in ci], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(base[:, None] > 0, 100 * diff / base[:, None], np.nan)
    return _err_from(rel, pct)


def split_affected(results: Sequence[Result], out_dir, stem="affected_split") -> list[Path]:
    """Position-0 acceptance and token agreement for requests in and out of the bad case."""
    results = [r for r in results if r.pd and r.requests]
    with plt.rc_context(STYLE):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(7, 1.4 * len(results) + 3), 3.2))
        names = [label(r) for r in results]
        x = np.arange(len(results))
        for j, (affected, hatch) in enumerate(((False, ""), (True, "//"))):
            acc, agree = [], []
            for r in results:
                rows = [q for q in r.requests if q.get("affected") == affected and "pd" in q]
                drafts = sum(q["pd"]["num_drafts"] for q in rows)
                acc.append(sum(q["pd"]["accepted_per_pos"][0] for q in rows) / drafts
                           if drafts else np.nan)
                rows_a = [q for q in rows if "agree" in q]
                agree.append(np.mean([q["agree"] for q in rows_a]) if rows_a else np.nan)
            lab = ("affected: ceil((N+L)/bs) > ceil(N/bs)" if affected else "unaffected")
            xs = x - 0.2 + 0.4 * j
            for ax, values in ((ax1, acc), (ax2, agree)):
                ax.bar(xs, values, 0.4, hatch=hatch, label=lab,
                       color="tab:red" if affected else "tab:blue")
                mark_small(ax, xs, values)
        for ax, yl in ((ax1, "position-0 acceptance on D"), (ax2, "token agreement")):
            ax.set_xticks(x, names, rotation=30, ha="right", fontsize=7)
            ax.set_ylabel(yl)
            ax.set_ylim(0, 1.05)
        ax1.legend(fontsize=7)
        fig.suptitle("Requests split by prompt length mod block size")
        return save(fig, out_dir, stem, provenance(results))


def token_agreement(results: Sequence[Result], out_dir, stem="token_agreement") -> list[Path]:
    results = [r for r in results if r.token_agreement is not None]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(5, 0.9 * len(results) + 2), 3.0))
        values = [r.token_agreement for r in results]
        ax.bar(range(len(results)), values, color="tab:gray")
        mark_small(ax, range(len(results)), values)
        ax.set_xticks(range(len(results)), [label(r) for r in results], rotation=30, ha="right",
                      fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("requests whose PD output\nequals the baseline's")
        ax.set_title("Token agreement (greedy: a correct PD pipeline gives 1.0)")
        return save(fig, out_dir, stem, provenance(results))


def concurrency(r: Result) -> int:
    """Requests in flight per side when ``r`` was measured (1 before concurrent runs)."""
    return int((r.measurement or {}).get("concurrency", 1))


def setting(r: Result) -> str:
    """A run's knob setting and prompt set, without its concurrency (the load grid's panels)."""
    return f"{changed_knobs(r)} ({r.prompt_set})"


def acceptance_vs_concurrency(results: Sequence[Result], out_dir,
                              stem="acceptance_vs_concurrency") -> list[Path]:
    """Per-position acceptance against the requests in flight, PD (solid) and the baseline
    (dashed) with their 95% intervals, one panel per knob setting."""
    groups: dict[str, list[Result]] = {}
    for r in sorted((r for r in results if r.pd or r.baseline), key=concurrency):
        groups.setdefault(setting(r), []).append(r)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups), 3.4),
                                 squeeze=False, sharey=True)
        for ax, (name, rs) in zip(axes[0], groups.items(), strict=True):
            _load_panel(ax, rs, name)
        axes[0][0].set_ylabel("per-position acceptance")
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.suptitle("Acceptance under load: PD on D against the baseline" + CI_NOTE, y=1.08)
        return save(fig, out_dir, stem, provenance(results))


def _load_panel(ax, rs: list[Result], name: str) -> None:
    xs = [concurrency(r) for r in rs]
    for side, fmt in (("pd", "-o"), ("baseline", "--s")):
        have = [r for r in rs if getattr(r, side)]
        for i in range(_positions(have)):
            rates = [getattr(r, side)["per_position"][i] for r in have]
            cis = [(getattr(r, side).get("per_position_ci95") or [None] * (i + 1))[i]
                   for r in have]
            ax.errorbar([concurrency(r) for r in have], rates, yerr=error_bars(rates, cis),
                        fmt=fmt, color=f"C{i}", ms=4, capsize=2, lw=1,
                        label=f"{'PD' if side == 'pd' else 'baseline'}, position {i}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(xs)), [str(x) for x in sorted(set(xs))])
    ax.set_xlabel("requests in flight per side")
    ax.set_ylim(0, 1)
    ax.set_title(name, fontsize=8)


def all_figures(results: Sequence[Result], out_dir) -> list[Path]:
    """Every figure that the results have data for (e.g. no relative error without a baseline;
    acceptance against concurrency only where runs differ in it)."""
    need = {per_position: lambda r: r.pd, relative_error: lambda r: r.pd and r.baseline,
            split_affected: lambda r: r.pd and r.requests,
            token_agreement: lambda r: r.token_agreement is not None}
    out = []
    for fn, has in need.items():
        if any(has(r) for r in results):
            out += fn(results, out_dir)
    if len({concurrency(r) for r in results}) > 1:
        out += acceptance_vs_concurrency(results, out_dir)
    return out + kv_plots.kv_probe(results, out_dir)


def per_position_spread(groups: Sequence[Sequence[Result]], out_dir,
                        stem="per_position_spread") -> list[Path]:
    """Per-position acceptance on D for settings run several times (the explorer's repeats):
    one bar per setting at the mean over its repeats, whiskers from min to max, and the
    baseline's mean as a marker with its own min-max whisker. One repeat: no whiskers."""
    groups = [[r for r in g if r.pd] for g in groups]
    groups = [g for g in groups if g]
    with plt.rc_context(STYLE):
        k = _positions([r for g in groups for r in g])
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(groups) + 2), 3.2))
        width = 0.8 / max(1, len(groups))
        x = np.arange(k)
        for i, g in enumerate(groups):
            xs = x - 0.4 + width * (i + 0.5)
            pd_ = np.array([r.pd["per_position"] for r in g], dtype=float)
            mean = pd_.mean(axis=0)
            err = _spread_err(pd_, mean, g[0].pd)
            name = label(g[0]) + (f" (n={len(g)})" if len(g) > 1 else "")
            ax.bar(xs, mean, width, yerr=err, capsize=3, label=name)
            mark_small(ax, xs, mean)
            with_base = [r for r in g if r.baseline]
            if with_base:
                base = np.array([r.baseline["per_position"] for r in with_base], dtype=float)
                bmean = base.mean(axis=0)
                _baseline_marker(ax, xs, bmean, _spread_err(base, bmean, with_base[0].baseline),
                                 width)
        _acceptance_axes(ax, k, _spread_note(any(len(g) > 1 for g in groups),
                                             any(len(g) == 1 and _has_ci(g[0]) for g in groups)))
        return save(fig, out_dir, stem, provenance([r for g in groups for r in g]))


def _spread_err(rows: np.ndarray, mean: np.ndarray, side: dict) -> np.ndarray | None:
    """Min-max whiskers over several repeats; one repeat: its bootstrap interval, if any."""
    if len(rows) > 1:
        return np.vstack([mean - rows.min(axis=0), rows.max(axis=0) - mean])
    return _side_err(side)


def _spread_note(repeats: bool, ci: bool) -> str:
    if repeats and ci:
        return "\n(mean, min-max over repeats; one run: 95% bootstrap interval over requests)"
    return ("\n(mean, min-max over repeats)" if repeats else "") + (CI_NOTE if ci else "")


def _has_ci(r: Result) -> bool:
    return any(_side_err(s) is not None for s in (r.pd, r.baseline))
