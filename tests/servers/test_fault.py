"""A server killed in the middle of a concurrent run: a clear error, a saved partial result,
no process left. Marked ``restart`` so it runs where the shared servers restart anyway (the
host-staged tests come next and restart them)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import pytest
from conftest import alive, tree_pids

from workbench.results import Result

pytestmark = [pytest.mark.vllm, pytest.mark.restart]


def test_d_killed_mid_run_ends_it_with_a_clear_error_and_a_partial_result(pd_session,
                                                                           base_cfg, tmp_path):
    cfg = replace(base_cfg, num_prompts=16, max_tokens=48, concurrency=8, run_baseline=False)
    pd_session.ensure(cfg)
    d_pids = tree_pids(pd_session.servers["d"])
    others = set().union(*(tree_pids(s) for r, s in pd_session.servers.items() if r != "d"))
    assert len(d_pids) >= 3 and others

    def kill_d_after_three(side, done, total):
        if side == "pd" and done == 3:
            for pid in d_pids:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match="the d server died during the run"):
        pd_session.run(cfg, progress=kill_d_after_three, out_dir=tmp_path / "cut")
    partial = Result.load(tmp_path / "cut")
    assert partial.complete is False and "d server died" in partial.error
    assert "d.log" in partial.error, "the error names D's log"
    measured = [q for q in partial.requests if "pd" in q]
    assert 3 <= len(measured) < 16 and partial.pd["num_requests"] == len(measured)
    deadline = time.monotonic() + 30
    while alive(d_pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(d_pids), f"left running: {alive(d_pids)}"
    pd_session.stop()  # the others go too: nothing of this server set is left
    deadline = time.monotonic() + 30
    while alive(others) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(others), f"left running: {alive(others)}"
