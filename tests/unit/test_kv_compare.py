"""The KV probe's pure parts: digests, the slot layout, comparisons, fetch sizes, summaries.

The GPU path is the same torch code on another device; here a CUDA-free stand-in (a counting
``to_host``) checks that only digests leave the KV tensor's device.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from workbench.knobs import kv_probe
from workbench.measuring import kv_compare

BS = 4


def record(values: np.ndarray, groups: dict[str, str], n: int) -> dict:
    """A worker record from ``values[layer][block, slot, :]``."""
    layers = {}
    for i, (name, group) in enumerate(groups.items()):
        x = torch.from_numpy(values[i].astype(np.float32))
        layers[name] = {"group": group, "digests": "".join(kv_probe.digest(x))}
    return {"key": "k", "num_prompt_tokens": n, "block_size": BS,
            "block_ids": [list(range(10, 10 + values.shape[1]))], "layers": layers}


GROUPS = {"model.layers.0.attn": "target", "model.layers.1.attn": "target",
          "model.layers.2.attn": "drafter"}


@pytest.fixture
def kv():
    return np.random.default_rng(0).normal(size=(3, 3, BS, 8))  # layers x blocks x slots x vals


def test_equal_bits_give_equal_digests_and_one_flipped_bit_does_not():
    x = torch.randn(2, BS, 16)
    y = x.clone()
    y.view(torch.int32)[1, 2, 5] ^= 1  # the lowest mantissa bit of one value
    a, b = kv_probe.digest(x), kv_probe.digest(y)
    assert a == kv_probe.digest(x.clone())
    assert [i for i, (p, q) in enumerate(zip(a, b, strict=True)) if p != q] == [1 * BS + 2]


def test_digests_of_half_precision_kv():
    x = torch.randn(1, BS, 16, dtype=torch.bfloat16)
    y = x.clone()
    y[0, 3, 0] += 1
    assert kv_probe.digest(x)[:3] == kv_probe.digest(y)[:3]
    assert kv_probe.digest(x)[3] != kv_probe.digest(y)[3]


def test_cuda_free_standin_only_digests_leave_the_device():
    moved = []

    def to_host(t):
        moved.append(t.numel())
        return t.cpu()

    x = torch.randn(5, BS, 512)
    kv_probe.digest(x, to_host=to_host)
    assert moved == [5 * BS * 2], "one [blocks, slots, 2] digest tensor, not the KV"


def test_layout_finds_block_and_slot_dims():
    assert kv_probe.layout((100, 4, 32, 128), 100, 32) == (0, 2)  # [B, H, N, C]
    assert kv_probe.layout((2, 100, 16, 8, 128), 100, 16) == (1, 2)  # [2, B, N, H, D]
    assert kv_probe.layout((7, 7), 100, 16) is None


def test_cpu_attn_slot_order_is_learnt_from_vllms_own_kernel():
    """A token written by ``ops.cpu_attn_reshape_and_cache`` at slot s reads back as row s."""
    from vllm import _custom_ops as ops

    h, d, bs = 2, 32, 32
    cache = torch.zeros(3, h, bs, 2 * d)
    layer = {"name": "l", "backend": "CPU_ATTN", "tensor": cache, "block_dim": 0,
             "slot_dim": 2, "block_size": bs, "module": SimpleNamespace(isa="vec")}
    key, value = torch.randn(1, h, d), torch.randn(1, h, d)
    k_cache, v_cache = cache.view(3, h, 2 * bs, d).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(key, value, k_cache, v_cache,
                                   torch.tensor([2 * bs + 5]), "vec")  # block 2, slot 5
    rows = kv_probe.slots(layer, [2])[0]  # [slot, K|V per head]
    want = torch.cat([key[0], value[0]], dim=-1).flatten()
    got = rows[5].view(2, h, d).permute(1, 0, 2).flatten()
    assert torch.equal(got, want)
    assert torch.count_nonzero(rows[[s for s in range(bs) if s != 5]]) == 0


def test_the_isa_is_read_where_each_release_keeps_it_and_never_guessed():
    """From 0.29.0 the layer carries ``isa``; up to 0.28.0 only its backend impl does. With
    neither, the probe refuses: a logical slot of a CPU_ATTN block is not a token (the ``vec``
    ISA stores one token's K across half the block's rows)."""
    assert kv_probe.layer_isa(SimpleNamespace(isa="vec", impl=None)) == "vec"
    assert kv_probe.layer_isa(SimpleNamespace(impl=SimpleNamespace(isa="vec"))) == "vec"
    layer = {"name": "l", "backend": "CPU_ATTN", "tensor": torch.zeros(3, 2, 32, 64),
             "block_dim": 0, "slot_dim": 2, "block_size": 32,
             "module": SimpleNamespace(impl=SimpleNamespace())}
    with pytest.raises(RuntimeError, match="no ISA"):
        kv_probe.slots(layer, [0])
    layer["module"].impl.isa = "vec"
    assert kv_probe.slots(layer, [0]).shape == (1, 32, 128)
    assert layer["order_note"] == "learnt from isa 'vec'"


def test_identical_records_compare_identical(kv):
    d = record(kv, GROUPS, n=10)
    c = kv_compare.compare(d, record(kv, GROUPS, n=10))
    assert c["identical"] and c["first_differing"] is None and c["layers_differing"] == []


def test_a_difference_names_its_layer_group_block_slot_and_position(kv):
    ref = kv.copy()
    ref[2, 1, 3, 0] += 1e-3  # drafter, block 1, slot 3
    c = kv_compare.compare(record(kv, GROUPS, 10), record(ref, GROUPS, 10))
    assert not c["identical"] and c["groups_differing"] == ["drafter"]
    assert c["first_differing"] == {"block": 1, "block_id": 11, "slot": 3, "position": 7,
                                    "layer": "model.layers.2.attn"}
    assert c["blocks_differing"] == {"model.layers.2.attn": [1]}


def test_positions_past_the_prompt_are_not_compared(kv):
    ref = kv.copy()
    ref[:, 2, 3] += 1  # position 11 > N - 1 = 9
    assert kv_compare.compare(record(kv, GROUPS, 10), record(ref, GROUPS, 10))["identical"]


def test_block_shift_finds_ps_numbering(kv):
    p = np.concatenate([np.zeros_like(kv[:, :1]), kv], axis=1)  # P's block j+1 is D's j
    d = record(kv, GROUPS, n=3 * BS)
    assert kv_compare.block_shift(d, record(p, GROUPS, n=3 * BS)) == 1
    assert kv_compare.block_shift(d, record(kv, GROUPS, n=3 * BS)) is None


def _item(key, layer, blocks, arr):
    a = arr.astype(np.float32)
    return {"key": key, "layer": layer, "blocks": blocks, "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode()}


def vllm_id(role: str, row: str) -> str:
    """vLLM's request id for the workbench's ``X-Request-Id`` (``cmpl-<id>-0-<random>``)."""
    side = "base" if role == "baseline" else "pd"
    return f"cmpl-wb3-{side}-{row}-0-{abs(hash((role, row))) % 16**8:08x}"


def server(asked: list, recs: dict, src: dict):
    """Every server's probe: ``recs`` role -> its record(s), ``src`` role -> the slots a
    fetch of one of its request ids returns (the others are missing there, as on a worker)."""
    def ask(req):
        asked.append(req)
        mine = {r: v if isinstance(v, list) else [v] for r, v in recs.items()}
        if req["op"] == "records":
            return [{"role": r, "records": v, "capture_s": 0.01} for r, v in mine.items()]
        if req["op"] == "fetch":
            return [{"role": r, "items": [
                _item(it["key"], it["layer"], it["blocks"],
                      (src[r][it["key"]] if isinstance(src[r], dict) else src[r])[
                          list(GROUPS).index(it["layer"]), it["blocks"]])
                if any(x["req_id"] == it["key"] for x in mine[r]) else
                {**it, "missing": "not captured"} for it in req["items"]]} for r in src]
        return []
    return ask


def test_two_requests_with_one_prompt_are_compared_each():
    """Each request's own capture on every server: the second request's D differs from P at
    block 1, the first's does not (by prompt key, one record would have stood for both)."""
    rng = np.random.default_rng(2)
    kv = rng.normal(size=(3, 3, BS, 8))
    bad = kv.copy()
    bad[:, 1] += 1.0
    recs = {"p": [{**record(kv, GROUPS, 12), "req_id": vllm_id("p", q)} for q in ("r0", "r1")],
            "baseline": [{**record(kv, GROUPS, 12), "req_id": vllm_id("baseline", q)}
                         for q in ("r0", "r1")],
            "d": [{**record(kv, GROUPS, 12), "req_id": "cmpl-wb3-prime-r1-0-00000000"},
                  {**record(kv, GROUPS, 12), "req_id": vllm_id("d", "r0")},
                  {**record(bad, GROUPS, 12), "req_id": vllm_id("d", "r1")}]}
    src = {r: {x["req_id"]: (bad if x["req_id"] == vllm_id("d", "r1") else kv)
               for x in v} for r, v in recs.items()}
    probes, _ = kv_compare.collect(server([], recs, src), [("r0", "k"), ("r1", "k")])
    assert probes[0]["vs_p"]["identical"]
    assert probes[1]["vs_p"]["blocks_differing"] == {layer: [1] for layer in GROUPS}
    assert probes[1]["vs_p"]["max_abs_diff"] == pytest.approx(1.0)


