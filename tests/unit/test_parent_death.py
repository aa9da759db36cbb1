"""``knobs/parent_death.py`` on real processes: a child armed with the parent's pid dies when
the parent is SIGKILLed; the same child unarmed outlives it (what vLLM's engine core does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import alive

from workbench.knobs import parent_death
from workbench.knobs.spec import ENV_DIE_WITH_PID

CHILD = textwrap.dedent("""
    import time
    from workbench.knobs import parent_death
    if (parent := parent_death.requested()) is not None:
        parent_death.install(parent)
    print("ready", flush=True)
    time.sleep(120)
""")
PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    env = dict(os.environ)
    if sys.argv[1] == "armed":
        env[{env!r}] = str(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", {child!r}], env=env, stdout=subprocess.PIPE,
                             text=True)
    child.stdout.readline()
    print(child.pid, flush=True)
    time.sleep(120)
""").format(env=ENV_DIE_WITH_PID, child=CHILD)


def _child_after_parent_killed(mode: str, wait_s: float) -> bool:
    """Whether the child still runs ``wait_s`` after its parent was SIGKILLed."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())
    try:
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + wait_s
        while alive({child}) and time.monotonic() < deadline:
            time.sleep(0.1)
        return bool(alive({child}))
    finally:
        if alive({child}):
            os.kill(child, signal.SIGKILL)


def test_an_armed_child_dies_with_its_sigkilled_parent():
    assert not _child_after_parent_killed("armed", wait_s=10)


def test_an_unarmed_child_outlives_its_sigkilled_parent():
    assert _child_after_parent_killed("unarmed", wait_s=3)


@pytest.mark.parametrize("value", ["", "abc", "-1", "1"])
def test_a_pid_that_is_not_the_parents_arms_nothing(monkeypatch, value):
    """The engine core's own worker, and anything else started with the variable, whose
    parent is not that pid, is left as it is (the worker has vLLM's death pipe)."""
    monkeypatch.setenv(ENV_DIE_WITH_PID, value)
    assert parent_death.requested() is None


def test_the_parents_pid_arms(monkeypatch):
    monkeypatch.setenv(ENV_DIE_WITH_PID, str(os.getppid()))
    assert parent_death.requested() == os.getppid()
