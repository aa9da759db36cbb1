"""What every figure shares: the style, run labels, provenance and the export.

Exports are byte-reproducible where the backend allows: no dates in PDF/SVG metadata, a
fixed SVG hash salt, and PNG text chunks holding only the provenance.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ..knobs import spec as knob_spec
from ..measuring.results import Result

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.frameon": False,
    "svg.hashsalt": "pd-eagle3-workbench",
    "svg.fonttype": "path",
    "pdf.fonttype": 42,
}
def label(r: Result) -> str:
    """A short name for a run: its grid-point name, else the knobs that differ from defaults."""
    return r.config.get("label") or changed_knobs(r)


def changed_knobs(r: Result) -> str:
    """The knobs a run set away from their defaults, or "all fixes in place"."""
    changed = knob_spec.changed(r.knobs.get("requested", {}), instruments=False)
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "all fixes in place"


def provenance(results: Sequence[Result]) -> dict:
    return {
        "runs": [
            {"label": label(r), "knobs_p": r.knobs.get("p"), "knobs_d": r.knobs.get("d"),
             "prompt_set": r.prompt_set, "num_prompts": r.num_prompts,
             "created": r.created}
            for r in results
        ],
        "vllm_version": sorted({r.vllm_version for r in results}),
        "git_commit": sorted({r.git_commit for r in results}),
    }


def save(fig, out_dir: str | Path, stem: str, prov: dict) -> list[Path]:
    """Write PNG, SVG and PDF with the provenance in each file's metadata."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(prov, sort_keys=True)
    paths = []
    for ext, meta in (
        ("png", {"Title": stem, "Description": text, "Software": "pd-eagle3-workbench"}),
        ("svg", {"Title": stem, "Description": text, "Date": None, "Creator": None}),
        ("pdf", {"Title": stem, "Subject": text, "CreationDate": None, "ModDate": None,
                 "Producer": None, "Creator": "pd-eagle3-workbench"}),
    ):
        p = out / f"{stem}.{ext}"
        fig.savefig(p, format=ext, metadata=meta, bbox_inches="tight")
        paths.append(p)
    plt.close(fig)
    return paths
