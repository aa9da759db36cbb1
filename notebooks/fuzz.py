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
# # Fuzz: differences between PD and the baseline that no known finding explains
#
# Runs `python -m workbench fuzz` in this kernel (`docs/fuzz.md`): generated scenarios
# (server shapes; requests with shared prefixes, arrivals, aborts) through PD and the
# standalone baseline, judged by the exact oracle (tokens, per-position counts, the KV
# probe), each unexplained difference shrunk to a minimal case under `out_dir/failures/`.
#
# Parameters (papermill `-p`): `budget` ("5m", "20m"); `out_dir` (a rerun resumes it);
# `seed`; `space_file` (a JSON space, None: the built-in one); `attribute` (False counts the
# known findings' differences as unexplained too); `show_dir`, a fuzz run to show instead of
# running one.

# %% tags=["parameters"]
budget = "5m"
out_dir = "fuzz-run"
seed = 0
space_file = None  # e.g. "../data/fuzz/space-legacy.json"
attribute = True
show_dir = None  # e.g. "fuzz-run": show it, run nothing

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Markdown, display

from workbench.fuzz import command
from workbench.fuzz.space import Space

if show_dir is None:
    command.hunt(Path(out_dir), command.parse_budget(budget), Space.load(space_file),
                 command.base_config_for(), seed, attribute)
shown = Path(show_dir or out_dir)
display(Markdown((shown / "summary.md").read_text()))
trials = pd.read_json(shown / "trials.jsonl", lines=True)
display(trials[["trial", "shape", "phase", "verdict", "signatures", "seconds"]].tail(20))

# %% [markdown]
# Each unexplained difference at its smallest: its report (observed against expected, where
# to look in vLLM's source) as `failures/<hash>/report.md`, replayable with
# `python -m workbench fuzz --replay failures/<hash>/case.json --out DIR`.

# %%
for report in sorted((shown / "failures").glob("*/report.md")):
    display(Markdown(report.read_text()))
