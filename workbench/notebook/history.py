"""The explorer's runs: groups of repeats, their table, figure and export.

Kept apart from the widgets so the same history can be tabulated and exported without a
browser (papermill, tests).
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from ..figures import plots
from ..measuring.results import Result

# Columns the explorer's table shows (the exported CSV has every column of summary_row).
TABLE_FIRST = ("run", "repeat", "label", "prompt_set", "num_prompts", "k_p", "k_d")
TABLE_LAST = ("pd_acceptance_length", "baseline_acceptance_length", "token_agreement",
              "wall_seconds")
MAX_PLOTTED = 6  # the figure shows the last few runs; the table and export keep all


RUN_DIR = re.compile(r"run(\d+)-rep\d+$")


def claim_run_dir(runs_dir: Path) -> int:
    """The next run number under ``runs_dir``, claimed by creating its first repeat's
    directory (``mkdir`` fails for everyone but one): numbers go on from the runs already on
    disk, so an explorer in a new kernel never overwrites an earlier kernel's ``run001``."""
    runs_dir.mkdir(parents=True, exist_ok=True)
    taken = [int(m.group(1)) for d in runs_dir.iterdir() if (m := RUN_DIR.match(d.name))]
    n = max(taken, default=0) + 1
    while True:
        try:
            (runs_dir / f"run{n:03d}-rep1").mkdir()
            return n
        except FileExistsError:
            n += 1


class RunHistory:
    """Every Run click's results: one group per click, one Result per repeat."""

    def __init__(self) -> None:
        self.groups: list[list[Result]] = []

    @property
    def results(self) -> list[Result]:
        return [r for g in self.groups for r in g]

    def numbered(self):
        """(run number, repeat number, result) for every result, from 1."""
        for i, g in enumerate(self.groups, 1):
            for j, r in enumerate(g, 1):
                yield i, j, r

    def table(self, full: bool = False) -> pd.DataFrame:
        """One row per (run, repeat): knob values in force on D, k, prompts, per-position
        acceptance for PD and the baseline, token agreement."""
        df = pd.DataFrame([{"run": i, "repeat": j, "label": plots.label(r), **r.summary_row()}
                           for i, j, r in self.numbered()])
        if full or df.empty:
            return df
        pos = sorted(c for c in df.columns if c.startswith(("pd_pos", "baseline_pos")))
        knobs = [c for c in df.columns if c.startswith("knob_")]
        return df[[c for c in (*TABLE_FIRST, *knobs, *pos, *TABLE_LAST) if c in df.columns]]

    def figure(self, out_dir: str | Path, stem: str = "per_position_spread") -> list[Path]:
        """The explorer's figure (last ``MAX_PLOTTED`` runs, min-max over repeats)."""
        return plots.per_position_spread(self.groups[-MAX_PLOTTED:], out_dir, stem)

    def export(self, out: Path) -> list[Path]:
        """Every figure (PNG, SVG, PDF with provenance), ``results.csv`` (one row per run and
        repeat), ``requests.csv`` and each run's ``result.json`` under ``out``."""
        if not self.groups:
            raise RuntimeError("nothing to export yet: press Run first")
        out.mkdir(parents=True, exist_ok=True)
        written = self.figure(out / "figures")
        written += plots.all_figures([g[-1] for g in self.groups], out / "figures")
        self.table(full=True).to_csv(out / "results.csv", index=False)
        reqs = pd.concat([r.requests_frame().assign(run=i, repeat=j, label=plots.label(r))
                          for i, j, r in self.numbered()], ignore_index=True)
        reqs.to_csv(out / "requests.csv", index=False)
        written += [out / "results.csv", out / "requests.csv"]
        written += [r.save(out / "runs" / f"run{i:03d}-rep{j}") for i, j, r in self.numbered()]
        return written
