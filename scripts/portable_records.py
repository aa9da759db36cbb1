"""Rewrite the committed records so that none names a path of the machine that wrote them.

    python scripts/portable_records.py [--root PATH ...] [--replace PATH=TEXT ...] [--dry-run]

* every tracked text file under data/, docs/ and notebooks/: each checkout's absolute path
  (``--root``: this checkout and any other that wrote records) taken out
  (``provenance.portable_text``), and each ``--replace`` path (an interpreter's own
  directory, say) put as the text given;
* every sweep point's ``point.json``: its digest computed again over the rewritten config,
  so a clone anywhere resumes the sweep;
* every committed ``check`` record (``data/findings/**/check.json``): judged again from its
  runs (``check.rejudge``) and its reports written again beside it.

Run once after a change that wrote machine paths; ``tests/unit/test_portable_records.py``
fails while a tracked file still holds one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

from workbench.findings import check
from workbench.notebook.sweep import POINT_RECORD, _digest
from workbench.paths import REPO
from workbench.provenance import atomic_write_json, atomic_write_text, portable_text

TREES = ("data", "docs", "notebooks")
BINARY = (".png", ".pdf", ".safetensors", ".bin", ".pt", ".npz", ".gz", ".whl")


def tracked() -> list[Path]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", *TREES], capture_output=True,
                         text=True, check=True).stdout.split()
    return [REPO / p for p in out if not p.endswith(BINARY)]


def rewrite_text(files: list[Path], roots: list[str], replace: list[str], dry: bool) -> int:
    n = 0
    for f in files:
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        new = text
        for root in roots:
            new = portable_text(new, root)
        for pair in replace:
            old, _, by = pair.partition("=")
            new = new.replace(old, by)
        if new != text:
            n += 1
            if not dry:
                atomic_write_text(f, new)
    return n


def redigest(files: list[Path], dry: bool) -> int:
    n = 0
    for f in (f for f in files if f.name == POINT_RECORD):
        rec = json.loads(f.read_text())
        if rec.get("digest") != (d := _digest(rec)):
            n += 1
            if not dry:
                atomic_write_json(f, {**rec, "digest": d}, indent=2, portable=True)
    return n


def rejudge(dry: bool) -> list[Path]:
    done = []
    for doc in sorted((REPO / "data" / "findings").glob("**/check.json")):
        reports = doc.parent / "reports"
        if not dry:
            check.rejudge(doc.parent, reports if reports.is_dir() else None)
        done.append(doc)
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", action="append", default=[str(REPO)],
                    help="a checkout's absolute path the records name (repeat; this one always)")
    ap.add_argument("--replace", action="append", default=[], metavar="PATH=TEXT",
                    help="another machine path, and what to put instead")
    ap.add_argument("--dry-run", action="store_true", help="count, write nothing")
    a = ap.parse_args()
    files = tracked()
    print(f"text files rewritten: {rewrite_text(files, a.root, a.replace, a.dry_run)}")
    print(f"point digests computed again: {redigest(files, a.dry_run)}")
    for doc in rejudge(a.dry_run):
        print(f"judged again: {doc.relative_to(REPO)}")


if __name__ == "__main__":
    main()
