"""A benchmark's figures into the repository: its record under ``data/performance/<name>.json``
and its table between ``<!-- <name>:begin -->`` and ``<!-- <name>:end -->`` in
docs/performance.md, so the page's numbers are the script's
(``tests/unit/test_performance_tables.py`` renders each table again from its record)."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "performance.md"
RECORDS = REPO / "data" / "performance"


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def record(name: str) -> dict:
    return json.loads((RECORDS / f"{name}.json").read_text())


def block(name: str) -> str:
    begin, end = markers(name)
    return DOC.read_text().split(begin, 1)[1].split(end, 1)[0].strip()


def write_block(path: Path, name: str, text: str) -> None:
    """``text`` in place of what stands between ``name``'s markers in ``path``."""
    from workbench.provenance import atomic_write_text

    begin, end = markers(name)
    head, rest = path.read_text().split(begin, 1)
    atomic_write_text(path, f"{head}{begin}\n{text}\n{end}{rest.split(end, 1)[1]}")


def write(name: str, doc: dict, text: str) -> None:
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{name}.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    write_block(DOC, name, text)
