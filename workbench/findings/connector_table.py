"""The connector x finding table: one ``check --connector NAME`` per connector, side by side;
with ``--by runner``, the runner x finding table of ``check --runner NAME`` the same way.

``make check-connectors`` runs the checks and then this module, which reads each check's
``check.json``, prints the table and writes it into ``docs/connectors.md`` between its
markers, so the page always shows the last checks run (and the command that ran them);
``--by runner`` writes into ``docs/check.md``.

    python -m workbench.findings.connector_table [--by connector|runner] [--doc PAGE] DIR...
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..knobs.connector import DEFAULT
from ..paths import REPO, portable
from ..provenance import atomic_write_text
from . import FINDINGS
from .finding import FAILED, INCONCLUSIVE, NOT_APPLICABLE

BEGIN, END = "<!-- check-connectors: begin -->", "<!-- check-connectors: end -->"
# what a check is told apart by: its check.json field, the value older records mean, the page
BY = {"connector": ("connector", DEFAULT, REPO / "docs" / "connectors.md"),
      "runner": ("runner", "v1", REPO / "docs" / "check.md")}


def markers(by: str) -> tuple[str, str]:
    return (BEGIN, END) if by == "connector" else (f"<!-- check-{by}s: begin -->",
                                                   f"<!-- check-{by}s: end -->")


def load(dirs: list[Path], by: str = "connector") -> dict[str, dict]:
    """Each check's ``check.json`` by its connector (older ones without: NIXL pull), or by its
    runner (older ones: v1)."""
    field, default, _ = BY[by]
    docs = {}
    for d in dirs:
        doc = json.loads((Path(d) / "check.json").read_text())
        docs[doc.get(field, default)] = {**doc, "dir": portable(Path(d))}
    return docs


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def cell(f: dict) -> str:
    """A finding's verdict, marked where it is not the expected one."""
    if f["verdict"] == NOT_APPLICABLE:
        return "n/a"
    mark = "" if f["verdict"] == f.get("expected") else f" (expected {f.get('expected')})"
    return f"**{f['verdict']}**{mark}" if f["verdict"] == "present" else f"{f['verdict']}{mark}"


def markdown(docs: dict[str, dict]) -> str:
    """The table, then why each not-applicable one does not apply, then the commands."""
    names = list(docs)
    by = {c: {f["id"]: f for f in d["findings"]} for c, d in docs.items()}
    lines = ["| finding | " + " | ".join(f"`{c}`" for c in names) + " |",
             "|---|" + "---|" * len(names)]
    for fid in FINDINGS:
        lines.append(f"| `{fid}` | " + " | ".join(
            cell(by[c][fid]) if fid in by[c] else "not run" for c in names) + " |")
    why = sorted({(fid, c, first_line(by[c][fid]["evidence"].get("why", "")))
                  for c in names for fid in by[c]
                  if by[c][fid]["verdict"] in (NOT_APPLICABLE, INCONCLUSIVE, FAILED)})
    if why:
        lines += ["", "Not applicable, inconclusive or run failed, and why:", ""]
        lines += [f"- `{fid}` on `{c}`: {w}" for fid, c, w in why]
    lines += ["", "Run by:", ""]
    for c, d in docs.items():
        build, secs = d["build"], sum(f["seconds"] for f in d["findings"])
        lines.append(f"- `{c}`: `{d['command']}` (vLLM {build.get('version')}, "
                     f"{secs:.0f} s of runs, `{d['dir']}/check.json`, {d['created']})")
    return "\n".join(lines)


def write_into(doc: Path, table: str, by: str = "connector") -> Path:
    """``table`` between the page's markers (appended with them when the page lacks them)."""
    begin, end = markers(by)
    text = doc.read_text() if doc.is_file() else ""
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    return atomic_write_text(doc, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench.findings.connector_table",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="check output directories (--out)")
    ap.add_argument("--by", choices=tuple(BY), default="connector",
                    help="tell the checks apart by their KV connector or their model runner")
    ap.add_argument("--doc", type=Path, help="the page to write the table into (default: "
                    "docs/connectors.md, with --by runner docs/check.md)")
    args = ap.parse_args(argv)
    missing = [str(d) for d in args.dirs if not (d / "check.json").is_file()]
    if missing:
        ap.error(f"no check.json in {', '.join(missing)}: run python -m workbench check "
                 "--connector NAME --out DIR first")
    docs = load(args.dirs, args.by)
    table = markdown(docs)
    print(table)
    print(f"wrote {write_into(args.doc or BY[args.by][2], table, args.by)}")
    return 0 if all(d["ok"] for d in docs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
