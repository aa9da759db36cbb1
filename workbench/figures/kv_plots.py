"""The ``kv_probe`` figure: which blocks and layers D got wrong, against the baseline and P.

Left: one request (default: the first affected request whose KV differs from the baseline),
layers x the prompt's blocks, colour = log10 of the largest absolute difference from the
baseline's KV (white: bit-identical), an ``x`` where D's block also differs from P's (the
transfer itself moved other bytes). Right: across requests, per knob setting, the share of
requests whose target / drafter KV differs from the baseline, affected and unaffected apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import Colormap, ListedColormap
from matplotlib.patches import Patch

from ..measuring.results import Result
from .figstyle import STYLE, label, provenance, save

FLOOR = 1e-8  # log scale's bottom for differences that exist but are tiny
IDENTICAL = "white"  # a bit-identical cell, and its swatch in the legend
# Where the difference scale starts in magma_r: its own low end (#fcfdbf) is a pale yellow
# that reads as the white of a bit-identical cell; from 0.15 on the lightest colour is orange.
CMAP_START = 0.15


def diff_cmap() -> Colormap:
    """The heat panel's colours: magma_r without its near-white end, and white (``bad``: the
    NaN cells of ``heat``) only for bit-identical blocks, so white on the figure means one
    thing."""
    colours = plt.get_cmap("magma_r")(np.linspace(CMAP_START, 1.0, 256))
    return ListedColormap(colours, name="magma_r_from_orange").with_extremes(bad=IDENTICAL)


def pick_request(r: Result, request_id: str | None = None) -> dict | None:
    """The request to draw: ``request_id``, else the first affected one whose KV differs from
    the baseline, else the first that differs, else the first probed."""
    probed = [q for q in r.requests if q.get("kv_probe")]
    if request_id is not None:
        return next((q for q in probed if q["id"] == request_id), None)
    differs = [q for q in probed if not q["kv_probe"]["vs_baseline"]["identical"]]
    return next((q for q in differs if q.get("affected")), None) or \
        (differs[0] if differs else (probed[0] if probed else None))


def choose(rs: Sequence[Result], request_id: str | None = None) -> tuple[Result, dict] | None:
    """The (run, request) to draw: across runs, the first affected request whose KV differs
    from the baseline, else the first that differs, else the first probed."""
    picks = [(r, q) for r in rs if (q := pick_request(r, request_id)) is not None]
    def differs(q):
        return not q["kv_probe"]["vs_baseline"]["identical"]
    return (next(((r, q) for r, q in picks if differs(q) and q.get("affected")), None)
            or next(((r, q) for r, q in picks if differs(q)), None)
            or (picks[0] if picks else None))


def layer_order(q: dict) -> list[str]:
    """Target layers first in model order, the drafter's last."""
    groups = q["kv_probe"]["layers"]
    return sorted(groups, key=lambda n: (groups[n] == "drafter", _index(n), n))


def _index(name: str) -> int:
    nums = [int(p) for p in name.split(".") if p.isdigit()]
    return nums[0] if nums else 0


