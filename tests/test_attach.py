"""Attach mode: servers started separately (as if remote), the workbench starts nothing."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import psutil

import pytest

from conftest import alive
from workbench import servers
from workbench.config import ConfigError, ExperimentConfig
from workbench.experiment import Session

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


def test_attach_without_the_plugin_channel_says_so(remote, tiny_pair):
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], prompt_set="random",
                           num_prompts=2, max_tokens=8)
    with Session.attach(remote["urls"]) as s:
        r = s.run(cfg)  # defaults: vLLM untouched, runs without the channel
        assert r.knobs["d"]["finalize"].startswith("unknown")
        with pytest.raises(ConfigError, match="plugin"):
            s.run(ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1],
                                   prompt_set="random", num_prompts=2,
                                   knobs={"block_handoff": "legacy"}))
