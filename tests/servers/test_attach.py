"""Attach mode: servers started separately (as if remote), the workbench starts nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import replace

import psutil
import pytest
from conftest import alive

from workbench.config import ConfigError, ExperimentConfig
from workbench.experiment import Session
from workbench.knobs import channel
from workbench.serving import servers

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def remote(tiny_pair, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("remote")
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench", "serve", "--target", tiny_pair[0], "--drafter",
         tiny_pair[1], "--prompt-set", "random", "--log-dir", str(log_dir)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"`workbench serve` exited with {proc.wait()}; logs in {log_dir}")
        pids = {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        yield json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)  # SIGTERM to `serve` alone: it must stop its servers
        proc.wait(60)
    deadline = time.monotonic() + 30
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(pids), f"`workbench serve` left {alive(pids)} after SIGTERM"


def test_attached_run_starts_nothing_and_reads_knobs_back(remote, tiny_pair, monkeypatch):
    def no_start(self):
        raise AssertionError("attach mode started a server")

    monkeypatch.setattr(servers.VllmServer, "start", no_start)
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=3, max_tokens=8, knobs={"finalize": "eager"})
    with Session.attach(remote["urls"], knobs_file=remote["knobs_file"],
                        state_dir=remote["state_dir"]) as s:
        r = s.run(cfg)
    assert r.token_agreement == 1.0 and r.pd["num_drafts"] > 0
    assert r.knobs["d"]["finalize"] == "eager"  # the plugin on the remote servers answered
    # Closing an attached session leaves the servers running.
    for url in remote["urls"].values():
        assert servers.RemoteServer("x", url).alive()


def test_knobs_travel_over_http_when_no_file_is_shared(remote, tiny_pair):
    """Servers on another machine share no files: the plugin's worker method, reached through
    vLLM's POST /collective_rpc, writes each server's own control file and reads back."""
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=2, max_tokens=8,
                           knobs={"finalize": "eager", "block_handoff": "legacy"})
    with Session.attach(remote["urls"]) as s:  # URLs only
        assert s.knobs_over_http, s.knobs_channel_problem
        r = s.run(cfg)
        assert r.knobs["channel"] == "http"
        assert r.knobs["d"]["finalize"] == "eager" and r.knobs["p"]["block_handoff"] == "legacy"
        back = s.run(replace(cfg, knobs={}))  # and back to the defaults
        assert back.knobs["d"]["finalize"] == "deferred"
        assert back.knobs["p"]["block_handoff"] == "clipped"
    # The same servers' state files (shared here) agree with what came over HTTP.
    states = [st for st in channel.read_states(remote["state_dir"]) if st["role"] == "p"]
    assert states and all(st["knobs"].get("block_handoff", "clipped") == "clipped"
                          for st in states)


def test_kv_probe_over_http(remote, tiny_pair):
    """The probe's records and differing blocks come back through the worker method
    ``workbench_kvprobe`` (POST /collective_rpc) when no file is shared."""
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="badcase",
                           num_prompts=4, max_tokens=4, kv_probe=True,
                           knobs={"block_handoff": "legacy"})
    with Session.attach(remote["urls"]) as s:
        assert s.knobs_over_http, s.knobs_channel_problem
        r = s.run(cfg)
    assert r.kv_probe_summary["cost"]["captured"] == {"p": 4, "d": 4, "baseline": 4}
    hit = [q for q in r.requests if q["affected"]]
    assert hit and all(not q["kv_probe"]["vs_baseline"]["identical"] for q in hit)
    assert all(q["kv_probe"]["vs_baseline"]["max_abs_diff"] > 0 for q in hit)
    assert all(q["kv_probe"]["vs_baseline"]["identical"] for q in r.requests
               if not q["affected"])


@pytest.fixture(scope="module")
def plain_server(tiny_pair, tmp_path_factory):
    """A vLLM server as a user might start it: without the plugin (VLLM_PLUGINS names none of
    ours) and without per-request spec-decode metrics; dev mode on."""
    spec = servers.ServerSpec(role="baseline", target=tiny_pair[0], drafter=tiny_pair[1],
                              num_speculative_tokens=3, log_dir=tmp_path_factory.mktemp("plain"),
                              cpus="1", extra_env={"VLLM_PLUGINS": "none"},
                              per_request_metrics=False, dev_mode=True)
    with servers.VllmServer(spec) as server:
        server.wait_ready(300)
        yield server


def test_attach_to_a_server_without_the_plugin_says_so(plain_server, tiny_pair):
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=2, max_tokens=8, run_pd=False)
    pid = plain_server.proc.pid
    assert plain_server.start().proc.pid == pid  # starting a running server starts nothing
    # Dev mode: the route is there (a GET answers 405), so the session's probe lets it run.
    assert servers.RemoteServer("baseline", plain_server.url).has_reset_prefix_cache()
    with Session.attach({"baseline": plain_server.url}) as s:
        assert not s.knobs_over_http
        assert "plugin is not loaded" in s.knobs_channel_problem, s.knobs_channel_problem
        r = s.run(replace(cfg, num_prompts=3))  # defaults: vLLM untouched, no channel
        assert r.baseline["num_drafts"] > 0
        # No per-request metrics in its responses: one request at a time between scrapes.
        assert r.measurement["source"] == "metrics-scrape"
        assert r.measurement["sides"]["baseline"]["concurrency"] == 1
        assert r.measurement["crosscheck"] is None
        assert any("one at a time" in n for n in r.notes), r.notes
        assert sum(q["baseline"]["num_drafts"] for q in r.requests) == r.baseline["num_drafts"]
        assert r.knobs["baseline"]["finalize"].startswith("unknown")
        assert s.prefix_reset_checked == {"baseline"}
        with pytest.raises(ConfigError, match="plugin is not loaded"):
            s.run(replace(cfg, knobs={"blocks": "zeroed"}))
    with pytest.raises(ConfigError, match="no knob channel over HTTP"):
        Session.attach({"baseline": plain_server.url}, knobs_over_http=True)
