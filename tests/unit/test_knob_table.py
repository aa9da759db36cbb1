"""The knob table: its vocabulary, what is derived from it, and adding a knob.

Pure logic: no vLLM server, no vLLM import (the Model Runner V2 stand-in is a torch tensor).
"""

from __future__ import annotations

import pytest

from workbench.knobs import spec


def test_validate_fills_defaults():
    assert spec.validate({}) == spec.defaults()
    assert spec.validate({"finalize": "eager"})["finalize"] == "eager"


def test_bad_value_names_value_and_allowed():
    with pytest.raises(ValueError) as e:
        spec.validate({"blocks": "filthy"})
    msg = str(e.value)
    assert "'filthy'" in msg and "blocks" in msg
    for v in spec.KNOBS["blocks"].values:
        assert v in msg


def test_warmup_dirty_source_needs_dirty_blocks():
    assert spec.validate({"blocks": "dirty", "dirty_source": "warmup"})["dirty_source"] == "warmup"
    for blocks in ("as-is", "zeroed", "poisoned"):
        with pytest.raises(ValueError, match=f"needs blocks='dirty', not '{blocks}'"):
            spec.validate({"blocks": blocks, "dirty_source": "warmup"})


def test_warmup_observation_on_mrv2_layout_stand_in_for_gpu_no_gpu():
    """Model Runner V2's start-up warm-up (GPU only) leaves KV in blocks 1 upward and zeroes
    block 0: the observation must see it and name the runner. A torch tensor in vLLM's
    layout stands in for the GPU runner's cache."""
    import types

    import torch

    from workbench.knobs import blocks, release

    MRV2 = type("GPUModelRunner", (), {"__module__": "vllm.v1.worker.gpu.model_runner"})
    runner = MRV2()
    kv = torch.zeros(2, 16, 32, 2, 8)  # (K/V, num_blocks, block_size, heads, head_dim)
    kv[:, 1:5].normal_()
    ns = types.SimpleNamespace
    runner.kv_cache_config = ns(num_blocks=16, kv_cache_groups=[ns(layer_names=["layers.0.attn"])])
    runner.compilation_config = ns(static_forward_context={"layers.0.attn": ns(kv_cache=[kv])})
    assert release.runner_kind(runner) == "v2"
    seen = blocks.observe(runner)
    assert seen["tensors"] == 1 and seen["diag_blocks"] == 15
    assert seen["nonzero_fraction"] == pytest.approx(4 / 15)
    note = blocks.warmup_note("v2", seen)
    assert "26.7%" in note and "Model Runner V2's start-up warm-up" in note
    kv.zero_()
    assert "hold zeros" in blocks.warmup_note("v2", blocks.observe(runner))


def test_bad_name_lists_knobs():
    with pytest.raises(ValueError) as e:
        spec.validate({"finalise": "eager"})
    assert "'finalise'" in str(e.value)
    for name in spec.KNOBS:
        assert name in str(e.value)


def test_parse_assignment():
    assert spec.parse_assignment("prefill_lookahead=0") == ("prefill_lookahead", "0")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        spec.parse_assignment("prefill_lookahead")
    with pytest.raises(ValueError, match="allowed values: default, 0"):
        spec.parse_assignment("prefill_lookahead=2")


def test_spec_names_and_env_unchanged():
    assert spec.ENV_CONTROL_FILE == "WORKBENCH_KNOBS_FILE"
    assert spec.ENV_STATE_DIR == "WORKBENCH_KNOBS_STATE_DIR"
    assert spec.ENV_ROLE == "WORKBENCH_ROLE"
    assert spec.ENV_TRANSFER == "WORKBENCH_TRANSFER"
    assert spec.ENV_CONNECTOR == "WORKBENCH_CONNECTOR"
    assert spec.ENV_RUNNER == "WORKBENCH_RUNNER"
    assert spec.restart_knobs() == ("transfer", "connector", "runner")
    assert spec.restart_knobs("p") == spec.restart_knobs("d") == (
        "transfer", "connector", "runner")
    # no KV connector to stage through; the runner is D's
    assert spec.restart_knobs("baseline") == ("runner",)
    # every knob the server reports is owned by some component; double_bos is client-side
    owned = {k for c in spec.COMPONENTS for k in spec.owned(c)}
    assert owned | set(spec.client_side()) == set(spec.KNOBS)


