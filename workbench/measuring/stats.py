"""Bootstrap confidence intervals for draft acceptance, resampling whole requests.

Definitions follow vLLM's ``vllm/v1/spec_decode/metrics.py`` (as ``metrics.py`` does):
the per-position rate at i is sum(accepted_at_position_i) / sum(num_drafts) over a run's
requests, a ratio of sums. That is the rate vLLM's counters give; a mean of per-request rates
would weigh a request with 3 drafts as much as one with 300. Acceptance length is
1 + sum(num_accepted) / sum(num_drafts).

Why requests, not drafts, are resampled: the drafts of one request share a prompt, a KV cache
and a hand-off (one bad hand-off spoils all of them), so they are not independent, and
resampling single drafts would give intervals that are too narrow. Requests are the
independent unit: every resample draws whole requests with replacement, each with its drafts
and accepted counts together (``paired=True``; in ``paired_diff`` also with the same request's
counts on the other side).

Why a seed: a table or figure made again from the same result.json must show the same
interval, so each function takes ``seed`` and hands scipy ``numpy.random.default_rng(seed)``.

Why the percentile method and not scipy's default BCa: BCa gives NaN (with a
DegenerateDataWarning) whenever the bootstrap distribution is degenerate, which is common here
(a late position that no request reaches is 0 in every resample); its jackknife costs n
evaluations on n - 1 requests; and with tens of requests or more the ratio of sums is close to
normal, so BCa's skew correction changes little. Percentile bounds are values of the bootstrap
distribution, so a rate's interval stays inside [0, 1], and a zero-width distribution gives
[x, x] without a special case in scipy.

Undefined intervals: ``ratio_ci`` returns NaN rows, the dict/list functions return None, when
the rate is undefined (no drafts at all: 0 / 0) or there is no spread to estimate (fewer than
two requests with drafts: every resample of one request is that request, and a zero-width
interval would claim a certainty that one request cannot give; scipy refuses it too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
TOLERANCE = 0.05  # vLLM's PD + spec-decode acceptance test: two-sided 5% relative
WITHIN, OUTSIDE, INCONCLUSIVE = "within", "outside", "inconclusive"
_MAX_BATCH_CELLS = 4_000_000  # bounds the resample arrays scipy builds (cells of float64)

Interval = list[float] | None


def ratio_ci(drafts: np.ndarray, accepted: np.ndarray, *, seed: int = 0,
             confidence: float = CONFIDENCE, n_resamples: int = N_RESAMPLES) -> np.ndarray:
    """The (k, 2) percentile interval of sum(accepted[:, i]) / sum(drafts) for each i.

    ``drafts``: shape (n,), one entry per request; ``accepted``: shape (n, k). Requests with
    no drafts are left out (they add 0 to both sums, and a resample of only them has no rate).
    NaN rows where the interval is undefined (see the module docstring).
    """
    drafts, accepted = _check(drafts, accepted)
    keep = drafts > 0
    drafts, accepted = drafts[keep], accepted[keep]
    if len(drafts) < 2:
        return np.full((accepted.shape[1], 2), np.nan)
    return _interval((accepted.T, drafts), _ratio, seed=seed, confidence=confidence,
                     n_resamples=n_resamples)


def mean_ci(values: np.ndarray, *, seed: int = 0) -> Interval:
    """95% interval of the mean of one value per request (token agreement: 0 or 1 each), by
    the same resampling of whole requests; None where undefined."""
    v = np.asarray(values, dtype=float).reshape(-1)
    return _pair(ratio_ci(np.ones(len(v)), v, seed=seed)[0])


def side_intervals(drafts: np.ndarray, accepted_per_pos: np.ndarray, num_accepted: np.ndarray,
                   *, seed: int = 0) -> dict[str, list[Interval] | Interval]:
    """95% intervals for one side of a run (PD or the baseline), from its request rows.

    ``per_position_ci95``: [low, high] per position (None where undefined);
    ``acceptance_length_ci95``: [low, high] of 1 + sum(num_accepted) / sum(num_drafts), from
    the same resamples as the positions (None where undefined).
    """
    drafts, per_pos = _check(drafts, accepted_per_pos)
    ci = ratio_ci(drafts, np.column_stack([per_pos, np.ravel(num_accepted)]), seed=seed)
    return {"per_position_ci95": [_pair(row) for row in ci[:-1]],
            "acceptance_length_ci95": _pair(1.0 + ci[-1])}


def paired_diff(pd_drafts: np.ndarray, pd_accepted: np.ndarray, base_drafts: np.ndarray,
                base_accepted: np.ndarray, *, seed: int = 0
                ) -> tuple[list[float | None], list[Interval]]:
    """PD's per-position rate minus the baseline's, and its 95% interval.

    Row j of every array is the same request on both sides, and each resample draws the same
    requests on both sides (paired): the prompt-to-prompt spread, common to both sides, cancels
    out of the difference instead of widening it. Requests with no drafts on either side are
    left out. None entries where a rate is undefined (see the module docstring).
    """
    pd_d, pd_a = _check(pd_drafts, pd_accepted)
    b_d, b_a = _check(base_drafts, base_accepted)
    if pd_a.shape != b_a.shape:
        raise ValueError(f"PD rows {pd_a.shape} and baseline rows {b_a.shape} differ")
    point = _diff(pd_a.T, pd_d, b_a.T, b_d)
    keep = (pd_d > 0) | (b_d > 0)
    if keep.sum() < 2 or not np.isfinite(point).all():
        return [_num(p) for p in point], [None] * pd_a.shape[1]
    ci = _interval((pd_a[keep].T, pd_d[keep], b_a[keep].T, b_d[keep]), _diff, seed=seed,
                   confidence=CONFIDENCE, n_resamples=N_RESAMPLES)
    return [_num(p) for p in point], [_pair(row) for row in ci]


def verdict(diff_ci: Sequence[Interval], baseline_rates: Sequence[float | None],
            tol: float = TOLERANCE) -> list[str]:
    """Per position: is PD's rate within ``tol`` (relative) of the baseline's?

    The interval of the relative error is diff_ci / baseline rate (the baseline's point rate;
    its own spread enters through the paired difference). ``"within"``: the whole interval lies
    in [-tol, +tol]; ``"outside"``: the whole interval lies above +tol or below -tol;
    ``"inconclusive"``: it straddles a band edge, or there is no interval (None / NaN).

    A baseline rate of 0 has no relative error. Choice: ``"within"`` only when the difference
    interval is exactly [0, 0] (PD accepted nothing either), ``"outside"`` when the whole
    interval is above 0 (PD accepts what the baseline never does: an infinite relative error),
    else ``"inconclusive"``.
    """
    return [_verdict_one(ci, b, tol) for ci, b in zip(diff_ci, baseline_rates, strict=True)]


def _verdict_one(ci: Interval, base: float | None, tol: float) -> str:
    if ci is None or base is None or not np.isfinite([*ci, base]).all():
        return INCONCLUSIVE
    if base < 0:
        raise ValueError(f"a rate cannot be negative: {base}")
    lo, hi = ci
    if base == 0:
        if lo == 0 and hi == 0:
            return WITHIN
        return OUTSIDE if lo > 0 or hi < 0 else INCONCLUSIVE
    lo, hi = lo / base, hi / base
    if -tol <= lo and hi <= tol:
        return WITHIN
    return OUTSIDE if lo > tol or hi < -tol else INCONCLUSIVE


# --- helpers ------------------------------------------------------------------------------
def _check(drafts: np.ndarray, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float arrays of shapes (n,) and (n, k); a 1-D ``accepted`` is one position."""
    d = np.asarray(drafts, dtype=float).reshape(-1)
    a = np.asarray(accepted, dtype=float)
    a = a[:, None] if a.ndim == 1 else a
    if a.ndim != 2 or a.shape[0] != len(d):
        raise ValueError(f"drafts {d.shape} and accepted counts {a.shape}: want (n,), (n, k)")
    return d, a


