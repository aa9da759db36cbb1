"""`plan` prints every server's command line; each parses with vLLM's own argument parser."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workbench import experiment


def vllm_parser():
    """vLLM's own server parser (``make_arg_parser``: ``vllm.entrypoints.launchers.cli_args``
    in 0.32.0, ``vllm.entrypoints.common.cli_args`` in 0.33.0)."""
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ModuleNotFoundError:
        from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def plan(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "workbench", "plan", *args],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("profile", ["gpu", "gpu-single", "cpu"])
def test_plan_command_lines_parse_with_vllms_parser_no_gpu(profile):
    servers = plan("--profile", profile)
    assert [s["role"] for s in servers] == ["p", "d", "baseline"]
    for s in servers:
        argv = s["argv"]
        args = vllm_parser().parse_args(
            argv[argv.index("vllm.entrypoints.openai.api_server") + 1:])
        assert args.host == "127.0.0.1"
        assert args.speculative_config["method"] == "eagle3"
        assert args.speculative_config["num_speculative_tokens"] == (1 if s["role"] == "p" else 3)
        if s["role"] == "baseline":
            assert args.kv_transfer_config is None
        else:
            assert args.kv_transfer_config.kv_connector == "NixlConnector"
            assert s["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
        if profile.startswith("gpu"):
            assert args.block_size == 16 and args.enforce_eager
            assert "CUDA_VISIBLE_DEVICES" in s["env"]


def test_gpu_plan_without_enforce_eager_lets_mrv2_warm_up_no_gpu():
    """Model Runner V2's start-up warm-up (dirty_source=warmup's source) needs graphs on."""
    servers = plan("--profile", "gpu", "--no-enforce-eager", "--knob", "blocks=dirty",
                   "--knob", "dirty_source=warmup")
    for s in servers:
        argv = s["argv"]
        args = vllm_parser().parse_args(
            argv[argv.index("vllm.entrypoints.openai.api_server") + 1:])
        assert not args.enforce_eager
    bad = subprocess.run(
        [sys.executable, "-m", "workbench", "plan", "--knob", "dirty_source=warmup"],
        capture_output=True, text=True)
    assert bad.returncode != 0 and "needs blocks='dirty'" in bad.stderr


def test_gpu_plan_host_staged_uses_vllms_own_cpu_buffer_no_gpu():
    servers = plan("--profile", "gpu", "--knob", "transfer=host-staged")
    for s in servers[:2]:
        cfg = json.loads(s["argv"][s["argv"].index("--kv-transfer-config") + 1])
        assert cfg["kv_buffer_device"] == "cpu"


def test_gpu_results_get_pass_fail_against_vllms_reference_no_gpu():
    """Stands in for a GPU run: numbers typed in, not measured. The baseline at the reference
    figures passes; D at the regression that started the investigation (position 2 at
    0.3360, 5.2% low) fails."""
    from workbench.measuring.results import Result

    def side(length, per_pos):
        return {"acceptance_length": length, "per_position": per_pos, "num_drafts": 1000,
                "conditional": per_pos}

    r = Result(config={"profile": "gpu", "k_p": 1, "k_d": 3}, command="", vllm_version="0.32.0",
               git_commit="x", created="", prompt_set="mt_bench", num_prompts=80,
               wall_seconds=1.0, engine_seconds=1.0, knobs={},
               baseline=side(2.60, [0.7296, 0.5208, 0.3545]),
               pd=side(2.58, [0.7296, 0.5208, 0.3360]), token_agreement=1.0)
    row = r.summary_row()
    assert row["baseline_vs_expected"] == "pass"
    assert row["pd_vs_expected"] == "fail"
    assert row["pd_rel_err_acceptance_length"] == pytest.approx(-0.02 / 2.60)
    cpu = Result(**{**r.to_dict(), "config": {"profile": "cpu"}}).summary_row()
    assert "baseline_vs_expected" not in cpu  # no reference figures for the CPU models


async def _client_against_uvicorn(concurrency: int, keep_alive_s: float) -> dict:
    """The measurement client (``experiment.client_limits``) against uvicorn, the server vLLM
    runs, with a short keep-alive. Returns the client port of each sequential request, and
    whether ``2 * concurrency`` requests (both sides' requests in flight) were open at once."""
    import asyncio

    import httpx
    import uvicorn

    peers: list[int] = []
    arrived = [0]
    all_in = asyncio.Event()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/hold":  # answers once every request in flight has arrived
            arrived[0] += 1
            if arrived[0] == 2 * concurrency:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 10)
        else:
            peers.append(scope["client"][1])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           timeout_keep_alive=keep_alive_s, lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    try:
        async with httpx.AsyncClient(timeout=5,
                                     limits=experiment.client_limits(concurrency)) as client:
            for pause in (0, 0.1, keep_alive_s, keep_alive_s / 2):  # idle, at and past the edge
                await asyncio.sleep(pause)
                (await client.get(url + "/")).raise_for_status()
            together = await asyncio.gather(
                *(client.get(url + "/hold") for _ in range(2 * concurrency)),
                return_exceptions=True)
    finally:
        server.should_exit = True
        await task
    return {"peers": peers, "together": [getattr(r, "status_code", repr(r)) for r in together]}


@pytest.mark.parametrize("concurrency", [1, 4])
def test_the_client_keeps_no_idle_connection_for_vllm_to_close_under_a_request(concurrency):
    """vLLM's HTTP server (uvicorn) closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE
    seconds (vllm/envs.py, 5 by default); a client that reuses one at that edge gets
    httpx.ReadError. The workbench's client (``experiment.client_limits``) reuses none: every
    request comes from a connection of its own; and both sides' requests fit in it at once."""
    import asyncio

    import vllm.envs

    assert "VLLM_HTTP_TIMEOUT_KEEP_ALIVE" in vllm.envs.environment_variables
    seen = asyncio.run(_client_against_uvicorn(concurrency, keep_alive_s=0.5))
    assert len(seen["peers"]) == 4 and len(set(seen["peers"])) == 4, seen  # none reused
    assert seen["together"] == [200] * 2 * concurrency, seen
