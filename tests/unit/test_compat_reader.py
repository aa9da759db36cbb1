"""``compat``'s static reader on a made-up source tree: it finds what is there, follows
re-exports, and fails a check that no longer holds (with where and why)."""

from __future__ import annotations

from pathlib import Path

from workbench.compat import checks
from workbench.knobs import patch_checks
from workbench.knobs.source import DirSource, find_def, params

KV = '''
from .impl import Zeroer


class ActiveKVConnector:
    def post_forward(self, finished_req_ids, defer_finalize=False):
        if not defer_finalize:
            self.kv_connector.wait_for_save()
        return None
'''
IMPL = '''
class Zeroer:
    def zero_block_ids(self, block_ids, *rest, **kw):
        pass
'''
ENVS = '''
environment_variables = {
    "VLLM_KV_CACHE_LAYOUT": env_with_choices("VLLM_KV_CACHE_LAYOUT", None, ["NHD", "HND"]),
    "VLLM_NIXL_SIDE_CHANNEL_PORT": lambda: 1,
}
'''


def tree(tmp_path: Path) -> DirSource:
    for rel, text in {"vllm/__init__.py": "", "vllm/w/__init__.py": "", "vllm/w/kv.py": KV,
                      "vllm/w/impl.py": IMPL, "vllm/envs.py": ENVS}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return DirSource(tmp_path, "test tree")


def test_reader_finds_methods_and_follows_reexports(tmp_path):
    src = tree(tmp_path)
    node, rel = find_def(src, "vllm.w.kv", "ActiveKVConnector.post_forward")
    assert rel == "vllm/w/kv.py" and params(node) == ["self", "finished_req_ids",
                                                      "defer_finalize"]
    node, rel = find_def(src, "vllm.w.kv", "Zeroer.zero_block_ids")  # re-exported
    assert rel == "vllm/w/impl.py" and params(node) == ["self", "block_ids", "rest", "kw"]
    assert find_def(src, "vllm.w.kv", "ActiveKVConnector.finalize_step") is None


def test_a_check_that_no_longer_holds_fails_with_its_reason(tmp_path):
    src = tree(tmp_path)
    old = patch_checks._target("vllm.w.kv", "ActiveKVConnector", "post_forward",
                         ["self", "finished_req_ids"])
    ok, why = old.run(src)
    assert not ok and "takes (self, finished_req_ids, defer_finalize)" in why
    gone = patch_checks._target("vllm.w.kv", "ActiveKVConnector", "finalize_step", ["self"])
    ok, why = gone.run(src)
    assert not ok and "missing" in why
    order = patch_checks._order("vllm.w.kv", "ActiveKVConnector.post_forward",
                                ("wait_for_save()", "if not defer_finalize:"))
    ok, why = order.run(src)
    assert not ok and "not found after" in why
    assert patch_checks._order("vllm.w.kv", "ActiveKVConnector.post_forward",
                               ("if not defer_finalize:", "wait_for_save()")).run(src)[0]


def test_env_names_and_choices(tmp_path):
    src = tree(tmp_path)
    assert checks._env("VLLM_KV_CACHE_LAYOUT", "HND").run(src)[0]
    ok, why = checks._env("VLLM_KV_CACHE_LAYOUT", "LBHNC").run(src)
    assert not ok and "choices" in why
    assert checks._env("VLLM_NIXL_SIDE_CHANNEL_PORT", "").run(src)[0]
    assert not checks._env("VLLM_NOT_THERE", "").run(src)[0]
