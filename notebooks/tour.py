# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tour: speculative-decoding acceptance under PD disaggregation, on this CPU
#
# This notebook starts the real pipeline: a **prefill** vLLM server (P, EAGLE3 with
# `k_p` draft tokens), a **decode** server (D, `k_d` draft tokens) that receives P's KV cache
# over **NIXL**, and a **standalone baseline** server (same model pair and `k_d`, no PD).
# Every prompt goes to the baseline, then through P and D (greedy), up to `concurrency`
# requests in flight on each side (32 unless `config` says otherwise). Each request's drafts
# and accepted tokens come from its own response (vLLM's per-request spec-decode metrics), and
# the workbench checks their sums against each server's `/metrics` counters, scraped before and
# after each side's requests. The number that matters is the **per-position acceptance on D**:
# at position *i*, the share of drafts whose tokens 0..*i* were all accepted. A correct PD
# pipeline matches the baseline (and, greedy, its tokens).
#
# Then it runs the same prompts with one or more **knobs** set: each knob switches one
# mechanism inside the servers' processes (a historical vLLM bug, upstream's open fix for D's
# first step, or the client's prompt), and reads back what is in force. The servers start
# once and stay up for every later run. `profile` picks where they run: `cpu` (this machine),
# `gpu` or `gpu-single` (`workbench/inputs/profiles.py`, `docs/gpu.md`), each with its own models,
# block size and default prompt set.

# %% tags=["parameters"]
profile = "cpu"  # cpu, gpu or gpu-single: placement, flags, default models and prompt set
num_prompts = 8  # prompts per run
max_tokens = 32  # new tokens per request
prompt_set = ""  # indomain, mt_bench, badcase, lastblock, random; empty: the profile's
target = ""  # target model directory; empty: data/models/target (the trained pair)
drafter = ""  # EAGLE3 drafter directory; empty: data/models/drafter
config = {}  # any other ExperimentConfig fields, e.g. {"k_d": 2}
knobs = {"block_handoff": "legacy"}  # the second run's knobs ({} skips the second run)
knob_prompt_set = "badcase"  # the second run's prompt set; empty: prompt_set
kv_probe = True  # the second run also captures every KV layer's blocks on P, D and the baseline
attach = {}  # use running servers instead of starting them (widgets.open_session)
out_dir = "../data/runs/tour"

# %%
from dataclasses import replace
from pathlib import Path

import pandas as pd
from IPython.display import display

from workbench.config import ExperimentConfig
from workbench.experiment import with_knobs
from workbench.figures import kv_plots, plots
from workbench.knobs import spec
from workbench.measuring import kv_compare
from workbench.notebook.widgets import (
    acceptance_frame,
    knob_table,
    notebook_config,
    open_session,
    show_figure,
)

out = Path(out_dir)
# What the profile changes from the plain defaults (a GPU profile: models, block size, prompt
# set, lengths); `config` and the parameters above override it.
plain = ExperimentConfig(require_models=False).to_dict()
by_profile = {k: v for k, v in ExperimentConfig.for_profile(profile, require_models=False)
              .to_dict().items() if v != plain[k]}
cfg = notebook_config({**by_profile, **config}, target=target, drafter=drafter,
                      num_prompts=num_prompts, max_tokens=max_tokens,
                      prompt_set=prompt_set or None, label="all fixes in place")
session = open_session(attach, log_dir=out / "logs", baseline_cache=out / "baseline-cache")
print("profile:", cfg.profile, "| target:", cfg.target, "| drafter:", cfg.drafter,
      "| k on P:", cfg.k_p, "| k on D:", cfg.k_d)
print("server logs:", session.log_dir)

# %% [markdown]
# ## 1. Every fix in place: PD against the baseline
#
# The first run starts the three servers, then measures the baseline and the PD pipeline on
# the same prompts. On this 2-core CPU the three servers took 52 to 106 s to start together in
# the sweep-time measurements (`docs/performance.md`). `result.json` keeps the configuration,
# the knob values read back from each server, every request's counters and tokens.
#
# The figure puts D's bar at each position beside the baseline's on the same requests
# (hatched, to its right); each bar's whisker is its own 95% bootstrap interval (requests
# resampled); under the bars are the prompt set, n (requests) and token agreement, and above
# each pair the verdict: D within, outside or inconclusive against vLLM's ±5% on the paired
# interval. A circle marks D with its padded load step set aside (one all-rejected placeholder
# draft per request, finding `padded-load-step`).

# %%
def report(phase, done, total):
    if done == total:
        print(f"{phase}: {done}/{total}")


fixed = session.run(cfg, out_dir=out / "fixed", progress=report)
print(f"{fixed.num_prompts} prompts in {fixed.wall_seconds:.1f} s; token agreement "
      f"{fixed.token_agreement}; knobs in force on D: {fixed.knobs['d']}")
acceptance_frame([fixed]).round(4)

