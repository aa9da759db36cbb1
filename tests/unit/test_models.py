"""Model names: local directories offline, Hugging Face ids fetched once before servers."""

from __future__ import annotations

import sys
import types

import pytest

from workbench.config import ConfigError, ExperimentConfig
from workbench.inputs import models


def test_hub_ids_and_local_directories(tmp_path):
    assert models.is_hub_id("meta-llama/Llama-3.1-8B-Instruct")
    assert models.is_hub_id("RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3")
    for path in ("/models/x", "./a/b", "~/a/b", "a/b/c", "plain"):
        assert not models.is_hub_id(path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert not models.is_hub_id(str(tmp_path / "org" / "name"))  # an existing path wins
    assert "has no config.json" in models.problem(str(tmp_path / "org" / "name"))
    assert "does not exist" in models.problem(str(tmp_path / "missing"))
    assert models.problem("meta-llama/Llama-3.1-8B-Instruct") is None


def test_config_takes_hub_ids_and_still_refuses_a_missing_directory(tmp_path):
    cfg = ExperimentConfig.for_profile("gpu")  # vLLM's test's models, by Hub id
    assert cfg.target == "meta-llama/Llama-3.1-8B-Instruct" and cfg.max_model_len == 16384
    with pytest.raises(ConfigError, match="target model directory .* does not exist"):
        ExperimentConfig(target=str(tmp_path / "nope"))


def _fake_hub(monkeypatch, calls):
    hub = types.ModuleType("huggingface_hub")

    def snapshot_download(repo_id, local_files_only=False):
        calls.append((repo_id, local_files_only))
        return f"/cache/{repo_id}"

    hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)


def test_fetch_downloads_each_hub_id_once_and_skips_local_dirs(monkeypatch, tmp_path):
    calls: list = []
    _fake_hub(monkeypatch, calls)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    got = models.fetch(["org/a", str(tmp_path), "org/a", "org/b"])
    assert calls == [("org/a", False), ("org/b", False)]
    assert got == {"org/a": "/cache/org/a", "org/b": "/cache/org/b"}
    assert models.fetch([str(tmp_path)]) == {}


def test_fetch_offline_uses_the_cache_only(monkeypatch):
    calls: list = []
    _fake_hub(monkeypatch, calls)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models.fetch(["org/a"])
    assert calls == [("org/a", True)]


def test_result_names_the_runner_the_workers_reported():
    from workbench.measuring.results import runner_in_force

    def worker(runner):
        return {"components": {"worker": {"runner": runner}, "engine_core": {"runner": "v1"}}}

    assert runner_in_force({"detail": {"p": worker("v2"), "d": worker("v2")}}) == "v2"
    assert runner_in_force({"detail": {"p": worker("v1"), "d": worker("v2")}}) == "v1,v2"
    assert runner_in_force({"requested": {}}) is None


def test_fetch_names_a_model_that_is_neither_local_nor_on_the_hub(monkeypatch):
    hub = types.ModuleType("huggingface_hub")

    def snapshot_download(repo_id, local_files_only=False):
        raise OSError("404 Repository Not Found")

    hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ValueError, match="'models/target' is not a local directory"):
        models.fetch(["models/target"])
