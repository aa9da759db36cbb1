"""Edits of vLLM's source that dev builds in the tests apply: the proposed fixes, and a
refactor a PR could make. Importable from every test directory (``tests/`` is on ``sys.path``
through its ``conftest.py``)."""

from __future__ import annotations

import difflib
from pathlib import Path

from workbench import devbuild

PATCHES = Path(__file__).resolve().parents[1] / "patches" / "vllm-0.32.0"
KV_MANAGER = "vllm/v1/core/kv_cache_manager.py"
SCHEDULER = "vllm/v1/core/sched/scheduler.py"


def rename_param_patch(tmp_path: Path) -> Path:
    """A refactor a PR could make: ``request_id`` renamed ``req_id`` in
    ``KVCacheManager.get_block_ids_for_computed_tokens`` and at its one caller (vLLM still
    runs), which the hand-off knob's wrapper expects by name."""
    pkg, _ = devbuild.installed()
    diff = []
    for rel, start, span in ((KV_MANAGER, "def get_block_ids_for_computed_tokens", 25),
                             (SCHEDULER, "self.kv_cache_manager.get_block_ids_for_computed", 3)):
        old = (pkg.parent / rel).read_text().splitlines(keepends=True)
        at = next(i for i, line in enumerate(old) if start in line)
        new = old[:at] + [line.replace("request_id=", "req_id=") if rel == SCHEDULER else
                          line.replace("request_id", "req_id") for line in old[at:at + span]
                          ] + old[at + span:]
        diff += difflib.unified_diff(old, new, f"a/{rel}", f"b/{rel}")
    path = tmp_path / "rename.patch"
    path.write_text("".join(diff))
    return path
