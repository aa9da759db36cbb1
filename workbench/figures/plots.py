"""Figures for PRs and papers: one style, PNG + SVG + PDF, provenance in the file metadata.

Every comparison pairs a setting with its own baseline: the standalone server's numbers on
the same requests of the same run (prompt set, n, load), drawn beside D's, never beside
another setting's; each run's name under its bars says its prompt set, n and token
agreement, and a legend says what the whiskers are.

Exports are byte-reproducible where the backend allows: no dates in PDF/SVG metadata, a
fixed SVG hash salt, and PNG text chunks holding only the provenance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ..measuring.results import Result, is_padded_load_step
from . import kv_plots
from .figstyle import (
    DIVERGED_WORDS,
    STYLE,
    agreement,
    caption,
    diverged,
    flag_diverged,
    label,
    n_requests,
    provenance,
    save,
    wrap,
)
from .figstyle import changed_knobs as changed_knobs

BASELINE_COLOR = "black"
TOLERANCE = 0.05  # vLLM's PD + spec-decode acceptance test: two-sided 5% relative
SMALL = 0.01  # a bar below this is too thin to see: it gets its value written on the axis
CI_WORDS = "95% bootstrap interval (requests resampled)"
CI_NOTE = f"\n(whiskers: {CI_WORDS})"
MIN_MAX_WORDS = "min to max over the repeats"
PAIRED_WORDS = "95% interval of D - baseline, paired by request"
ASIDE_WORDS = "D with its padded load step set aside\n(finding padded-load-step)"
RAW_MARK_WORDS = ("vLLM's raw rate on D, where its bar sets\nD's padded load step aside "
                  "(finding\npadded-load-step), as the verdict does")
BASELINE_WORDS = "standalone baseline, same requests"
BASELINE_HATCH = "////"
VERDICT_COLOR = {"within": "tab:green", "outside": "tab:red", "inconclusive": "dimgray"}
UNLIKE_NOTE = ("\nprompt sets differ between settings: read each D bar against the\n"
               "baseline beside it, not against another setting's bars")


def _positions(results: Sequence[Result]) -> int:
    return max((len((r.pd or r.baseline or {}).get("per_position", [])) for r in results),
               default=0)


def position_color(i: int):
    return f"C{i}"


def baseline_face(color) -> tuple:
    """A baseline bar's fill: its D bar's colour, faded (the hatch keeps the full colour)."""
    return to_rgba(color, 0.25)


def verdicts(r: Result) -> tuple[list[str] | None, str | None]:
    """Per position, D against its own baseline (vLLM's 5% relative tolerance on the paired
    95% interval), and its basis: ``"headline"`` (D's padded load step attributed) where the
    record has one, else ``"raw"`` (vLLM's raw counts; older records); (None, None): none."""
    eff = getattr(r, "effect", None) or {}
    head = eff.get("headline") or {}
    if head.get("verdict"):
        return list(head["verdict"]), "headline"
    if eff.get("verdict"):
        return list(eff["verdict"]), "raw"
    return None, None


@dataclass
class Aside:
    """D's rates with its padded load step set aside, and their paired interval against the
    baseline (None: the record has none for exactly this)."""

    rates: list[float]
    diff_ci: list | None


def padded_aside(r: Result) -> Aside | None:
    """D's rates without the drafts of its padded load step (finding padded-load-step: one
    all-rejected placeholder draft per request whose tokens equal the baseline's); None where
    no request has it, or an older record cannot say which drafts are that padding. Older
    records set aside every extra draft of D, a request's own too: those rates are redone
    here from the requests, and their interval kept only where every extra draft was padding."""
    pd_, eff = r.pd or {}, getattr(r, "effect", None) or {}
    head, rates = eff.get("headline") or {}, pd_.get("per_position_without_extra_drafts")
    if head.get("verdict") is not None:
        ok = head.get("attributed") and rates
        return Aside(rates, head.get("per_position_diff_ci95")) if ok else None
    ci = (eff.get("without_extra_drafts") or {}).get("per_position_diff_ci95")
    if "padded_load_step_drafts" in pd_:
        return Aside(rates, ci) if pd_["padded_load_step_drafts"] and rates else None
    rows = [q for q in r.requests if "pd" in q and "baseline" in q]
    if not rows or not all("extra_pd_drafts" in q and "agree" in q for q in rows):
        return None
    padded = [int(is_padded_load_step(q)) for q in rows]
    denom = pd_.get("num_drafts", 0) - sum(padded)
    if not sum(padded) or denom <= 0:
        return None
    same = all(q["extra_pd_drafts"] == p for q, p in zip(rows, padded, strict=True))
    return Aside([a / denom for a in pd_["accepted_per_pos"]], ci if same else None)


@dataclass
class Pair:
    """One setting's bars: D's per-position rates beside its own baseline's (same requests).
    ``d`` is what the verdict above it is about: the rates with D's padded load step set
    aside where the headline attributes it (``raw`` then holds vLLM's raw rates, drawn as a
    mark), else the raw rates."""

    caption: str
    d: np.ndarray
    d_err: np.ndarray | None
    base: np.ndarray | None
    base_err: np.ndarray | None
    raw: np.ndarray | None = None
    verdicts: list[str] | None = None
    diverged: bool = False

    def drawn(self) -> dict:
        """What the figure draws, for its metadata and the tests that read it."""
        def values(a):
            return None if a is None else [round(float(x), 6) for x in a]

        return {"caption": self.caption, "d_bar": values(self.d), "raw_mark": values(self.raw),
                "baseline_bar": values(self.base), "verdicts": self.verdicts,
                "d_whisker": "own 95% interval" if self.d_err is not None else None}


def _pair_of(r: Result) -> Pair:
    aside = padded_aside(r)
    raw = np.asarray(r.pd["per_position"], dtype=float)
    if aside is not None:  # the bar is the headline's value, the raw rate a mark on it
        return Pair(caption(r), np.asarray(aside.rates, dtype=float), None, *_base(r), raw,
                    verdicts(r)[0], diverged(r))
    return Pair(caption(r), raw, _side_err(r.pd), *_base(r), None, verdicts(r)[0],
                diverged(r))


def _base(r: Result) -> tuple[np.ndarray | None, np.ndarray | None]:
    return (np.asarray(r.baseline["per_position"], dtype=float) if r.baseline else None,
            _side_err(r.baseline))


def per_position(results: Sequence[Result], out_dir, stem="per_position") -> list[Path]:
    """Per-position acceptance on D, one group per setting: at each position D's bar beside
    its own baseline's (the same requests of the same run), each with its own whisker; under
    the group the setting, its prompt set, n and token agreement; above each pair the verdict."""
    results = [r for r in results if r.pd]
    whiskers = ([f"{CI_WORDS},\neach bar its own, not the paired\ninterval of D - baseline "
                  "the verdict uses"] if any(_has_ci(r) for r in results) else [])
    return _pairs_figure([_pair_of(r) for r in results], whiskers,
                         {verdicts(r)[1] for r in results} - {None},
                         len({r.prompt_set for r in results}) > 1, out_dir, stem,
                         provenance(results))


def _pairs_figure(pairs: list[Pair], whiskers: list[str], bases: set[str], unlike: bool,
                  out_dir, stem: str, prov: dict) -> list[Path]:
    with plt.rc_context(STYLE):
        k = max((len(p.d) for p in pairs), default=0)
        fig, ax = plt.subplots(figsize=_group_size(len(pairs), k))
        tops = [_draw_pair(ax, g, p) for g, p in enumerate(pairs)]
        ax.set_xticks(range(len(pairs)), [p.caption for p in pairs], fontsize=6.5)
        ax.set_xlim(-0.6, len(pairs) - 0.4)
        ax.set_ylabel("per-position acceptance")
        ax.set_ylim(0, max([1.0, *(t + 0.02 for t in tops)]))
        _pair_legend(ax, k, whiskers, any(p.raw is not None for p in pairs), bases,
                     flag_diverged(ax, [p.diverged for p in pairs]))
        ax.set_title("Per-position acceptance on D beside its own baseline\n(the "
                     "standalone server on the same requests)" + (UNLIKE_NOTE if unlike else ""),
                     fontsize=9)
        return save(fig, out_dir, stem, {**prov, "drawn": [p.drawn() for p in pairs]})


def _group_size(groups: int, k: int) -> tuple[float, float]:
    return max(4.5, max(1.6, 0.5 * k) * groups + 0.8), 3.4


def _draw_pair(ax, g: int, p: Pair) -> float:
    """Group ``g``'s bars, whiskers, set-aside markers and verdicts; returns the height the
    axes need above them."""
    k = len(p.d)
    width = 0.8 / (2 * max(1, k))
    xd = g - 0.4 + width * (2 * np.arange(k) + 0.5)
    xb = xd + width
    colors = [position_color(i) for i in range(k)]
    err_kw = {"elinewidth": 0.9, "capthick": 0.9}
    ax.bar(xd, p.d, width, color=colors, yerr=p.d_err, capsize=2, error_kw=err_kw)
    mark_small(ax, xd, p.d)
    base = p.base if p.base is not None else np.full(k, np.nan)
    if p.base is not None:
        ax.bar(xb, base, width, color=[baseline_face(c) for c in colors], edgecolor=colors,
               linewidth=0.6, hatch=BASELINE_HATCH, yerr=p.base_err, capsize=2,
               error_kw=err_kw)
    mark_small(ax, xb, base)
    if p.raw is not None:  # vLLM's raw rate, its padded load step counted
        ax.plot(xd, p.raw, "_", color="black", ms=9, mew=1.4, zorder=3)
    tops = np.nanmax(np.vstack([_top(p.d, p.d_err), _top(base, p.base_err),
                                p.raw if p.raw is not None else np.full(k, np.nan),
                                np.zeros(k)]), axis=0)
    for i, word in enumerate((p.verdicts or [])[:k]):
        ax.text((xd[i] + xb[i]) / 2, tops[i] + 0.02, word, rotation=90, ha="center",
                va="bottom", fontsize=6, color=VERDICT_COLOR.get(word, "dimgray"),
                gid=f"verdict-{g}-{i}")
    return float(np.max(tops)) + (0.2 if p.verdicts else 0.0)  # room for the words


def _top(values: np.ndarray, err: np.ndarray | None) -> np.ndarray:
    return values + (np.nan_to_num(err[1]) if err is not None else 0)


def _pair_legend(ax, k: int, whiskers: list[str], aside: bool, bases: set[str],
                 flagged: bool) -> None:
    handles = [Patch(color=position_color(i), label=f"D, position {i}") for i in range(k)]
    handles.append(Patch(facecolor=baseline_face("0.4"), edgecolor="0.4", hatch=BASELINE_HATCH,
                         linewidth=0.6, label=f"{BASELINE_WORDS}\n(right of each D bar)"))
    handles += [Line2D([], [], color="black", marker="|", ms=10, mew=1, ls="none",
                       label=f"whiskers: {w}") for w in whiskers]
    if aside:
        handles.append(Line2D([], [], marker="_", color="black", ms=9, mew=1.4, ls="none",
                              label=RAW_MARK_WORDS))
    if flagged:
        handles.append(_words_only(DIVERGED_WORDS))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    if bases:
        ax.text(1.02, 0.0, verdict_note(bases), transform=ax.transAxes, ha="left", va="bottom",
                fontsize=6.5, color="0.25", gid="note-verdicts")


def _words_only(words: str) -> Line2D:
    """A legend entry that is only its words (no swatch)."""
    return Line2D([], [], ls="none", label=words)


def verdict_note(bases: set[str]) -> str:
    """What the word above each pair says, and on which counts."""
    basis = {frozenset({"headline"}): "the headline verdict (D's padded load step\nset "
                                      "aside where a request has it)",
             frozenset({"raw"}): "on vLLM's raw counts (the records\nhave no headline verdict)"
             }.get(frozenset(bases), "the headline verdict where the record has\none, "
                   "else on vLLM's raw counts")
    return ("Above each pair: D against its own baseline,\nwithin / outside vLLM's ±5% "
            "(relative) on the\n95% paired interval, or inconclusive;\n" + basis)


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


def extra_drafts(results: Sequence[Result], out_dir, stem="extra_drafts") -> list[Path]:
    """D's drafts minus the baseline's, request by request (the padded load step's own
    evidence: one extra all-rejected draft in each request whose tokens equal the baseline's),
    with the verdict on vLLM's raw rates, the rates a user reads, beside it. Nothing here sets
    the padding aside."""
    r = next(x for x in results if x.pd)
    rows = [q for q in r.requests if "extra_pd_drafts" in q]
    extra = [int(q["extra_pd_drafts"]) for q in rows]
    padded = [bool(q.get("padded_load_step")) for q in rows]
    raw = list(((r.effect or {}).get("verdict")) or [])
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * len(rows) + 1.5), 3.0))
        ax.bar(range(len(rows)), extra, color=["tab:red" if p else "0.6" for p in padded])
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(rows)), [q.get("id", "") for q in rows], rotation=90,
                      fontsize=6)
        ax.set_ylabel("D's drafts - baseline's")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # whole drafts
        ax.legend(handles=[Patch(color="tab:red", label="padded load step: tokens equal,\n"
                                 "one all-rejected draft more"),
                           Patch(color="0.6", label="other requests")],
                  fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title(f"{sum(padded)} of {len(rows)} requests have D's padded load step (one "
                     f"all-rejected draft more)\nverdict on vLLM's raw rates, per position: "
                     f"{', '.join(raw)}",
                     fontsize=8)
        drawn = {"extra_drafts": extra, "padded": padded, "raw_verdict": raw,
                 "requests": [q.get("id") for q in rows]}
        return save(fig, out_dir, stem, {**provenance([r]), "drawn": drawn})


def relative_error(results: Sequence[Result], out_dir, stem="relative_error") -> list[Path]:
    """(D - baseline) / baseline per position, each setting against its own baseline, with
    vLLM's test tolerance as a band; where D's padded load step can be set aside, that rate
    as a circle with its own (thinner, grey) whisker beside the bar's."""
    results = [r for r in results if r.pd and r.baseline]
    with plt.rc_context(STYLE):
        k = _positions(results)
        fig, ax = plt.subplots(figsize=_group_size(len(results), k))
        ax.axhspan(-100 * TOLERANCE, 100 * TOLERANCE, color="tab:green", alpha=0.12)
        shown = [_rel_group(ax, g, r) for g, r in enumerate(results)]
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(range(len(results)), [caption(r) for r in results], fontsize=6.5)
        flagged = flag_diverged(ax, [diverged(r) for r in results])
        ax.set_ylabel("D vs its baseline (%)")
        handles = [Patch(color="tab:green", alpha=0.12, label="±5% (vLLM's test tolerance)"),
                   *(Patch(color=position_color(i), label=f"position {i}") for i in range(k))]
        if any(s[0] for s in shown):
            handles.append(Line2D([], [], color="black", marker="|", ms=10, ls="none",
                                  label=f"whiskers: {PAIRED_WORDS},\nin % of the baseline's "
                                  "rate"))
        if any(s[1] for s in shown):
            handles.append(Line2D([], [], marker="o", mfc="white", mec="black", ms=5,
                                  ls="none", label=ASIDE_WORDS))
        if any(s[2] for s in shown):
            handles.append(Line2D([], [], color="0.3", marker="|", ms=10, mew=0.8, ls="none",
                                  label="grey whisker right of a circle: its own paired\n"
                                  "interval (where the record has it)"))
        if flagged:
            handles.append(_words_only(DIVERGED_WORDS))
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax.set_title("D's per-position acceptance relative to its own baseline (same requests)")
        return save(fig, out_dir, stem, provenance(results))


def _rel_group(ax, g: int, r: Result) -> tuple[bool, bool, bool]:
    """One setting's relative errors; returns (whiskers drawn, circles, circles' whiskers)."""
    base = np.array(r.baseline["per_position"], dtype=float)
    k = len(base)
    width = 0.8 / max(1, k)
    x = g - 0.4 + width * (np.arange(k) + 0.5)
    effect = getattr(r, "effect", None) or {}
    rel = _rel(r.pd["per_position"], base)
    err = _rel_err(effect.get("per_position_diff_ci95"), base, rel)
    ax.bar(x, rel, width, color=[position_color(i) for i in range(k)], yerr=err, capsize=2)
    aside = padded_aside(r)
    if aside is None:
        return err is not None, False, False
    adj_rel = _rel(aside.rates, base)
    ax.plot(x - width / 4, adj_rel, "o", mfc="white", mec="black", ms=5, zorder=3)
    adj_err = _rel_err(aside.diff_ci, base, adj_rel)
    if adj_err is not None:  # beside the bar's own whisker, not over it
        ax.errorbar(x + width / 4, adj_rel, yerr=adj_err, fmt="none", ecolor="0.3", capsize=2,
                    elinewidth=0.8)
    return err is not None, True, adj_err is not None and bool(np.nanmax(adj_err, initial=0))


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


SUBSETS = ((False, "tab:blue", "unaffected"),
           (True, "tab:red", "affected: ceil((N+L)/bs) > ceil(N/bs)"))


def _subset(r: Result, affected: bool) -> tuple[float, float, float, int]:
    """Position-0 acceptance of D and of the baseline, token agreement and n over a run's
    requests in (or out of) the bad case; NaN where the subset is empty."""
    rows = [q for q in r.requests if q.get("affected") == affected and "pd" in q]
    rates = []
    for side in ("pd", "baseline"):
        have = [q for q in rows if side in q]
        drafts = sum(q[side]["num_drafts"] for q in have)
        rates.append(sum(q[side]["accepted_per_pos"][0] for q in have) / drafts
                     if drafts else np.nan)
    agree = [q["agree"] for q in rows if q.get("agree") is not None]
    return rates[0], rates[1], float(np.mean(agree)) if agree else np.nan, len(rows)


def split_affected(results: Sequence[Result], out_dir, stem="affected_split") -> list[Path]:
    """Position-0 acceptance (D beside its baseline on the same requests) and token agreement,
    for requests in and out of the bad case, n of each under the run's name."""
    results = [r for r in results if r.pd and r.requests]
    with plt.rc_context(STYLE):
        fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True,
                                       figsize=(max(5, 1.6 * len(results) + 0.8), 5.0))
        x = np.arange(len(results))
        counts = {}
        for j, (affected, color, _) in enumerate(SUBSETS):
            got = [_subset(r, affected) for r in results]
            counts[affected] = [g[3] for g in got]
            xs = x - 0.4 + 0.4 * j + 0.1
            ax1.bar(xs, [g[0] for g in got], 0.2, color=color)
            ax1.bar(xs + 0.2, [g[1] for g in got], 0.2, color=baseline_face(color),
                    edgecolor=color, linewidth=0.6, hatch=BASELINE_HATCH)
            ax2.bar(xs + 0.1, [g[2] for g in got], 0.36, color=color)
            for ax, values, at in ((ax1, [g[0] for g in got], xs),
                                   (ax1, [g[1] for g in got], xs + 0.2),
                                   (ax2, [g[2] for g in got], xs + 0.1)):
                mark_small(ax, at, values)
        ax2.set_xticks(x, [f"{wrap(label(r))}\n{r.prompt_set}\nunaffected "
                           f"n={counts[False][i]}\naffected n={counts[True][i]}"
                           for i, r in enumerate(results)], fontsize=6.5)
        flagged = flag_diverged(ax2, [diverged(r) for r in results])
        for ax, yl in ((ax1, "position-0 acceptance"), (ax2, "token agreement\n(D = baseline)")):
            ax.set_ylabel(yl)
            ax.set_ylim(0, 1.05)
        handles = [*(Patch(color=c, label=w) for _, c, w in SUBSETS),
                   Patch(facecolor="0.4", label="D (PD pipeline)"),
                   Patch(facecolor=baseline_face("0.4"), edgecolor="0.4", hatch=BASELINE_HATCH,
                         linewidth=0.6, label=f"{BASELINE_WORDS}\n(right of each D bar)"),
                   *([_words_only(DIVERGED_WORDS)] if flagged else [])]
        ax1.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        ax1.set_title("Requests split by prompt length mod block size: D beside its own "
                      "baseline on the same requests\n(n: requests in each part; a part "
                      "with none is n/a)")
        return save(fig, out_dir, stem, provenance(results))


