"""Tests for workbench.training: tiny training end to end (transformers + vLLM),
the drafter's training-time-test unroll against a step-by-step decode, the
random tiny pair, and the shipped checkpoints in data/models measured in vLLM.

vLLM tests start one engine per fixture (about 45 s each on a 2-core CPU) and are
marked ``vllm``.  Run them one at a time on a small box, e.g.
``flock /tmp/wb/vllm.lock pytest tests/test_training.py``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from pathlib import Path

import psutil
import pytest
import torch
from conftest import one_ipc_dir, sockets_in_tempdir

from workbench import ipc_dir
from workbench.knobs.parent_death import ARMED
from workbench.knobs.spec import ENV_DIE_WITH_PID

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "data" / "models"
PROMPTS = REPO / "data" / "prompts" / "indomain.jsonl"


# --------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def tiny_trained(tmp_path_factory):
    from workbench.training import train

    d = tmp_path_factory.mktemp("tiny")
    tdir, ddir = train.main(["--tiny", "--out", str(d / "models"), "--work-dir", str(d / "work")])
    return d, Path(tdir), Path(ddir)


@pytest.fixture(scope="module")
def one_core():
    """The in-process engines (``evaluate.make_llm``) run one OpenMP thread, on core 0, not one
    per core: under ``make test`` the other worker keeps both cores busy, and two threads then
    wait on each other, slower and costlier to that worker, for the same acceptance
    (docs/performance.md, ``benchmarks/openmp_under_load.py``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
        yield


def _close(llm):
    # best effort: the engine may already be gone, and a failed shutdown must not fail a test
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def _small_drafter():
    """A random 16-wide drafter over a 50-token vocabulary, in eval mode."""
    from workbench.training.model import DrafterConfig, Eagle3Drafter

    c = DrafterConfig(vocab_size=50, draft_vocab_size=50, hidden_size=16, target_hidden_size=16,
                      intermediate_size=24, num_attention_heads=2, num_key_value_heads=2,
                      aux_layer_ids=[0, 1, 2])
    return Eagle3Drafter(c).eval()


# --------------------------------------------------------------------------- CPU-only tests

def test_tiny_training_outputs(tiny_trained):
    d, tdir, ddir = tiny_trained
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tdir / f).exists(), f
    dcfg = json.loads((ddir / "config.json").read_text())
    assert dcfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert dcfg["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert dcfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert dcfg["draft_vocab_size"] == 256 and dcfg["target_hidden_size"] == 64
    from safetensors.torch import load_file

    sd = load_file(str(ddir / "model.safetensors"))
    assert sd["fc.weight"].shape == (64, 3 * 64)
    assert sd["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * 64
    assert sd["lm_head.weight"].shape[0] == 256
    assert {"d2t", "t2d", "norm.weight", "midlayer.hidden_norm.weight",
            "embed_tokens.weight"} <= set(sd)
    # d2t offsets map draft ids onto exactly the target ids flagged in t2d
    mapped = torch.arange(256) + sd["d2t"]
    assert torch.equal(torch.nonzero(sd["t2d"]).flatten(), mapped)
    card = (d / "models" / "MODEL_CARD.md").read_text()
    assert "Python" in card and "PSF" in card
    # resumable: a second run finds the finished checkpoints and only re-exports
    from workbench.training import train

    train.main(["--tiny", "--out", str(d / "models2"), "--work-dir", str(d / "work")])
    a = load_file(str(tdir / "model.safetensors"))
    b = load_file(str(d / "models2" / "target" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_tiny_target_loads_in_transformers(tiny_trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.training.model import Llama, TargetConfig

    _, tdir, _ = tiny_trained
    tok = AutoTokenizer.from_pretrained(str(tdir))
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"
    ids = tok("def f(x):\n    return x\n").input_ids
    assert ids[0] == tok.bos_token_id == 1
    hf = AutoModelForCausalLM.from_pretrained(str(tdir), dtype=torch.float32)
    cfg = json.loads((tdir / "config.json").read_text())
    mine = Llama(TargetConfig(**{k: v for k, v in cfg.items()
                                 if k in TargetConfig.__dataclass_fields__}))
    from safetensors.torch import load_file

    mine.load_state_dict(load_file(str(tdir / "model.safetensors")), strict=False)
    x = torch.tensor([ids])
    with torch.no_grad():
        out = hf(x, output_hidden_states=True)
        logits, aux = mine(x, aux_ids=[0, 1])
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-4)
    # vLLM's aux id i == HF's hidden_states[i] (the residual stream entering layer i), i < L
    torch.testing.assert_close(out.hidden_states[1], aux[1], atol=1e-5, rtol=1e-5)
    gen = hf.generate(x, max_new_tokens=5, do_sample=False)
    assert gen.shape[1] == x.shape[1] + 5


def test_ttt_unroll_matches_stepwise_decode():
    """forward_ttt step s at row j == the drafter run the way vLLM runs it: KV of
    step-0 entries for positions <= j, then its own chain at positions j+1.."""
    import math

    import torch.nn.functional as F

    torch.manual_seed(0)
    d = _small_drafter()
    B, T, S = 1, 12, 3
    toks = torch.randint(0, 50, (B, T))
    aux = [torch.randn(B, T, 16) for _ in range(3)]
    with torch.no_grad():
        outs = d.forward_ttt(toks, aux, S)
        attn = d.midlayer.self_attn
        h0 = d.fc(torch.cat(aux, -1))
        for j in (0, 4, 7):
            # step 0 KV for positions 0..j (target features, token shifted by one)
            x, res, cos, sin = d._step_inputs(toks[:, 1 : j + 2], h0[:, : j + 1],
                                              torch.arange(j + 1))
            q, k, v = attn.qkv(x, cos, sin)
            K, V = [k], [v]
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            pre, lg = d._finish(y.transpose(1, 2).reshape(B, j + 1, -1), res)
            torch.testing.assert_close(lg[:, j], outs[0][:, j], atol=1e-5, rtol=1e-4)
            h = pre[:, j : j + 1]
            for s in range(1, S):
                if j + s + 1 >= T:
                    break
                x, res, cos, sin = d._step_inputs(toks[:, j + s + 1 : j + s + 2], h,
                                                  torch.tensor([j + s]))
                q, k, v = attn.qkv(x, cos, sin)
                K.append(k)
                V.append(v)
                kk, vv = torch.cat(K, 2), torch.cat(V, 2)
                p = ((q @ kk.transpose(-1, -2)) / math.sqrt(attn.hd)).softmax(-1)
                y = (p @ vv).transpose(1, 2).reshape(B, 1, -1)
                pre, lg = d._finish(y, res)
                torch.testing.assert_close(lg[:, 0], outs[s][:, j], atol=1e-5, rtol=1e-4)
                h = pre


def test_zeroed_prompt_kv_in_unroll_matches_stepwise_decode():
    """forward_ttt(zero_kv_before=P) == a step-0 decode whose K/V for positions < P are zero,
    which is what evaluate's vLLM hook writes into the drafter's cache."""
    import torch.nn.functional as F

    torch.manual_seed(1)
    d = _small_drafter()
    T, P = 12, 5
    toks = torch.randint(0, 50, (1, T))
    aux = [torch.randn(1, T, 16) for _ in range(3)]
    with torch.no_grad():
        clean = d.forward_ttt(toks, aux, 1)[0]
        bad = d.forward_ttt(toks, aux, 1, zero_kv_before=P)[0]
        attn = d.midlayer.self_attn
        h0 = d.fc(torch.cat(aux, -1))[:, : T - 1]
        x, res, cos, sin = d._step_inputs(toks[:, 1:], h0, torch.arange(T - 1))
        q, k, v = attn.qkv(x, cos, sin)
        k[:, :, :P] = 0
        v[:, :, :P] = 0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        _, ref = d._finish(y.transpose(1, 2).reshape(1, T - 1, -1), res)
    torch.testing.assert_close(bad, ref, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(bad[:, P:], clean[:, P:])


def test_probe_walk_follows_verification():
    from workbench.training.probe import walk

    acc = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 1],
                        [0, 0, 0]]).bool()
    # start 0 accepts 2 -> next chain at 3; start 3 accepts 3 -> next at 7 (past the end)
    assert walk(acc).int().tolist() == [[1, 1, 0], [1, 1, 1]]


def test_aux_layer_ids_follow_vllm_default():
    from workbench.training.train import aux_layer_ids

    assert aux_layer_ids(8) == [2, 4, 5]  # vLLM's (2, L//2, L-3)
    assert aux_layer_ids(32) == [2, 16, 29]
    assert aux_layer_ids(6) == [1, 3, 6]  # (2, 3, 3) would repeat a layer
    assert aux_layer_ids(8, "1,4,8") == [1, 4, 8]
    with pytest.raises(SystemExit, match="'1,1,8'"):
        aux_layer_ids(8, "1,1,8")
    with pytest.raises(SystemExit, match="0..8"):
        aux_layer_ids(8, "2,4,9")


def test_tiny_grid_trains_probes_and_ranks(tmp_path):
    """The driver that picked the shipped pair: parents then children, each probed."""
    from workbench.training import grid

    out = tmp_path / "grid"
    assert grid.main(["--tiny", "--out", str(out), "--seed-work", str(tmp_path / "none"),
                      "--prompts", "3"]) == 0
    rec = json.loads((out / "grid.json").read_text())
    assert set(rec["ranked"]) == {"a", "a-ul"}
    for v in rec["variants"].values():
        assert 0 <= v["distinct_median"] <= 1 and len(v["clean"]["per_pos"]) == 3
        assert v["train_info"]["target"]["steps"] == 20
    assert rec["variants"]["a-ul"]["train_info"]["target"]["ul"]["steps"] == 5
    # the child reused its parent's target checkpoint rather than training its own
    assert "target: loaded finished checkpoint" in (out / "work" / "a-ul" / "train.log").read_text()
    with pytest.raises(SystemExit, match="a-ul"):
        grid.main(["--tiny", "--out", str(out), "--variants", "a-ul"])


def test_copied_stdlib_reports_its_own_release(tmp_path):
    from workbench.training.corpus import VERSION_FILE, python_version

    (tmp_path / VERSION_FILE).write_text("3.11.7\n")
    assert python_version(str(tmp_path)) == "3.11.7"


def test_copy_candidates_for_unlikelihood():
    from workbench.training.train import copy_candidates, unlikelihood_term

    x = torch.tensor([[5, 6, 7, 5, 6, 8, 5, 6]])
    # position t: continuation of the latest earlier occurrence of bigram (x[t-1], x[t])
    assert copy_candidates(x).tolist() == [[-1, -1, -1, -1, 7, -1, -1, 8]]
    logits = torch.zeros(1, 7, 10, requires_grad=True)
    ul = unlikelihood_term(logits, x[:, :-1], x[:, 1:])
    ul.backward()
    assert ul.item() > 0 and logits.grad[0, 4, 7] > 0  # pushes p(copy) down where copy is wrong


def test_make_random_pair(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from workbench.training.tiny import make_random_pair

    tdir, ddir = make_random_pair(tmp_path)
    tok = AutoTokenizer.from_pretrained(tdir)
    assert tok("x = 1").input_ids[0] == tok.bos_token_id
    m = AutoModelForCausalLM.from_pretrained(tdir)
    assert m.config.num_hidden_layers == 2 and m.config.hidden_size == 64
    cfg = json.loads(Path(ddir, "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert len(cfg["eagle_aux_hidden_state_layer_ids"]) == 3


def test_prompt_set_shape():
    if not PROMPTS.exists():
        pytest.skip("data/prompts/indomain.jsonl absent "
                    "(made by python -m workbench.training.train)")
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 96
    assert all(set(r) == {"id", "text", "source"} for r in rows)
    assert all(r["text"].endswith("\n") for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    from workbench.training.corpus import is_heldout

    assert all(is_heldout(r["source"].split(":")[0][len("Lib/"):]) for r in rows)


def test_shipped_size_budget():
    if not (SHIPPED / "target").exists():
        pytest.skip("data/models/ absent: no shipped checkpoints")
    total = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert total <= 40 * 2**20, total


def test_shipped_drafter_names_its_aux_layers():
    """Set explicitly, so nothing depends on vLLM's default (which repeats a layer below 7
    layers)."""
    if not (SHIPPED / "drafter").exists():
        pytest.skip("data/models/ absent: no shipped checkpoints")
    cfg = json.loads((SHIPPED / "drafter" / "config.json").read_text())
    n = json.loads((SHIPPED / "target" / "config.json").read_text())["num_hidden_layers"]
    ids = cfg["eagle_aux_hidden_state_layer_ids"]
    assert ids == cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert len(set(ids)) == 3 and ids == sorted(ids) and max(ids) <= n


def test_probe_on_shipped_pair_cpu():
    """The offline probe (used to pick the pair on a GPU) runs on the CPU too and sees a
    drafter that agrees with its target and needs its prompt KV."""
    if not (SHIPPED / "target").exists():
        pytest.skip("data/models/ absent: no shipped checkpoints")
    from workbench.training.probe import probe

    torch.set_num_threads(2)
    r = probe(str(SHIPPED), str(PROMPTS), n=4, max_tokens=48, device="cpu")
    pp = r["clean"]["per_pos"]
    assert pp[0] > 0.3 and pp[0] >= pp[1] >= pp[2], pp
    assert r["kv_zeroed"]["per_pos"][0] < pp[0], r


# --------------------------------------------------------------------------- vLLM tests

@pytest.mark.vllm
def test_tiny_pair_runs_in_vllm(tiny_trained, one_core, capfd):
    from workbench.training.evaluate import make_llm, run_batch

    _, tdir, ddir = tiny_trained
    before = os.environ.get(ipc_dir.ENV)
    llm = make_llm(None, target_dir=str(tdir), drafter_dir=str(ddir), kv_bytes=64 * 2**20,
                   max_model_len=256)
    try:
        cores = [p.pid for p in psutil.Process().children() if p.name().startswith("VLLM::Eng")]
        sockets = sockets_in_tempdir({os.getpid(), *cores, *(c.pid for pid in cores for c in
                                                            psutil.Process(pid).children(True))})
        r, toks, texts = run_batch(llm, [{"text": "import os\n"}, {"text": "def f(x):\n"}],
                                   max_tokens=8)
    finally:
        _close(llm)
    assert all(len(t) == 8 for t in toks)
    assert r["num_drafts"] > 0 and len(r["per_pos"]) == 3
    # the engine core was set to die with this process (knobs/parent_death.py), and no other
    assert len(cores) == 1
    said = capfd.readouterr().err
    assert said.count(ARMED.format(pid=cores[0], parent=os.getpid())) == 1, said[-2000:]
    assert said.count("[workbench parent_death]") == 1
    assert ENV_DIE_WITH_PID not in os.environ
    # its IPC socket files went to a directory of its own (workbench/ipc_dir.py), the
    # variable only set while it was built
    one_ipc_dir(sockets)
    assert os.environ.get(ipc_dir.ENV) == before


@pytest.fixture(scope="module")
def shipped_eval(one_core):
    if not (SHIPPED / "target" / "model.safetensors").exists():
        pytest.skip("data/models/ absent: no shipped checkpoints to measure")
    from workbench.training.evaluate import evaluate

    return evaluate(str(SHIPPED), str(PROMPTS), n_prompts=16, max_tokens=128, kv_corruption=True,
                    write=False)


@pytest.mark.vllm
def test_shipped_pair_meets_bar(shipped_eval):
    c = shipped_eval["clean"]
    pp = c["per_pos"]
    assert c["num_drafts"] > 0
    assert pp[0] > pp[1] > pp[2], pp
    assert pp[0] >= 0.45, pp
    assert pp[2] <= 0.8 * pp[0], pp
    assert 1.8 <= c["acceptance_length"] <= 3.2, c["acceptance_length"]


@pytest.mark.vllm
def test_shipped_pair_output_not_degenerate(shipped_eval):
    c = shipped_eval["clean"]
    assert c["distinct_median"] >= 0.25, c["distinct"]
    assert c["max_token_share"] <= 0.40


@pytest.mark.vllm
def test_drafter_kv_corruption_lowers_acceptance(shipped_eval):
    """Corrupting the drafter's KV for each whole prompt lowers position-0 acceptance: the
    drafter reads its own cache, so the knobs that corrupt it are visible. The damage is the
    drafter's only: greedy target output is the clean run's, token for token, in every
    request. Measured on the shipped pair (16 prompts, 128 tokens): position-0 drop 0.346
    zeroed, 0.995 noise, target output unchanged in 16 of 16 prompts both times (64 prompts:
    0.323, 0.996, 64 of 64, data/models/eval_results.json)."""
    z, k = shipped_eval["corrupt"], shipped_eval["corrupt_noise"]
    assert z["pos0_rel_drop"] >= 0.25, (shipped_eval["clean"]["per_pos"], z["per_pos"])
    assert k["pos0_rel_drop"] >= 0.9, (shipped_eval["clean"]["per_pos"], k["per_pos"])
    assert k["pos0_rel_drop"] >= z["pos0_rel_drop"]  # garbage hurts more than zeros
    for bad in (z, k):
        assert bad["same_output"] == shipped_eval["n_prompts"], bad["same_output"]
