"""Which servers a config change restarts (``ServerSet.stale``), from the config's per-role
shape (``ExperimentConfig.server_key``). No server is started here: the sets below hold
stand-ins that only answer ``alive()``; the real restart of P and D with the baseline kept
runs on vLLM in ``tests/servers/test_knob_effects.py``."""

from __future__ import annotations

from types import SimpleNamespace

from workbench.config import ExperimentConfig
from workbench.knobs import spec as knob_spec
from workbench.serving import channels, plan
from workbench.serving.server_set import ServerSet


class Running:
    def __init__(self, up: bool = True) -> None:
        self.up = up

    def alive(self) -> bool:
        return self.up


def running_set(tmp_path, cfg: ExperimentConfig) -> ServerSet:
    fleet = ServerSet(tmp_path, channels.FileChannel.in_dir(tmp_path))
    fleet.servers = {r: Running() for r in cfg.roles()}
    fleet.keys = {r: cfg.server_key(r) for r in cfg.roles()}
    return fleet


def test_a_transfer_change_restarts_p_and_d_and_keeps_the_baseline(tmp_path):
    direct = ExperimentConfig()
    staged = ExperimentConfig(knobs={"transfer": "host-staged"})
    fleet = running_set(tmp_path, direct)
    assert fleet.stale(staged) == ["p", "d"] and fleet.needs_start(staged)
    # What the baseline would be started with does not change either: no transfer there.
    env = {s.role: s.env()[knob_spec.ENV_TRANSFER] for s in plan.server_specs(staged, tmp_path)}
    assert env == {"p": "host-staged", "d": "host-staged", "baseline": "direct"}


def test_runtime_knobs_restart_nothing_and_a_port_restarts_its_role_only(tmp_path):
    cfg = ExperimentConfig()
    fleet = running_set(tmp_path, cfg)
    eager = ExperimentConfig(knobs={"finalize": "eager", "blocks": "poisoned"})
    assert fleet.stale(eager) == [] and not fleet.needs_start(eager)
    assert fleet.stale(ExperimentConfig(ports={"d": 18555})) == ["d"]
    # Each role's own k: D and its reference draft k_d, P k_p.
    assert fleet.stale(ExperimentConfig(k_d=2)) == ["d", "baseline"]
    assert fleet.stale(ExperimentConfig(k_p=2)) == ["p"]
    assert fleet.stale(ExperimentConfig(block_size=64)) == ["p", "d", "baseline"]


def test_a_dead_server_is_restarted_and_a_role_no_longer_needed_is_stopped(tmp_path):
    cfg = ExperimentConfig()
    fleet = running_set(tmp_path, cfg)
    fleet.servers["p"] = Running(up=False)
    assert fleet.stale(cfg) == ["p"]
    fleet.servers["p"] = Running()
    pd_only = ExperimentConfig(run_baseline=False)
    assert fleet.stale(pd_only) == [] and fleet.needs_start(pd_only)  # the baseline goes


def test_hub_models_are_fetched_before_any_server_starts_with_stand_ins(tmp_path, monkeypatch):
    """A sweep's driver starts the servers itself (its notebook kernels attach), so the
    one download of a Hub id (``models.fetch``) must come with the start, not only with
    ``Session.run``. The download and the start are stand-ins here (no network, no GPU)."""
    from workbench.inputs import models
    from workbench.serving import server_set

    order: list[str] = []
    monkeypatch.setattr(models, "fetch", lambda names: order.append(f"fetch {names}"))
    monkeypatch.setattr(server_set, "check_vllm_release", lambda knobs=None: None)
    def start_all(specs, timeout):
        order.append("start " + ",".join(s.role for s in specs))
        return [SimpleNamespace(spec=s, ready_seconds=0.0) for s in specs]

    monkeypatch.setattr(server_set, "start_all", start_all)
    cfg = ExperimentConfig.for_profile("gpu", require_models=False)
    fleet = ServerSet(tmp_path, channels.FileChannel.in_dir(tmp_path))
    fleet.ensure(cfg)
    assert order[0] == f"fetch {[cfg.target, cfg.drafter]}" and order[1] == "start p,d,baseline"


def test_each_server_flag_restarts_only_the_roles_that_take_it(tmp_path):
    """Item by item, what a change restarts: a role's budget that role, the connector P and D
    (the baseline has none), the cache size, the block size, the drafter batch and the runner
    every server (each is given them). With the fork server a restart costs about 9 s a
    server, not 35 (docs/performance.md), but a kept server costs nothing."""
    cfg = ExperimentConfig()
    fleet = running_set(tmp_path, cfg)
    cases = {
        "p": ExperimentConfig(max_num_batched_tokens={"p": 64}),
        "d": ExperimentConfig(max_num_batched_tokens={"d": 64}),
        "pd": ExperimentConfig(knobs={"connector": "example"}),
        "all-cache": ExperimentConfig(kv_cache_bytes=24 * 2**20),
        "all-block": ExperimentConfig(block_size=64),
        "all-drafter-batch": ExperimentConfig(padded_drafter_batch=False),
        "all-runner": ExperimentConfig(knobs={"runner": "v2"}),
    }
    want = {"p": ["p"], "d": ["d"], "pd": ["p", "d"]}
    for name, changed in cases.items():
        assert fleet.stale(changed) == want.get(name, ["p", "d", "baseline"]), name
