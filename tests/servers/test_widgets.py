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

from workbench.notebook.widgets import KnobExplorer


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
