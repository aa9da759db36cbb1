"""The sweep's kernels (``kernels.KernelStarter``), with real Jupyter kernels (no vLLM)."""

from __future__ import annotations

import os
import signal
import time

import psutil
from jupyter_core.utils import run_sync

from workbench import paths
from workbench.kernels import KernelStarter


def pid_of(km) -> int:
    return km.provisioner.process.pid


def gone(pid: int, within: float = 10.0) -> bool:
    """The process ended (a zombie not yet reaped counts as ended)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_the_kernel_started_ahead_is_the_one_taken_and_close_stops_an_unused_one():
    starter = KernelStarter(paths.REPO / "notebooks")
    starter.launch_next()
    ahead = starter._next
    km = starter.take()
    taken = pid_of(km)
    try:
        assert km is ahead and run_sync(km.is_alive)()
        starter.launch_next()
        unused = pid_of(starter._next)
    finally:
        starter.stop(km)
        starter.close()
    assert gone(taken) and gone(unused), "a kernel was left running"


def test_a_kernel_that_died_while_waiting_is_replaced():
    starter = KernelStarter(paths.REPO / "notebooks")
    starter.launch_next()
    dead = pid_of(starter._next)
    os.kill(dead, signal.SIGKILL)
    assert gone(dead)
    km = starter.take()
    try:
        assert pid_of(km) != dead and run_sync(km.is_alive)()
    finally:
        starter.stop(km)
        starter.close()
