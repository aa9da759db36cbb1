"""The P-then-D request flow, as vLLM's ``toy_proxy_server.py`` does it.

P gets a copy of the request with ``max_tokens=1``, ``stream=false`` and ``do_remote_decode``;
D gets the original request plus the ``kv_transfer_params`` P returned, under the same request
id (NIXL pull and push: push pairs D's registration with P's request by that id). A connector
that shares storage (``ExampleConnector``) gets no ``kv_transfer_params``: P computes and
stores the prompt, then D gets the same request and finds P's KV by the prompt's tokens, as
vLLM's ``disaggregated-prefill-v1`` example runs it.
"""

from __future__ import annotations

import copy
import time
import uuid
from typing import Any

import httpx

from ..knobs.connector import PARAMS, SAME_PROMPT

P_TRANSFER_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_request(body: dict[str, Any], flow: str = PARAMS) -> dict[str, Any]:
    req = copy.deepcopy(body)
    req["max_tokens"] = 1
    req.pop("max_completion_tokens", None)
    req["stream"] = False
    req.pop("stream_options", None)
    if flow == PARAMS:
        req["kv_transfer_params"] = dict(P_TRANSFER_PARAMS)
    return req


def decode_request(body: dict[str, Any], p_response: dict[str, Any],
                   flow: str = PARAMS) -> dict[str, Any]:
    req = copy.deepcopy(body)
    if flow == SAME_PROMPT:
        return req
    params = p_response.get("kv_transfer_params")
    if not params:
        raise RuntimeError(
            "P returned no kv_transfer_params: is P running with a kv_producer NIXL connector?"
        )
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
    flow: str = PARAMS,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run one request through P then D; return (P's response, D's response). ``timings``,
    when given, gets each leg's seconds (``"p"``: P's prefill, ``"d"``: D's KV load and
    decode)."""
    rid = request_id or f"wb-{uuid.uuid4().hex}"
    headers = {"X-Request-Id": rid}
    t0 = time.monotonic()
    r = await client.post(f"{p_url}{endpoint}", json=prefill_request(body, flow), headers=headers)
    r.raise_for_status()
    p_resp = r.json()
    t1 = time.monotonic()
    r = await client.post(f"{d_url}{endpoint}", json=decode_request(body, p_resp, flow),
                         headers=headers)
    r.raise_for_status()
    if timings is not None:
        timings.update(p=t1 - t0, d=time.monotonic() - t1)
    return p_resp, r.json()
