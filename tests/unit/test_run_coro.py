"""measure.run_coro inside a running event loop (Jupyter): an interrupt cancels the run's
coroutine and waits for it, instead of leaving it sending in a helper thread."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from workbench.measuring.measure import run_coro


def test_an_interrupt_inside_a_running_loop_cancels_the_coroutine_and_waits():
    state = {"ticks": 0, "cancelled": False, "finished": False}

    async def requests():
        try:
            for _ in range(200):
                state["ticks"] += 1
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            state["cancelled"] = True
            raise
        finally:
            state["finished"] = True

    async def cell():
        return run_coro(requests())

    # ipykernel's way: no asyncio.run SIGINT handler, and SIGINT raising KeyboardInterrupt in
    # the main thread. Set here: a pytest started in the background by a shell without job
    # control inherits SIGINT ignored, and Python then installs no handler of its own.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(cell())
    finally:
        signal.signal(signal.SIGINT, previous)
        loop.close()
    assert state["cancelled"] and state["finished"], state
    ticks = state["ticks"]
    time.sleep(0.2)
    assert state["ticks"] == ticks < 200, "nothing runs after the interrupt"


def test_results_and_errors_come_back_from_the_helper_thread():
    async def ok():
        return 42

    async def bad():
        raise ValueError("boom")

    async def cell():
        return run_coro(ok()), pytest.raises(ValueError, run_coro, bad())

    loop = asyncio.new_event_loop()
    try:
        value, _ = loop.run_until_complete(cell())
    finally:
        loop.close()
    assert value == 42
