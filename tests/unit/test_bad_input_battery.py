"""The standing battery of bad inputs: every one is refused by the CLI with exit code 2, a
message that names the value, no traceback, within seconds, and no vLLM process started; a
bad prompt file before the tokenizer loads. One table; each case builds its argv from a
context of prepared bad files, and every field of ExperimentConfig and every flag of ``run``
that takes a value meets a bad value in at least one case.

``pytest -s`` prints the totals at the end: inputs tried, refused early, processes left.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import psutil
import pytest

from workbench import cli
from workbench.config import ExperimentConfig
from workbench.inputs import input_checks, modelfiles, prompts
from workbench.knobs import release
from workbench.notebook import sweep
from workbench.serving import rundir, servers

REFUSE_WITHIN_S = 10.0  # in-process; the servers' start-up alone takes 30-70 s on the CPU
TALLY = {"tried": 0, "refused_early": 0, "processes_left": 0}


@dataclass
class Ctx:
    """Prepared inputs: the tiny pair, broken copies of it, files, a taken port."""

    target: str
    drafter: str
    tmp: Path
    taken_port: int
    config_keys: set[str] = field(default_factory=set)  # every key a config file case sets

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
        if isinstance(data, dict):
            self.config_keys |= set(data)
        return str(p)

    def prompt_file(self, name: str, content: str | bytes | list) -> str:
        """A prompt file: text, raw bytes, or a list of JSON lines."""
        p = self.tmp / f"{name}.jsonl"
        if isinstance(content, list):
            content = "".join(json.dumps(row) + "\n" for row in content)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
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
    ("connector-unknown", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knob",
                                     "connector=push"], "'push'"),
    ("connector-gpu-only", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knob",
                                      "connector=offloading"], "connector='offloading' cannot run"),
    ("connector-knob-n/a", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knob",
                                      "connector=example", "--knob", "block_handoff=legacy"],
     "does not act through connector='example'"),
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
    # A tuple of needles: each must be in the message.
    ("max-tokens-over-model-len", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--max-tokens",
                                             "100000"],
     ("max_tokens=100000", "max_model_len=1024")),
    ("longest-prompt-over-model-len", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-set",
                                                 "random", "--prompts", "4", "--max-tokens",
                                                 "1000"],
     ("the longest prompt", "max_tokens=1000", "max_model_len=1024", "allowed: max_tokens <= ")),
    ("max-model-len-over-context", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                              c.config_file("long", {"max_model_len": 2048})],
     ("max_model_len=2048", "max_position_embeddings=1024")),
    ("out-cannot-be-created", lambda c: [*R, "/proc/nope/r", *c.pair()],
     ("'/proc/nope/r'", "cannot be created")),
    ("kv-bytes-below-one-request", lambda c: [*R, str(c.tmp / "o"), *c.pair(),
                                              "--kv-cache-bytes", "1"],
     ("kv_cache_bytes=1 ", "max_model_len=1024", "block_size=32", "allowed: kv_cache_bytes >= ")),
    ("kv-bytes-over-memory", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--kv-cache-bytes",
                                        str(2**62)], (f"kv_cache_bytes={2**62}", "available")),
    ("seed-over-numpy", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--seed", str(2**32)],
     (f"seed={2**32}", f"0..{2**32 - 1}")),
    ("host-not-here", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--host", "192.0.2.1",
                                 "--allow-remote"], ("'192.0.2.1'", "an address of this machine")),
    ("port-baseline-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--port-baseline", "0"],
     "ports['baseline']=0"),
    ("budget-0", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--max-num-batched-tokens", "0"],
     "max_num_batched_tokens=0"),
    ("prompts-over-set", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-set", "mt_bench",
                                    "--prompts", "81"], ("num_prompts=81", "'mt_bench'", "1..80")),
    ("knobs-file-without-attach", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--knobs-file",
                                             str(c.tmp / "k.json")], ("k.json", "--attach")),
    ("state-dir-without-attach", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--state-dir",
                                            str(c.tmp / "state")], ("state", "--attach")),
    ("run-log-dir-file", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-set", "random",
                                    "--prompts", "1", "--log-dir", str(c.tmp / "a-file")],
     ("a-file", "not a directory")),
    ("label-number", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                c.config_file("label", {"label": 5})], "label=5"),
    ("require-models-string", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                         c.config_file("reqm", {"require_models": "yes"})],
     "require_models='yes'"),
    ("nothing-to-run", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--no-baseline", "--config",
                                  c.config_file("nopd", {"run_pd": False})], "nothing to run"),
    ("request-timeout-negative", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                            c.config_file("rt", {"request_timeout_s": -1})],
     "request_timeout_s=-1"),
    ("enforce-eager-string", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                        c.config_file("eager", {"enforce_eager": "sometimes"})],
     "enforce_eager='sometimes'"),
    ("kv-probe-string", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                   c.config_file("probe", {"kv_probe": "yes"})], "kv_probe='yes'"),
    ("padded-drafter-batch-string", lambda c: [
        *R, str(c.tmp / "o"), *c.pair(), "--config",
        c.config_file("padded", {"padded_drafter_batch": "no"})], "padded_drafter_batch='no'"),
    ("allow-remote-string", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                       c.config_file("remote", {"allow_remote": "yes"})],
     "allow_remote='yes'"),
    ("prompt-file-number", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--config",
                                      c.config_file("pfnum", {"prompt_file": 5})], "prompt_file=5"),
    # Prompt files: each names the file (and the line), before the tokenizer loads.
    ("prompt-file-line-2", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompts", "1",
                                      "--prompt-file", c.prompt_file(
                                          "line2", '{"text": "a"}\n{\'text\': \'b\'}\n')],
     ("line2.jsonl", "line 2", '{"text": "..."}')),
    ("prompt-file-empty", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                     c.prompt_file("empty", "")], ("empty.jsonl", "is empty")),
    ("prompt-file-blank", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                     c.prompt_file("blank", "\n  \n")],
     ("blank.jsonl", "only blank lines")),
    ("prompt-file-not-utf8", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                        c.prompt_file("latin1", b'{"text": "caf\xe9"}\n')],
     ("latin1.jsonl", "not UTF-8", "line 1")),
    ("prompt-file-directory", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                         str(c.tmp)], "is a directory"),
    ("prompt-file-not-object", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                          c.prompt_file("list", [[1, 2]])],
     ("list.jsonl", "line 1", "JSON list")),
    ("prompt-file-no-key", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                      c.prompt_file("nokey", [{"prompt": "x"}])],
     ("nokey.jsonl", "'prompt'", "neither 'text' nor 'prompt_token_ids'")),
    ("prompt-file-text-number", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                           c.prompt_file("textnum", [{"text": 5}])], "text=5"),
    ("prompt-file-ids-empty", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                         c.prompt_file("noids", [{"prompt_token_ids": []}])],
     "prompt_token_ids=[]"),
    ("prompt-file-ids-strings", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                           c.prompt_file("strids", [{"prompt_token_ids": ["a"]}])],
     'prompt_token_ids=["a"]'),
    ("prompt-file-id-negative", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompt-file",
                                           c.prompt_file("negid", [{"prompt_token_ids": [-1]}])],
     "prompt_token_ids=[-1]"),
    ("prompt-file-id-out-of-vocab", lambda c: [
        *R, str(c.tmp / "o"), *c.pair(), "--prompts", "2", "--prompt-file",
        c.prompt_file("vocab", [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [5, 10**6]}])],
     ("vocab.jsonl", "line 2", "token id 1000000", "vocab_size=")),
    ("prompt-file-ids-too-long", lambda c: [
        *R, str(c.tmp / "o"), *c.pair(), "--prompts", "1", "--prompt-file",
        c.prompt_file("longids", [{"prompt_token_ids": [3] * 1000}])],
     ("longids.jsonl", "1000 tokens", "max_tokens=64", "max_model_len=1024")),
    ("prompt-file-too-few", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompts", "3",
                                       "--prompt-file", c.prompt_file("few", [{"text": "a"}])],
     ("num_prompts=3", "few.jsonl", "only 1")),
    ("prompt-file-same-id", lambda c: [
        *R, str(c.tmp / "o"), *c.pair(), "--prompts", "2", "--prompt-file",
        c.prompt_file("sameid", [{"id": "q", "text": "a"}, {"id": "q", "text": "b"}])],
     ("sameid.jsonl", "line 2", "'q'")),
    ("prompt-file-id-not-ascii", lambda c: [*R, str(c.tmp / "o"), *c.pair(), "--prompts", "1",
                                            "--prompt-file",
                                            c.prompt_file("uid", [{"id": "q\u00e9", "text": "a"}])],
     ("uid.jsonl", "printable ASCII")),
]
# What a message must not say: the empty file used to be reported as a prompt set it never read.
ABSENT = {"prompt-file-empty": "prompt set"}


def _vllm_descendants() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "vllm" in cmd or "workbench.serving.reaper" in cmd:
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
    name, argv, needles = case
    if name == "vllm-version":
        monkeypatch.setattr(release, "vllm_version", lambda: "0.31.9")
    tokenizer_loads: list[str] = []
    real_load = prompts.load_tokenizer
    monkeypatch.setattr(prompts, "load_tokenizer",
                        lambda d: tokenizer_loads.append(d) or real_load(d))
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
    for needle in needles if isinstance(needles, tuple) else (needles,):
        assert needle in err, (needle, err)
    assert ABSENT.get(name, "\0") not in err, err
    if name.startswith("prompt-file"):
        assert not tokenizer_loads, "a bad prompt file was reported after the tokenizer loaded"
    assert took < REFUSE_WITHIN_S, f"refused after {took:.1f} s"
    TALLY["refused_early"] += 1


SUBPROCESS_CASES = ["k_d-0", "ports-string", "host-any", "drafter-aux-layers", "attach-dead",
                    "out-is-a-file", "max-tokens-over-model-len", "out-cannot-be-created",
                    "kv-bytes-below-one-request", "prompt-file-line-2", "prompt-file-empty",
                    "prompt-file-not-utf8"]


@pytest.mark.parametrize("name", SUBPROCESS_CASES)
def test_the_real_cli_process_refuses_too(name, ctx):
    """The same through ``python -m workbench``: rc 2, the value named, no traceback on
    stderr, and the process leaves no reaper or vLLM child behind."""
    (argv,) = [a for n, a, _ in CASES if n == name]
    (needles,) = [w for n, _, w in CASES if n == name]
    needles = needles if isinstance(needles, tuple) else (needles,)
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
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert all(n in err for n in needles), (needles, err)
    assert not reapers
    assert time.monotonic() - t0 < REFUSE_WITHIN_S + 20


# A flag's dest that names no ExperimentConfig field, and the field it sets.
DEST_FIELD = {"port_p": "ports", "port_d": "ports", "port_baseline": "ports",
              "no_baseline": "run_baseline", "no_enforce_eager": "enforce_eager",
              "no_padded_drafter_batch": "padded_drafter_batch", "knob": "knobs"}


def _run_parser() -> argparse.ArgumentParser:
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["run"]


def _flags_under_test(c: Ctx, argv: list[str]) -> set[str]:
    """The flags of a case, less the scaffolding every case shares (the good pair, the plain
    output directory)."""
    plain = {("--target", c.target), ("--drafter", c.drafter), ("--out", str(c.tmp / "o"))}
    return {a for a, v in zip(argv, [*argv[1:], None], strict=True)
            if a.startswith("--") and (a, v) not in plain}


def test_every_config_field_and_run_flag_meets_a_bad_value(ctx):
    """A field added to ExperimentConfig, or a flag added to ``run``, fails this until the
    battery has a case that gives it a bad value. A switch (a flag with no value) cannot be
    wrong alone: it is exempt, and which flags are switches is read from the parser."""
    run_cases = [_flags_under_test(ctx, argv(ctx)) for _, argv, _ in CASES]
    used = set().union(*run_cases)
    flags = {a.option_strings[-1]: a for a in _run_parser()._actions if a.option_strings}
    valued = {f for f, a in flags.items() if a.nargs != 0}
    assert not valued - used, f"run flags with no bad-input case: {sorted(valued - used)}"
    dests = {flags[f].dest for f in used if f in flags}
    covered = {DEST_FIELD.get(d, d) for d in dests} | ctx.config_keys
    missing = [f.name for f in fields(ExperimentConfig) if f.name not in covered]
    assert not missing, f"ExperimentConfig fields with no bad-input case: {missing}"


def test_the_kv_cache_bound_is_vllms_own_arithmetic():
    """``input_checks.kv_cache_bytes_needed`` for the shipped pair equals what vLLM's own
    KV spec classes make of the same shapes: every attention layer's
    ``FullAttentionSpec.max_memory_usage_bytes`` (one request of max_model_len tokens) plus
    one block of each (the null block ``check_enough_kv_cache_memory`` holds back)."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from workbench import paths

    target = modelfiles.read_config(paths.DEFAULT_TARGET, "target")
    drafter = modelfiles.read_config(paths.DEFAULT_DRAFTER, "drafter")
    vcfg = SimpleNamespace(model_config=SimpleNamespace(max_model_len=1024),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=1))
    specs = [FullAttentionSpec(block_size=32, num_kv_heads=c["num_key_value_heads"],
                               head_size=c["head_dim"], dtype=torch.float32)
             for c in (target, drafter) for _ in range(c["num_hidden_layers"])]
    want = sum(s.max_memory_usage_bytes(vcfg) + s.page_size_bytes for s in specs)
    assert input_checks.kv_cache_bytes_needed(target, drafter, 4, 32, 1024) == want


HEAVY = ("matplotlib", "scipy", "pandas", "httpx", "transformers", "torch", "vllm")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["run", "--out", "{tmp}",
                                                                  "--k-d", "0"]],
                         ids=["help", "run-help", "refusal"])
def test_help_and_a_refused_flag_import_nothing_heavy(argv, tmp_path):
    """The CLI answers ``--help`` and refuses a bad flag in a fraction of a second because it
    imports what a command needs only when it runs: none of these (each costs a second or
    more; matplotlib and scipy came with the ``releases`` subcommand's parser). Counted from
    ``sys.modules``, which a busy machine cannot make flaky as a timing would."""
    code = ("import sys\nfrom workbench import cli\ntry:\n    cli.main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", code, *[a.format(tmp=tmp_path / "o")
                                                          for a in argv]],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout[-500:] + proc.stderr