# %%
show_figure(plots.per_position([fixed], out / "figures", stem="per_position_fixed"))

# %% [markdown]
# ## 2. The knobs
#
# Each knob is switched inside the vLLM processes by the workbench's plugin
# (`workbench/knobs/`, loaded through vLLM's `vllm.general_plugins` entry point in every
# process). The values are read back from the processes, never echoed from the request.
# The table below is generated from `workbench/knobs/spec.py`, the single list of knobs (its
# one instrument, `kv_probe`, observes and changes nothing: section 4). Details and how to add
# a knob: `docs/knobs.md`.

# %%
knob_table().loc[list(spec.settings())]

# %% [markdown]
# **`finalize`** (`deferred` / `eager`): when the KV connector is finalized in a step.
# Source: `vllm/v1/worker/kv_connector_model_runner_mixin.py`,
# `KVConnectorModelRunnerMixin.maybe_get_kv_connector_output(scheduler_output,
# defer_finalize=...)` and `finalize_kv_connector()`; `execute_model` passes
# `defer_finalize = speculative_config is not None` and `sample_tokens` finalizes after
# `propose_draft_token_ids`. Model Runner V2 in vLLM 0.32.0 finalizes once per step in
# `ActiveKVConnector.post_forward` (`vllm/v1/worker/gpu/kv_connector.py`), after the speculator;
# the plugin moves that to `finish_forward` for `eager`. `eager` restores the old order: the
# connector is finalized (metadata cleared, `wait_for_save()`) right after the target's forward,
# *before* the EAGLE3 drafter wrote its KV. It shows only where finalize copies something: NIXL
# on a CPU KV buffer sets `use_host_buffer = False`
# (`vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py`) and D reads P's memory
# directly, so with `transfer=direct` expect parity; use `transfer=host-staged`.
# Runtime switch, no restart.
#
# **`prefill_lookahead`** (`default` / `0`): P's scheduler lookahead,
# `Scheduler.num_lookahead_tokens` in `vllm/v1/core/sched/scheduler.py` (set after
# `Scheduler.__init__`; with EAGLE it defaults to P's `num_speculative_tokens`). With lookahead
# L > 0, P allocates `ceil((N + L) / block_size)` blocks for an N-token prompt while D allocates
# `ceil(N / block_size)` (D withholds lookahead while a request loads asynchronously:
# `limit_lookahead_tokens` in the same file). `0` is the proposed change that gives P nothing
# extra to hand over. Runtime switch, no restart.
#
# **`block_handoff`** (`clipped` / `legacy`): which block ids P reports to D when a request
# finishes. Source: `KVCacheManager.get_block_ids_for_computed_tokens`
# (`vllm/v1/core/kv_cache_manager.py`), which clips each group's ids to
# `cdiv(num_computed_tokens, block_size)` (the fix, vLLM 0.25+). `legacy` returns the unclipped
# ids: when P holds one block more than D, D's NIXL worker (`_apply_prefix_caching` in
# `nixl/base_worker.py`) keeps the tail `prefill_blocks[-num_decode_blocks:]` and the whole
# mapping shifts by a block. Only prompts with `ceil((N+L)/bs) > ceil(N/bs)` are hit (for L = 1:
# N a multiple of the block size; the `badcase` prompt set alternates in and out).
# Runtime switch, no restart.
#
# **`load_step`** (`as-released` / `gated` / `gated-async`): D's first step after NIXL's
# load. As released, the scheduler pads that one-token step with placeholder drafts
# (`pad_spec_decode` in `Scheduler.schedule`, `vllm/v1/core/sched/scheduler.py`), so D counts
# one all-rejected draft per request more than the baseline. `gated` is upstream's open fix
# (vLLM PR #50173) as written: no padding and no lookahead on a *synchronous* external-load
# step; NIXL loads asynchronously, so it never fires. `gated-async` applies the same gate to
# the first step after an asynchronous load lands, and D's drafts equal the baseline's
# (`docs/findings.md`). Acts on D's engine core. Runtime switch, no restart.
#
# **`blocks`** (`as-is` / `zeroed` / `dirty` / `poisoned`): what KV blocks hold when a request
# gets them. vLLM allocates the KV cache with `torch.zeros`; zeroing on allocation exists but is
# gated by `KVCacheConfig.needs_kv_cache_zeroing`, which drives
# `SchedulerOutput.new_block_ids_to_zero` and the worker's `_zero_block_ids`. `zeroed` forces
# that path, `dirty`/`poisoned` fill free blocks with stale values before a run. It matters only
# where attention reads a slot this request never wrote (the legacy hand-off, or eager finalize
# with host staging): zeros are a mild error, stale KV is not. The `lastblock` prompt set primes
# D so it loads only the prompt's last block from P. Runtime switch, no restart.
#
# **`dirty_source`** (`noise` / `warmup`): where `blocks=dirty` gets its stale values: seeded
# noise written into the KV tensors when the knob version arrives, or (`warmup`) nothing written:
# the blocks keep what Model Runner V2's start-up warm-up (GPU, not under `--enforce-eager`) and
# earlier requests left, measured and recorded by each worker. On the CPU (V1 runner, no
# KV-writing warm-up) first-use blocks hold zeros. Runtime switch, no restart.
#
# **`transfer`** (`direct` / `host-staged`): NIXL's `use_host_buffer` (`nixl/base_worker.py`,
# `NixlBaseConnectorScheduler` / `NixlBaseConnectorWorker`). On the CPU, `host-staged` makes P
# stage its KV through a host buffer as `kv_buffer_device: cpu` does on a GPU, which is where
# eager finalize shows. **Needs a restart** of P and D: the staging buffer is allocated and
# registered with NIXL when the connector is built. The baseline has no KV connector and keeps
# running.
#
# **`double_bos`** (`off` / `on`): a client-side bug: the prompt's token ids start with a second BOS
# (a doubled BOS lowered acceptance by several percent in vLLM's own test). It acts in the
# workbench's client, not in a server. Runtime, no restart.
#
# Which knobs restart which servers, straight from the spec (a change of k, the models or the
# block size restarts all three):