def _ratio(accepted: np.ndarray, drafts: np.ndarray, axis: int = -1) -> np.ndarray:
    """Vectorized ratio of sums: accepted (k, ..., n) / drafts (..., n) summed over ``axis``."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return accepted.sum(axis=axis) / drafts.sum(axis=axis)


def _diff(pd_a: np.ndarray, pd_d: np.ndarray, b_a: np.ndarray, b_d: np.ndarray,
          axis: int = -1) -> np.ndarray:
    return _ratio(pd_a, pd_d, axis) - _ratio(b_a, b_d, axis)


def _interval(data: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], *,
              seed: int, confidence: float, n_resamples: int) -> np.ndarray:
    """(m, 2) percentile interval of an m-vector statistic over paired request resamples
    (requests along the last axis); [x, x] where every resample gives x, NaN where any
    resample's statistic is undefined."""
    rows, n = max(a.shape[0] if a.ndim > 1 else 1 for a in data), data[0].shape[-1]
    batch = max(1, min(n_resamples, _MAX_BATCH_CELLS // (n * rows * len(data))))
    res = stats.bootstrap(data, statistic, n_resamples=n_resamples, batch=batch,
                          vectorized=True, paired=True, axis=-1, confidence_level=confidence,
                          method="percentile", rng=np.random.default_rng(seed))
    ci = np.column_stack([res.confidence_interval.low, res.confidence_interval.high])
    dist = res.bootstrap_distribution.reshape(len(ci), -1)
    flat = np.ptp(dist, axis=-1) == 0
    ci[flat] = dist[flat, :1]
    ci[np.isnan(dist).any(axis=-1)] = np.nan
    return ci


def _pair(row: np.ndarray) -> Interval:
    """[low, high] as plain floats, None when undefined."""
    return None if np.isnan(row).any() else [float(row[0]), float(row[1])]


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None
