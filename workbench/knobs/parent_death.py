"""An in-process ``LLM``'s engine core, stopped when the process that built it dies.

vLLM's worker watches its parent, the engine core, through a death pipe
(``WorkerProc.monitor_death_pipe``), but ``EngineCoreProc`` watches nothing: when the process
that built an offline ``LLM`` is killed (SIGTERM with no handler, SIGKILL, a test timeout's
``os._exit``), ``VLLM::EngineCore`` and its worker keep running (vllm-project/vllm#19849 and
#55510; fixes proposed in #34816 and #55846, open). The workbench's servers have their reaper;
``training.evaluate.make_llm`` sets ``WORKBENCH_DIE_WITH_PID`` to its own pid while vLLM starts
the engine core, and in that process (the one whose parent has that pid) this asks the kernel
for SIGTERM when the parent dies (``PR_SET_PDEATHSIG``). The engine core's own handler turns it
into vLLM's shutdown, and the worker follows through its death pipe. The kernel sends it when
the thread that started the child ends, so ``make_llm`` sets it from the main thread only.

Not a knob: nothing vLLM computes changes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

from .spec import ENV_DIE_WITH_PID as ENV

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ARMED = "[workbench parent_death] SIGTERM to pid {pid} when pid {parent} dies"
_armed = False  # vLLM loads its plugins more than once per process


def requested() -> int | None:
    """The pid this process must die with: set, and this process's parent."""
    raw = os.environ.get(ENV, "")
    return int(raw) if raw.isdigit() and int(raw) == os.getppid() else None


def install(parent: int) -> bool:
    """SIGTERM to this process when ``parent`` dies; at once if it is already gone."""
    global _armed
    if _armed:
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # not Linux
        return False
    _armed = True
    print(ARMED.format(pid=os.getpid(), parent=parent), file=sys.stderr, flush=True)
    if os.getppid() != parent:  # it died before the request
        os.kill(os.getpid(), signal.SIGTERM)
    return True
