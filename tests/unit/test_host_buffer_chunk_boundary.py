"""The host-buffer-chunk-boundary finding's position model and detector, on result rows (the
live runs are in data/findings/host-buffer-chunk-boundary/)."""

from __future__ import annotations

from workbench.findings.finding import ABSENT, INCONCLUSIVE, PRESENT
from workbench.findings.host_buffer_chunk_boundary import detect, lookahead, lost_positions

LAYERS = {f"model.layers.{i}.self_attn.attn": ("drafter" if i == 8 else "target")
          for i in range(9)}


def test_a_boundary_inside_a_block_loses_the_rest_of_that_block():
    # [48, 48, 16]: block 1 (32..63) allocated in step 0, 48..63 written in step 1
    assert lost_positions([48, 48, 16], 112, 32, 0) == set(range(48, 64))


def test_a_lookahead_slot_past_a_block_boundary_allocates_the_next_block_early():
    # the chunk ends at 96 = 3 * 32; its lookahead slot 96 makes step 1 allocate block 3
    assert lost_positions([48, 48, 16], 112, 32, 1) == set(range(48, 64)) | set(range(96, 112))
    assert lost_positions([64, 64, 14], 142, 32, 0) == set()
    assert lost_positions([64, 64, 14], 142, 32, 1) == set(range(64, 96)) | set(range(128, 142))


def test_unchunked_and_several_boundaries_in_one_block():
    assert lost_positions([112], 112, 32, 1) == set()
    assert lost_positions(None, 112, 32, 1) == set()
    # boundaries 10 and 20 inside block 0: both later chunks' slots are lost
    assert lost_positions([10, 10, 20], 40, 32, 0) == set(range(10, 32))


def test_lookahead_reads_k_p_unless_the_knob_turns_it_off():
    assert lookahead({"k_p": 1, "knobs": {"prefill_lookahead": "default"}}) == 1
    assert lookahead({"k_p": 2, "knobs": {}}) == 2
    assert lookahead({"k_p": 1, "knobs": {"prefill_lookahead": "0"}}) == 0


def row(chunks: list[int], n: int, lost: set[int] | None, layers=LAYERS) -> dict:
    runs = [[p, p] for p in sorted(lost or ())]
    merged: list[list[int]] = []
    for a, b in runs:
        if merged and a == merged[-1][1] + 1:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    differs = {name: merged for name in layers} if lost else {}
    return {"kv_probe": {"positions_compared": n, "layers": LAYERS,
                         "prefill_chunks": {"p": chunks, "baseline": [n]},
                         "vs_p": {"identical": not lost, "layers_differing": sorted(differs),
                                  "positions_differing": differs}}}


def result(*rows: dict, ahead: str = "default") -> dict:
    return {"config": {"block_size": 32, "k_p": 1,
                       "knobs": {"transfer": "host-staged", "prefill_lookahead": ahead}},
            "requests": list(rows)}


def test_present_only_when_every_layer_differs_exactly_at_the_lost_positions():
    lost = set(range(48, 64)) | set(range(96, 112))
    assert detect(result(row([48, 48, 16], 112, lost), row([68], 68, None)))[0] == PRESENT
    # a layer missing, or a position more: something else
    some = {k: v for k, v in LAYERS.items() if v == "target"}
    assert detect(result(row([48, 48, 16], 112, lost, some)))[0] == INCONCLUSIVE
    assert detect(result(row([48, 48, 16], 112, lost | {3})))[0] == INCONCLUSIVE


def test_absent_needs_a_chunked_request_equal_to_p():
    assert detect(result(row([48, 48, 16], 112, None)))[0] == ABSENT  # a fixed build
    assert detect(result(row([64, 64, 14], 142, None), ahead="0"))[0] == ABSENT
    assert detect(result(row([112], 112, None)))[0] == INCONCLUSIVE  # nothing chunked
    assert detect(result(row([112], 112, {5})))[0] == INCONCLUSIVE


# --- when a host-staged run may meet it: the run's note, and the default sweep ------------
def _cfg(**kw):
    from workbench.config import ExperimentConfig
    return ExperimentConfig(**kw)


def _prompts(*lengths):
    from workbench.inputs.prompts import Prompt
    return [Prompt(id=str(i), token_ids=[1] * n)
            for i, n in enumerate(lengths)]


def test_a_host_staged_run_whose_prompts_overflow_ps_step_budget_says_so():
    from workbench.inputs.input_checks import chunking_note
    staged = {"transfer": "host-staged"}
    # the CPU profile's budget is vLLM's 2048: 16 x 150 tokens do not fit, 8 x 150 do
    note = chunking_note(_cfg(knobs=staged, concurrency=16), _prompts(*[150] * 16))
    assert "16 x 150 tokens" in note and "2048" in note and "at most 13 in flight" in note
    assert chunking_note(_cfg(knobs=staged, concurrency=8), _prompts(*[150] * 16)) is None
    # an explicit budget counts, one prompt at a time too; direct transfer has no host buffer
    assert chunking_note(_cfg(knobs=staged, concurrency=1, max_num_batched_tokens=64),
                         _prompts(150)) is not None
    assert chunking_note(_cfg(concurrency=32), _prompts(*[150] * 32)) is None


def test_the_default_sweeps_host_staged_points_keep_every_prefill_whole():
    from workbench.config import SWEEP_NUM_PROMPTS, ExperimentConfig
    from workbench.inputs import prompts
    from workbench.inputs.input_checks import chunking_note
    from workbench.notebook import sweep
    staged = [pt for pt in sweep.grid_points("default") if pt.knobs.get("transfer")]
    assert len(staged) == 3 and all(pt.overrides["concurrency"] > 1 for pt in staged)
    for pt in staged:
        cfg = sweep.point_config(ExperimentConfig(num_prompts=SWEEP_NUM_PROMPTS), pt)
        assert cfg.num_prompts == 64 and cfg.concurrency == 12
        assert chunking_note(cfg, prompts.for_config(cfg)) is None, pt.name


def test_a_prefix_cache_hit_on_p_moves_the_lost_positions_with_it():
    # measured (fuzz, host staging, P at 96 tokens a step): a 223-token prompt with a
    # 64-token hit on P ran in chunks [96, 63]; D lost exactly positions 160..191
    from workbench.findings.host_buffer_chunk_boundary import lost_positions

    assert lost_positions([96, 63], 223, 32, 1, start=64) == set(range(160, 192))
    assert lost_positions([96, 63], 159, 32, 1) == set(range(96, 128))  # no hit: from 0
