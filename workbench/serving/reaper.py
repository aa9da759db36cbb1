"""Run one server command and make sure its whole process tree dies with it.

``python -m workbench.serving.reaper --parent PID -- CMD ...``: starts CMD, then stops CMD's process
tree (SIGTERM, then SIGKILL after a grace period) when this reaper gets SIGTERM/SIGINT/SIGHUP,
when CMD exits, or when PID (the workbench process) is gone, e.g. a Jupyter kernel that was
SIGKILLed on restart and had no chance to run its own clean-up.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from .. import ipc_dir

GRACE_S = 15.0
STOPPING = "[workbench.serving.reaper] stopping server tree"  # what a server's log gets


def become_subreaper() -> None:
    """Orphaned grandchildren (engine core, workers) re-parent to us, so we can still find them."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def terminate_tree(root: psutil.Process, grace: float = GRACE_S) -> None:
    """Stop every descendant of ``root`` (not ``root`` itself)."""
    procs = _descendants(root)
    if not procs:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace)
    # Children may have spawned more children while shutting down.
    for p in alive + _descendants(root):
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _descendants(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.serving.reaper")
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        ap.error("no command given")

    become_subreaper()
    child = subprocess.Popen(cmd)
    return supervise(child, lambda: not psutil.pid_exists(args.parent)
                     or os.getppid() != args.parent, args.parent, os.environ.get(ipc_dir.ENV))


def supervise(child, parent_gone, parent: int, ipc: str | None = None) -> int:
    """Wait for ``child`` (``poll()``/``wait(timeout)``) to exit, or for a stop signal, or for
    ``parent_gone()``; then stop this process's whole tree and remove its IPC socket directory
    (``ipc_dir``). Returns the child's exit code."""
    me = psutil.Process()
    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    while stop["why"] is None:
        if child.poll() is not None:
            break  # the server died by itself; its stragglers go below
        if parent_gone():
            stop["why"] = f"parent {parent} is gone"
        time.sleep(0.5)

    if stop["why"] is not None:
        print(f"{STOPPING}: {stop['why']}", file=sys.stderr, flush=True)
    terminate_tree(me)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(5)
    ipc_dir.remove(ipc)
    return child.returncode if child.returncode is not None else 1


if __name__ == "__main__":
    sys.exit(main())
