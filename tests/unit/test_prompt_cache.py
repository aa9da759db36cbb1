"""Built prompt sets come back from the disk cache, identical, without a tokenizer load."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from workbench.inputs import prompt_cache, prompts
from workbench.paths import DEFAULT_TARGET

TARGET = str(DEFAULT_TARGET)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(prompt_cache, "CACHE", tmp_path / "cache")
    return tmp_path / "cache"


@pytest.mark.parametrize("name,double_bos", [("indomain", False), ("badcase", True),
                                             ("mt_bench", False)])
def test_a_cached_build_equals_a_fresh_one(cache, name, double_bos):
    fresh = prompts._build(name, 12, TARGET, seed=0, block_size=32, prompt_file=None,
                           double_bos=double_bos)
    first = prompts.build(name, 12, TARGET, double_bos=double_bos)
    assert len(list(cache.iterdir())) == 1
    again = prompts.build(name, 12, TARGET, double_bos=double_bos)
    assert fresh == first == again


def test_the_key_follows_every_input(cache, tmp_path):
    args = {"name": "indomain", "n": 8, "seed": 0, "block_size": 32, "prompt_file": None,
            "double_bos": False}
    k = prompt_cache.key(args, TARGET)
    assert prompt_cache.key({**args, "n": 9}, TARGET) != k
    assert prompt_cache.key({**args, "double_bos": True}, TARGET) != k
    copy = tmp_path / "target"
    shutil.copytree(DEFAULT_TARGET, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    assert prompt_cache.key(args, str(copy)) == k  # the same tokenizer files
    cfg = copy / "tokenizer_config.json"
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "add_bos_token": False}))
    assert prompt_cache.key(args, str(copy)) != k
    assert prompt_cache.key(args, "some-org/some-hub-model") is None  # nothing to digest


def test_an_unreadable_entry_is_built_again(cache):
    ps = prompts.build("indomain", 4, TARGET)
    [entry] = cache.iterdir()
    entry.write_text("{not json")
    assert prompts.build("indomain", 4, TARGET) == ps
    assert json.loads(entry.read_text())[0]["token_ids"] == ps[0].token_ids


def test_a_fresh_process_gets_the_ids_without_transformers():
    ps = prompts.build("indomain", 16, TARGET)  # the repository's cache, as a sweep uses it
    code = ("import json, sys; from workbench.inputs import prompts; "
            f"ps = prompts.build('indomain', 16, {TARGET!r}); "
            "print(json.dumps([[p.token_ids for p in ps], 'transformers' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    ids, imported = json.loads(out)
    assert ids == [p.token_ids for p in ps] and imported is False


@pytest.mark.parametrize("name", ["indomain", "mt_bench", "badcase", "lastblock"])
def test_the_client_sends_one_bos_unless_double_bos_is_on(name):
    """The client-side double BOS (no vLLM build can change it, so it is no finding of check):
    every prompt the workbench builds starts with one BOS; double_bos=on doubles it."""
    from transformers import AutoTokenizer

    bos = AutoTokenizer.from_pretrained(TARGET).bos_token_id
    single = prompts.build(name, 8, TARGET)
    doubled = prompts.build(name, 8, TARGET, double_bos=True)
    assert all(p.token_ids[0] == bos and p.token_ids[1] != bos for p in single)
    assert all(p.token_ids[:2] == [bos, bos] for p in doubled)
