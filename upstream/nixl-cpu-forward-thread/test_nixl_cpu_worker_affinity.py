# SPDX-License-Identifier: Apache-2.0
# Location in vLLM's tree: tests/v1/kv_connector/unit/test_nixl_cpu_worker_affinity.py
# Runs in seconds on a CPU with NIXL installed: one NixlConnector worker, no model weights, no
# server. The model's config is read from VLLM_TEST_MODEL (a local directory for an offline
# run; default: the hub id vLLM's helpers use).
"""On the CPU, ``NixlBaseConnectorWorker.__init__`` reserves the last core of each NUMA node
for KV transfers with ``os.sched_setaffinity(0, rsv_cores_for_kv)``. ``0`` is the calling
thread, and the connector is built on the worker's main thread, the one that then runs every
forward pass: the model runs on the reserved core(s) alone, the other cores idle.
"""

import os
import tempfile
from pathlib import Path

import pytest
from vllm.config import set_current_vllm_config
from vllm.distributed import (
    cleanup_dist_env_and_memory,
    init_distributed_environment,
    initialize_model_parallel,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlConnector
from vllm.platforms import current_platform

from .utils import create_vllm_config, make_kv_cache_config

MODEL = os.environ.get("VLLM_TEST_MODEL", "facebook/opt-125m")


@pytest.mark.skipif(not current_platform.is_cpu(), reason="the CPU worker's path")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to tell")
def test_building_the_cpu_worker_leaves_the_calling_threads_cores_alone():
    vllm_config = create_vllm_config(model=MODEL, block_size=16)
    fd, store = tempfile.mkstemp()
    os.close(fd)
    before = os.sched_getaffinity(0)
    try:
        with set_current_vllm_config(vllm_config):
            init_distributed_environment(
                world_size=1, rank=0, distributed_init_method=f"file://{store}",
                local_rank=0, backend="gloo",
            )
            initialize_model_parallel(1, 1)
            NixlConnector(vllm_config, KVConnectorRole.WORKER,
                          make_kv_cache_config(block_size=16, num_blocks=10))
            after = os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, before)  # whatever happened, give the test run its cores back
        cleanup_dist_env_and_memory()
        Path(store).unlink(missing_ok=True)  # the store may remove its file itself
    assert after == before, (
        f"building the NIXL worker moved the calling thread (the forward thread) from cores "
        f"{sorted(before)} to {sorted(after)}; expected its cores unchanged (the transfer "
        f"threads, not the caller, belong on the reserved cores)"
    )
