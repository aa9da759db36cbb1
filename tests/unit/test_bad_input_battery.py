"""The standing battery of bad inputs (issue 13): every one is refused by the CLI with exit
code 2, a message that names the value, no traceback, within seconds, and no vLLM process
started. One table; each case builds its argv from a context of prepared bad files.

``pytest -s`` prints the totals at the end: inputs tried, refused early, processes left.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from workbench import cli, rundir, servers, sweep
from workbench.config import ExperimentConfig
from workbench.knobs import release

REFUSE_WITHIN_S = 10.0  # in-process; the servers' start-up alone takes 30-70 s on the CPU
TALLY = {"tried": 0, "refused_early": 0, "processes_left": 0}


@dataclass
class Ctx:
    """Prepared inputs: the tiny pair, broken copies of it, files, a taken port."""

    target: str
    drafter: str
    tmp: Path
    taken_port: int

    def pair(self) -> list[str]:
        return ["--target", self.target, "--drafter", self.drafter]

    def drafter_with(self, name: str, **changes) -> str:
        """A copy of the drafter whose config.json has ``changes``."""
        d = self.tmp / f"drafter-{name}"
        if not d.exists():
            shutil.copytree(self.drafter, d)
            cfg = json.loads((d / "config.json").read_text())
            cfg.update(changes)
            (d / "config.json").write_text(json.dumps(cfg))
        return str(d)

    def config_file(self, name: str, data) -> str:
        p = self.tmp / f"{name}.json"
        p.write_text(data if isinstance(data, str) else json.dumps(data))
        return str(p)

    def not_writable(self) -> str:
        """A directory this user cannot write into (root ignores modes: /proc/sys)."""
        if os.geteuid() == 0:
            return "/proc/sys/workbench-out"
        d = self.tmp / "readonly"
        d.mkdir(exist_ok=True)
        d.chmod(0o500)
        return str(d / "out")


@pytest.fixture(scope="module")
def ctx(tiny_pair, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("battery")
    target, drafter = tiny_pair
    no_tok = tmp / "target-no-tokenizer"
    shutil.copytree(target, no_tok)
    for n in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (no_tok / n).unlink(missing_ok=True)
    (tmp / "a-file").write_text("not a directory")
    (tmp / "symlinked-logs").symlink_to(tmp)
    gw = tmp / "group-writable"
    gw.mkdir()
    gw.chmod(0o775)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield Ctx(str(target), str(drafter), tmp, s.getsockname()[1])
    print(f"\nbad-input battery: {TALLY['tried']} inputs tried, {TALLY['refused_early']} "
          f"refused early, {TALLY['processes_left']} processes left")


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed: nothing listens there


def _old_sweep(c: Ctx) -> str:
    """A sweep directory whose points ran with 16 prompts and k_d 3 (the issue's case)."""
    out = c.tmp / "old-sweep"
    if not out.exists():
        base = ExperimentConfig(target=c.target, drafter=c.drafter, num_prompts=16)
        ident = sweep.PointIdentity()
        for pt in sweep.grid_points("smoke"):
            cfg = sweep.point_config(base, pt)
            d = out / "points" / pt.slug
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps(
                {"complete": True, "config": cfg.to_dict(), "vllm_version": ident.vllm_version}))
            (d / sweep.POINT_RECORD).write_text(json.dumps(ident.record(cfg)))
    return str(out)


