"""``native_vs_knob``: an old release's bug as it was, beside the knob that re-creates it.

One row of panels per request group (unaffected, affected: P's allocation a block longer
than the prompt's), and per row D's per-position acceptance and the token agreement of every
PD series of ``results.csv`` (the native release, the installed release with the knob, with
every fix), each with its 95% bootstrap interval (whole requests resampled). A value of 0 is
written on the axis (``plots.mark_small``), so it never looks like a missing bar.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..figures.figstyle import STYLE, save
from ..figures.plots import error_bars, mark_small

# Per kind, one shade per series of that kind (native red, the knob oranges, fixed blues).
SHADES = {"native": ("tab:red", "firebrick"), "knob": ("tab:orange", "gold", "peru"),
          "fixed": ("tab:blue", "lightskyblue", "navy")}
GROUP_TITLES = {"unaffected": "unaffected requests",
                "affected": "affected requests: ceil((N+k_p)/bs) > ceil(N/bs)"}


def _ci(cell) -> list[float] | None:
    return json.loads(cell) if isinstance(cell, str) else None


def _positions(df: pd.DataFrame) -> int:
    return sum(1 for c in df.columns if c.startswith("p") and c[1:].isdigit())


def colors(kinds) -> list[str]:
    """A color per series, by kind and order within the kind."""
    seen: dict[str, int] = {}
    out = []
    for k in kinds:
        out.append(SHADES[k][seen.get(k, 0) % len(SHADES[k])])
        seen[k] = seen.get(k, 0) + 1
    return out


def _acceptance(ax, rows: pd.DataFrame, k: int) -> None:
    width = 0.8 / max(1, len(rows))
    for j, ((_, r), c) in enumerate(zip(rows.iterrows(), colors(rows["kind"]), strict=True)):
        xs = np.arange(k) - 0.4 + width * (j + 0.5)
        rates = [r[f"p{i}"] for i in range(k)]
        ax.bar(xs, rates, width, color=c, label=f"{r['series']} (n={r['requests']})",
               yerr=error_bars(rates, [_ci(r[f"p{i}_ci95"]) for i in range(k)]), capsize=2)
        mark_small(ax, xs, rates)
    ax.set_xticks(range(k), [f"position {i}" for i in range(k)])
    ax.set_ylabel("acceptance rate on D")
    ax.set_ylim(0, 1.0)


def _agreement(ax, rows: pd.DataFrame) -> None:
    xs = np.arange(len(rows))
    values = rows["token_agreement"].astype(float).to_numpy()
    ax.bar(xs, values, 0.6, color=colors(rows["kind"]),
           yerr=error_bars(values, [_ci(c) for c in rows["token_agreement_ci95"]]), capsize=2)
    mark_small(ax, xs, values)
    ax.set_xticks(xs, rows["series"], rotation=25, ha="right", fontsize=7)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("token agreement\n(D = same release's baseline)")


def native_vs_knob(table: pd.DataFrame, out_dir: Path, prov: dict,
                   stem: str = "native_vs_knob") -> list[Path]:
    """The figure for one native run's rows of ``results.csv`` (PD side only)."""
    pd_rows = table[table["side"] == "pd"]
    k = _positions(table)
    groups = [g for g in GROUP_TITLES if (pd_rows["group"] == g).any()]
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3.3 * len(groups)),
                                 gridspec_kw={"width_ratios": [3, 2]}, squeeze=False)
        for (ax1, ax2), g in zip(axes, groups, strict=True):
            rows = pd_rows[pd_rows["group"] == g]
            _acceptance(ax1, rows, k)
            _agreement(ax2, rows)
            ax1.set_title(GROUP_TITLES[g], loc="left", fontsize=9)
        for row in axes:
            row[0].legend(fontsize=7, loc="upper right")
        native = pd_rows[pd_rows["kind"] == "native"]["series"].iloc[0]
        fig.suptitle(f"{native} against the knob that re-creates its bug "
                     f"({table['prompts'].iloc[0]}; whiskers: 95% bootstrap interval, "
                     "requests resampled)", fontsize=9)
        fig.tight_layout()
        return save(fig, out_dir, stem, prov)