def token_agreement(results: Sequence[Result], out_dir, stem="token_agreement") -> list[Path]:
    results = [r for r in results if r.token_agreement is not None]
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(max(5, 1.5 * len(results) + 0.8), 3.0))
        values = [r.token_agreement for r in results]
        ax.bar(range(len(results)), values, 0.6, color="tab:gray")
        mark_small(ax, range(len(results)), values)
        ax.set_xticks(range(len(results)), [caption(r) for r in results], fontsize=6.5)
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


def load_groups(results: Sequence[Result]) -> dict[str, list[Result]]:
    """The runs by setting, each in order of load; only the settings measured at more than
    one load where any was (a setting at one load is no line against load)."""
    groups: dict[str, list[Result]] = {}
    for r in sorted((r for r in results if r.pd or r.baseline), key=concurrency):
        groups.setdefault(setting(r), []).append(r)
    varied = {k: g for k, g in groups.items() if len({concurrency(r) for r in g}) > 1}
    return varied or groups


BASELINE_SHIFT = 1.08  # the baseline's points sit this factor right of their load level


def acceptance_vs_concurrency(results: Sequence[Result], out_dir,
                              stem="acceptance_vs_concurrency") -> list[Path]:
    """Per-position acceptance against the requests in flight, PD (solid) and the baseline
    (dashed, a little to the right so neither hides the other) with their 95% intervals, one
    panel per knob setting measured at more than one load."""
    groups = load_groups(results)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups), 3.6),
                                 squeeze=False, sharey=True)
        for ax, (name, rs) in zip(axes[0], groups.items(), strict=True):
            _load_panel(ax, rs, name)
        axes[0][0].set_ylabel("per-position acceptance")
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        fig.suptitle("Acceptance under load: PD on D against the baseline on the same requests"
                     f"\n(whiskers: {CI_WORDS}; the baseline's points a little right of "
                     "their load)", y=1.1)
        return save(fig, out_dir, stem, provenance([r for g in groups.values() for r in g]))