R = ["run", "--out"]  # run's own --out comes next in every run case
# (id, argv from the context, the text the message must contain)
CASES = [
    ("no-target", lambda c: [*R, str(c.tmp / "o"), "--target", "/no/such/model",
                             "--drafter", c.drafter], "/no/such/model"),
    ("no-drafter", lambda c: [*R, str(c.tmp / "o"), "--target", c.target,
                              "--drafter", "/no/such/drafter"], "/no/such/drafter"),
    ("k_d-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--k-d", "0"], "k_d=0"),
    ("k_p-negative", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--k-p", "-1"], "k_p=-1"),
    ("prompt-set", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-set", "nosuchset"],
     "'nosuchset'"),
    ("knob-value", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knob", "finalize=sometimes"],
     "'sometimes'"),
    ("knob-name", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knob", "frobnicate=on"],
     "'frobnicate'"),
    ("knob-syntax", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knob", "finalize"],
     "NAME=VALUE"),
    ("block-size-cpu", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--block-size", "16"],
     "block_size=16"),
    ("block-size-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--block-size", "0"],
     "block_size=0"),
    ("block-size-negative", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--block-size", "-32"],
     "block_size=-32"),
    ("kv-bytes-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--kv-cache-bytes", "0"],
     "kv_cache_bytes=0"),
    ("kv-bytes-negative", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--kv-cache-bytes", "-1"],
     "kv_cache_bytes=-1"),
    ("prompts-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompts", "0"],
     "num_prompts=0"),
    ("max-tokens-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--max-tokens", "0"],
     "max_tokens=0"),
    ("concurrency-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--concurrency", "0"],
     "concurrency=0"),
    ("seed-negative", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--seed", "-1"], "seed=-1"),
    ("profile", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--profile", "tpu"], "'tpu'"),
    ("prompt-file", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                               "/no/such/prompts.jsonl"], "/no/such/prompts.jsonl"),
    ("config-missing", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                  "/no/such/config.json"], "/no/such/config.json"),
    ("config-not-json", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                   c.config_file("notjson", "{not json")], "notjson.json"),
    ("config-array", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                c.config_file("array", [1, 2])], "JSON object"),
    ("config-unknown-key", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                      c.config_file("typo", {"num_promts": 3})], "num_promts"),
    ("bool-for-k", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                              c.config_file("boolk", {"k_d": True})], "k_d=True"),
    ("bool-for-prompts", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                    c.config_file("boolp", {"num_prompts": True})],
     "num_prompts=True"),
    ("ports-string", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                c.config_file("ports", {"ports": "abc"})], "ports='abc'"),
    ("port-bool", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                             c.config_file("portbool", {"ports": {"p": True}})],
     "ports['p']=True"),
    ("port-range", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--port-p", "70000"],
     "ports['p']=70000"),
    ("port-role", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                             c.config_file("portrole", {"ports": {"x": 8000}})], "'x'"),
    ("knobs-string", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                c.config_file("knobs", {"knobs": "abc"})], "knobs='abc'"),
    ("timeout-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                             c.config_file("timeout", {"startup_timeout_s": 0})],
     "startup_timeout_s=0"),
    ("same-port-two-roles", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--port-p", "18555",
                                       "--port-d", "18555"], "18555"),
    ("port-taken", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-set", "random",
                              "--port-d", str(c.taken_port)], "already in use"),
    ("host-any", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--host", "0.0.0.0"],
     "--allow-remote"),
    ("host-lan", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--host", "192.168.1.5"],
     "'192.168.1.5'"),
    ("out-is-a-file", lambda c: [*R, str(c.tmp / "a-file"), *c.pair()], "a-file"),
    ("out-under-a-file", lambda c: [*R, str(c.tmp / "a-file" / "sub"), *c.pair()], "is a file"),
    ("out-not-writable", lambda c: [*R, c.not_writable(), *c.pair()], "not writable"),
    ("drafter-is-target", lambda c: ["run", "--out", str(c.tmp / "o"), "--target", c.target,
                                     "--drafter", c.target], "is the target directory"),
    ("drafter-holds-a-target", lambda c: [
        *R, str(c.tmp / "o"), "--target", c.target, "--drafter",
        c.drafter_with("arch", architectures=["LlamaForCausalLM"])], "LlamaForCausalLM"),
    ("drafter-hidden", lambda c: [*R, str(c.tmp / "o"), "--target", c.target, "--drafter",
                                  c.drafter_with("hidden", target_hidden_size=999)],
     "target_hidden_size=999"),
    ("drafter-vocab", lambda c: [*R, str(c.tmp / "o"), "--target", c.target, "--drafter",
                                 c.drafter_with("vocab", vocab_size=7)], "vocab_size=7"),
    ("drafter-draft-vocab", lambda c: [*R, str(c.tmp / "o"), "--target", c.target, "--drafter",
                                       c.drafter_with("dvocab", draft_vocab_size=10**6)],
     "draft_vocab_size=1000000"),
    ("drafter-aux-layers", lambda c: [
        *R, str(c.tmp / "o"), "--target", c.target, "--drafter",
        c.drafter_with("aux", eagle_aux_hidden_state_layer_ids=[0, 1, 99],
                       eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 99]})], "[99]"),
    ("target-no-tokenizer", lambda c: [*R, str(c.tmp / "o"), "--target",
                                       str(c.tmp / "target-no-tokenizer"), "--drafter",
                                       c.drafter], "has no tokenizer"),
    ("attach-dead", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--attach",
                               f"p={_dead_url()},d={_dead_url()}"], "p='http://127.0.0.1:"),
    ("attach-not-a-url", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--attach",
                                    "p=nonsense,d=http://127.0.0.1:9"], "'nonsense'"),
    ("attach-role", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--attach",
                               "x=http://127.0.0.1:9"], "x=http://127.0.0.1:9"),
    ("vllm-version", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-set", "random",
                                "--prompts", "1"], "0.31.9"),
    ("sweep-grid", lambda c: ["sweep", "--out", str(c.tmp / "s"), *c.pair(), "--grid",
                              "nosuch"], "'nosuch'"),
    ("sweep-out-file", lambda c: ["sweep", "--out", str(c.tmp / "a-file"), *c.pair()],
     "a-file"),
    ("sweep-other-config", lambda c: ["sweep", "--out", _old_sweep(c), *c.pair(), "--grid",
                                      "smoke", "--prompts", "2", "--max-tokens", "4", "--k-d",
                                      "2"], "num_prompts: 16 -> 2"),
    ("sweep-out-symlink", lambda c: ["sweep", "--out", str(c.tmp / "symlinked-logs"),
                                     *c.pair(), "--grid", "smoke"], "is a symlink"),
    ("sweep-second-owner", lambda c: ["sweep", "--out", str(c.tmp / "locked"), *c.pair(),
                                      "--grid", "smoke"], f"pid {os.getpid()}"),
    ("serve-log-dir-symlink", lambda c: ["serve", "--log-dir", str(c.tmp / "symlinked-logs"),
                                         *c.pair()], "is a symlink"),
    ("serve-log-dir-group-writable", lambda c: ["serve", "--log-dir",
                                                str(c.tmp / "group-writable"), *c.pair()],
     "writable by group"),
    ("plan-host", lambda c: ["plan", "--host", "0.0.0.0"], "'0.0.0.0'"),
]


