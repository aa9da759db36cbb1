"""Faster stand-ins for the interpreted Triton kernels that cost Model Runner V2 most on the CPU.

Triton's interpreter runs a kernel one program at a time, each ``tl`` operation a numpy call
wrapped in Triton's semantics: MRV2 spends most of a CPU step there (docs/performance.md). A
stand-in (``kernels/``) computes what one kernel computes, for the same arguments and grid,
with numpy over each program's block, and writes exactly the elements the kernel writes. It
is used only for the kernel source it was checked against (a hash of the kernel's text and of
the ``@triton.jit`` helpers it calls, ``kernels.STANDINS``) and only in the cases it covers
(greedy rows, no context parallelism); anything else goes to the interpreter as before.

``WORKBENCH_TRITON_STANDINS`` (read in each vLLM process that interprets Triton):

* ``on`` (the default): covered launches run the stand-in;
* ``off``: every launch runs in Triton's interpreter;
* ``verify``: every covered launch runs both, the stand-in on a copy of every storage the
  launch's arguments point into, and the two sets of storages are compared byte for byte. The
  run keeps the interpreter's results. Counts (``compared``, ``mismatched``) go to the profile
  files (``profile.py``; ``verify`` needs ``WORKBENCH_TRITON_PROFILE``).

The hook is on ``triton.runtime.interpreter.InterpretedFunction.run``, the launch of
``kernel[grid](...)`` under ``TRITON_INTERPRET=1``: Triton's code path, not vLLM's.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from typing import Any

from . import profile

ENV = "WORKBENCH_TRITON_STANDINS"
MODES = ("on", "off", "verify")
log = logging.getLogger(__name__)


_installed = False


def mode(env: dict[str, str]) -> str:
    """The mode ``env`` asks for; a clear error for a value not in ``MODES``."""
    value = env.get(ENV, "on")
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: allowed values are {', '.join(MODES)}")
    if value == "verify" and not env.get(profile.ENV):
        raise ValueError(f"{ENV}=verify writes its counts with the profile: set "
                         f"{profile.ENV} to a folder as well")
    return value


def requested() -> str | None:
    """The mode of this process, None where Triton is not interpreted."""
    return mode(os.environ) if os.environ.get("TRITON_INTERPRET") == "1" else None


def install(mode: str) -> None:
    """Route covered launches to their stand-ins (``on``) or check them (``verify``)."""
    global _installed
    if mode == "off" or _installed:
        return
    _installed = True
    from triton.runtime.interpreter import InterpretedFunction

    from .kernels import STANDINS

    orig = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        entry = STANDINS.get(profile.kernel_name(self.fn))
        launch = _launch(self, entry, args, kwargs, grid, warmup)
        if launch is None:
            return orig(self, *args, grid=grid, warmup=warmup, **kwargs)
        if mode == "verify":
            return _verify(self, orig, entry, launch, args, kwargs, grid)
        if entry.fn(*launch):
            profile.count(entry.name, "standin")
            return None
        profile.count(entry.name, "deferred")
        return orig(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run


def _launch(jit, entry, args, kwargs, grid, warmup) -> tuple[tuple, dict] | None:
    """(grid, arguments by name) for a launch a stand-in may take, None otherwise."""
    if entry is None or warmup or callable(grid) or jit.pre_run_hooks:
        return None
    if not entry.source_matches(jit.fn):
        profile.count(entry.name, "source_changed")
        return None
    sig = _signature(jit.fn)
    bound = sig.bind(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    bound.apply_defaults()
    return tuple(int(g) for g in grid) + (1,) * (3 - len(grid)), dict(bound.arguments)


@functools.cache
def _signature(fn) -> inspect.Signature:
    """A kernel's signature, read once: ``_launch`` runs on every launch."""
    return inspect.signature(fn)


def _verify(jit, orig, entry, launch, args, kwargs, grid):
    """Run the stand-in on copies and the interpreter on the real storages; compare."""
    import torch

    grid3, named = launch
    copies = _copy_storages(named)
    covered = entry.fn(grid3, {k: copies.get(k, v) for k, v in named.items()})
    orig(jit, *args, grid=grid, warmup=False, **kwargs)
    if not covered:
        profile.count(entry.name, "deferred")
        return None
    differ = [k for k, c in copies.items()
              if not torch.equal(_bytes(named[k]), _bytes(c))]
    profile.count(entry.name, "compared")
    if differ:
        profile.count(entry.name, "mismatched")
        log.warning("stand-in for %s differs from Triton's interpreter in %s",
                    entry.name, ", ".join(differ))
    return None


def _copy_storages(named: dict[str, Any]) -> dict[str, Any]:
    """Each tensor argument on a copy of its whole storage (tensors that share a storage
    share the copy), with its offset, sizes and strides: a kernel addresses the storage."""
    import torch

    copies, out = {}, {}
    for k, v in named.items():
        if isinstance(v, torch.Tensor):
            st = v.untyped_storage()
            c = copies.setdefault(st.data_ptr(), st.clone())
            out[k] = v.new_empty(0).set_(c, v.storage_offset(), v.size(), v.stride())
    return out


def _bytes(t):
    import torch

    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