def _load_panel(ax, rs: list[Result], name: str) -> None:
    xs = [concurrency(r) for r in rs]
    for side, fmt, shift in (("pd", "-o", 1.0), ("baseline", "--s", BASELINE_SHIFT)):
        have = [r for r in rs if getattr(r, side)]
        for i in range(_positions(have)):
            rates = [getattr(r, side)["per_position"][i] for r in have]
            cis = [(getattr(r, side).get("per_position_ci95") or [None] * (i + 1))[i]
                   for r in have]
            ax.errorbar([concurrency(r) * shift for r in have], rates,
                        yerr=error_bars(rates, cis), fmt=fmt, color=position_color(i), ms=4,
                        capsize=2, lw=1,
                        label=f"{'PD' if side == 'pd' else 'baseline'}, position {i}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(xs)), [str(x) for x in sorted(set(xs))])
    ax.set_xlabel("requests in flight per side")
    ax.set_ylim(0, 1)
    ns = sorted({n_requests(r) for r in rs})
    agree = sorted({r.token_agreement for r in rs if r.token_agreement is not None})
    words = (f"token agreement {agree[0]:.2f}" if len(agree) == 1 else
             f"token agreement {agree[0]:.2f} to {agree[-1]:.2f}" if agree else "")
    ax.set_title(f"{name}\nn={'/'.join(map(str, ns))} per load; {words}", fontsize=8)


def all_figures(results: Sequence[Result], out_dir) -> list[Path]:
    """Every figure that the results have data for (e.g. no relative error without a baseline;
    acceptance against concurrency only where a setting was measured at several loads)."""
    need = {per_position: lambda r: r.pd, relative_error: lambda r: r.pd and r.baseline,
            split_affected: lambda r: r.pd and r.requests,
            token_agreement: lambda r: r.token_agreement is not None}
    out = []
    for fn, has in need.items():
        if any(has(r) for r in results):
            out += fn(results, out_dir)
    if any(len({concurrency(r) for r in g}) > 1 for g in load_groups(results).values()):
        out += acceptance_vs_concurrency(results, out_dir)
    return out + kv_plots.kv_probe(results, out_dir)


def per_position_spread(groups: Sequence[Sequence[Result]], out_dir,
                        stem="per_position_spread") -> list[Path]:
    """Per-position acceptance on D for settings run several times (the explorer's repeats),
    laid out as ``per_position``: D's mean over the repeats beside its own baseline's mean,
    whiskers min to max over the repeats (one run: its 95% interval)."""
    groups = [[r for r in g if r.pd] for g in groups]
    groups = [g for g in groups if g]
    flat = [r for g in groups for r in g]
    whiskers = []
    if any(len(g) > 1 for g in groups):
        whiskers.append(f"{MIN_MAX_WORDS} (runs repeated)")
    if any(len(g) == 1 and _has_ci(g[0]) for g in groups):
        whiskers.append(f"{CI_WORDS}\n(runs made once)")
    return _pairs_figure([_spread_pair(g) for g in groups], whiskers,
                         {verdicts(r)[1] for r in flat} - {None},
                         len({r.prompt_set for r in flat}) > 1, out_dir, stem, provenance(flat))


def _spread_pair(g: list[Result]) -> Pair:
    pd_ = np.array([r.pd["per_position"] for r in g], dtype=float)
    mean = pd_.mean(axis=0)
    with_base = [r for r in g if r.baseline]
    base = bmean = berr = None
    if with_base:
        base = np.array([r.baseline["per_position"] for r in with_base], dtype=float)
        bmean = base.mean(axis=0)
        berr = _spread_err(base, bmean, with_base[0].baseline)
    asides = [padded_aside(r) for r in g]
    said = [verdicts(r)[0] for r in g]
    words = (said[0] if all(s == said[0] for s in said) else
             ["varies" for _ in range(len(mean))]) if all(said) else None
    if all(a is not None for a in asides):  # the bar is what the verdict is about
        aside = np.array([a.rates for a in asides], dtype=float)
        err = _spread_err(aside, aside.mean(axis=0), {}) if len(g) > 1 else None
        return Pair(_spread_caption(g), aside.mean(axis=0), err, bmean, berr, mean, words,
                    any(diverged(r) for r in g))
    return Pair(_spread_caption(g), mean, _spread_err(pd_, mean, g[0].pd), bmean, berr,
                None, words, any(diverged(r) for r in g))


def _spread_caption(g: list[Result]) -> str:
    """The setting's caption; with repeats, how many, and the agreement of each."""
    if len(g) == 1:
        return caption(g[0])
    lines = caption(g[0]).split("\n")
    said = [agreement(r) for r in g]
    if len(set(said)) > 1:
        counted = all(s.startswith("tokens equal") for s in said)
        lines[-1] = ("tokens equal " + ", ".join(s.split()[2] for s in said) if counted
                     else "token agreement varies over the repeats")
    return "\n".join([*lines, f"{len(g)} repeats"])


def _spread_err(rows: np.ndarray, mean: np.ndarray, side: dict) -> np.ndarray | None:
    """Min-max whiskers over several repeats; one repeat: its bootstrap interval, if any."""
    if len(rows) > 1:
        return np.vstack([mean - rows.min(axis=0), rows.max(axis=0) - mean])
    return _side_err(side)


def _has_ci(r: Result) -> bool:
    return any(_side_err(s) is not None for s in (r.pd, r.baseline))
