"""NIXL's progress thread, made to sleep between polls on the CPU profile.

``nixl._api.nixl_agent`` builds every agent with ``pthrDelay = 0``: its progress thread polls
UCX without pause, so each idle P and D worker burns a whole core. On the 2-core CPU box that
starved everything else (a Jupyter kernel took 15 minutes to import torch next to idle P and D
servers). With a delay of 1 ms the thread costs about 2% of a core (measured with one agent,
``benchmarks/nixl_progress_cpu.py``) and a transfer waits at most that long for its next
progress round, against CPU engine steps of tens of milliseconds. What moves, and when the
connector is finalized, are unchanged.

Not a knob: part of a profile (``Profile.nixl_progress_delay_us``), passed to the servers as
``WORKBENCH_NIXL_PROGRESS_DELAY_US`` and recorded with each server's environment.
"""

from __future__ import annotations

import os
import warnings

from . import spec


def requested_delay_us() -> int:
    """The delay asked for in this process's environment; 0 means vLLM's own behaviour.

    A malformed value is ignored with a warning, not raised: this runs in the plugin's
    ``register``, inside every vLLM process started in that environment (the workbench's or
    anyone's), and an exception there would crash each of them at start-up."""
    raw = os.environ.get(spec.ENV_NIXL_PROGRESS_DELAY_US, "0")
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        warnings.warn(f"{spec.ENV_NIXL_PROGRESS_DELAY_US}={raw!r} is not an integer number of "
                      "microseconds >= 0; ignored (NIXL's default polling, no delay)",
                      RuntimeWarning, stacklevel=2)
        return 0
    return value


def install(delay_us: int, api=None) -> bool:
    """Give every NIXL agent built in this process a progress-thread delay of ``delay_us``.

    ``nixl_agent.__init__`` sets ``pthrDelay = 0`` on a fresh ``nixlBind.nixlAgentConfig``;
    the module's class is swapped for a subclass that turns that 0 into ``delay_us``.
    Returns False when NIXL is not installed."""
    if api is None:
        try:
            from vllm.distributed import nixl_utils

            nixl_utils.nixl_agent_config  # noqa: B018  (loads nixl the way vLLM does)
            import nixl._api as api
        except ImportError:
            return False
    base = api.nixlBind.nixlAgentConfig
    if getattr(base, "_workbench_delay_us", None) is not None:
        return True

    class DelayedProgressConfig(base):
        _workbench_delay_us = delay_us

        def __setattr__(self, name, value):
            if name == "pthrDelay" and value == 0:
                value = self._workbench_delay_us
            super().__setattr__(name, value)

    api.nixlBind.nixlAgentConfig = DelayedProgressConfig
    return True
