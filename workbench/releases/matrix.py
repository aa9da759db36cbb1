"""``findings-matrix.csv`` and its figure: each finding's native verdict on each release.

One row per (release, finding): the verdict ``check`` gives (present, absent, inconclusive,
detector-broken, not-applicable), its evidence as compact JSON (for not-applicable: ``why``),
the seconds its runs took, how D's counts were measured (``source``), each control's status
and the command that ran the release. The figure puts releases across and findings down, one
colour per verdict, and numbers every distinct not-applicable reason under the grid, so a
blank never reads as absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from ..figures.figstyle import STYLE, save
from ..findings.finding import ABSENT, OWN_RUN, PRESENT, VERDICTS, controls_line
from ..findings.timeline import CSV_NAME
from ..knobs.release import version_key
from ..provenance import atomic_write_text, git_commit

COLUMNS = ("release", "finding", "verdict", "evidence", "seconds", "source", "controls",
           "vllm_version", "command")
FIGURE_STEM = "findings-matrix"
SCRAPED = "1x"  # a cell's mark: its counts came one request at a time
# A cell's verdict is ``check``'s, but ``absent`` only where the finding's positive control
# ran on that release and detected the bug (the instrument shown able to see it there); any
# other absence is ``unchecked``, with why, and reads as no measurement.
UNCHECKED = "unchecked"
MATRIX_VERDICTS = (*VERDICTS, UNCHECKED)
COLORS = {"present": "tab:red", "absent": "tab:green", "inconclusive": "gold",
          "detector-broken": "black", "not-applicable": "lightgray",
          "run-failed": "tab:purple", UNCHECKED: "lightsteelblue"}


def unseen(f: dict[str, Any]) -> str | None:
    """Why an ``absent`` outcome is not a checked absence (None: its positive control ran on
    that release and detected the bug)."""
    pos = (f.get("controls") or {}).get("positive")
    if pos is None:
        return "the finding has no positive control"
    if pos.get("verdict") == PRESENT:
        return None
    if pos.get("status") == OWN_RUN:
        return ("its positive control is its own run, which saw nothing: no run shows the "
                "instrument can see the bug on this release")
    return f"its positive control did not detect it here ({pos.get('status')}: " \
           f"{pos.get('why') or pos.get('verdict')})"


def verdict_of(f: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A cell's verdict and evidence: ``check``'s, an unchecked absence said so."""
    if f["verdict"] == ABSENT and (why := unseen(f)) is not None:
        return UNCHECKED, {**f["evidence"], "why": why}
    return f["verdict"], f["evidence"]


def rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The matrix rows of every release record (``history.ReleaseRecord`` as saved)."""
    out = []
    for rec in records:
        for f in rec["findings"]:
            verdict, evidence = verdict_of(f)
            out.append({"release": rec["release"], "finding": f["id"], "verdict": verdict,
                        "evidence": json.dumps(evidence, sort_keys=True, separators=(",", ":")),
                        "seconds": f["seconds"], "source": f.get("source") or "",
                        "controls": controls_line(f.get("controls") or {}),
                        "vllm_version": rec.get("vllm_version") or "",
                        "command": rec.get("command") or ""})
    return out


def frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    df = pd.DataFrame(rows(records), columns=list(COLUMNS))
    bad = set(df["verdict"]) - set(MATRIX_VERDICTS)
    if bad:
        raise ValueError(f"verdicts {sorted(bad)} are none of {', '.join(MATRIX_VERDICTS)}")
    return df


def reason_of(evidence: str) -> str:
    return json.loads(evidence).get("why", "")


def grid(df: pd.DataFrame) -> tuple[list[str], list[str], pd.DataFrame, list[str]]:
    """(releases in order, findings in order, verdict codes, the numbered reasons), every
    not-applicable cell's note the number of its reason."""
    releases = sorted(df["release"].unique(), key=version_key)
    findings = list(dict.fromkeys(df["finding"]))
    reasons: list[str] = []
    for _, r in df[df["verdict"] == "not-applicable"].iterrows():
        if (why := reason_of(r["evidence"])) not in reasons:
            reasons.append(why)
    codes = df.pivot(index="finding", columns="release", values="verdict")
    return releases, findings, codes.reindex(index=findings, columns=releases), reasons


