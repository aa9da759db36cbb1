"""Launches of vLLM's MRV2 kernels under Triton's interpreter with the stand-ins in ``verify``
mode, for ``test_triton_standins.py`` (run in a fresh interpreter with the workbench's Triton
backend: ``python standin_launches.py [--broken]``). Prints each kernel's counts as JSON.

The shapes are the runs' (32 requests, k=3, a 2,048-token vocabulary, 32-token blocks) and
the cases the runs rarely meet: rejected and placeholder (-1) drafts, ties and NaN in the
logits, dummy requests (``idx_mapping`` -1), a disabled slot mapping, non-greedy rows.
"""

from __future__ import annotations

import json

import torch
from vllm.v1.worker.gpu import block_table as bt
from vllm.v1.worker.gpu.spec_decode import rejection_sampler_utils as rs

from workbench.knobs.triton_cpu import profile, standins

K, VOCAB, BLOCK = 3, 2048, 8192
g = torch.Generator().manual_seed(0)


def slot_mappings(num_reqs: int, enabled: bool, dummy: bool) -> None:
    tables = [torch.randint(0, 500, (40, 16), dtype=torch.int32, generator=g) for _ in range(2)]
    lens = torch.randint(0, 70, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(lens, 0)
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(
        torch.randint(0, 150, (num_reqs,), generator=g).tolist(), lens.tolist(),
        strict=True)] or [torch.zeros(0, dtype=torch.int64)])
    idx = torch.randperm(40, generator=g)[:num_reqs].to(torch.int32)
    if dummy:
        idx[::3] = -1
    out = torch.full((2, 4096), 7, dtype=torch.int64)
    bt._compute_slot_mappings_kernel[(2, num_reqs + 1)](
        out.shape[1], idx, qsl, pos,
        torch.tensor([t.data_ptr() for t in tables], dtype=torch.uint64),
        torch.tensor([t.stride(0) for t in tables], dtype=torch.int64),
        torch.tensor([32, 16], dtype=torch.int32), torch.tensor([enabled, True]),
        torch.tensor([True, True]), out, out.stride(0), 0,
        CP_SIZE=1, CP_INTERLEAVE=1, PAD_ID=-1, TRITON_BLOCK_SIZE=1024)


def logits(num_logits: int, ties: bool, nan: bool) -> torch.Tensor:
    x = torch.randn(num_logits, VOCAB, generator=g)
    if ties:
        x[:, 100] = x[:, 1900] = x.max() + 1
    if nan:
        x[1, 5] = float("nan")
    return x


def rejection(num_reqs: int, temps: list[float], ties=False, nan=False) -> None:
    n = num_reqs * (K + 1)
    target = logits(n, ties, nan)
    idx = torch.randperm(64, generator=g)[:num_reqs].to(torch.int32)
    temp = torch.zeros(64, dtype=torch.float32)
    temp[idx.long()] = torch.tensor(temps[:num_reqs] + [0.0] * (num_reqs - len(temps)))
    local_pos = torch.arange(K + 1, dtype=torch.int32).repeat(num_reqs)
    exp_idx = idx.repeat_interleave(K + 1)
    nb = 1
    amax = torch.full((n, nb), 123456, dtype=torch.int64)
    lmax, lsum = torch.full((n, nb), 9.0), torch.full((n, nb), 9.0)
    dmax, dsum = torch.full((n, nb), 9.0), torch.full((n, nb), 9.0)
    rs._compute_local_logits_stats_kernel[(n, nb)](
        amax, nb, lmax, nb, lsum, nb, dmax, nb, dsum, nb, target, VOCAB, target, 0, 0,
        exp_idx, local_pos, temp, VOCAB, K, BLOCK_SIZE=BLOCK, HAS_DRAFT_LOGITS=False)
    draft = target.argmax(-1)  # accept everything ...
    draft[torch.rand(n, generator=g) < 0.3] = 7  # ... then reject some
    draft[torch.rand(n, generator=g) < 0.1] = -1  # and some placeholders
    cu = torch.arange(0, n + 1, K + 1, dtype=torch.int32)
    sampled = torch.full((num_reqs, K + 1), -5, dtype=torch.int64)
    num_sampled = torch.full((num_reqs,), -5, dtype=torch.int32)
    t_lse, d_lse = torch.full((num_reqs,), 3.0), torch.full((num_reqs,), 3.0)
    rs._rejection_kernel[(num_reqs,)](
        sampled, sampled.stride(0), num_sampled, t_lse, d_lse, target, VOCAB, amax, nb,
        lmax, nb, lsum, nb, draft, target, 0, 0, dmax, nb, dsum, nb, cu, idx, temp,
        torch.arange(64, dtype=torch.int64), torch.arange(n, dtype=torch.int64), None, None,
        None, 0, nb, PADDED_VOCAB_NUM_BLOCKS=1, HAS_DRAFT_LOGITS=False, SYNTHETIC_MODE=False,
        USE_BLOCK_VERIFICATION=False, num_warps=1)


def main(broken: bool) -> None:
    if broken:  # a stand-in that gets one element wrong: verify must see it
        from workbench.knobs.triton_cpu import kernels

        entry = kernels.STANDINS[f"{kernels.BLOCK_TABLE}:_compute_slot_mappings_kernel"]
        right = entry.fn

        def wrong(grid, a):
            covered = right(grid, a)
            kernels.flat(a["slot_mappings_ptr"])[-1] += 1
            return covered

        entry.fn = wrong
    standins.install("verify")
    for num_reqs, enabled, dummy in ((32, True, False), (5, True, True), (4, False, False),
                                     (0, True, False)):
        slot_mappings(num_reqs, enabled, dummy)
    rejection(32, [])
    rejection(8, [], ties=True, nan=True)
    rejection(4, [0.0, 0.7])  # a non-greedy request: both kernels go to the interpreter
    print(json.dumps(profile._totals))


if __name__ == "__main__":
    import sys

    main("--broken" in sys.argv)
