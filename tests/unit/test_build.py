"""A vLLM build the table lacks: the entry it uses and the knobs its source allows, checked on
real dev builds of the installed vLLM (``python -m workbench devbuild``: links, one file
patched)."""

from __future__ import annotations

import pytest
from vllm_edits import PATCHES, rename_param_patch

from workbench import devbuild
from workbench.knobs import build, component, spec
from workbench.knobs.source import DirSource


def test_a_dev_build_with_a_source_fix_passes_every_check_of_its_entry(tmp_path):
    pkg, _ = devbuild.installed()
    released = (pkg / "v1/core/sched/scheduler.py").read_text()
    out = devbuild.make(tmp_path / "dev", patches=[PATCHES / "padded-load-step.patch"])
    b = build.check(devbuild.default_version(), DirSource(out, "dev"))
    assert (b.table_entry, b.source, b.commit) == ("0.32.0", "installed-source", "0000000")
    assert b.checks_passed == b.checks_total > 40 and b.failures == {} and b.refused() == {}
    assert "all" in b.summary() and "0.32.0 entry" in b.summary()
    # the patch was applied to a copy, never to the installed package
    assert (out / "vllm/v1/core/sched/scheduler.py").read_text() != released
    assert (pkg / "v1/core/sched/scheduler.py").read_text() == released
    assert not (out / "vllm/v1/core/sched/scheduler.py").is_symlink()


def test_a_removed_patch_target_refuses_only_its_knob_by_name(tmp_path):
    out = devbuild.make(tmp_path / "dev", patches=[rename_param_patch(tmp_path)])
    b = build.check(devbuild.default_version(), DirSource(out, "dev"))
    assert list(b.failures) == ["handoff"] and b.checks_passed == b.checks_total - 2
    assert list(b.refused()) == ["block_handoff"]
    assert "get_block_ids_for_computed_tokens" in b.refused()["block_handoff"][0]
    why = build.refusal(b, {**spec.defaults(), "block_handoff": "legacy"})
    assert "block_handoff=legacy refused" in why and "req_id" in why
    assert build.refusal(b, spec.defaults()) is None  # no knob set: it runs
    assert build.refusal(b, {**spec.defaults(), "load_step": "gated-async"}) is None


def test_the_plugin_installs_no_hook_of_a_refused_knob_and_refuses_its_value(monkeypatch):
    monkeypatch.setattr(component, "_refused", {"block_handoff": ["handoff: missing"]})
    monkeypatch.setenv(spec.ENV_ROLE, "p")  # the hand-off acts on P only
    monkeypatch.setattr(component, "resolve", lambda ref: lambda *a: ("x", {}))
    comp = component.Component("engine_core", object())
    assert "block_handoff" not in comp.hooks() and "prefill_lookahead" in comp.hooks()
    comp.apply({"version": 1, "knobs": {}})
    assert comp.errors == [] and comp.knobs["block_handoff"] == "clipped"
    comp.apply({"version": 2, "knobs": {"block_handoff": "legacy"}})
    assert comp.errors and "block_handoff=legacy refused" in comp.errors[0]


def test_the_verdict_reaches_the_servers_unchanged(monkeypatch):
    b = build.Build("0.32.1.dev1", "0.32.0", "installed-source", 54, 55, None,
                    {"handoff": ["x: missing"]})
    monkeypatch.setenv(build.ENV_VERDICT, build.env(b)[build.ENV_VERDICT])
    assert build.from_env() == b and build.from_env().record()["checks_passed"] == 54


def test_a_missing_diff_target_fails_with_the_file_named(tmp_path):
    bad = tmp_path / "bad.patch"  # a real git-style diff, of a file the build does not have
    bad.write_text("diff --git a/vllm/no_such_module.py b/vllm/no_such_module.py\n"
                   "--- a/vllm/no_such_module.py\n+++ b/vllm/no_such_module.py\n"
                   "@@ -1,2 +1,2 @@\n import os\n-x = 1\n+x = 2\n")
    with pytest.raises(devbuild.DevBuildError, match="bad.patch does not apply") as e:
        devbuild.make(tmp_path / "dev", patches=[bad])
    assert "can't find file to patch" in str(e.value) and "no_such_module.py" in str(e.value)
    assert not (tmp_path / "dev").exists()


def test_a_file_that_is_not_a_diff_is_refused_by_name(tmp_path):
    bad = tmp_path / "bad.patch"
    bad.write_text("not a diff\n")
    with pytest.raises(devbuild.DevBuildError, match="bad.patch: no '\\+\\+\\+ b/"):
        devbuild.make(tmp_path / "dev", patches=[bad])
