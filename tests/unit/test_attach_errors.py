"""Attach mode against servers that cannot do what a run needs: refused with one line and exit
code 2 before any request, not a traceback mid-run. Stand-in servers (``http.server`` on
loopback) answer the routes a vLLM server answers with or without VLLM_SERVER_DEV_MODE=1, so
no vLLM server is started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workbench.config import ConfigError, ExperimentConfig
from workbench.experiment import Session
from workbench.serving import servers

REPO = Path(__file__).resolve().parents[2]


class FakeVllm:
    """A server answering as vLLM's API server does: ``/health``, ``/v1/models`` and
    ``/metrics`` always; ``/collective_rpc`` and ``/reset_prefix_cache`` (POST-only routes:
    a GET answers 405) only in dev mode, 404 otherwise. Every request is recorded."""

    def __init__(self, dev_mode: bool) -> None:
        self.dev_mode = dev_mode
        self.seen: list[tuple[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.answer(self, "GET")

            def do_POST(self) -> None:
                fake.answer(self, "POST")

            def log_message(self, *args) -> None:  # keep pytest's output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = h.path.split("?")[0]
        self.seen.append((method, path))
        if n := int(h.headers.get("Content-Length") or 0):
            h.rfile.read(n)
        dev_routes = ("/collective_rpc", "/reset_prefix_cache")
        if path == "/health" and method == "GET":
            status, body = 200, b""
        elif path == "/v1/models" and method == "GET":
            status, body = 200, json.dumps({"object": "list", "data": []}).encode()
        elif path == "/metrics" and method == "GET":
            status, body = 200, b""
        elif path in dev_routes and self.dev_mode:
            status, body = (200, b'{"success": true}') if method == "POST" else (405, b"")
        else:
            status, body = 404, b'{"detail": "Not Found"}'
        h.send_response(status)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def requests_beyond_probes(self) -> list[tuple[str, str]]:
        """What was sent other than health checks and the knob channel's and the prefix
        reset's probes: any of it would be part of a run."""
        probes = {("GET", "/health"), ("POST", "/collective_rpc"), ("GET", "/reset_prefix_cache")}
        return [s for s in self.seen if s not in probes]

    def __enter__(self) -> FakeVllm:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def no_dev_mode() -> Iterator[tuple[FakeVllm, FakeVllm]]:
    """P and D as started without VLLM_SERVER_DEV_MODE=1."""
    with FakeVllm(dev_mode=False) as p, FakeVllm(dev_mode=False) as d:
        yield p, d


def test_cli_refuses_servers_without_dev_mode_before_any_request(no_dev_mode, tiny_pair,
                                                                 tmp_path):
    p, d = no_dev_mode
    argv = [sys.executable, "-m", "workbench", "run", "--attach", f"p={p.url},d={d.url}",
            "--no-baseline", "--prompts", "2", "--max-tokens", "4", "--prompt-set", "random",
            "--target", tiny_pair[0], "--drafter", tiny_pair[1], "--out", str(tmp_path / "o")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1, proc.stderr
    (line,) = errors
    for needle in ("/reset_prefix_cache", f"p={p.url}", f"d={d.url}", "VLLM_SERVER_DEV_MODE=1",
                   "workbench serve", "--knobs-file"):
        assert needle in line, (needle, line)
    assert p.requests_beyond_probes() == [] and d.requests_beyond_probes() == []
    assert not (tmp_path / "o" / "result.json").exists()


def test_session_names_only_the_servers_without_the_endpoint(tiny_pair):
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=2, max_tokens=4, run_baseline=False)
    with FakeVllm(dev_mode=True) as p, FakeVllm(dev_mode=False) as d, \
            Session.attach({"p": p.url, "d": d.url}, knobs_over_http=False) as s:
        with pytest.raises(ConfigError, match="no /reset_prefix_cache") as e:
            s.run(cfg)
        assert f"d={d.url}" in str(e.value) and p.url not in str(e.value)
        assert p.requests_beyond_probes() == [] and d.requests_beyond_probes() == []


def test_probe_tells_dev_mode_apart_without_resetting():
    with FakeVllm(dev_mode=True) as dev, FakeVllm(dev_mode=False) as plain:
        assert servers.RemoteServer("p", dev.url).has_reset_prefix_cache()
        assert not servers.RemoteServer("d", plain.url).has_reset_prefix_cache()
        assert ("POST", "/reset_prefix_cache") not in dev.seen + plain.seen
        with pytest.raises(ConfigError, match="VLLM_SERVER_DEV_MODE=1"):
            servers.RemoteServer("d", plain.url).reset_prefix_cache()


def test_no_probe_with_the_plugin_channel(no_dev_mode, tiny_pair, tmp_path):
    """With the shared knob files the plugin resets the prefix cache in the engine core: the
    endpoint is not needed, so it is not asked for."""
    p, d = no_dev_mode
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=2, max_tokens=4, run_baseline=False)
    (tmp_path / "state").mkdir(mode=0o700)
    with Session.attach({"p": p.url, "d": d.url}, knobs_file=tmp_path / "knobs.json",
                        state_dir=tmp_path / "state") as s:
        s.ensure(cfg)
    assert ("GET", "/reset_prefix_cache") not in p.seen + d.seen
