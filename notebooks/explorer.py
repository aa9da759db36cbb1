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
# # Knob explorer
#
# Set the knobs, the servers' k, the prompts and the number of repeats, press **Run**: the
# panel runs the baseline and the PD pipeline (P then D over NIXL) on the servers it keeps up,
# and redraws the results table and the figure: per run, D's per-position acceptance beside
# its own baseline's on the same requests (hatched), whiskers min to max over the repeats (a
# run made once: its 95% bootstrap interval), the prompt set, n, repeats and token agreement
# under each run, the verdict above each pair. **Export** writes the figures (PNG/SVG/PDF,
# provenance in their metadata) and the CSVs. ↻ marks settings that restart servers
# (`transfer`, `connector`: P and D; k: all three); the knobs' meaning and the vLLM source each one
# changes are in `tour.ipynb` and `docs/knobs.md`. `profile` picks where the servers run:
# `cpu` (this machine), `gpu` or `gpu-single` (`docs/gpu.md`), each with its own models,
# block size and default prompt set.
#
# Headless (`papermill -p interactive False`), the notebook runs each entry of `runs` through
# the same code path as the Run button (`KnobExplorer.run_once`) and shows the figure and table.

# %% tags=["parameters"]
interactive = True  # False: run `runs` without widgets (papermill, CI)
runs = [{}, {"block_handoff": "legacy"}]  # headless: one run per dict (knobs and/or controls)
profile = "cpu"  # cpu, gpu or gpu-single: placement, flags, default models and prompt set
num_prompts = 8
max_tokens = 32
prompt_set = ""  # empty: the profile's; random for a randomly initialised pair
repeats = 1
k_p = 1  # P's num_speculative_tokens
k_d = 3  # D's and the baseline's num_speculative_tokens
target = ""  # target model directory; empty: data/models/target (the trained pair)
drafter = ""  # EAGLE3 drafter directory; empty: data/models/drafter
config = {}  # any other ExperimentConfig fields
attach = {}  # use running servers instead of starting them (widgets.open_session)
out_dir = "../data/runs/explorer"

# %%
from pathlib import Path

from IPython.display import Image, display

from workbench.config import ExperimentConfig
from workbench.notebook.widgets import KnobExplorer, notebook_config, open_session

out = Path(out_dir)
# What the profile changes from the plain defaults (a GPU profile: models, block size, prompt
# set, lengths); `config` and the parameters above override it.
plain = ExperimentConfig(require_models=False).to_dict()
by_profile = {k: v for k, v in ExperimentConfig.for_profile(profile, require_models=False)
              .to_dict().items() if v != plain[k]}
base = notebook_config({**by_profile, **config}, target=target, drafter=drafter,
                       num_prompts=num_prompts, max_tokens=max_tokens,
                       prompt_set=prompt_set or None, k_p=k_p, k_d=k_d)
session = open_session(attach, log_dir=out / "logs", baseline_cache=out / "baseline-cache")
explorer = KnobExplorer(base, session, out_dir=out, echo=not interactive)
explorer.set_values(repeats=repeats)
if interactive:
    display(explorer)

# %%
if not interactive:
    for values in runs:
        explorer.set_values(**values)
        explorer.run_once()
    exported = explorer.export(out / "export")
    print(f"exported {len(exported)} files to {out / 'export'}")
    display(Image(data=bytes(explorer.plot.value)))
    display(explorer.table().round(4))

# %% [markdown]
# The servers stay up while this kernel runs (one session for every click); they stop when
# the kernel exits, or run `session.close()`.

# %%
if not interactive:
    session.close()
