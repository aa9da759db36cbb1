"""The stand-ins for MRV2's hottest interpreted kernels (``knobs/triton_cpu/standins.py``,
``kernels.py``): each equal, byte for byte over every storage its launch points into, to
Triton's interpreter running vLLM's kernel, on the runs' shapes and their edge cases (a fresh
interpreter with the workbench's backend, ``standin_launches.py``); a wrong stand-in caught;
the cases a stand-in does not cover left to the interpreter; the mode checked before any
server starts. The runs' own launches are compared live in ``tests/servers/test_runners.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.knobs.triton_cpu import kernels, server_env, standins

LAUNCHES = Path(__file__).with_name("standin_launches.py")
SLOTS = f"{kernels.BLOCK_TABLE}:_compute_slot_mappings_kernel"
STATS = f"{kernels.REJECTION}:_compute_local_logits_stats_kernel"
REJECT = f"{kernels.REJECTION}:_rejection_kernel"


def launches(*flags: str) -> dict:
    base = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "TRITON_INTERPRET") and not k.startswith("WORKBENCH_")}
    env = {**base, **server_env({})}
    proc = subprocess.run([sys.executable, str(LAUNCHES), *flags], env=env, cwd=LAUNCHES.parent,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def verified():
    return launches()


def test_each_stand_in_equals_the_interpreted_kernel_on_every_covered_launch(verified):
    assert verified[SLOTS] == {"compared": 4}
    assert verified[STATS]["compared"] == 2 and "mismatched" not in verified[STATS]
    assert verified[REJECT]["compared"] == 2 and "mismatched" not in verified[REJECT]


def test_a_non_greedy_request_sends_both_rejection_kernels_to_the_interpreter(verified):
    assert verified[STATS]["deferred"] == 1 and verified[REJECT]["deferred"] == 1


def test_verify_catches_a_stand_in_that_gets_one_element_wrong():
    assert launches("--broken")[SLOTS] == {"compared": 4, "mismatched": 4}


def test_a_kernel_text_other_than_the_pinned_one_does_not_match():
    entry = kernels.Entry("m:k", kernels.block_table.slot_mappings, "0" * 64)
    assert not entry.source_matches(test_a_kernel_text_other_than_the_pinned_one_does_not_match)


@pytest.mark.parametrize("env, message", [
    ({standins.ENV: "fast"}, "allowed values are on, off, verify"),
    ({standins.ENV: "verify"}, "WORKBENCH_TRITON_PROFILE"),
])
def test_a_bad_mode_is_refused_before_any_server_starts(env, message):
    with pytest.raises(ValueError, match=message):
        server_env(env)


def test_mrv2_servers_run_the_stand_ins_unless_switched_off():
    assert server_env({})[standins.ENV] == "on"
    assert server_env({standins.ENV: "off"})[standins.ENV] == "off"