# %%
{name: ("restarts " + ", ".join(spec.KNOBS[name].roles)) if spec.KNOBS[name].restart
 else "runtime" for name in spec.settings()}

# %% [markdown]
# ## 3. One knob set: a re-created bug, on its own prompts
#
# The second run keeps the servers (no restart-time knob changed). It runs on
# `knob_prompt_set` (`badcase` by default: prompt lengths in and out of the block hand-off's
# bad case), so its numbers are not comparable with the first run's: another prompt set has
# another acceptance, on the baseline too. The session keeps the baseline's rows and reuses
# them for a run with the same baseline server, prompts (their token ids), `max_tokens` and
# concurrency, except with `kv_probe`: the probe compares D with the baseline's own KV of this
# run, so the baseline runs again. `affected` marks the requests whose length puts them in the
# bad case of the block hand-off.
#
# In the figure each run is a group of its own: D beside *its own* baseline (the same
# requests), never beside the other run's bars, and the title says when the prompt sets
# differ. Under the legacy hand-off read the token agreement under the group (named in red
# when any request diverged): the affected requests' output parts from the baseline's, while
# their acceptance, averaged with the unaffected half, can stay within the interval of the
# baseline at a few prompts (verdict inconclusive).

# %%
runs = [fixed]
if knobs:
    knob_cfg = with_knobs(replace(cfg, prompt_set=knob_prompt_set or cfg.prompt_set), **knobs)
    knob_cfg = replace(knob_cfg, label=", ".join(f"{k}={v}" for k, v in knobs.items()),
                       kv_probe=kv_probe)
    knobbed = session.run(knob_cfg, out_dir=out / "knobs")
    runs.append(knobbed)
    print("requested:", knobbed.knobs["requested"])
    print("in force on P:", knobbed.knobs["p"])
    print("in force on D:", knobbed.knobs["d"])
    print("token agreement:", knobbed.token_agreement)
    for note in knobbed.notes:
        print("note:", note)
acceptance_frame(runs).round(4)

# %%
if knobs:
    show_figure(plots.per_position(runs, out / "figures"))
    display(knobbed.requests_frame()[["id", "prompt_len", "affected", "p_handed_blocks",
                                      "agree", "first_diff"]])

# %% [markdown]
# ## 4. Why: what D's KV cache holds (the KV probe)
#
# With `kv_probe`, each server's worker reduces every KV layer's blocks of every request (the
# target's layers and the EAGLE3 drafter's) to one digest per token slot where the KV lives:
# D just before its first step (after NIXL's load), P and the baseline after the prefill's
# drafter. The workbench compares D with P (did the transfer move the right bytes?) and with
# the baseline (is it what a standalone engine computed?), then fetches only the blocks that
# differ to measure by how much. Under the legacy hand-off, affected requests differ from the
# baseline from position 0 in every layer, while block for block D holds P's blocks shifted by
# one: the transfer was faithful, the block mapping was not.

# %%
if knobs and kv_probe:
    show_figure(kv_plots.kv_probe(runs, out / "figures"))
    display(pd.DataFrame(kv_compare.table(knobbed.requests)))
    print("captures per server:", knobbed.kv_probe_summary["cost"]["captured"])

# %% [markdown]
# ## 5. Done
#
# The results are in `out_dir` (`fixed/result.json`, `knobs/result.json`, `figures/`).
# The explorer notebook (`explorer.ipynb`) sets every knob from a panel; the sweep
# (`python -m workbench sweep`) runs a whole grid and writes the paper figures;
# `findings.ipynb` (or `python -m workbench check`) re-runs every known finding on the
# installed vLLM build (`docs/findings.md`, `docs/check.md`).
# The next cell stops the servers (they are also stopped when the kernel exits).

# %%
session.close()
