"""Bootstrap intervals over requests: reproducible, honest in degenerate cases, and verdicts
against vLLM's +-5% relative tolerance."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from workbench.measuring import stats


def requests(n: int, seed: int, rates=(0.7, 0.6, 0.5)) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic request rows: drafts per request, and accepted counts per position (position
    i counts a draft only when 0..i were all accepted, as vLLM's counters do)."""
    rng = np.random.default_rng(seed)
    drafts = rng.integers(5, 40, n)
    cols, reach = [], drafts
    for p in rates:
        reach = rng.binomial(reach, p)
        cols.append(reach)
    return drafts, np.column_stack(cols)


def point(drafts, accepted) -> np.ndarray:
    return np.asarray(accepted).sum(axis=0) / np.sum(drafts)


def test_same_seed_same_interval_other_seed_may_differ():
    d, a = requests(64, seed=1)
    first = stats.ratio_ci(d, a, seed=7)
    assert np.array_equal(first, stats.ratio_ci(d, a, seed=7))
    assert not np.array_equal(first, stats.ratio_ci(d, a, seed=8))
    assert stats.side_intervals(d, a, a.sum(axis=1), seed=3) == stats.side_intervals(
        d, a, a.sum(axis=1), seed=3)


def test_interval_contains_the_ratio_of_sums():
    d, a = requests(64, seed=2)
    ci = stats.ratio_ci(d, a)
    assert ci.shape == (3, 2)
    est = point(d, a)
    assert np.all(ci[:, 0] <= est) and np.all(est <= ci[:, 1])
    assert np.all(ci[:, 0] < ci[:, 1])


def test_it_is_a_ratio_of_sums_not_a_mean_of_ratios():
    # One request with 1 draft, all accepted; 9 with 100 drafts, none accepted.
    d = np.array([1] + [100] * 9)
    a = np.array([[1]] + [[0]] * 9)
    ci = stats.ratio_ci(d, a)[0]
    assert ci[0] <= 1 / 901 <= ci[1]
    assert ci[1] < 0.1  # the mean of per-request rates (0.1) is not what is estimated


def test_interval_narrows_with_more_requests():
    small = stats.ratio_ci(*requests(16, seed=3))
    large = stats.ratio_ci(*requests(256, seed=4))
    width_small, width_large = np.diff(small)[:, 0], np.diff(large)[:, 0]
    # sqrt(256 / 16) = 4: expect about a quarter of the width, allow a wide margin.
    assert np.all(width_large < 0.6 * width_small)


def test_side_intervals_are_plain_floats_and_cover_the_point():
    d, a = requests(48, seed=5)
    num_accepted = a.sum(axis=1)
    out = stats.side_intervals(d, a, num_accepted)
    assert set(out) == {"per_position_ci95", "acceptance_length_ci95"}
    for (lo, hi), est in zip(out["per_position_ci95"], point(d, a), strict=True):
        assert type(lo) is float and type(hi) is float and lo <= est <= hi
    lo, hi = out["acceptance_length_ci95"]
    assert lo <= 1 + num_accepted.sum() / d.sum() <= hi


def test_paired_difference_of_identical_sides_is_exactly_zero_and_within():
    d, a = requests(32, seed=6)
    diff, ci = stats.paired_diff(d, a, d, a)
    assert diff == [0.0, 0.0, 0.0]
    assert ci == [[0.0, 0.0]] * 3
    assert stats.verdict(ci, list(point(d, a))) == ["within"] * 3


def test_paired_difference_resamples_the_same_requests():
    """A constant offset of one accepted draft per request on PD's side: pairing keeps the
    interval far narrower than the spread of either side alone."""
    d, a = requests(64, seed=7)
    pd_a = a.copy()
    pd_a[:, 0] = np.minimum(a[:, 0] + 1, d)
    diff, ci = stats.paired_diff(d, pd_a, d, a)
    lo, hi = ci[0]
    assert lo <= diff[0] <= hi and lo > 0
    side = stats.ratio_ci(d, a)[0]
    assert hi - lo < 0.25 * (side[1] - side[0])


def test_paired_difference_contains_the_point():
    d, a = requests(64, seed=8)
    d2, a2 = requests(64, seed=9)
    diff, ci = stats.paired_diff(d, a, d2, a2)
    assert diff == pytest.approx(list(point(d, a) - point(d2, a2)))
    for x, (lo, hi) in zip(diff, ci, strict=True):
        assert lo <= x <= hi


