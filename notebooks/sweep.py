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
# # Sweep: one grid point (or a whole grid) of the PD + EAGLE3 workbench
#
# `python -m workbench sweep` runs this notebook once per grid point through papermill,
# attached to servers the driver owns; the executed copy is the record of that run.
# Run by hand, it starts its own servers (attach empty) or runs a whole grid (`grid`).

# %% tags=["parameters"]
config = {}  # ExperimentConfig fields; {} means the CPU defaults
# attach: {"urls": {"p": ..., "d": ..., "baseline": ...}, "knobs_file", "state_dir",
# "baseline_cache"}: the sweep driver's running servers
attach = {}
out_dir = "../data/runs/notebook-point"
grid = ""  # a grid name ("default", "smoke") runs the whole grid here instead of one point
results_store = ""  # a CSV to append this run's row to

# %%
from IPython.display import display

from workbench.config import ExperimentConfig
from workbench.notebook import sweep

if grid:
    base = ExperimentConfig.from_dict(dict(config)) if config else ExperimentConfig()
    table = sweep.run_sweep(grid, out_dir, base, use_papermill=False)
    result = None
else:
    result = sweep.run_point(config, attach or None, out_dir, results_store or None)
    table = result.to_dataframe()
display(table)

# %%
if result is not None:  # what `run` prints: the headline verdicts, with the raw ones beside
    from workbench.measuring import readout

    print("knobs in force on D:", result.knobs.get("d"))
    print("\n".join(readout.lines(result)))
    for note in result.notes:
        print("note:", note)
