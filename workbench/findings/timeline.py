"""Since when, and until when, each finding is present: its native verdicts across releases,
in one sentence.

Read from the committed ``data/releases/findings-matrix.csv`` (``python -m workbench releases
--check``: each finding's detector natively on each release), so a report says what was
measured on the old releases instead of only the release a finding was first seen on.
"""

from __future__ import annotations

import csv
from itertools import groupby
from pathlib import Path

from ..knobs.release import version_key
from ..paths import DATA

CSV_NAME = "findings-matrix.csv"
MATRIX = DATA / "releases" / CSV_NAME


def verdicts(finding: str, path: Path = MATRIX) -> list[tuple[str, str]]:
    """(release, verdict) of ``finding``, oldest release first; empty without a matrix."""
    if not path.is_file():
        return []
    with path.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["finding"] == finding]
    return sorted(((r["release"], r["verdict"]) for r in rows), key=lambda x: version_key(x[0]))


def spans(pairs: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """Consecutive releases with one verdict: (first, last, verdict)."""
    out = []
    for verdict, grp in groupby(pairs, key=lambda x: x[1]):
        rel = [r for r, _ in grp]
        out.append((rel[0], rel[-1], verdict))
    return out


def since(finding: str, path: Path = MATRIX) -> str | None:
    """``present natively since 0.25.1, still on 0.34.0 (the newest release measured)``, or
    ``present natively on 0.23.0-0.24.0 only, until 0.24.0``, or never measured natively; then
    every span: None without a matrix row for ``finding``."""
    pairs = verdicts(finding, path)
    if not pairs:
        return None
    sp = spans(pairs)
    present = [s for s in sp if s[2] == "present"]
    # a release that cannot run it (not-applicable), whose absence is unchecked (no positive
    # control saw the bug there: matrix.UNCHECKED) or whose run failed, between two present
    # ones ends no span
    measured = [(r, v) for r, v in pairs
                if v not in ("not-applicable", "unchecked", "run-failed")]
    verdicts_measured = [v for _, v in measured]
    if not present:
        head = ("not measurable natively on any release" if all(
            s[2] == "not-applicable" for s in sp) else "not present natively on any release")
    elif set(verdicts_measured[verdicts_measured.index("present"):]) == {"present"}:
        head = (f"present natively since {present[0][0]}, still on {measured[-1][0]} (the "
                "newest release checked)")
    else:
        after = [(r, v) for r, v in measured if version_key(r) > version_key(present[-1][1])]
        head = ("present natively on " + ", ".join(_span(s) for s in present) + " only, until "
                f"{present[-1][1]} ({after[0][1]} on {after[0][0]})")
    return f"{head} ({'; '.join(f'{_span(s)} {s[2]}' for s in sp)}; {CSV_NAME})"


def _span(s: tuple[str, str, str]) -> str:
    return s[0] if s[0] == s[1] else f"{s[0]}-{s[1]}"