@pytest.mark.parametrize("ci, base, expected", [
    ([-0.01, 0.02], 0.5, "within"),          # -2% .. +4%
    ([-0.025, 0.025], 0.5, "within"),        # exactly on the band edges: inside
    ([0.03, 0.06], 0.5, "outside"),          # +6% .. +12%: above the band
    ([-0.06, -0.03], 0.5, "outside"),        # -12% .. -6%: below the band
    ([-0.01, 0.03], 0.5, "inconclusive"),    # -2% .. +6%: straddles the upper edge
    ([-0.04, 0.0], 0.5, "inconclusive"),     # -8% .. 0%: straddles the lower edge
    ([-0.06, 0.06], 0.5, "inconclusive"),    # wider than the band
    ([0.0, 0.0], 0.0, "within"),             # baseline 0, PD 0 in every resample
    ([0.01, 0.02], 0.0, "outside"),          # baseline 0, PD accepts: infinite rel. error
    ([0.0, 0.02], 0.0, "inconclusive"),      # baseline 0, PD maybe 0
    (None, 0.5, "inconclusive"),             # no interval
    ([0.0, 0.0], None, "inconclusive"),      # no baseline rate
])
def test_verdict_on_typed_in_numbers(ci, base, expected):
    assert stats.verdict([ci], [base]) == [expected]


def test_verdict_tolerance_is_a_parameter():
    assert stats.verdict([[0.03, 0.04]], [0.5], tol=0.1) == ["within"]
    assert stats.verdict([[0.03, 0.04]], [0.5]) == ["outside"]


def test_one_request_has_no_interval():
    assert np.isnan(stats.ratio_ci([10], [[7, 3]])).all()
    out = stats.side_intervals([10], [[7, 3]], [10])
    assert out == {"per_position_ci95": [None, None], "acceptance_length_ci95": None}
    diff, ci = stats.paired_diff([10], [[7]], [10], [[6]])
    assert diff == [pytest.approx(0.1)] and ci == [None]


def test_zero_drafts_give_none_not_a_crash():
    zeros = np.zeros((5, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(stats.ratio_ci(np.zeros(5), zeros)).all()
        out = stats.side_intervals(np.zeros(5), zeros, np.zeros(5))
        diff, ci = stats.paired_diff(np.zeros(5), zeros, np.zeros(5), zeros)
    assert out == {"per_position_ci95": [None, None], "acceptance_length_ci95": None}
    assert diff == [None, None] and ci == [None, None]
    assert stats.verdict(ci, [0.0, 0.0]) == ["inconclusive"] * 2
    empty = stats.side_intervals([], np.zeros((0, 2)), [])
    assert empty["per_position_ci95"] == [None, None]


def test_requests_without_drafts_are_left_out():
    d, a = requests(32, seed=10)
    padded_d = np.concatenate([d, np.zeros(8, dtype=int)])
    padded_a = np.vstack([a, np.zeros((8, 3), dtype=int)])
    assert np.array_equal(stats.ratio_ci(d, a), stats.ratio_ci(padded_d, padded_a))


def test_degenerate_distribution_gives_a_zero_width_interval_not_nan():
    """Every request identical, and a position nobody reaches: every resample gives the same
    value, so the interval is [x, x] (scipy's BCa would give NaN and warn)."""
    d = np.full(12, 8)
    a = np.tile([4, 0], (12, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ci = stats.ratio_ci(d, a)
    assert ci.tolist() == [[0.5, 0.5], [0.0, 0.0]]


def test_shapes_are_checked():
    with pytest.raises(ValueError):
        stats.ratio_ci([1, 2, 3], [[1], [1]])
    with pytest.raises(ValueError):
        stats.paired_diff([1, 2], [[1], [1]], [1, 2], [[1, 1], [1, 1]])


def test_mean_ci_of_a_share_holds_the_share_and_is_reproducible():
    agree = np.array([1, 0, 1, 1, 0, 1, 1, 1, 0, 1], dtype=float)
    lo, hi = stats.mean_ci(agree, seed=3)
    assert lo < agree.mean() < hi and lo >= 0 and hi <= 1
    assert stats.mean_ci(agree, seed=3) == [lo, hi]
    assert stats.mean_ci(np.ones(5)) == [1.0, 1.0]
    assert stats.mean_ci(np.ones(1)) is None  # one request: no spread to estimate
