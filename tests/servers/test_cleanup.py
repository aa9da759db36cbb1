"""No orphaned vLLM processes, and no socket file of theirs left behind (``workbench/ipc_dir.py``):
after an exception mid-run, and after the owner is SIGKILLed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import alive, ipc_sockets, one_ipc_dir, tree_pids

from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.measuring.results import Result

pytestmark = pytest.mark.vllm


class Boom(RuntimeError):
    pass


def test_run_that_raises_half_way_leaves_no_process_and_keeps_what_was_measured(
    tiny_pair, tmp_path
):
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=6, max_tokens=8, run_pd=False)
    seen: set[int] = set()
    sockets: dict[str, set[str]] = {}

    with pytest.raises(Boom), Session(tmp_path / "logs") as s:
        def progress(phase, done, total):
            for server in s.servers.values():
                seen.update(tree_pids(server))
                for where, paths in ipc_sockets(server).items():
                    sockets.setdefault(where, set()).update(paths)
            if done == 3:
                raise Boom("half-way")

        s.run(cfg, progress=progress, out_dir=tmp_path / "out")

    assert len(seen) >= 3  # reaper, API server, engine core (+ worker)
    deadline = time.monotonic() + 30
    while alive(seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(seen), f"left running: {alive(seen)}"
    # the baseline's sockets were all in its own directory, and went with it
    where = one_ipc_dir(sockets)
    assert not where.exists(), sorted(where.iterdir())
    partial = Result.load(tmp_path / "out")
    assert partial.complete is False and "half-way" in partial.error
    measured = [r for r in partial.requests if "baseline" in r]
    assert len(measured) == 3 and partial.baseline["num_requests"] == 3


def test_servers_die_with_a_sigkilled_owner(tiny_pair, tmp_path):
    """A Jupyter kernel killed on restart runs no clean-up: the reaper must stop the servers."""
    script = textwrap.dedent(f"""
        import json, sys, time
        from conftest import ipc_sockets, tree_pids
        from workbench.config import ExperimentConfig
        from workbench.experiment import Session
        cfg = ExperimentConfig(target={tiny_pair[0]!r}, drafter={tiny_pair[1]!r},
                               prompt_set="random", num_prompts=1, max_tokens=4, run_pd=False)
        s = Session({str(tmp_path / "logs")!r})
        s.ensure(cfg)
        print(json.dumps([sorted(set().union(*(tree_pids(v) for v in s.servers.values()))),
                          {{where: sorted(paths) for server in s.servers.values()
                           for where, paths in ipc_sockets(server).items()}}]), flush=True)
        time.sleep(600)
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))  # conftest's helpers
    owner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env=env)
    try:
        pids, sockets = json.loads(owner.stdout.readline())
        pids = set(pids)
        assert len(pids) >= 3 and alive(pids) == pids
        where = one_ipc_dir(sockets)
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 40
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive(pids), f"orphaned: {alive(pids)}"
        assert not where.exists(), sorted(where.iterdir())  # the reaper removed it
    finally:
        if owner.poll() is None:
            owner.kill()
