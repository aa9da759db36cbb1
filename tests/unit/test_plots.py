"""Figures from synthetic results: intervals as whiskers when a result has them, figures still
made when it has none (older result.json), and values of 0 / no data visible as such."""

from __future__ import annotations

import json
from dataclasses import fields
from types import SimpleNamespace

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer, ErrorbarContainer

from workbench.figures import kv_plots, plots
from workbench.measuring.results import Result

EXTS = ("png", "svg", "pdf")


def side(rates, ci=None, drafts=100) -> dict:
    s = {"per_position": list(rates), "conditional": list(rates), "acceptance_length": 1.5,
         "num_drafts": drafts, "accepted_per_pos": [round(r * drafts) for r in rates]}
    if ci is not None:
        s["per_position_ci95"] = ci
    return s


def row(affected: bool, accepted0: int, agree: bool) -> dict:
    return {"affected": affected, "agree": agree,
            "pd": {"num_drafts": 10, "accepted_per_pos": [accepted0, 0]},
            "baseline": {"num_drafts": 10, "accepted_per_pos": [8, 0]}}


def result(name: str, pd, baseline, agreement, rows, prompt_set="synthetic") -> Result:
    return Result(config={"label": name}, command="test", vllm_version="0.0", git_commit="x",
                  created="2025-01-01T00:00:00", prompt_set=prompt_set, num_prompts=len(rows),
                  wall_seconds=1.0, engine_seconds=1.0, knobs={}, pd=pd, baseline=baseline,
                  token_agreement=agreement, requests=rows)


@pytest.fixture
def with_ci() -> Result:
    return result("with ci", side([0.8, 0.5], [[0.75, 0.85], [0.45, 0.56]]),
                  side([0.8, 0.52], [[0.76, 0.84], [0.47, 0.57]]), 1.0,
                  [row(False, 8, True), row(True, 8, True)])


@pytest.fixture
def legacy() -> Result:
    """The legacy hand-off: affected requests disagree (agreement 0) and accept nothing."""
    return result("legacy", side([0.4, 0.3]), side([0.8, 0.5]), 0.0,
                  [row(False, 8, False), row(True, 0, False)])


@pytest.fixture
def poisoned() -> Result:
    """Acceptance 0.001 at position 0, no affected requests at all (no data: NaN)."""
    return result("poisoned", side([0.001, 0.0]), side([0.8, 0.5]), 0.5,
                  [row(False, 0, True), row(False, 0, False)])


@pytest.fixture
def figures(monkeypatch) -> dict:
    """Each figure's Figure by stem, caught in place of plots.save (nothing is written: the
    tests without this fixture check the files)."""
    caught = {}

    def spy(fig, out_dir, stem, prov):
        caught[stem] = fig
        plt.close(fig)
        return []

    monkeypatch.setattr(plots, "save", spy)
    return caught


def texts(ax, kind: str = "value-label") -> list[str]:
    """The texts of one kind written on an Axes: ``value-label`` (mark_small's values of bars
    too thin to see), ``verdict`` (the words above each pair)."""
    return [t.get_text() for t in ax.texts if (t.get_gid() or "").startswith(kind)]


