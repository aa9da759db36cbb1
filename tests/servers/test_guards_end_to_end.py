"""Guards the unit tests check without servers, end to end on real vLLM servers: a sweep that
resumes only points of its own configuration, servers bound beyond loopback (the address they
really bound, and the run's note), and a second Session on a live session's directory refused
while its servers run.
"""

from __future__ import annotations

import json
from dataclasses import replace

import psutil
import pytest
from conftest import tree_connections

from workbench.config import ConfigError, is_loopback
from workbench.experiment import Session
from workbench.notebook import sweep
from workbench.serving import rundir

pytestmark = pytest.mark.vllm


@pytest.fixture
def small_cfg(base_cfg):
    return replace(base_cfg, num_prompts=2, max_tokens=8, concurrency=2)


def test_sweep_resumes_only_points_of_its_own_configuration(pd_session, small_cfg, tmp_path):
    points = [sweep.Point("fixed", small_cfg.prompt_set, {}, "parity")]
    out = tmp_path / "sweep"
    sweep.run_sweep(points, out, small_cfg, use_papermill=False, session=pd_session)
    record = json.loads((out / "points" / "fixed" / sweep.POINT_RECORD).read_text())
    assert record["config"]["num_prompts"] == 2 and len(record["digest"]) == 64
    mtime = (out / "points" / "fixed" / "result.json").stat().st_mtime_ns

    seen = []
    sweep.run_sweep(points, out, small_cfg, use_papermill=False, session=pd_session,
                    on_point=lambda pt, s: seen.append(s))
    assert seen == ["skipped (complete)"]
    assert (out / "points" / "fixed" / "result.json").stat().st_mtime_ns == mtime

    other = replace(small_cfg, max_tokens=4)
    with pytest.raises(ConfigError, match="max_tokens: 8 -> 4"):
        sweep.run_sweep(points, out, other, use_papermill=False, session=pd_session)
    assert (out / "points" / "fixed" / "result.json").stat().st_mtime_ns == mtime  # kept

    sweep.run_sweep(points, out, other, use_papermill=False, session=pd_session, resume=False)
    again = json.loads((out / "points" / "fixed" / "result.json").read_text())
    assert again["config"]["max_tokens"] == 4


def test_a_second_session_on_a_live_sessions_directory_is_refused(pd_session, small_cfg):
    pd_session.ensure(small_cfg)
    with pytest.raises(rundir.RunDirError, match="in use by another workbench process"):
        Session(pd_session.log_dir)
    assert all(s.alive() for s in pd_session.servers.values())  # the first owner untouched


def listening(server) -> dict[int, set[str]]:
    """The ports the server's process tree listens on, each with the addresses it is bound to
    (the kernel's socket table, through psutil)."""
    out: dict[int, set[str]] = {}
    for c in tree_connections(server, "inet"):
        if c.status == psutil.CONN_LISTEN:
            out.setdefault(c.laddr.port, set()).add(c.laddr.ip)
    return out


@pytest.mark.restart
@pytest.mark.beyond_loopback
def test_servers_bound_beyond_loopback_say_so_in_the_notes(pd_session, small_cfg, tmp_path):
    """P and D restarted on 0.0.0.0 (host is a server field): their HTTP port and NIXL's side
    channel are bound to every interface, and the run's notes say so once."""
    cfg = replace(small_cfg, host="0.0.0.0", allow_remote=True, run_baseline=False)
    result = pd_session.run(cfg, out_dir=tmp_path / "run")
    for role in ("p", "d"):
        server = pd_session.servers[role]
        bound = listening(server)
        assert bound.get(server.spec.port) == {"0.0.0.0"}, (role, server.spec.port, bound)
        assert bound.get(server.spec.side_channel_port) == {"0.0.0.0"}, (
            role, server.spec.side_channel_port, bound)
    exposed = [n for n in result.notes if "0.0.0.0" in n]
    assert len(exposed) == 1 and "side channel" in exposed[0]


def test_servers_on_loopback_listen_on_loopback_only(pd_session, small_cfg):
    """Every socket P's and D's process trees listen on, NIXL's UCX transfer listeners
    included, is on a loopback address when the servers are bound to 127.0.0.1 (UCX listens
    on every interface unless UCX_NET_DEVICES says otherwise)."""
    pd_session.run(replace(small_cfg, run_baseline=False))
    for role in ("p", "d"):
        bound = listening(pd_session.servers[role])
        beyond = {port: ips for port, ips in bound.items()
                  if any(not is_loopback(ip) for ip in ips)}
        assert bound and not beyond, (role, beyond)
