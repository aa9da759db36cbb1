"""The knob ``connector`` against vLLM 0.32.0's source: every command line ``plan`` prints for
each connector parses with vLLM's own argument parser into a ``KVTransferConfig`` naming a
class in ``KVConnectorFactory``'s registry, and each refusal's reason is still in the source
it cites (when vLLM changes it, the refusal must be read again)."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.knobs import connector as kv_connector

VLLM = Path(importlib.util.find_spec("vllm").origin).parent


def vllm_parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser  # 0.32.0
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def plan(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "workbench", "plan", *args],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def parsed(profile: str, name: str) -> dict:
    servers = {s["role"]: s for s in plan("--profile", profile, "--knob", f"connector={name}")}
    out = {}
    for role, s in servers.items():
        argv = s["argv"]
        out[role] = (vllm_parser().parse_args(
            argv[argv.index("vllm.entrypoints.openai.api_server") + 1:]), s["env"])
    return out


@pytest.mark.parametrize("name", [n for n, c in kv_connector.CONNECTORS.items()
                                  if not c.unsupported])
def test_every_connector_plans_what_vllms_parser_and_registry_take_no_gpu(name):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    conn = kv_connector.get(name)
    profile = "cpu" if not conn.cpu_refusal else "gpu"
    servers = parsed(profile, name)
    assert servers["baseline"][0].kv_transfer_config is None
    for role, kv_role in (("p", "kv_producer"), ("d", "kv_consumer")):
        args, env = servers[role]
        cfg = args.kv_transfer_config
        assert cfg.kv_connector == conn.classes[0]
        assert cfg.kv_connector in KVConnectorFactory._registry
        parts = (cfg.kv_connector_extra_config or {}).get("connectors")
        if conn.classes[0] == "MultiConnector":
            assert [p["kv_connector"] for p in parts] == list(conn.classes[1:])
            assert all(p["kv_connector"] in KVConnectorFactory._registry for p in parts)
        assert cfg.kv_role == ("kv_both" if name == "example" else kv_role)
        assert ("VLLM_NIXL_SIDE_CHANNEL_PORT" in env) == conn.nixl
    if name == "example":  # P saves where D loads
        paths = {servers[r][0].kv_transfer_config.kv_connector_extra_config[
            "shared_storage_path"] for r in ("p", "d")}
        assert len(paths) == 1


def test_nixl_connector_is_the_pull_connector_vllm_builds():
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import connector

    for name, built in kv_connector.ALIASES.items():
        assert getattr(connector, name) is getattr(connector, built)


def source_of(module: str, qualname: str) -> str:
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return inspect.getsource(obj)


def test_the_cpu_refusals_still_hold_in_the_installed_source():
    mooncake = source_of(
        "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector",
        "MooncakeConnectorWorker.__init__")
    assert "torch.accelerator.current_device_index()" in mooncake
    boot = (VLLM / "distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py"
            ).read_text()
    assert 'MooncakeBootstrapServer("0.0.0.0"' in boot.replace("'", '"')
    finished = source_of(
        "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector",
        "MooncakeConnectorScheduler.request_finished")
    assert "return delay_free_blocks, None" in finished  # P hands D no kv_transfer_params
    offload = source_of("vllm.v1.kv_offload.cpu.spec", "CPUOffloadingSpec.get_worker")
    assert "if not (current_platform.is_cuda_alike() or current_platform.is_xpu()):" in offload
    assert '"CPU Offloading is currently only supported on CUDA-alike "' in offload
    lmcache = (VLLM / "distributed/kv_transfer/kv_connector/v1/lmcache_integration/"
               "vllm_v1_adapter.py").read_text()
    assert 'torch.device(f"cuda:{' in lmcache


def test_example_connector_stores_and_loads_as_the_table_says():
    """The reasons ``block_handoff`` does not act through ExampleConnector: it stores from a
    step's new requests' block_ids, and its ``request_finished`` is the base class's."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import example_connector
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    cls = example_connector.ExampleConnector
    assert "request_finished" not in vars(cls)
    assert cls.request_finished is KVConnectorBase_V1.request_finished
    build = inspect.getsource(cls.build_connector_meta)
    assert "scheduled_new_reqs" in build and "block_ids[0]" in build