def legend_texts(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def bars(ax) -> list[tuple[str, list[float], list[float]]]:
    """Every ax.bar call of an Axes, in order: ("baseline" for a hatched call, else "d"), the
    bars' heights and their x centres."""
    out = []
    for c in ax.containers:
        if isinstance(c, BarContainer):
            kind = "baseline" if c.patches[0].get_hatch() else "d"
            out.append((kind, [p.get_height() for p in c.patches],
                        [p.get_x() + p.get_width() / 2 for p in c.patches]))
    return out


def whiskers(ax) -> list[np.ndarray]:
    """The y-extent (low, high) of every drawn whisker in an Axes (a NaN one draws nothing)."""
    out = []
    for c in ax.containers:  # a bar's whiskers are an ErrorbarContainer of their own too
        if isinstance(c, ErrorbarContainer) and c.has_yerr:
            for coll in c.lines[2]:
                out += [np.array([s[0][1], s[-1][1]]) for s in coll.get_segments() if len(s)]
    return out


def test_all_figures_writes_every_stem_with_and_without_intervals(tmp_path, with_ci, legacy,
                                                                  poisoned):
    paths = plots.all_figures([with_ci, legacy, poisoned], tmp_path)
    for stem in ("per_position", "relative_error", "affected_split", "token_agreement"):
        for ext in EXTS:
            assert (tmp_path / f"{stem}.{ext}").stat().st_size > 0
    assert len(paths) == 4 * len(EXTS)
    old = plots.all_figures([legacy, poisoned], tmp_path / "old")  # no CI keys at all
    assert len(old) == 4 * len(EXTS) and all(p.exists() for p in old)


def test_per_position_draws_the_intervals_as_whiskers(tmp_path, figures, with_ci, legacy):
    plots.per_position([with_ci, legacy], tmp_path)
    (ax,) = figures["per_position"].axes
    drawn = sorted(tuple(np.round(w, 6)) for w in whiskers(ax))
    # D's bars and the baseline's bars, from [low, high]; the legacy run has none.
    assert drawn == sorted([(0.75, 0.85), (0.45, 0.56), (0.76, 0.84), (0.47, 0.57)])
    said = [t for t in legend_texts(ax) if t.startswith("whiskers:")]
    assert said == ["whiskers: 95% bootstrap interval (requests resampled),\neach bar its own, "
                    "not the paired\ninterval of D - baseline the verdict uses"]


def test_per_position_without_intervals_has_no_whiskers(tmp_path, figures, legacy):
    plots.per_position([legacy], tmp_path)
    (ax,) = figures["per_position"].axes
    assert whiskers(ax) == []
    assert not [t for t in legend_texts(ax) if "whisker" in t or "95%" in t]


def two_prompt_sets() -> tuple[Result, Result]:
    """The tour's two runs: every fix in place on in-domain prompts, the legacy hand-off on
    the bad-case prompts, whose own baseline accepts more at position 0 than indomain's."""
    fixed = result("all fixes in place", side([0.29, 0.12]), side([0.30, 0.13]), 1.0,
                   [row(False, 3, True), row(True, 3, True)], prompt_set="indomain")
    legacy = result("block_handoff=legacy", side([0.44, 0.20]), side([0.48, 0.25]), 0.5,
                    [row(False, 4, True), row(True, 0, False)], prompt_set="badcase")
    return fixed, legacy


def test_per_position_draws_each_d_bar_beside_its_own_baseline(tmp_path, figures):
    """The tour's figure put the legacy run's D beside nothing of its own (a baseline marker
    shared the slot of indomain's fixed bar): each run's baseline bars are that run's
    baseline, right next to its D bars, in the run's own group."""
    fixed, legacy = two_prompt_sets()
    plots.per_position([fixed, legacy], tmp_path)
    (ax,) = figures["per_position"].axes
    drawn = bars(ax)
    assert [kind for kind, *_ in drawn] == ["d", "baseline", "d", "baseline"]
    for (_, d, xd), (_, base, xb), r in zip(drawn[::2], drawn[1::2], (fixed, legacy),
                                            strict=True):
        assert d == pytest.approx(r.pd["per_position"])
        assert base == pytest.approx(r.baseline["per_position"])
        width = xb[0] - xd[0]
        assert width > 0 and np.allclose(np.array(xb) - np.array(xd), width)  # beside it
    # the groups do not interleave: all of fixed's bars lie left of legacy's
    assert max(drawn[1][2]) < min(drawn[2][2])
    assert "prompt sets differ" in ax.get_title()
    plots.per_position([fixed, fixed], tmp_path)
    assert "prompt sets differ" not in figures["per_position"].axes[0].get_title()


def test_per_position_labels_carry_prompt_set_n_and_token_agreement(tmp_path, figures):
    fixed, legacy = two_prompt_sets()
    plots.per_position([fixed, legacy], tmp_path)
    (ax,) = figures["per_position"].axes
    ticks = ax.get_xticklabels()
    assert [t.get_text() for t in ticks] == [
        "all fixes in place\nindomain, n=2\ntokens equal 2/2",
        "block_handoff=legacy\nbadcase, n=2\ntokens equal 1/2"]
    # the run whose tokens diverged is named in red, and the legend says what red means
    assert to_rgba(ticks[1].get_color()) == to_rgba("tab:red")
    assert to_rgba(ticks[0].get_color()) != to_rgba("tab:red")
    assert any(t.startswith("red name") for t in legend_texts(ax))


def test_per_position_shows_the_headline_verdict_else_the_raw_one(tmp_path, figures):
    fixed, legacy = two_prompt_sets()
    fixed.effect = {"verdict": ["inconclusive", "within"]}
    plots.per_position([fixed], tmp_path)
    (ax,) = figures["per_position"].axes
    assert texts(ax, "verdict-") == ["inconclusive", "within"]
    assert "raw counts" in "".join(texts(ax, "note-verdicts"))
    fixed.effect["headline"] = {"verdict": ["within", "within"], "attributed": []}
    plots.per_position([fixed], tmp_path)
    (ax,) = figures["per_position"].axes
    assert texts(ax, "verdict-") == ["within", "within"]
    assert "headline verdict" in "".join(texts(ax, "note-verdicts"))
    legacy.effect = None  # a record without an effect: no words, no note
    plots.per_position([legacy], tmp_path)
    assert texts(figures["per_position"].axes[0], "verdict") == []


def padded_row(extra: int, agree: bool = True, first_accepted: int = 0) -> dict:
    q = row(False, 8, agree)
    q.update(extra_pd_drafts=extra, pd_spec={"per_step_accepted": [first_accepted, 1]})
    return q


def test_padded_aside_sets_aside_only_the_padding_in_an_older_record(with_ci):
    """Older records set aside every extra draft of D, a request's own too; the figures
    count only D's padded load step (one all-rejected draft in a request whose tokens equal
    the baseline's) and drop the recorded interval where it set aside more."""
    with_ci.pd.update(num_drafts=100, accepted_per_pos=[40, 20],
                      per_position_without_extra_drafts=[0.5, 0.25], extra_drafts_vs_baseline=20)
    with_ci.effect = {"without_extra_drafts": {"per_position_diff_ci95": [[-0.1, 0.1]] * 2}}
    with_ci.requests = [padded_row(1), padded_row(1), padded_row(18, agree=False)]
    aside = plots.padded_aside(with_ci)
    assert aside.rates == pytest.approx([40 / 98, 20 / 98]) and aside.diff_ci is None
    with_ci.requests = [padded_row(1), padded_row(1), padded_row(0, agree=False)]
    assert plots.padded_aside(with_ci).diff_ci == [[-0.1, 0.1]] * 2  # the same drafts
    with_ci.requests = [padded_row(2), padded_row(1, first_accepted=1)]
    assert plots.padded_aside(with_ci) is None  # no request has the padding
    with_ci.requests = [row(False, 8, True)]
    assert plots.padded_aside(with_ci) is None  # the record cannot tell


def test_the_bar_is_the_value_its_verdict_is_about_and_the_raw_rate_a_mark(tmp_path, with_ci):
    """The headline sets D's padded load step aside: D's bar is that rate (what "within" is
    about), vLLM's raw rate a mark on it; read from the figure's metadata, not its pixels."""
    from PIL import Image

    with_ci.pd["per_position_without_extra_drafts"] = [0.82, 0.51]
    with_ci.effect = {"headline": {"verdict": ["within", "inconclusive"],
                                   "attributed": ["padded-load-step"],
                                   "per_position_diff_ci95": [[0.0, 0.0], None]}}
    plots.per_position([with_ci], tmp_path)
    meta = json.loads(Image.open(tmp_path / "per_position.png").text["Description"])
    (drawn,) = meta["drawn"]
    assert drawn["d_bar"] == [0.82, 0.51] and drawn["raw_mark"] == [0.8, 0.5]
    assert drawn["verdicts"] == ["within", "inconclusive"]
    assert drawn["d_whisker"] is None  # no per-bar interval for the set-aside rate
    assert "token" in drawn["caption"]  # token agreement under every group
    with_ci.effect["headline"]["attributed"] = []
    (raw,) = plots.per_position([with_ci], tmp_path / "raw") and [
        json.loads(Image.open(tmp_path / "raw" / "per_position.png").text["Description"])[
            "drawn"][0]]
    assert raw["d_bar"] == [0.8, 0.5] and raw["raw_mark"] is None


def test_padded_aside_follows_the_headline(with_ci):
    with_ci.pd["per_position_without_extra_drafts"] = [0.82, 0.51]
    with_ci.effect = {"headline": {"verdict": ["within"] * 2, "attributed": ["padded-load-step"],
                                   "per_position_diff_ci95": [[0.0, 0.0], None]}}
    aside = plots.padded_aside(with_ci)
    assert aside.rates == [0.82, 0.51] and aside.diff_ci == [[0.0, 0.0], None]
    with_ci.effect["headline"]["attributed"] = []
    assert plots.padded_aside(with_ci) is None


def test_relative_error_draws_the_paired_interval_in_percent(tmp_path, figures, with_ci):
    with_ci.effect = {"per_position_diff": [0.0, -0.02],
                      "per_position_diff_ci95": [[-0.02, 0.01], [-0.04, 0.0]]}
    plots.relative_error([with_ci], tmp_path)
    (ax,) = figures["relative_error"].axes
    drawn = sorted(tuple(np.round(w, 6)) for w in whiskers(ax))
    # percent of the baseline's rates 0.8 and 0.52
    assert drawn == sorted([(100 * -0.02 / 0.8, 100 * 0.01 / 0.8),
                            (round(100 * -0.04 / 0.52, 6), 0.0)])


def test_relative_error_draws_the_interval_without_extra_drafts(tmp_path, figures, with_ci):
    with_ci.pd["extra_drafts_vs_baseline"] = 2
    with_ci.pd["padded_load_step_drafts"] = 2  # a record that counts D's padding apart
    with_ci.pd["per_position_without_extra_drafts"] = [0.8, 0.52]
    with_ci.effect = {"per_position_diff_ci95": None,
                      "without_extra_drafts": {"per_position_diff_ci95": [[-0.04, 0.04], None]}}
    plots.relative_error([with_ci], tmp_path)
    (ax,) = figures["relative_error"].axes
    drawn = [tuple(np.round(w, 6)) for w in whiskers(ax)]
    assert drawn == [(-5.0, 5.0)]  # position 1's interval is undefined: no whisker
    said = legend_texts(ax)
    assert any(t.startswith("grey whisker right of a circle") for t in said)
    assert not any(t.startswith("whiskers:") for t in said)  # the bars have none


def test_relative_error_labels_each_setting_with_its_prompts_and_whiskers(tmp_path, figures,
                                                                          with_ci):
    with_ci.effect = {"per_position_diff_ci95": [[-0.02, 0.01], [-0.04, 0.0]]}
    plots.relative_error([with_ci], tmp_path)
    (ax,) = figures["relative_error"].axes
    assert ax.get_xticklabels()[0].get_text() == "with ci\nsynthetic, n=2\ntokens equal 2/2"
    assert any(t.startswith("whiskers: 95% interval of D - baseline, paired by request")
               for t in legend_texts(ax))


@pytest.mark.parametrize("drop", [True, False])
def test_relative_error_without_effect_has_no_whiskers(tmp_path, figures, with_ci, drop):
    """An older result.json: no ``effect`` (None), or a Result object without the attribute."""
    with_ci.effect = None
    old = with_ci
    if drop:
        old = SimpleNamespace(**{f.name: getattr(with_ci, f.name) for f in fields(Result)
                                 if f.name != "effect"})
    assert getattr(old, "effect", None) is None and hasattr(old, "effect") is not drop
    plots.relative_error([old], tmp_path)
    (ax,) = figures["relative_error"].axes
    assert whiskers(ax) == [] and not any("whisker" in t for t in legend_texts(ax))


def test_zero_and_tiny_values_are_labelled(tmp_path, figures, with_ci, legacy, poisoned):
    plots.all_figures([with_ci, legacy, poisoned], tmp_path)
    # per_position: the poisoned run's 0.001 and 0.0, the rest are visible bars
    assert sorted(texts(figures["per_position"].axes[0])) == ["0", "0.001"]
    # token agreement 0 for the legacy run
    assert texts(figures["token_agreement"].axes[0]) == ["0"]
    acc, agree = figures["affected_split"].axes
    # legacy: affected requests accept nothing and all disagree; poisoned: 0 acceptance, and
    # no affected request at all, which is "n/a", not 0 (for D and for its baseline)
    assert sorted(texts(acc)) == ["0", "0", "n/a", "n/a"]
    assert sorted(texts(agree)) == ["0", "0", "n/a"]


def test_affected_split_draws_the_baseline_of_the_same_requests(tmp_path, figures):
    """Position 0 on D, affected and unaffected apart, each beside the baseline's rate over
    the same requests; n of each part under the run's name."""
    r = result("legacy", side([0.4, 0.3]), side([0.8, 0.5]), 0.5,
               [row(False, 6, True), row(False, 8, True), row(True, 0, False)])
    r.requests[2]["baseline"]["accepted_per_pos"] = [9, 0]
    plots.split_affected([r], tmp_path)
    acc, _ = figures["affected_split"].axes
    assert [(kind, h) for kind, h, _ in bars(acc)] == [
        ("d", [0.7]), ("baseline", [0.8]), ("d", [0.0]), ("baseline", [0.9])]
    label = figures["affected_split"].axes[1].get_xticklabels()[0].get_text()
    assert "unaffected n=2" in label and "affected n=1" in label


def test_value_labels_reach_the_svg(tmp_path, legacy):
    plots.token_agreement([legacy], tmp_path)
    assert 'id="value-label-0-0"' in (tmp_path / "token_agreement.svg").read_text()


def test_mark_small_tells_zero_tiny_and_missing_apart():
    fig, ax = plt.subplots()
    out = plots.mark_small(ax, [0, 1, 2, 3], [0.0, 0.004, np.nan, 0.5])
    assert [t.get_text() for t in out] == ["0", "0.004", "n/a"]
    assert out[2].get_style() == "italic" and out[0].get_style() == "normal"
    plt.close(fig)


def test_token_agreement_label_fits_the_axes(tmp_path, figures, with_ci, legacy):
    plots.token_agreement([with_ci, legacy], tmp_path)
    fig = figures["token_agreement"]
    (ax,) = fig.axes
    canvas = FigureCanvasAgg(fig)  # plots.save closed the figure: draw it again
    canvas.draw()
    renderer = canvas.get_renderer()
    lab = ax.yaxis.label.get_window_extent(renderer)
    box = ax.get_window_extent(renderer)
    assert lab.y0 >= box.y0 and lab.y1 <= box.y1


def test_spread_uses_intervals_for_one_repeat_and_min_max_for_several(tmp_path, figures,
                                                                      with_ci, legacy):
    again = result("legacy", side([0.5, 0.2]), side([0.8, 0.5]), 0.0, legacy.requests)
    plots.per_position_spread([[with_ci], [legacy, again]], tmp_path)
    (ax,) = figures["per_position_spread"].axes
    drawn = sorted(tuple(np.round(w, 6)) for w in whiskers(ax))
    ci = [(0.75, 0.85), (0.45, 0.56), (0.76, 0.84), (0.47, 0.57)]
    min_max = [(0.4, 0.5), (0.2, 0.3)]  # the baseline's two repeats are equal: zero whiskers
    assert drawn == sorted([*ci, *min_max, (0.8, 0.8), (0.5, 0.5)])
    said = [t for t in legend_texts(ax) if t.startswith("whiskers:")]
    assert said == ["whiskers: min to max over the repeats (runs repeated)",
                    "whiskers: 95% bootstrap interval (requests resampled)\n(runs made once)"]
    # each group: D's mean beside its own baseline's mean; the repeats said under the name
    assert [(kind, np.round(h, 6).tolist()) for kind, h, _ in bars(ax)] == [
        ("d", [0.8, 0.5]), ("baseline", [0.8, 0.52]), ("d", [0.45, 0.25]),
        ("baseline", [0.8, 0.5])]
    assert ax.get_xticklabels()[1].get_text().endswith("2 repeats")


def test_spread_writes_its_files_with_and_without_intervals(tmp_path, with_ci, legacy):
    for i, groups in enumerate(([[with_ci], [legacy, legacy]], [[legacy]])):
        paths = plots.per_position_spread(groups, tmp_path / str(i))
        assert [p.name for p in paths] == [f"per_position_spread.{e}" for e in EXTS]
        assert all(p.stat().st_size > 0 for p in paths)


def test_spread_without_intervals_has_no_whiskers(tmp_path, figures, legacy):
    plots.per_position_spread([[legacy]], tmp_path)
    assert whiskers(figures["per_position_spread"].axes[0]) == []


def test_acceptance_against_concurrency_has_a_panel_per_setting_and_a_point_per_level(
        figures, tmp_path):
    runs = []
    for knobs in ({}, {"finalize": "eager"}):
        for c in (1, 4, 16):
            r = result(f"c{c}", side([0.6, 0.3], [[0.55, 0.65], [0.25, 0.35]]),
                       side([0.62, 0.31]), 1.0, [row(False, 6, True)])
            r.knobs = {"requested": {**knobs}}
            r.measurement = {"concurrency": c}
            runs.append(r)
    plots.all_figures(runs, tmp_path)
    fig = figures["acceptance_vs_concurrency"]
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert sorted(ax.get_title() for ax in axes) == [
        "all fixes in place (synthetic)\nn=1 per load; token agreement 1.00",
        "finalize=eager (synthetic)\nn=1 per load; token agreement 1.00"]
    pd_pos0, *_, base_pos1 = [c for c in axes[0].containers if isinstance(c, ErrorbarContainer)]
    assert list(pd_pos0.lines[0].get_xdata()) == [1, 4, 16]
    assert pd_pos0.has_yerr  # the PD side's intervals are drawn
    # the baseline's points sit a little right of D's, so neither hides the other
    assert list(base_pos1.lines[0].get_xdata()) == pytest.approx(
        [c * plots.BASELINE_SHIFT for c in (1, 4, 16)])
    # one concurrency only: no such figure
    figures.clear()
    plots.all_figures(runs[:1], tmp_path)
    assert "acceptance_vs_concurrency" not in figures
    # the default sweep's case: loads differ between settings, each measured at one load
    figures.clear()
    plots.all_figures([runs[0], runs[5]], tmp_path)
    assert "acceptance_vs_concurrency" not in figures
    # beside a setting at several loads, a setting at one load gets no panel
    figures.clear()
    plots.all_figures([*runs[:3], runs[5]], tmp_path)
    titles = [ax.get_title() for ax in figures["acceptance_vs_concurrency"].axes]
    assert [t.split("\n")[0] for t in titles if t] == ["all fixes in place (synthetic)"]


DRAFTER_LAYER = "model.layers.2.self_attn.attn"


def kv_result(name: str) -> Result:
    """One probed request whose drafter KV differs from the baseline's (and from P's) in block
    1, and a summary with a share in every split."""
    layers = {f"model.layers.{i}.self_attn.attn": "target" for i in range(2)}
    probe = {"positions_compared": 96, "layers": {**layers, DRAFTER_LAYER: "drafter"},
             "vs_baseline": {"identical": False, "blocks_differing": {DRAFTER_LAYER: [1]},
                             "max_abs_diff_per_block": {DRAFTER_LAYER: {"1": 8.0}}},
             "vs_p": {"blocks_differing": {DRAFTER_LAYER: [1]}, "block_shift": None}}
    r = result(name, side([0.5, 0.2]), side([0.5, 0.2]), 1.0,
               [{"id": "q0", "affected": True, "kv_probe": probe}])
    r.config["block_size"] = 32
    r.kv_probe_summary = {g: {"vs_baseline": {"affected": {"share": 1.0},
                                              "unaffected": {"share": share}}}
                          for g, share in (("target", 0.0), ("drafter", 0.5))}
    return r


@pytest.fixture
def kv_figure(monkeypatch):
    """The KV figure, drawn (kv_plots.save caught: nothing is written)."""
    caught = []

    def spy(fig, out_dir, stem, prov):
        caught.append(fig)
        plt.close(fig)
        return []

    monkeypatch.setattr(kv_plots, "save", spy)
    kv_plots.kv_probe([kv_result("legacy"), kv_result("fixed")], "unused")
    (fig,) = caught
    canvas = FigureCanvasAgg(fig)  # save closed the figure: draw it again
    canvas.draw()
    return fig, canvas.get_renderer()


def test_kv_figure_legends_clear_every_label(kv_figure):
    """The right panel's legend was drawn over its x label: no legend (the figure's or an
    axes') may overlap any axes, axis label, tick label or title, colour bar included."""
    fig, renderer = kv_figure
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    assert len(legends) == 2
    entries = [t.get_text() for lg in legends for t in lg.get_texts()]
    assert "differs from P too" in entries and "drafter, unaffected" in entries
    for ax in fig.axes:
        artists = [ax, ax.xaxis.label, ax.yaxis.label, ax.title,
                   *ax.get_xticklabels(), *ax.get_yticklabels()]
        boxes = [a.get_window_extent(renderer) for a in artists if a.get_visible()
                 and (not hasattr(a, "get_text") or a.get_text())]
        for lg in legends:
            box = lg.get_window_extent(renderer)
            hit = [b for b in boxes if box.overlaps(b)]
            assert not hit, f"legend {[t.get_text() for t in lg.get_texts()]} overlaps {hit}"


def test_kv_figure_white_means_bit_identical_only(kv_figure):
    """White is the bit-identical cells' colour (and the legend's swatch for them); the
    difference scale's lightest colour is far from it (magma_r's own low end is pale
    yellow)."""
    fig, _ = kv_figure
    heat = fig.axes[0]
    (im,) = heat.get_images()
    cmap = im.get_cmap()
    assert tuple(cmap.get_bad()) == (1.0, 1.0, 1.0, 1.0)
    lightest = np.array(cmap(0.0)[:3])
    assert np.abs(1 - lightest).max() > 0.4, lightest
    swatches = {t.get_text(): h for lg in fig.legends
                for t, h in zip(lg.get_texts(), lg.legend_handles, strict=True)}
    identical = swatches["block bit-identical to the baseline"]
    assert tuple(identical.get_facecolor()) == (1.0, 1.0, 1.0, 1.0)


def test_kv_figure_writes_its_files(tmp_path):
    paths = kv_plots.kv_probe([kv_result("legacy")], tmp_path, stem="kv")
    assert [p.name for p in paths] == [f"kv.{e}" for e in EXTS]
    assert all(p.stat().st_size > 0 for p in paths)


def test_padded_load_steps_report_figure_draws_its_evidence_and_no_set_aside_verdict(
        tmp_path):
    """``check --only padded-load-step --report``'s figure, from the committed 0.32.0 run: D's
    extra draft per request and the verdict on vLLM's raw rates; no "within" that sets the
    padding aside (the report is about exactly that padding)."""
    from PIL import Image

    from workbench.findings import FINDINGS, report
    from workbench.paths import DATA

    res = json.loads((DATA / "releases" / "history" / "0.32.0" / "runs" /
                      "padded-load-step-main" / "result.json").read_text())
    name = report.figure(FINDINGS["padded-load-step"], res, tmp_path)
    drawn = json.loads(Image.open(tmp_path / name).text["Description"])["drawn"]
    rows = [q for q in res["requests"] if "extra_pd_drafts" in q]
    assert drawn["extra_drafts"] == [q["extra_pd_drafts"] for q in rows]
    assert sum(drawn["padded"]) == sum(q["padded_load_step"] for q in rows) > 0
    assert drawn["raw_verdict"] == res["effect"]["verdict"]
    assert "d_bar" not in json.dumps(drawn)  # not the per-position figure and its headline


def test_kv_summary_bars_are_named_in_words_and_a_zero_bar_is_seen(kv_figure):
    """The right panel told its four bars apart by colour alone and drew nothing for 0."""
    fig, _ = kv_figure
    right = next(ax for ax in fig.axes if ax.get_xlabel().startswith("share of requests"))
    said = {t.get_gid() for t in right.texts}
    assert "target, unaffected: 0.00" in said and "drafter, unaffected: 0.50" in said
    zero_ticks = [ln for ln in right.lines if ln.get_marker() == "|"]
    assert len(zero_ticks) == 2  # target, unaffected is 0 in both runs
