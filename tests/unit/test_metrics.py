"""Acceptance math on counter deltas, parsed from vLLM's exposition format."""

from pathlib import Path

import pytest

from workbench.measuring import metrics

DATA = Path(__file__).parents[1] / "data"


def _delta():
    before = metrics.parse((DATA / "metrics_before.txt").read_text())
    after = metrics.parse((DATA / "metrics_after.txt").read_text())
    return after - before


def test_parse_reads_counters_not_created_samples():
    c = metrics.parse((DATA / "metrics_before.txt").read_text())
    assert c.num_drafts == 100 and c.num_accepted == 150
    assert c.accepted_per_pos == [70, 50, 30]
    assert c.prefix_queries == 640 and c.prefix_hits == 64


def test_per_position_and_length_follow_vllm_definitions():
    d = _delta()
    assert d.num_drafts == 80
    assert d.per_position() == pytest.approx([0.7, 0.3, 0.2])
    assert d.acceptance_length() == pytest.approx(1 + 96 / 80)
    assert d.conditional() == pytest.approx([0.7, 0.3 / 0.7, 0.2 / 0.3])


def test_sums_over_engines():
    text = (DATA / "metrics_before.txt").read_text()
    two = text + text.replace('engine="0"', 'engine="1"').replace("# HELP", "# X").replace(
        "# TYPE", "# Y")
    # A second engine's samples are summed, not overwritten.
    c = metrics.parse(two)
    assert c.num_drafts == 200 and c.accepted_per_pos == [140, 100, 60]


def test_no_drafts_gives_zero_rates_not_division_error():
    c = metrics.SpecCounters(accepted_per_pos=[0, 0, 0])
    assert c.per_position() == [0, 0, 0] and c.acceptance_length() == 1.0