def test_a_capture_whose_request_id_names_no_row_falls_back_to_its_prompt():
    rec = {"key": "k", "req_id": "someone-elses-id"}
    assert kv_compare.rows_of(rec, "d", [("a", "k"), ("b", "other"), ("c", "k")]) == ["a", "c"]
    assert kv_compare.rows_of({**rec, "req_id": "cmpl-wb1-prime-a-0-ab"}, "d",
                              [("a", "k")]) == []


def test_block_diffs_measure_only_the_prompts_positions(kv):
    ref = kv.copy()
    ref[0, 2, 1] += 0.5   # position 9: inside the prompt (N = 10)
    ref[0, 2, 3] += 100   # position 11: past it
    diffs = kv_compare.block_diffs([_item("k", "L", [2], kv[0, 2:3])],
                                   [_item("k", "L", [2], ref[0, 2:3])], n=10, bs=BS)
    assert diffs == {"L": {2: pytest.approx(0.5)}}


def test_collect_fetches_only_differing_blocks_and_clears():
    rng = np.random.default_rng(1)
    kv = rng.normal(size=(3, 3, BS, 8))
    base = kv.copy()
    base[1, 2, 0] += 2.0
    recs = {r: {**record(x, GROUPS, 12), "req_id": vllm_id(r, "q0")}
            for r, x in (("d", kv), ("p", kv), ("baseline", base))}
    asked = []
    ask = server(asked, recs, {"d": kv, "p": kv, "baseline": base})
    probes, cost = kv_compare.collect(ask, [("q0", "k")])
    fetch = next(a for a in asked if a["op"] == "fetch")
    layer = "model.layers.1.attn"
    assert fetch["items"] == [{"key": vllm_id(r, "q0"), "layer": layer, "blocks": [2]}
                              for r in ("d", "baseline")]
    assert asked[-1] == {"op": "clear"}
    pr = probes[0]
    assert pr["vs_p"]["identical"] and pr["vs_p"]["max_abs_diff"] == 0.0
    assert pr["vs_baseline"]["max_abs_diff"] == pytest.approx(2.0)
    assert cost["captured"] == {"d": 1, "p": 1, "baseline": 1}


def test_summary_splits_by_affected():
    def row(affected, groups):
        cmp = {"groups_differing": groups}
        return {"affected": affected, "kv_probe": {"vs_p": {"groups_differing": []},
                                                   "vs_baseline": cmp}}

    s = kv_compare.summary([row(True, ["target", "drafter"]), row(True, []),
                            row(False, ["drafter"]), {"affected": False, "kv_probe": None}])
    assert s["target"]["vs_baseline"]["affected"] == {"requests": 2, "differing": 1,
                                                      "share": 0.5}
    assert s["drafter"]["vs_baseline"]["unaffected"]["share"] == 1.0
    assert s["target"]["vs_p"]["affected"]["share"] == 0.0
    assert s["requests_probed"] == 3
