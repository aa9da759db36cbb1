"""The control channel: the workbench side (files, merging, acknowledgement) and the plugin's
component, run in this process without vLLM (hooks are plain functions given to the table).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace

import pytest

from workbench.knobs import channel, component, spec
from workbench.provenance import atomic_write_json


def only_table(monkeypatch, **hooks) -> None:
    """The knob table with no vLLM hooks but those given (knob -> {component: Hook})."""
    table = {n: replace(k, hooks=hooks.get(n, {}) if k.hooks else {}, register=None)
             for n, k in spec.KNOBS.items()}
    monkeypatch.setattr(spec, "KNOBS", table)


def test_control_round_trip(tmp_path):
    path = tmp_path / "knobs.json"
    doc = channel.write_control(path, 3, {"finalize": "eager"}, seed=11)
    assert doc == {"version": 3, "knobs": {**spec.defaults(), "finalize": "eager"}, "seed": 11}
    assert channel.read_control(path) == doc
    assert json.loads(path.read_text()) == doc
    assert not list(tmp_path.glob(".*.tmp"))  # the temporary file was replaced, not left


def test_write_control_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="allowed values"):
        channel.write_control(tmp_path / "k.json", 1, {"transfer": "rdma"}, 0)
    with pytest.raises(ValueError, match="version"):
        channel.write_control(tmp_path / "k.json", 0, {}, 0)
    assert channel.read_control(tmp_path / "k.json") is None


def _state(tmp_path, role, comp, version, pid=None, **kw):
    st = {"version": version, "role": role, "component": comp, "pid": pid or os.getpid(),
          "knobs": kw.pop("knobs", {}), "errors": kw.pop("errors", []), **kw}
    atomic_write_json(tmp_path / f"{role}-{comp}-{st['pid']}-{time.time_ns()}.json", st)


def test_wait_for_version_merges_roles(tmp_path):
    _state(tmp_path, "p", "engine_core", 2, knobs={"block_handoff": "legacy", "blocks": "zeroed",
                                                   "prefill_lookahead": "0", "transfer": "direct"})
    _state(tmp_path, "p", "worker", 2, knobs={"finalize": "eager", "blocks": "zeroed",
                                              "dirty_source": "noise", "transfer": "direct"})
    got = channel.wait_for_version(tmp_path, 2, ["p"], timeout=1)
    assert got["p"]["knobs"] == {"finalize": "eager", "prefill_lookahead": "0",
                                 "block_handoff": "legacy", "blocks": "zeroed",
                                 "dirty_source": "noise", "transfer": "direct"}
    assert got["p"]["version"] == 2 and not got["p"]["disagreements"]
    assert set(got["p"]["components"]) == {"engine_core", "worker"}


def test_wait_for_version_timeout_names_missing(tmp_path):
    _state(tmp_path, "d", "engine_core", 5)
    _state(tmp_path, "d", "worker", 4)
    with pytest.raises(TimeoutError) as e:
        channel.wait_for_version(tmp_path, 5, ["d", "p"], timeout=0.2, logs={"d": "/x/d.log"})
    msg = str(e.value)
    assert "d/worker" in msg and "version 4" in msg
    assert "p/engine_core" in msg and "p/worker" in msg
    assert "/x/d.log" in msg and "No state file at all for ['p']" in msg


def test_wait_for_version_ignores_dead_processes(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _state(tmp_path, "p", "engine_core", 1, pid=dead.pid)
    _state(tmp_path, "p", "worker", 1, pid=dead.pid)
    with pytest.raises(TimeoutError):
        channel.wait_for_version(tmp_path, 1, ["p"], timeout=0.2)
    assert len(channel.read_states(tmp_path, include_dead=True)) == 2


def test_wait_for_version_reports_apply_errors(tmp_path):
    _state(tmp_path, "d", "engine_core", 1)
    _state(tmp_path, "d", "worker", 1, errors=["blocks: RuntimeError: boom"])
    with pytest.raises(RuntimeError, match="boom"):
        channel.wait_for_version(tmp_path, 1, ["d"], timeout=1)


def test_component_polls_and_acks(tmp_path, monkeypatch):
    """The plugin side without vLLM: a component with a fake applier picks up a new version."""
    ctl, sdir = tmp_path / "knobs.json", tmp_path / "state"
    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(ctl))
    monkeypatch.setenv(spec.ENV_STATE_DIR, str(sdir))
    monkeypatch.setenv(spec.ENV_ROLE, "d")
    monkeypatch.setattr("workbench.knobs.component.vllm_version", lambda: "0.32.0")
    seen: list[tuple[str, int]] = []

    def applier(comp, knobs, seed):
        seen.append((knobs["finalize"], seed))
        return knobs["finalize"], {"applied": True}

    only_table(monkeypatch, finalize={"worker": spec.Hook(apply=applier)})
    comp = component.Component("worker", object())
    comp.start()
    try:
        st = channel.read_states(sdir)
        assert [(s["version"], s["knobs"]["finalize"]) for s in st] == [(0, "deferred")]
        channel.write_control(ctl, 1, {"finalize": "eager"}, seed=5)
        got = channel.wait_for_version(sdir, 1, ["d"], timeout=5, components=("worker",))
        assert got["d"]["knobs"]["finalize"] == "eager"
        assert seen[-1] == ("eager", 5)
        comp.bump("finalize", "eager_steps", 3)
        deadline = time.monotonic() + 5  # a flush every EVENT_FLUSH_S; slower on a busy box
        time.sleep(component.EVENT_FLUSH_S + 4 * channel.POLL_S)
        (st,) = channel.read_states(sdir)
        while "eager_steps" not in st["events"]["finalize"] and time.monotonic() < deadline:
            time.sleep(channel.POLL_S)
            (st,) = channel.read_states(sdir)
        assert st["events"]["finalize"]["eager_steps"] == 3
    finally:
        comp._stop.set()
        comp._thread.join(2)


def test_register_does_nothing_without_control_file(monkeypatch):
    from workbench.knobs import _patch, plugin

    monkeypatch.delenv(spec.ENV_CONTROL_FILE, raising=False)
    before = list(_patch.PATCHED)
    plugin.register()
    assert before == _patch.PATCHED


def test_plugin_refuses_unsupported_vllm(monkeypatch, tmp_path):
    from workbench.knobs import plugin, release

    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(tmp_path / "k.json"))
    monkeypatch.setattr(plugin, "_installed", False)
    monkeypatch.setattr(release, "vllm_version", lambda: "0.31.2")
    with pytest.raises(RuntimeError) as e:
        plugin.register()
    msg = str(e.value)
    assert "0.31.2" in msg
    for v in release.SUPPORTED_VLLM:
        assert v in msg


@pytest.mark.parametrize("version", ["0.32.0+cpu", "0.33.0"])
def test_plugin_accepts_both_releases(monkeypatch, tmp_path, version):
    from workbench.knobs import plugin, release

    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(tmp_path / "k.json"))
    monkeypatch.setattr(plugin, "_installed", False)
    monkeypatch.setattr(release, "vllm_version", lambda: version)
    installed = []
    monkeypatch.setattr(plugin, "_install_knobs", lambda: installed.append(version))
    plugin.register()
    assert installed == [version]


def test_session_refuses_an_unknown_release_before_any_server_starts(monkeypatch, tmp_path):
    from workbench import experiment
    from workbench.config import ConfigError, ExperimentConfig
    from workbench.knobs import release
    from workbench.serving import server_set

    monkeypatch.setattr(release, "vllm_version", lambda: "0.31.2")  # older than every entry
    started = []
    monkeypatch.setattr(server_set, "start_all", lambda *a, **k: started.append(a))
    with experiment.Session(tmp_path) as s, pytest.raises(ConfigError, match="0.31.2"):
        s.ensure(ExperimentConfig())
    assert started == []


@pytest.mark.parametrize(("version", "entry", "source"), [
    ("0.32.0+cpu", "0.32.0", "table"), ("0.33.0", "0.33.0", "table"),
    ("0.32.1.dev1+g0000000", "0.32.0", "installed-source"),  # a build of main after 0.32.0
    ("0.33.0rc1", "0.32.0", "installed-source"),  # a candidate precedes its release
    ("0.33.0.dev7+gabcdef0", "0.32.0", "installed-source"),
    ("0.33.1", "0.33.0", "installed-source"), ("0.34.0+cpu", "0.34.0", "table"),
    ("0.34.1rc1", "0.34.0", "installed-source"), ("0.40.0", "0.34.0", "installed-source"),
])
def test_a_version_uses_the_nearest_table_entry_at_or_below_it(version, entry, source):
    from workbench.knobs import release

    assert release.table_entry(version) == (entry, source)
    assert release.current(version).version == entry


@pytest.mark.parametrize("old", ["0.31.2", "0.32.0rc1", "0.22.1"])
def test_a_version_older_than_every_entry_is_refused_naming_the_entries(old):
    from workbench.knobs import release

    with pytest.raises(RuntimeError, match=r"older than every release .*0\.32\.0, 0\.33\.0"):
        release.check_version(old)


def test_release_table_picks_the_finalize_mechanism_per_release():
    """0.32.0's MRV2 has no defer_finalize (stash at finish_forward); 0.33.0's has it."""
    from workbench.knobs import finalize, release
    from workbench.knobs.component import resolve

    old, new = release.RELEASES["0.32.0"], release.RELEASES["0.33.0"]
    assert resolve(old.patch_set("finalize", "v2").install) is finalize.install_v2_stash
    assert resolve(new.patch_set("finalize", "v2").install) is finalize.install_v2_defer
    for r in (old, new):
        assert resolve(r.patch_set("finalize", "v1").install) is finalize.install_v1
        assert r.patch_set("lookahead", "v2") is r.patches["lookahead"]  # runner-independent
    assert new.patch_set("load_step", "v2") is new.patches["load_step"]
    with pytest.raises(KeyError, match="no_such_mechanism"):
        new.patch_set("no_such_mechanism")
    for r in (old, new):  # every reference resolves to a tuple of the documented shape
        for ps in r.patches.values():
            assert all(len(t) == 4 for t in resolve(ps.targets))
            assert all(len(s) == 3 and s[2] for s in (resolve(ps.source) if ps.source else ()))


def test_control_thread_is_daemon(tmp_path, monkeypatch):
    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(tmp_path / "none.json"))
    monkeypatch.setenv(spec.ENV_STATE_DIR, str(tmp_path))
    monkeypatch.setattr("workbench.knobs.component.vllm_version", lambda: "0.32.0")
    only_table(monkeypatch)
    comp = component.Component("engine_core", object())
    comp.start()
    try:
        assert comp._thread.daemon and comp._thread in threading.enumerate()
        (st,) = channel.read_states(tmp_path)
        assert st["version"] == 0 and st["component"] == "engine_core"
    finally:
        comp._stop.set()
        comp._thread.join(2)


@pytest.mark.parametrize("raw", ["soon", "-5", "1.5", ""])
def test_malformed_nixl_progress_delay_is_ignored_with_a_warning(monkeypatch, raw):
    """The plugin reads this in every vLLM process started in the
    environment; raising there crashed each of them at start-up."""
    from workbench.knobs import nixl_progress

    monkeypatch.setenv(spec.ENV_NIXL_PROGRESS_DELAY_US, raw)
    with pytest.warns(RuntimeWarning, match=spec.ENV_NIXL_PROGRESS_DELAY_US):
        assert nixl_progress.requested_delay_us() == 0
    monkeypatch.setenv(spec.ENV_NIXL_PROGRESS_DELAY_US, "1000")
    assert nixl_progress.requested_delay_us() == 1000


def test_cpu_pin_reads_vllms_bind_lists_and_names_nothing_for_auto():
    from workbench.knobs.cpu_pin import parse_cpus

    assert parse_cpus("0") == {0} and parse_cpus("0-2") == {0, 1, 2}
    assert parse_cpus("0,2,4-5") == {0, 2, 4, 5}
    for nothing in ("auto", "nobind", "", "0-x", "1,,"):
        assert parse_cpus(nothing) is None, nothing


def test_in_force_waits_until_every_process_wrote_its_events_after_the_ask(tmp_path,
                                                                           monkeypatch):
    """The flaky ``load_step`` count (3 of 8 under load): events counted in a vLLM process
    reach its state file only when its control thread runs, which a busy machine can starve;
    ``FileChannel.in_force`` now asks every process to write its state once more (a nonce) and
    reads only then: the counts are complete, or it says which process did not answer."""
    import threading

    from workbench.serving.channels import FileChannel

    ctl, sdir = tmp_path / "knobs.json", tmp_path / "state"
    sdir.mkdir()
    monkeypatch.setenv(spec.ENV_CONTROL_FILE, str(ctl))
    monkeypatch.setenv(spec.ENV_STATE_DIR, str(sdir))
    monkeypatch.setenv(spec.ENV_ROLE, "d")
    monkeypatch.setattr("workbench.knobs.component.vllm_version", lambda: "0.32.0")
    comp = component.Component("engine_core", object())  # no control thread: "starved"
    comp.write_state()
    for _ in range(8):
        comp.bump("load_step", "load_steps")
    assert channel.read_states(sdir)[0]["events"] == {}  # what a read used to see
    ch = FileChannel(ctl, sdir)
    with pytest.raises(TimeoutError, match="d engine_core pid"):
        ch.in_force({"d": None}, timeout=0.3)
    late = threading.Timer(0.3, comp._poll_once)  # the thread runs at last
    late.start()
    got = ch.in_force({"d": None}, timeout=10)
    late.join()
    assert got["d"]["components"]["engine_core"]["events"]["load_step"]["load_steps"] == 8
