"""The sweep's kernels (``kernels.KernelStarter``), with real Jupyter kernels (no vLLM)."""

from __future__ import annotations

import os
import signal
import stat
import time
from pathlib import Path

import psutil
from jupyter_core.utils import run_sync

from workbench import paths
from workbench.notebook.kernels import KernelStarter


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


def test_a_kernel_talks_over_ipc_in_a_private_directory_and_listens_on_no_tcp_port():
    """A local kernel needs no TCP: jupyter's default binds five unencrypted loopback ports
    (any local user may connect; ipykernel warns at every start) and ipykernel one more for
    forked children's output. Over IPC the kernel still runs code and sends its output."""
    starter = KernelStarter(paths.REPO / "notebooks")
    km = starter.take()
    try:
        info = km.get_connection_info()
        sockets = Path(info["ip"]).parent
        assert info["transport"] == "ipc", info
        assert stat.S_IMODE(sockets.stat().st_mode) & 0o777 == 0o700  # (jupyter_client adds +t)
        client = km.blocking_client()
        client.start_channels()
        client.wait_for_ready(timeout=120)
        out: list[str] = []
        reply = client.execute_interactive(
            "print(6 * 7)", timeout=60,
            output_hook=lambda m: out.append(m["content"].get("text", "")))
        client.stop_channels()
        assert reply["content"]["status"] == "ok" and "42" in "".join(out)
        kernel = psutil.Process(pid_of(km))
        assert kernel.net_connections(kind="inet") == []  # nothing on TCP or UDP at all
        bound = {c.laddr for c in kernel.net_connections(kind="unix")}
        ports = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")
        assert {f"{info['ip']}-{info[p]}" for p in ports} <= bound, bound
    finally:
        starter.stop(km)
        starter.close()
    assert not sockets.exists(), "close left the sockets' directory behind"
