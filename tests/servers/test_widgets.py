"""The knob explorer's callbacks drive real runs without a browser.

``Button.click()`` calls the same handler a click in JupyterLab does; the runs go to the
shared ``pd_session`` servers, and the assertions read the knob values back from the servers
(``result.knobs["d"]``), the figure's PNG bytes and the table.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from PIL import Image

from workbench.config import ConfigError
from workbench.experiment import Session
from workbench.knobs import spec
from workbench.widgets import KnobExplorer, knob_table


@pytest.fixture()
def offline_explorer(tiny_pair, tmp_path):
    """An explorer whose session never starts a server (nothing is run)."""
    from workbench.config import ExperimentConfig

    base = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                            num_prompts=2, max_tokens=8)
    ex = KnobExplorer(base, Session(tmp_path / "logs"), out_dir=tmp_path)
    yield ex
    ex.session.close()


def test_controls_come_from_the_spec(offline_explorer):
    ex = offline_explorer
    assert list(ex.knob_controls) == list(spec.KNOBS)
    for name, k in spec.KNOBS.items():
        dd = ex.knob_controls[name]
        assert tuple(dd.options) == k.values and dd.value == k.default
        assert ("↻" in dd.description) == k.restart
        assert k.where in dd.tooltip
    assert list(knob_table().index) == list(spec.KNOBS)


def test_controls_build_the_config(offline_explorer):
    ex = offline_explorer
    ex.set_values(finalize="eager", transfer="host-staged", k_d=2, prompt_set="badcase",
                  num_prompts=5, max_tokens=12)
    cfg = ex.config()
    assert cfg.knobs["finalize"] == "eager" and cfg.knobs["transfer"] == "host-staged"
    assert (cfg.k_d, cfg.prompt_set, cfg.num_prompts, cfg.max_tokens) == (2, "badcase", 5, 12)
    assert cfg.target == ex.base.target and "finalize=eager" in cfg.label
    with pytest.raises(ConfigError, match="allowed values"):
        ex.set_values(finalize="later")
    with pytest.raises(ConfigError, match="unknown control"):
        ex.set_values(finalise="eager")


def test_failed_run_is_shown_in_the_panel(offline_explorer):
    ex = offline_explorer
    ex.set_values(prompt_set="mt_bench", num_prompts=1000)  # fails before any server starts
    ex.run_button.click()
    assert isinstance(ex.last_error, ValueError) and "only" in str(ex.last_error)
    assert "run failed" in ex.status.value
    assert ex.history == [] and not ex.run_button.disabled
    assert not ex.session.servers


@pytest.mark.vllm
def test_run_button_runs_and_updates_plot_table_and_export(pd_session, base_cfg, tmp_path):
    base = replace(base_cfg, num_prompts=2, max_tokens=8)
    ex = KnobExplorer(base, pd_session, out_dir=tmp_path)
    assert bytes(ex.plot.value) == b""

    ex.knob_controls["finalize"].value = "eager"
    ex.controls["repeats"].value = 2
    ex.run_button.click()
    assert ex.last_error is None, ex.log_html.value
    assert len(ex.history) == 1 and len(ex.history[0]) == 2
    for r in ex.history[0]:
        assert r.knobs["d"]["finalize"] == "eager", r.knobs  # read back from D's worker
        assert r.config["num_prompts"] == 2 and r.pd["num_drafts"] > 0
    assert ex.progress.value == ex.progress.max == 2 * 2 * 2  # repeats x prompts x sides
    assert ex.progress.bar_style == "success"
    assert "finalize=eager" in ex.status.value  # the values in force, shown after the run
    first_png = bytes(ex.plot.value)  # the Image widget holds a memoryview
    assert first_png.startswith(b"\x89PNG")
    table = ex.table()
    assert list(table["knob_finalize"]) == ["eager", "eager"]
    assert list(table["repeat"]) == [1, 2]
    assert "<table" in ex.table_html.value and "eager" in ex.table_html.value

    ex.set_values(finalize="deferred", block_handoff="legacy", repeats=1)
    ex.run_button.click()
    assert ex.last_error is None, ex.log_html.value
    last = ex.history[-1][0]
    assert last.knobs["p"]["block_handoff"] == "legacy"  # acts on P; D keeps its own
    assert last.knobs["d"]["finalize"] == "deferred"
    assert "block_handoff=legacy" in ex.status.value and "NOT as requested" not in ex.status.value
    assert bytes(ex.plot.value).startswith(b"\x89PNG") and bytes(ex.plot.value) != first_png
    assert list(ex.table()["knob_block_handoff"]) == ["clipped", "clipped", "legacy"]
    assert list(ex.table()["knob_finalize"]) == ["eager", "eager", "deferred"]

    ex.export_dir.value = str(tmp_path / "export")
    ex.export_button.click()
    assert "exported" in ex.status.value, ex.status.value
    figures = tmp_path / "export" / "figures"
    for ext in ("png", "svg", "pdf"):
        assert (figures / f"per_position_spread.{ext}").stat().st_size > 1000
    with Image.open(figures / "per_position_spread.png") as im:
        prov = json.loads(im.text["Description"])
    assert [r["knobs_d"]["finalize"] for r in prov["runs"]] == ["eager", "eager", "deferred"]
    assert (tmp_path / "export" / "results.csv").read_text().count("\n") == 4
    assert len(list((tmp_path / "export" / "runs").iterdir())) == 3
