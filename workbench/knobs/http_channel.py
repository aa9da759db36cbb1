"""The knob channel over HTTP, for servers on another machine (no shared file system).

vLLM's dev-mode endpoint ``POST /collective_rpc`` (``VLLM_SERVER_DEV_MODE=1``) calls a method
by name on every worker of a server. The plugin gives the worker one such method,
``workbench_knobs``: with a request it writes the control file *on the server's own machine*
(where its engine core and worker poll it, exactly as when the workbench wrote it), and in
every case it returns the state files of that server's live processes. So knobs, read-back
and acknowledgement work the same way for a remote server as for a local one; the workbench
only needs the URL.

Server side: :func:`worker_method` (installed on ``Worker`` by ``plugin.py``).
Client side: :func:`call` and :func:`probe` (httpx; no vLLM, no torch).
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import channel, spec

METHOD = "workbench_knobs"
KV_PROBE_METHOD = "workbench_kvprobe"  # knobs/kv_probe.worker_method


# ------------------------------------------------------------------------ server side --
def worker_method(self, request: str = "") -> dict[str, Any]:
    """``Worker.workbench_knobs``: apply ``request`` (JSON ``{"version", "knobs", "seed"}``) if
    given and newer than the control file, then report this server's plugin processes."""
    path = os.environ[spec.ENV_CONTROL_FILE]
    state_dir = os.environ.get(spec.ENV_STATE_DIR)
    role = os.environ.get(spec.ENV_ROLE)
    written = False
    if request:
        req = json.loads(request)
        current = channel.read_control(path) or {}
        # Roles sharing one control file (servers started by one `workbench serve`) each get
        # the same request; the first writes it, the others find it there.
        if int(req["version"]) > int(current.get("version", 0)):
            channel.write_control(path, int(req["version"]), req["knobs"], int(req["seed"]))
            written = True
    states = channel.read_states(state_dir) if state_dir else []
    return {"role": role, "pid": os.getpid(), "written": written,
            "control": channel.read_control(path),
            "states": [s for s in states if s.get("role") == role]}


# ------------------------------------------------------------------------ client side --
class ChannelError(RuntimeError):
    """The server has no reachable knob channel; the message says why."""


def call(url: str, request: dict | None = None, timeout: float = 30.0,
         method: str = METHOD) -> list[dict]:
    """POST /collective_rpc on ``url``: ``method`` on every worker; one reply per worker."""
    import httpx

    body: dict[str, Any] = {"method": method, "timeout": timeout}
    if request is not None:
        body["args"] = [json.dumps(request)]
    try:
        r = httpx.post(f"{url}/collective_rpc", json=body, timeout=timeout + 5)
    except httpx.HTTPError as e:
        raise ChannelError(f"{url}/collective_rpc: {type(e).__name__}: {e}") from None
    if r.status_code == 404:
        raise ChannelError(f"{url} has no /collective_rpc: start the server with "
                           "VLLM_SERVER_DEV_MODE=1")
    if r.status_code != 200:
        detail = r.text[:300].replace("\n", " ")
        if "not implemented" in detail.lower() or method in detail:
            raise ChannelError(f"{url}: the workbench plugin is not loaded in this server's "
                               f"workers (no {method!r}; install the workbench in the server's "
                               f"Python and set {spec.ENV_CONTROL_FILE} and "
                               f"{spec.ENV_STATE_DIR}): {detail}")
        raise ChannelError(f"{url}/collective_rpc answered {r.status_code}: {detail}")
    results = r.json().get("results") or []
    if not results or not all(isinstance(x, dict) for x in results):
        raise ChannelError(f"{url}/collective_rpc: unexpected answer {r.text[:300]!r}")
    return results


def probe(url: str) -> str | None:
    """None if ``url`` answers the knob channel, else the reason it does not."""
    try:
        call(url, timeout=10.0)
    except ChannelError as e:
        return str(e)
    return None


def states(url: str, role: str) -> list[dict]:
    """The plugin state files of the server at ``url``, labelled with the role the workbench
    gave it (a deployment may not set WORKBENCH_ROLE the same way)."""
    out = []
    for reply in call(url):
        for st in reply["states"]:
            out.append({**st, "role": role})
    return out
