"""What every figure shares: the style, run labels, provenance and the export.

Exports are byte-reproducible where the backend allows: no dates in PDF/SVG metadata, a
fixed SVG hash salt, and PNG text chunks holding only the provenance.
"""

from __future__ import annotations

import json
import textwrap
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
WRAP = 22  # characters per line of a run's name under its bars


def label(r: Result) -> str:
    """A short name for a run: its grid-point name, else the knobs that differ from defaults."""
    return r.config.get("label") or changed_knobs(r)


def changed_knobs(r: Result) -> str:
    """The knobs a run set away from their defaults, or "all fixes in place"."""
    changed = knob_spec.changed(r.knobs.get("requested", {}), instruments=False)
    return ", ".join(f"{k}={v}" for k, v in changed.items()) or "all fixes in place"


def n_requests(r: Result) -> int:
    """How many requests a run measured (each on both sides)."""
    return int((r.pd or {}).get("num_requests") or len(r.requests) or r.num_prompts)


def agreement(r: Result) -> str:
    """Token agreement in words, with the count behind it: "tokens equal 32/64"."""
    rows = [q for q in r.requests if q.get("agree") is not None]
    if rows:
        return f"tokens equal {sum(bool(q['agree']) for q in rows)}/{len(rows)}"
    if r.token_agreement is not None:
        return f"token agreement {r.token_agreement:.2f}"
    return "tokens not compared"


def caption(r: Result) -> str:
    """A run's name under its bars, with what its numbers stand on: the prompt set and the
    requests (n), how many were in flight, and its token agreement with the baseline."""
    flight = (r.measurement or {}).get("concurrency")
    return "\n".join([wrap(label(r)), f"{r.prompt_set}, n={n_requests(r)}",
                      *([f"{flight} in flight"] if flight else []), agreement(r)])


def wrap(name: str) -> str:
    """A run's name in lines of about WRAP characters, broken at spaces only (a finding's id
    stays whole)."""
    return textwrap.fill(name, WRAP, break_on_hyphens=False, break_long_words=False)


def diverged(r: Result) -> bool:
    """Whether D's output parted from the baseline's in some request (greedy: a bug)."""
    rows = [q for q in r.requests if q.get("agree") is not None]
    if rows:
        return not all(bool(q["agree"]) for q in rows)
    return r.token_agreement is not None and r.token_agreement < 1


DIVERGED_COLOR = "tab:red"
DIVERGED_WORDS = "red name: D's tokens differ from the baseline's\nin some requests"


def flag_diverged(ax, flags: Sequence[bool]) -> bool:
    """Colour red the x tick label of each run whose flag is set (its tokens diverged: see
    ``diverged``); True when any is."""
    for tick, flag in zip(ax.get_xticklabels(), flags, strict=True):
        if flag:
            tick.set_color(DIVERGED_COLOR)
    return any(flags)


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
