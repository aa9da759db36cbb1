"""The knob explorer's controls, without a server: generated from the knob table, building
the config, and a failed run shown in the panel (it fails before any server starts)."""

from __future__ import annotations

import pytest

from workbench.config import ConfigError
from workbench.experiment import Session
from workbench.knobs import spec
from workbench.notebook.history import claim_run_dir
from workbench.notebook.widgets import KnobExplorer, knob_table


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
    assert list(ex.knob_controls) == list(spec.settings())  # instruments are checkboxes
    assert ex.controls["kv_probe"].value is False
    for name in spec.settings():
        k, dd = spec.KNOBS[name], ex.knob_controls[name]
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


def test_explorer_run_numbers_go_on_after_earlier_kernels(tmp_path):
    runs = tmp_path / "runs"
    (runs / "run001-rep1").mkdir(parents=True)
    (runs / "run002-rep3").mkdir()
    assert claim_run_dir(runs) == 3  # a new kernel's first run does not reuse run001
    assert claim_run_dir(runs) == 4
    assert (runs / "run003-rep1").is_dir() and (runs / "run004-rep1").is_dir()