def heat(q: dict, bs: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(log10 |D - baseline| per layer x block, NaN where identical; P mismatch mask; layers)."""
    pr = q["kv_probe"]
    layers = layer_order(q)
    nb = -(-pr["positions_compared"] // bs)
    grid = np.full((len(layers), nb), np.nan)
    vs_p = np.zeros((len(layers), nb), dtype=bool)
    base = pr["vs_baseline"]
    for i, name in enumerate(layers):
        mags = base.get("max_abs_diff_per_block", {}).get(name, {})
        for b in base.get("blocks_differing", {}).get(name, []):
            v = mags.get(str(b))
            grid[i, b] = np.log10(max(v, FLOOR)) if v is not None else np.log10(FLOOR)
        for b in pr["vs_p"].get("blocks_differing", {}).get(name, []):
            vs_p[i, b] = True
    return grid, vs_p, layers


def _heat_panel(ax, r: Result, q: dict) -> list:
    """Draw the request's layers x blocks; return its legend handles (the figure's legend
    holds them, below every axis label)."""
    bs = r.config["block_size"]
    grid, vs_p, layers = heat(q, bs)
    seen = grid[np.isfinite(grid)]
    im = ax.imshow(np.ma.masked_invalid(grid), aspect="auto", cmap=diff_cmap(),
                   vmin=min(-1.0, seen.min()) if seen.size else -1.0,
                   vmax=max(1.0, seen.max()) if seen.size else 1.0)
    ys, xs = np.nonzero(vs_p)
    marks = ax.scatter(xs, ys, marker="x", color="tab:cyan", s=30, label="differs from P too")
    groups = q["kv_probe"]["layers"]
    ax.set_yticks(range(len(layers)), [("drafter " if groups[n] == "drafter" else "") + _short(n)
                                       for n in layers])
    ax.set_xticks(range(grid.shape[1]))
    ax.set_xlabel(f"prompt block (block size {bs})")
    ax.grid(False)
    pr = q["kv_probe"]
    shift = pr["vs_p"].get("block_shift")
    ax.set_title(f"{label(r)}\nrequest {q['id']} (N={pr['positions_compared']}, "
                 f"{'affected' if q.get('affected') else 'unaffected'}"
                 + (f", D's blocks = P's shifted by {shift}" if shift else "") + ")")
    ax.figure.colorbar(im, ax=ax, label="log10 max |D - baseline| (white: bit-identical)")
    identical = Patch(facecolor=IDENTICAL, edgecolor="0.4", linewidth=0.6,
                      label="block bit-identical to the baseline")
    return [identical, marks] if len(xs) else [identical]


def _short(name: str) -> str:
    """``model.layers.3.self_attn.attn`` -> ``layers.3``."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return ".".join(parts[i:i + 2])
    return name


def _summary_panel(ax, results: Sequence[Result]) -> None:
    """Per run, the shares of requests whose KV on D differs from the baseline; its legend
    handles are the bars' labels (``ax.get_legend_handles_labels``)."""
    rs = [r for r in results if r.kv_probe_summary]
    names = [label(r) for r in rs]
    ys = np.arange(len(rs))
    bars = (("target", "affected", "tab:red", 0.3), ("target", "unaffected", "tab:orange", 0.1),
            ("drafter", "affected", "tab:blue", -0.1), ("drafter", "unaffected", "tab:cyan",
                                                         -0.3))
    for group, split, color, dy in bars:
        vals = [_share(r, group, split) for r in rs]
        ax.barh(ys + dy, [v if v is not None else 0 for v in vals], height=0.2, color=color,
                label=f"{group}, {split}")
        for y, v in zip(ys + dy, vals, strict=True):
            # each bar named in words (not by colour alone); a zero bar gets a tick to be seen
            words = f"{group}, {split}: " + ("no request" if v is None else f"{v:.2f}")
            ax.text(min(v or 0, 1) + 0.01, y, words, va="center", fontsize=5.5, gid=words)
            if v == 0:
                ax.plot([0], [y], marker="|", color=color, ms=6, mew=2)
    ax.set_yticks(ys, names)
    ax.set_xlim(0, 1.45)  # room for the words after a full bar
    ax.set_xlabel("share of requests whose KV on D differs from the baseline")
    ax.invert_yaxis()


def _share(r: Result, group: str, split: str) -> float | None:
    return r.kv_probe_summary[group]["vs_baseline"][split]["share"]


def kv_probe(results: Sequence[Result], out_dir, stem: str = "kv_probe",
             request_id: str | None = None) -> list[Path]:
    """The figure (PNG, SVG, PDF with provenance); [] if no run was probed.

    Each panel's legend is a figure legend "outside" below it: the constrained layout keeps
    room for them under the axes and their labels, which a legend anchored in an axes'
    own coordinates overlapped (the right panel's x label) whatever the figure's height."""
    rs = [r for r in results if r.kv_probe_summary]
    if not rs:
        return []
    shown = choose(rs, request_id)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, 2, figsize=(12, 0.35 * max(8, len(rs) * 1.2) + 2.5),
                                 gridspec_kw={"width_ratios": [1.3, 1]}, layout="constrained")
        if shown is not None:
            fig.legend(handles=_heat_panel(axes[0], *shown), loc="outside lower left",
                       fontsize=7)
        _summary_panel(axes[1], rs)
        fig.legend(*axes[1].get_legend_handles_labels(), loc="outside lower right", ncol=2,
                   fontsize=7)
        fig.suptitle("KV probe: what D holds for each prompt position, against the baseline "
                     "and against P")
        return save(fig, Path(out_dir), stem, provenance(rs))
