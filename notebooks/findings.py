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
# # Findings: which known acceptance bugs does this vLLM build have?
#
# Runs `python -m workbench check` in this kernel on the vLLM installed here (any build: a
# version the release table lacks uses its nearest entry at or below it, after that entry's
# patch checks passed on the installed source; `docs/check.md`). Each finding runs its own
# experiment with vLLM untouched, plus a positive and a negative control; the table shows the
# verdicts against the committed expectations, and each present finding's figure follows.
#
# Parameters (papermill `-p`): `only`, comma-separated finding ids (None: all, about ten
# minutes on a 2-core CPU); `report_dir`, where issue-ready pages go (None: none);
# `out_dir`, where `check.json` and every run's `result.json` go; `show_dir`, a check already
# run (`make check`'s or `check --out DIR`'s directory) to show instead of running one.

# %% tags=["parameters"]
only = None  # e.g. "padded-load-step,double-bos"
report_dir = None  # e.g. "findings-reports": <id>.md, <id>.png, <id>.repro.py, summary.md
out_dir = "findings-check"
show_dir = None  # e.g. "../data/findings/check": show it, run nothing

# %%
from pathlib import Path

import pandas as pd
from IPython.display import Image, Markdown, display

from workbench.findings import FINDINGS, check

checked = (check.load(show_dir) if show_dir else
           check.run(only, out_dir, report=report_dir, command="notebooks/findings.ipynb"))
table = pd.DataFrame([{"finding": o.id, "verdict": o.verdict, "expected": o.expected,
                       "positive control": o.controls.get("positive", {}).get("ok"),
                       "negative control": o.controls.get("negative", {}).get("ok"),
                       "seconds": o.seconds} for o in checked.outcomes])
print(f"vLLM {checked.build.version} ({checked.build.source}, table entry "
      f"{checked.build.table_entry}): {checked.runs} runs in {checked.seconds:.0f} s")
display(table)

# %% [markdown]
# Each present finding: what vLLM does and where, and its figure (with `report_dir` set): for
# a finding read from acceptance, D's per-position bars beside the baseline's on the same
# requests (each whisker that bar's 95% bootstrap interval; prompt set, n and token agreement
# under the bars, the verdict above each pair); for one read from the KV probe, the probe's
# figure.

# %%
for o in checked.outcomes:
    if o.verdict != "present":
        continue
    f = FINDINGS[o.id]
    display(Markdown(f"### {f.title}\n\n`{o.id}`: {f.where}\n\nEvidence: `{o.evidence}`"))
    png = Path(report_dir or "") / f"{o.id}.png"
    if report_dir and png.is_file():
        display(Image(filename=str(png)))