def figure(df: pd.DataFrame, out_dir: Path, prov: dict) -> list[Path]:
    releases, findings, codes, reasons = grid(df)
    cmap = ListedColormap([COLORS[v] for v in MATRIX_VERDICTS])
    values = codes.map(lambda v: MATRIX_VERDICTS.index(v) if isinstance(v, str)
                       else float("nan"))
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(1.0 + 0.62 * len(releases),
                                        1.6 + 0.42 * len(findings) + 0.16 * len(reasons)))
        ax.imshow(values.to_numpy(float), cmap=cmap, vmin=-0.5, vmax=len(MATRIX_VERDICTS) - 0.5,
                  aspect="auto")
        ax.set_xticks(range(len(releases)), releases, rotation=45, ha="right")
        ax.set_yticks(range(len(findings)), findings)
        for (i, fid), (j, rel) in ((a, b) for a in enumerate(findings)
                                   for b in enumerate(releases)):
            cell = df[(df["finding"] == fid) & (df["release"] == rel)]
            if len(cell) and cell.iloc[0]["verdict"] == "not-applicable":
                n = reasons.index(reason_of(cell.iloc[0]["evidence"])) + 1
                ax.text(j, i, str(n), ha="center", va="center", fontsize=7)
            elif len(cell) and cell.iloc[0]["source"] == "metrics-scrape":
                ax.text(j, i, SCRAPED, ha="center", va="center", fontsize=7)
        ax.set_xticks([x - 0.5 for x in range(len(releases) + 1)], minor=True)
        ax.set_yticks([y - 0.5 for y in range(len(findings) + 1)], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set_title("each finding natively on each vLLM release (CPU, observe-only; NIXL pull "
                     "unless a ported path: host staging, ExampleConnector)")
        ax.legend(handles=[Patch(color=COLORS[v], label=v) for v in MATRIX_VERDICTS],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        notes = "\n".join(f"{n}: {_short(w)}" for n, w in enumerate(reasons, 1))
        fig.text(0.01, -0.01, f"{SCRAPED}: counted by /metrics scrapes, one request at a time "
                 "(no per-request field)\nnot-applicable, why:\n" + notes, va="top",
                 fontsize=6.5, family="monospace")
        return save(fig, out_dir, FIGURE_STEM, prov)


def _short(why: str, width: int = 150) -> str:
    return why if len(why) <= width else why[: width - 3] + "..."


def write(out: Path, records: list[dict[str, Any]], command: str) -> pd.DataFrame:
    """``out/findings-matrix.csv`` (each row with the command that measured its release: a
    plain CSV, no comment line) and ``out/figures/`` from the release records."""
    df = frame(records)
    atomic_write_text(out / CSV_NAME, df.to_csv(index=False))
    figure(df, out / "figures", {"command": command, "csv": CSV_NAME,
                                 "git_commit": git_commit()})
    return df


SHORT = {"present": "**present**", "absent": "absent", "inconclusive": "inconclusive",
         "detector-broken": "BROKEN", "not-applicable": "n/a", "run-failed": "run failed",
         UNCHECKED: "unchecked"}
DOC_BEGIN, DOC_END = "<!-- findings-matrix:begin -->", "<!-- findings-matrix:end -->"


def markdown(df: pd.DataFrame) -> str:
    """The matrix as a Markdown table (docs/history.md): releases across, findings down."""
    releases, findings, codes, _ = grid(df)
    src = df.pivot(index="finding", columns="release", values="source")

    def cell(fid: str, rel: str) -> str:
        scraped = codes.loc[fid, rel] != "not-applicable" and src.loc[fid, rel] == "metrics-scrape"
        return SHORT[codes.loc[fid, rel]] + (f" ({SCRAPED})" if scraped else "")

    lines = ["| finding | " + " | ".join(releases) + " |",
             "|---|" + "---|" * len(releases)]
    lines += [f"| `{fid}` | " + " | ".join(cell(fid, r) for r in releases) + " |"
              for fid in findings]
    return "\n".join(lines)


def write_doc_table(df: pd.DataFrame, doc: Path) -> bool:
    """Replace the table between the markers in ``doc``; False when it has no markers."""
    text = doc.read_text()
    if DOC_BEGIN not in text:
        return False
    head, rest = text.split(DOC_BEGIN, 1)
    tail = rest.split(DOC_END, 1)[1]
    atomic_write_text(doc, f"{head}{DOC_BEGIN}\n{markdown(df)}\n{DOC_END}{tail}")
    return True
