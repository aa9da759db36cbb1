"""Run directories nobody else can reach, one owner each, and a store that keeps every row.
No server starts: where the code would start one, Popen fails."""

from __future__ import annotations

import multiprocessing
import os
import stat
import subprocess

import pandas as pd
import pytest

from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.measuring.results import Result, append_to_store
from workbench.provenance import atomic_path
from workbench.serving import channels, rundir, servers


def test_new_run_dirs_are_private(tmp_path):
    d = rundir.private_dir(tmp_path / "a" / "logs")
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    s = Session()  # the default: a fresh private temporary directory
    try:
        assert stat.S_IMODE(s.log_dir.stat().st_mode) == 0o700
    finally:
        s.close()


@pytest.mark.parametrize("problem", ["symlink", "group-writable", "world-writable", "file",
                                     "other-owner"])
def test_a_run_dir_others_can_write_is_refused(tmp_path, problem):
    d = tmp_path / "logs"
    if problem == "symlink":
        (tmp_path / "real").mkdir()
        d.symlink_to(tmp_path / "real")
    elif problem == "file":
        d.write_text("")
    else:
        d.mkdir()
        d.chmod({"group-writable": 0o770, "world-writable": 0o777}.get(problem, 0o700))
        if problem == "other-owner":
            if os.geteuid() != 0:
                pytest.skip("needs root to give a directory to another user")
            os.chown(d, 65534, 65534)
    needle = {"symlink": "symlink", "file": "not a directory", "other-owner": "uid 65534"}
    with pytest.raises(rundir.RunDirError, match=needle.get(problem, "writable by group")):
        Session(d)


def test_planted_state_dir_symlink_deletes_nothing(tmp_path):
    """Today's ``prepare`` globbed ``knob-state/*.json`` through a planted symlink and
    unlinked another directory's files."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.json").write_text("{}")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "knob-state").symlink_to(elsewhere)
    ch = channels.FileChannel.in_dir(logs)
    with pytest.raises(rundir.RunDirError, match="symlink"):
        ch.prepare(ExperimentConfig(require_models=False))
    assert (elsewhere / "precious.json").is_file()


def test_attach_refuses_a_state_dir_others_can_write(tmp_path):
    """Whoever can write the state directory could forge the values reported as read back
    from the servers."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(rundir.RunDirError, match="writable by group or others"):
        Session.attach({"d": "http://127.0.0.1:9"}, knobs_file=tmp_path / "knobs.json",
                       state_dir=shared)


def test_planted_log_symlink_is_not_appended_to(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched\n")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "p.log").symlink_to(victim)

    def no_process(*a, **kw):
        raise AssertionError("a server process was started")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    spec = servers.ServerSpec(role="p", target="t", drafter="d", num_speculative_tokens=1,
                              log_dir=logs)
    with pytest.raises(rundir.RunDirError, match="symlink"):
        servers.VllmServer(spec).start()
    assert victim.read_text() == "untouched\n"


def test_a_second_owner_of_a_directory_is_refused_with_the_holders_pid(tmp_path):
    first = Session(tmp_path / "logs")
    try:
        with pytest.raises(rundir.RunDirError, match=f"pid {os.getpid()}"):
            Session(tmp_path / "logs")
    finally:
        first.close()
    Session(tmp_path / "logs").close()  # released: the next owner gets it


def _result(tag: int) -> Result:
    return Result(config={"k_p": 1, "k_d": 3}, command=f"c{tag}", vllm_version="0.32.0",
                  git_commit="abc", created=f"t{tag}", prompt_set="indomain", num_prompts=tag,
                  wall_seconds=1.0, engine_seconds=1.0, knobs={}, pd=None, baseline=None,
                  token_agreement=None)


def _append_many(store: str, first: int, n: int) -> None:
    for i in range(first, first + n):
        append_to_store(_result(i), store)


def test_two_processes_appending_keep_every_row(tmp_path):
    """Two processes appending 25 rows each: today one crashed on a half-written file and
    30 of 50 rows were kept."""
    store = str(tmp_path / "store.csv")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(store, k * 100, 25)) for k in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    table = pd.read_csv(store)
    assert len(table) == 50
    assert sorted(table["num_prompts"]) == [*range(100, 125), *range(200, 225)]


def test_a_row_with_new_columns_widens_the_store(tmp_path):
    store = tmp_path / "store.csv"
    append_to_store(_result(1), store)
    wide = _result(2)  # a side the first row did not have: new columns
    wide.baseline = {"acceptance_length": 2.0, "num_drafts": 10, "per_position": [0.5]}
    append_to_store(wide, store)
    append_to_store(_result(3), store)  # fewer columns than the header: a plain append
    table = pd.read_csv(store)
    assert list(table["num_prompts"]) == [1, 2, 3]
    assert table["baseline_pos0"].tolist()[1] == 0.5
    assert table["baseline_pos0"].isna().tolist() == [True, False, True]


def test_atomic_writers_get_unique_temporary_names(tmp_path):
    target = tmp_path / "result.json"
    with atomic_path(target) as a, atomic_path(target) as b:
        assert a != b and a.parent == b.parent == tmp_path
        a.write_text("a")
        b.write_text("b")
    assert target.read_text() == "a"  # the outer block ended last