# ----------------------------------------------------- adding a knob: one table entry --

def _demo_apply(comp, knobs, seed):
    """A mechanism's apply hook: report the value and what it did."""
    return knobs["demo"], {"seen_seed": seed}


DEMO = spec.KnobSpec("demo", ("off", "on"), "off", where="worker: a test's stand-in mechanism",
                     hooks={"worker": spec.Hook(apply=_demo_apply)}, roles=("d",))


@pytest.fixture()
def demo_knob(monkeypatch):
    """The table plus one knob (and no vLLM hooks, so no vLLM class is patched here)."""
    from dataclasses import replace

    table = {n: replace(k, hooks={}, register=None) for n, k in spec.KNOBS.items()}
    monkeypatch.setattr(spec, "KNOBS", {**table, "demo": DEMO})


def test_a_new_knob_reaches_the_cli_the_config_and_the_widget_panel(demo_knob, capsys,
                                                                     tmp_path):
    from workbench import cli
    from workbench.config import ExperimentConfig
    from workbench.experiment import Session
    from workbench.notebook.widgets import KnobExplorer, knob_table

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    assert "demo: off|on" in " ".join(capsys.readouterr().out.split())
    cfg = ExperimentConfig(require_models=False, knobs={"demo": "on"})
    assert cfg.knobs["demo"] == "on"
    assert ExperimentConfig(require_models=False).knobs["demo"] == "off"
    with pytest.raises(ValueError, match="allowed values: off, on"):
        ExperimentConfig(require_models=False, knobs={"demo": "maybe"})
    with Session(tmp_path) as s:
        ex = KnobExplorer(cfg, s, out_dir=tmp_path)
        dd = ex.knob_controls["demo"]
        assert dd.value == "on" and DEMO.where in dd.tooltip
        ex.set_values(demo="off")
        assert ex.config().knobs["demo"] == "off"
    assert "demo" in knob_table().index
    assert spec.owned("worker") == ("demo",)  # the stand-in table has no other worker hook


@pytest.mark.parametrize("role, in_force", [("d", "on"), ("p", "off")])
def test_a_new_knob_is_applied_and_read_back_only_on_its_roles(demo_knob, monkeypatch, tmp_path,
                                                                role, in_force):
    from workbench.knobs import channel, component

    ctl, sdir = tmp_path / "knobs.json", tmp_path / "state"
    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(ctl))
    monkeypatch.setenv(spec.ENV_STATE_DIR, str(sdir))
    monkeypatch.setenv(spec.ENV_ROLE, role)
    monkeypatch.setattr("workbench.knobs.component.vllm_version", lambda: "0.32.0")
    channel.write_control(ctl, 1, {"demo": "on"}, seed=7)
    comp = component.Component("worker", object())
    comp.start()
    try:
        (st,) = channel.read_states(sdir)
        assert st["version"] == 1 and st["knobs"] == {"demo": in_force}
        assert st["requested"]["demo"] == "on"
        assert st["events"]["demo"]["seen_seed"] == 7
        assert ("acts on d only" in st["events"]["demo"].get("note", "")) == (role != "d")
        merged = channel.wait_for_version(sdir, 1, [role], timeout=2, components=("worker",))
        assert merged[role]["knobs"]["demo"] == in_force
    finally:
        comp._stop.set()
        comp._thread.join(2)


def test_restart_time_knobs_come_from_the_environment(monkeypatch):
    from workbench.knobs import component

    monkeypatch.setenv(spec.ENV_TRANSFER, "direct")
    gaps = component.restart_gaps({**spec.defaults(), "transfer": "host-staged"})
    assert list(gaps) == ["transfer"] and "needs a restart" in gaps["transfer"]
    assert component.restart_gaps(spec.defaults()) == {}
    assert spec.restart_env({**spec.defaults(), "transfer": "host-staged"}) == {
        spec.ENV_TRANSFER: "host-staged", spec.ENV_CONNECTOR: "nixl", spec.ENV_RUNNER: "v1"}
