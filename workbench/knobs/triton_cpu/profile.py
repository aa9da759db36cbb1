"""Where Model Runner V2's time goes on the CPU: each interpreted Triton kernel's launches and
seconds, per vLLM process (``benchmarks/runner_cost.py``).

With ``WORKBENCH_TRITON_PROFILE=<dir>`` the plugin wraps
``triton.runtime.interpreter.InterpretedFunction.run`` (the launch of ``kernel[grid](...)``
under ``TRITON_INTERPRET=1``) in each server process, and a thread writes the totals to
``<dir>/triton-<role>-<pid>.json`` every second. The wrapper times the launch; it changes no
argument and no result. The stand-ins (``standins.py``) count what they did into the same
totals (``count``), so one file per process says what ran where.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

ENV = "WORKBENCH_TRITON_PROFILE"
_totals: dict[str, dict[str, float]] = {}  # kernel -> {"launches": n, "seconds": s, ...}
_lock = threading.Lock()


def requested() -> str | None:
    return os.environ.get(ENV) or None


def install(out_dir: str, role: str) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    orig = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        t0 = time.perf_counter()
        try:
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        finally:
            _add(kernel_name(self.fn), time.perf_counter() - t0)

    InterpretedFunction.run = run
    _start_writer(out_dir, role)
    # A process forked from this one (the engine core and the worker, knobs/fork_start.py)
    # keeps the wrapper but not the thread: it gets its own, and its own totals and file.
    os.register_at_fork(after_in_child=lambda: _start_writer(out_dir, role, fresh=True))


def _start_writer(out_dir: str, role: str, fresh: bool = False) -> None:
    global _lock
    if fresh:  # the parent's writer may have held the lock at the fork
        _lock = threading.Lock()
        _totals.clear()
    path = Path(out_dir) / f"triton-{role}-{os.getpid()}.json"
    threading.Thread(target=_writer, args=(path,), name="workbench-triton-profile",
                     daemon=True).start()


def kernel_name(fn) -> str:
    """``module:qualname`` of a ``@triton.jit`` function, the key of every total."""
    return f"{fn.__module__}:{fn.__qualname__}"


def _add(kernel: str, seconds: float) -> None:
    count(kernel, "launches")
    count(kernel, "seconds", seconds)


def count(kernel: str, key: str, n: float = 1) -> None:
    """Add ``n`` to one of ``kernel``'s totals."""
    with _lock:
        t = _totals.setdefault(kernel, {})
        t[key] = t.get(key, 0) + n


def _writer(path: Path) -> None:
    from ...provenance import atomic_write_json

    while True:
        time.sleep(1.0)
        with _lock:
            doc = {k: dict(v) for k, v in _totals.items()}
        if doc:
            atomic_write_json(path, doc, indent=None, sort_keys=True)


def read(out_dir: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per role, each kernel's totals (launches, seconds, the stand-ins' counts) summed over
    the role's processes."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for f in sorted(Path(out_dir).glob("triton-*-*.json")):
        role = f.name.split("-")[1]
        for k, v in json.loads(f.read_text()).items():
            t = out.setdefault(role, {}).setdefault(k, {"launches": 0, "seconds": 0.0})
            for key, n in v.items():
                t[key] = t.get(key, 0) + n
    return out
