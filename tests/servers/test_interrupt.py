"""A run interrupted the way a Jupyter kernel interrupts (SIGINT -> KeyboardInterrupt in the
main thread, inside a running event loop) stops sending, keeps what it measured, and the next
run on the same Session counts only its own requests."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from dataclasses import replace

import httpx
import pytest

from workbench.measuring import metrics

pytestmark = pytest.mark.vllm


def idle(session, timeout: float = 30) -> None:
    """Until P and D run nothing (an aborted request may take a moment to leave)."""
    deadline = time.monotonic() + timeout
    for role in ("p", "d"):
        while metrics.in_flight(httpx.get(f"{session.servers[role].url}/metrics",
                                          timeout=10).text):
            assert time.monotonic() < deadline, f"{role} still busy"
            time.sleep(0.2)


def d_drafts(session) -> float:
    r = httpx.get(f"{session.servers['d'].url}/metrics", timeout=10)
    return metrics.parse(r.text).num_drafts


def test_interrupt_in_a_running_loop_stops_the_run_and_the_next_counts_only_its_own(
        pd_session, base_cfg, tmp_path):
    cfg = replace(base_cfg, num_prompts=6, max_tokens=32, concurrency=1, run_baseline=False)
    clean = pd_session.run(cfg)

    handled = threading.Event()

    def on_sigint(signum, frame):
        handled.set()
        signal.default_int_handler(signum, frame)

    def interrupt_after_first(side, done, total):
        if side == "pd" and done == 1:
            os.kill(os.getpid(), signal.SIGINT)  # what ipykernel's interrupt sends
            # The run goes on only once this thread's interrupt was raised in the caller: on
            # two busy cores the caller may otherwise get the CPU after the last request.
            assert handled.wait(60), "the caller never handled the interrupt"

    async def cell():  # a notebook cell: synchronous code inside the kernel's running loop
        return pd_session.run(cfg, progress=interrupt_after_first, out_dir=tmp_path / "cut")

    loop = asyncio.new_event_loop()  # as ipykernel runs its loop: no asyncio.run SIGINT hook
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(cell())
    finally:
        signal.signal(signal.SIGINT, previous)
        loop.close()
    saved = json.loads((tmp_path / "cut" / "result.json").read_text())
    assert saved["complete"] is False and "KeyboardInterrupt" in (saved["error"] or "")
    assert sum("pd" in q for q in saved["requests"]) == 1, "only the request done before it"
    idle(pd_session)
    before = d_drafts(pd_session)
    time.sleep(3)
    assert d_drafts(pd_session) == before, "requests kept going after the interrupt"
    after = pd_session.run(cfg)
    assert after.pd["num_drafts"] == clean.pd["num_drafts"]
    assert after.pd["accepted_per_pos"] == clean.pd["accepted_per_pos"]
    assert after.measurement["crosscheck_mismatch"] == 0
