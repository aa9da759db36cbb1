"""The sweep's Jupyter kernels: the next point's kernel starts while the current point runs.

A fresh kernel costs each point its start-up and the notebook's imports (the workbench,
pandas, scipy, httpx): about 2 s on an idle 2-core machine, more while servers start. So
``KernelStarter`` launches the next point's kernel as the current point begins, with those
imports run at kernel start-up (IPython's ``exec_lines``: not a cell, not counted in the
record's execution counts), and it is ready when the point ends. Papermill runs a notebook on
a kernel it is given (``execute_notebook(km=...)``, passed on to nbclient's
``NotebookClient``) and leaves that kernel running: ``KernelStarter.stop`` ends each one,
and ``close`` the one launched ahead if no point took it. A kernel whose parent dies exits
by itself (ipykernel's parent poller), as papermill's own kernels do.

The kernels talk over IPC (Unix sockets) in a directory only this user can enter, not over
TCP: jupyter's default binds five unencrypted TCP ports on loopback, which any local user can
connect to, and ipykernel warns about it at every kernel start (once per sweep point). The
connection file and its key live in the same directory; ``close`` removes it. The kernel
process is :func:`main` (``python -m workbench.notebook.kernels``), which also keeps ipykernel from
opening its one other TCP listener.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

from ..serving.rundir import fresh_private_dir

KERNEL_MODULE = "workbench.notebook.kernels"  # run in place of ipykernel_launcher (main below)

PRELOAD = ("workbench.notebook.sweep", "workbench.experiment")  # what the sweep notebook imports


class KernelStarter:
    def __init__(self, cwd: str | Path, kernel_name: str = "python3") -> None:
        self.cwd, self.kernel_name = str(cwd), kernel_name
        self._next: AsyncKernelManager | None = None
        self._sockets: Path | None = None  # 0700: the kernels' connection files and sockets
        self._launched = 0

    def take(self) -> AsyncKernelManager:
        """A started kernel: the one launched ahead if it still runs, else a new one."""
        km, self._next = self._next, None
        if km is not None and not run_sync(km.is_alive)():
            self.stop(km)
            km = None
        return km or self._launch()

    def launch_next(self) -> None:
        """Start the kernel the next ``take`` returns (it boots while this process waits)."""
        if self._next is None:
            self._next = self._launch()

    def _launch(self) -> AsyncKernelManager:
        if self._sockets is None:
            self._sockets = fresh_private_dir("workbench-kernels-")
        self._launched += 1
        # transport ipc: the sockets are <connection file's stem>-ipc-<n>, beside the file
        km = AsyncKernelManager(kernel_name=self.kernel_name, transport="ipc",
                                connection_file=str(self._sockets / f"k{self._launched}.json"),
                                kernel_spec_manager=_Specs())
        preload = repr([f"import {m}" for m in PRELOAD])
        run_sync(km.start_kernel)(cwd=self.cwd, extra_arguments=[
            "--HistoryManager.hist_file=:memory:",  # as nbclient starts its kernels
            f"--IPKernelApp.exec_lines={preload}"])
        return km

    @staticmethod
    def stop(km: AsyncKernelManager) -> None:
        run_sync(km.shutdown_kernel)(now=True)  # removes its connection file and sockets

    def close(self) -> None:
        if self._next is not None:
            self.stop(self._next)
            self._next = None
        if self._sockets is not None:
            shutil.rmtree(self._sockets, ignore_errors=True)
            self._sockets = None


class _Specs(KernelSpecManager):
    """The installed kernel specs, a Python kernel's launcher replaced by :func:`main`."""

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        spec = super().get_kernel_spec(kernel_name)
        spec.argv = [KERNEL_MODULE if a == "ipykernel_launcher" else a for a in spec.argv]
        return spec


def main() -> None:
    """A kernel process as ``ipykernel_launcher`` runs it, with IOPub's pipe for forked
    children off: ipykernel binds that pipe to a TCP port on loopback whatever the kernel's
    transport. Off is ipykernel's own fallback when it cannot bind it (a forked child's prints
    then do not reach the notebook; the sweep notebook forks none)."""
    from ipykernel import iostream, kernelapp

    class IOPubThread(iostream.IOPubThread):
        def __init__(self, socket, pipe: bool = False, session=False) -> None:
            super().__init__(socket, pipe=False, session=session)

    if sys.path and sys.path[0] == "":  # as ipykernel_launcher: not the kernel's cwd first
        del sys.path[0]
    kernelapp.IOPubThread = IOPubThread
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
