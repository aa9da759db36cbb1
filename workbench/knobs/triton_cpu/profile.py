"""Where Model Runner V2's time goes on the CPU: each interpreted Triton kernel's launches and
seconds, per vLLM process (``benchmarks/runner_cost.py``).

With ``WORKBENCH_TRITON_PROFILE=<dir>`` the plugin wraps
``triton.runtime.interpreter.InterpretedFunction.run`` (the launch of ``kernel[grid](...)``
under ``TRITON_INTERPRET=1``) in each server process, and a thread writes the totals to
``<dir>/triton-<role>-<pid>.json`` every second. The wrapper times the launch; it changes no
argument and no result.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

ENV = "WORKBENCH_TRITON_PROFILE"
_totals: dict[str, list[float]] = {}  # kernel -> [launches, seconds]
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
            _add(f"{self.fn.__module__}:{self.fn.__qualname__}", time.perf_counter() - t0)

    InterpretedFunction.run = run
    path = Path(out_dir) / f"triton-{role}-{os.getpid()}.json"
    threading.Thread(target=_writer, args=(path,), name="workbench-triton-profile",
                     daemon=True).start()


def _add(kernel: str, seconds: float) -> None:
    with _lock:
        t = _totals.setdefault(kernel, [0, 0.0])
        t[0] += 1
        t[1] += seconds


def _writer(path: Path) -> None:
    from ...provenance import atomic_write_json

    while True:
        time.sleep(1.0)
        with _lock:
            doc = {k: {"launches": int(n), "seconds": s} for k, (n, s) in _totals.items()}
        if doc:
            atomic_write_json(path, doc, indent=None, sort_keys=True)


def read(out_dir: str | Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per role, each kernel's launches and seconds summed over the role's processes."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for f in sorted(Path(out_dir).glob("triton-*-*.json")):
        role = f.name.split("-")[1]
        for k, v in json.loads(f.read_text()).items():
            t = out.setdefault(role, {}).setdefault(k, {"launches": 0, "seconds": 0.0})
            t["launches"] += v["launches"]
            t["seconds"] += v["seconds"]
    return out
