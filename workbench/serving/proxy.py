"""The P-then-D request flow, as vLLM's ``toy_proxy_server.py`` does it.

P gets a copy of the request with ``max_tokens=1``, ``stream=false`` and ``do_remote_decode``;
D gets the original request plus the ``kv_transfer_params`` P returned, under the same request
id.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import httpx

P_TRANSFER_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    req = copy.deepcopy(body)
    req["max_tokens"] = 1
    req.pop("max_completion_tokens", None)
    req["stream"] = False
    req.pop("stream_options", None)
    req["kv_transfer_params"] = dict(P_TRANSFER_PARAMS)
    return req


def decode_request(body: dict[str, Any], p_response: dict[str, Any]) -> dict[str, Any]:
    params = p_response.get("kv_transfer_params")
    if not params:
        raise RuntimeError(
            "P returned no kv_transfer_params: is P running with a kv_producer NixlConnector?"
        )
    req = copy.deepcopy(body)
    req["kv_transfer_params"] = params
    return req


async def pd_complete(
    client: httpx.AsyncClient,
    p_url: str,
    d_url: str,
    body: dict[str, Any],
    request_id: str | None = None,
    endpoint: str = "/v1/completions",
    timings: dict[str, float] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one request through P then D; return (P's response, D's response). ``timings``,
    when given, gets each leg's seconds (``"p"``: P's prefill, ``"d"``: D's KV load and
    decode)."""
    rid = request_id or f"wb-{uuid.uuid4().hex}"
    headers = {"X-Request-Id": rid}
    t0 = time.monotonic()
    r = await client.post(f"{p_url}{endpoint}", json=prefill_request(body), headers=headers)
    r.raise_for_status()
    p_resp = r.json()
    t1 = time.monotonic()
    r = await client.post(f"{d_url}{endpoint}", json=decode_request(body, p_resp), headers=headers)
    r.raise_for_status()
    if timings is not None:
        timings.update(p=t1 - t0, d=time.monotonic() - t1)
    return p_resp, r.json()