def _vllm_descendants() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "vllm" in cmd or "workbench.reaper" in cmd:
            out.append(p)
    return out


@pytest.fixture
def guard(monkeypatch):
    """Record any attempt to start a server (and refuse it)."""
    started: list[str] = []

    def start(self):
        started.append(self.spec.role)
        raise AssertionError(f"a {self.spec.role} server was started despite bad input")

    monkeypatch.setattr(servers.VllmServer, "start", start)
    return started


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_any_server_starts(case, ctx, guard, capsys, monkeypatch):
    name, argv, needle = case
    if name == "vllm-version":
        monkeypatch.setattr(release, "vllm_version", lambda: "0.31.9")
    lock = rundir.DirLock(rundir.private_dir(ctx.tmp / "locked"), "the battery") \
        if name == "sweep-second-owner" else None
    TALLY["tried"] += 1
    # Servers other tests share (a session-scoped fixture) may be this process's children.
    before = {p.pid for p in _vllm_descendants()}
    t0 = time.monotonic()
    try:
        code = cli.main(argv(ctx))
    finally:
        if lock:
            lock.release()
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    left = [p for p in _vllm_descendants() if p.pid not in before]
    TALLY["processes_left"] += len(left)
    assert not left and not guard, (left, guard)
    assert "Traceback" not in err, err
    assert code == 2, err
    assert needle in err, err
    assert took < REFUSE_WITHIN_S, f"refused after {took:.1f} s"
    TALLY["refused_early"] += 1


SUBPROCESS_CASES = ["k_d-0", "ports-string", "host-any", "drafter-aux-layers", "attach-dead",
                    "out-is-a-file"]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_the_real_cli_process_refuses_too(name, ctx):
    """The same through ``python -m workbench``: rc 2, the value named, no traceback on
    stderr, and the process leaves no reaper or vLLM child behind."""
    (argv,) = [a for n, a, _ in CASES if n == name]
    (needle,) = [w for n, _, w in CASES if n == name]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *argv(ctx)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=REFUSE_WITHIN_S + 20)
    except subprocess.TimeoutExpired:
        # Not refused: it is starting servers. Stop it (its SIGTERM handler stops them, and
        # their reapers follow a dead parent) rather than leave vLLM running.
        proc.terminate()
        proc.communicate(timeout=60)
        pytest.fail(f"{name}: not refused within {REFUSE_WITHIN_S + 20:.0f} s")
    reapers = [p for p in psutil.process_iter(["cmdline"])
               if f"--parent {proc.pid}" in " ".join(p.info["cmdline"] or [])]
    assert proc.returncode == 2 and needle in err and "Traceback" not in err, err
    assert not reapers
    assert time.monotonic() - t0 < REFUSE_WITHIN_S + 20


def test_the_battery_is_big_enough():
    assert len(CASES) >= 30
