"""Figures for PRs and papers: one style, PNG + SVG + PDF, provenance in the file metadata.

Exports are byte-reproducible where the backend allows: no dates in PDF/SVG metadata, a
fixed SVG hash salt, and PNG text chunks holding only the provenance.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .results import Result  # noqa: E402

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "svg.hashsalt": "pd-eagle3-workbench",
    "svg.fonttype": "path",
    "pdf.fonttype": 42,
}
BASELINE_COLOR = "black"
TOLERANCE = 0.05  # vLLM's PD + spec-decode acceptance test: two-sided 5% relative


def label(r: Result) -> str:
    """A short name for a run: its grid-point name, else the knobs that differ from defaults."""
    name = r.config.get("label")
    if name:
        return name
    from .knobs import spec

    req = r.knobs.get("requested", {})
    diff = [f"{k}={v}" for k, v in req.items() if v != spec.KNOBS[k].default]
    return ", ".join(diff) or "all fixes in place"


def provenance(results: Sequence[Result]) -> dict:
    return {
        "runs": [
            {"label": label(r), "knobs_p": r.knobs.get("p"), "knobs_d": r.knobs.get("d"),
             "prompt_set": r.prompt_set, "num_prompts": r.num_prompts,
             "created": r.created}
            for r in results
        ],
        "vllm_version": sorted({r.vllm_version for r in results}),
        "git_commit": sorted({r.git_commit for r in results}),
    }


def save(fig, out_dir: str | Path, stem: str, prov: dict) -> list[Path]:
    """Write PNG, SVG and PDF with the provenance in each file's metadata."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(prov, sort_keys=True)
    paths = []
    for ext, meta in (
        ("png", {"Title": stem, "Description": text, "Software": "pd-eagle3-workbench"}),
        ("svg", {"Title": stem, "Description": text, "Date": None, "Creator": None}),
        ("pdf", {"Title": stem, "Subject": text, "CreationDate": None, "ModDate": None,
                 "Producer": None, "Creator": "pd-eagle3-workbench"}),
    ):
        p = out / f"{stem}.{ext}"
        fig.savefig(p, format=ext, metadata=meta, bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return paths


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
            ax.bar(xs, r.pd["per_position"], width, label=label(r))
            if r.baseline:
                ax.plot(xs, r.baseline["per_position"], "_", color=BASELINE_COLOR, ms=12, mew=2)
        ax.plot([], [], "_", color=BASELINE_COLOR, ms=12, mew=2, label="standalone baseline")
        ax.set_xticks(x, [f"position {i}" for i in range(k)])
        ax.set_ylabel("per-position acceptance on D")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title("Draft acceptance under PD vs the standalone baseline")
        return save(fig, out_dir, stem, provenance(results))


def relative_error(results: Sequence[Result], out_dir, stem="relative_error") -> list[Path]:
    """(PD - baseline) / baseline per position, with vLLM's test tolerance as a band."""
    results = [r for r in results if r.pd and r.baseline]
    with plt.rc_context(STYLE):
        k = _positions(results)
        fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(results) + 2), 3.2))
        ax.axhspan(-100 * TOLERANCE, 100 * TOLERANCE, color="tab:green", alpha=0.12,
                   label="±5% (vLLM's test tolerance)")
        width = 0.8 / max(1, len(results))
        marked = False
        for i, r in enumerate(results):
            base = np.array(r.baseline["per_position"])
            x = np.arange(k) - 0.4 + width * (i + 0.5)
            ax.bar(x, _rel(r.pd["per_position"], base), width, label=label(r))
            # vLLM's raw rates on D include one all-rejected draft per request that the
            # baseline never counts (see experiment._extra_drafts); show both, hide neither.
            adj = r.pd.get("per_position_without_extra_drafts")
            if adj and r.pd.get("extra_drafts_vs_baseline"):
                ax.plot(x, _rel(adj, base), "o", mfc="none", mec="black", ms=5,
                        label=None if marked else "without D's extra drafts")
                marked = True
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(k), [f"position {i}" for i in range(k)])
        ax.set_ylabel("relative error vs baseline (%)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title("PD acceptance relative to the baseline")
        return save(fig, out_dir, stem, provenance(results))


def _rel(rates, base: np.ndarray) -> np.ndarray:
    """100 * (rates - base) / base, 0 where the baseline accepted nothing."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(base > 0, 100 * (np.array(rates) - base) / base, 0.0)


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
            ax1.bar(x - 0.2 + 0.4 * j, acc, 0.4, hatch=hatch, label=lab,
                    color="tab:red" if affected else "tab:blue")
            ax2.bar(x - 0.2 + 0.4 * j, agree, 0.4, hatch=hatch, label=lab,
                    color="tab:red" if affected else "tab:blue")
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
        ax.bar(range(len(results)), [r.token_agreement for r in results], color="tab:gray")
        ax.set_xticks(range(len(results)), [label(r) for r in results], rotation=30, ha="right",
                      fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("requests whose PD output equals the baseline's")
        ax.set_title("Token agreement (greedy: a correct PD pipeline gives 1.0)")
        return save(fig, out_dir, stem, provenance(results))


def all_figures(results: Sequence[Result], out_dir) -> list[Path]:
    """Every figure that the results have data for (e.g. no relative error without a baseline)."""
    need = {per_position: lambda r: r.pd, relative_error: lambda r: r.pd and r.baseline,
            split_affected: lambda r: r.pd and r.requests,
            token_agreement: lambda r: r.token_agreement is not None}
    out = []
    for fn, has in need.items():
        if any(has(r) for r in results):
            out += fn(results, out_dir)
    return out


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
            err = None
            if len(g) > 1:
                err = np.vstack([mean - pd_.min(axis=0), pd_.max(axis=0) - mean])
            name = label(g[0]) + (f" (n={len(g)})" if len(g) > 1 else "")
            ax.bar(xs, mean, width, yerr=err, capsize=3, label=name)
            base = np.array([r.baseline["per_position"] for r in g if r.baseline], dtype=float)
            if len(base):
                bmean = base.mean(axis=0)
                berr = (np.vstack([bmean - base.min(axis=0), base.max(axis=0) - bmean])
                        if len(base) > 1 else None)
                ax.errorbar(xs, bmean, yerr=berr, fmt="_", color=BASELINE_COLOR, ms=12, mew=2,
                            capsize=2, elinewidth=0.8)
        ax.plot([], [], "_", color=BASELINE_COLOR, ms=12, mew=2, label="standalone baseline")
        ax.set_xticks(x, [f"position {i}" for i in range(k)])
        ax.set_ylabel("per-position acceptance on D")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title("Draft acceptance under PD vs the standalone baseline"
                     + ("\n(mean, min-max over repeats)" if any(len(g) > 1 for g in groups)
                        else ""))
        return save(fig, out_dir, stem, provenance([r for g in groups for r in g]))
