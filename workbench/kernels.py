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
"""

from __future__ import annotations

from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync

PRELOAD = ("workbench.sweep", "workbench.experiment")  # what the sweep notebook imports


class KernelStarter:
    def __init__(self, cwd: str | Path, kernel_name: str = "python3") -> None:
        self.cwd, self.kernel_name = str(cwd), kernel_name
        self._next: AsyncKernelManager | None = None

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
        km = AsyncKernelManager(kernel_name=self.kernel_name)
        preload = repr([f"import {m}" for m in PRELOAD])
        run_sync(km.start_kernel)(cwd=self.cwd, extra_arguments=[
            "--HistoryManager.hist_file=:memory:",  # as nbclient starts its kernels
            f"--IPKernelApp.exec_lines={preload}"])
        return km

    @staticmethod
    def stop(km: AsyncKernelManager) -> None:
        run_sync(km.shutdown_kernel)(now=True)

    def close(self) -> None:
        if self._next is not None:
            self.stop(self._next)
            self._next = None
