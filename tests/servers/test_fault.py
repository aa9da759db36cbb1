"""P, then D, killed in the middle of a concurrent run: a clear error, a saved partial result,
no process left. Marked ``restart`` so it runs where the shared servers restart anyway (the
host-staged tests come next and restart them)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace

import pytest
from conftest import alive, tree_pids

from workbench.measuring.results import Result

pytestmark = [pytest.mark.vllm, pytest.mark.restart]


@pytest.mark.parametrize("victim", ["p", "d"])
def test_a_server_killed_mid_run_ends_it_with_a_clear_error_and_a_partial_result(
        pd_session, base_cfg, tmp_path, victim):
    cfg = replace(base_cfg, num_prompts=16, max_tokens=48, concurrency=8, run_baseline=False)
    pd_session.ensure(cfg)  # the first case's kill left no servers: the second restarts them
    pids = tree_pids(pd_session.servers[victim])
    others = set().union(*(tree_pids(s) for r, s in pd_session.servers.items() if r != victim))
    assert len(pids) >= 3 and others

    def kill_after_three(side, done, total):
        if side == "pd" and done == 3:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(RuntimeError, match=f"the {victim} server died during the run"):
        pd_session.run(cfg, progress=kill_after_three, out_dir=tmp_path / "cut")
    partial = Result.load(tmp_path / "cut")
    assert partial.complete is False and f"{victim} server died" in partial.error
    assert f"{victim}.log" in partial.error, "the error names the dead server's log"
    measured = [q for q in partial.requests if "pd" in q]
    assert 3 <= len(measured) < 16 and partial.pd["num_requests"] == len(measured)
    deadline = time.monotonic() + 30
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(pids), f"left running: {alive(pids)}"
    pd_session.stop()  # the others go too: nothing of this server set is left
    deadline = time.monotonic() + 30
    while alive(others) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(others), f"left running: {alive(others)}"
