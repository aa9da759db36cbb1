"""``python -m workbench compat``: each supported vLLM release checked against its own source.

For every release named, the CUDA wheel is fetched once with ``pip download --no-deps``
(cached under ``.cache/compat/``), only its ``.py`` files are read (nothing is installed or
imported), and the checks of ``compat/checks.py`` run on them: the patch targets and source
facts the release's ``knobs/release.RELEASES`` entry names, the GPU profiles' server flags and
variables, the metric names the workbench reads and the per-request spec-decode field. Each
release's record goes to ``data/compat/vllm-<release>.json`` and the README's compat table is
rewritten from the records. ``make test`` runs the same checks on the installed (CPU) release
and checks the committed records against the current checks, with no download.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Any

from ..knobs import release as releases
from ..knobs.patch_checks import Check, patch_checks
from ..knobs.source import Source, WheelSource, fetch_wheel, installed_source
from ..paths import DATA, REPO
from . import test_script
from .checks import entry_checks, field_checks, flag_checks, metric_checks

RECORDS = DATA / "compat"
CACHE = REPO / ".cache" / "compat"
README = REPO / "docs" / "releases.md"  # holds the compat table between its markers
TABLE_BEGIN, TABLE_END = "<!-- compat-table:begin -->", "<!-- compat-table:end -->"
KINDS = ("target", "order", "entry", "flag", "value", "env", "metric", "field")
PROFILES = ("gpu", "gpu-single", "cpu")  # the GPU profiles, and the CPU's for a CPU 0.33.0


def profile_servers() -> list[dict[str, Any]]:
    """What ``plan`` prints for every profile, with NIXL's device buffer and host staging
    (on a GPU ``kv_buffer_device`` ``cuda`` and ``cpu``), ports left to the OS."""
    from ..config import ExperimentConfig
    from ..serving.plan import server_specs

    out = []
    for profile in PROFILES:
        for transfer in ("direct", "host-staged"):
            cfg = ExperimentConfig.for_profile(profile, require_models=False,
                                               knobs={"transfer": transfer})
            for spec in server_specs(cfg, "/tmp/workbench-compat"):
                out.append({"role": spec.role, "argv": spec.command(), "env": spec.env()})
    return out


def checks_for(version: str) -> list[Check]:
    """Every check of ``version``, in a fixed order (a record's names must equal these)."""
    rel = releases.RELEASES[releases.base_version(version)]
    return [*patch_checks(rel), *entry_checks(), *flag_checks(profile_servers()), *metric_checks(),
            *field_checks()]


def run_checks(version: str, src: Source) -> dict[str, Any]:
    """One release's record: every check with its outcome, and a count per kind."""
    rows = []
    for c in checks_for(version):
        ok, where = c.run(src)
        rows.append({"kind": c.kind, "name": c.name, "ok": ok, "where": where})
    counts = {k: {"passed": sum(r["ok"] for r in rows if r["kind"] == k),
                  "total": sum(r["kind"] == k for r in rows)} for k in KINDS}
    return {"release": releases.base_version(version), "source": src.label,
            "ok": all(r["ok"] for r in rows), "counts": counts, "checks": rows}


def check_wheel(version: str, cache: Path = CACHE) -> dict[str, Any]:
    wheel = fetch_wheel(version, cache)
    record = run_checks(version, WheelSource(wheel))
    record["sha256"] = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return record


def check_installed() -> dict[str, Any]:
    """The same checks on the installed vLLM's files (the CPU release under ``make test``),
    with the table entry it uses (``knobs/release.table_entry``) where it is not a release."""
    version = releases.vllm_version()
    return run_checks(releases.table_entry(version)[0], installed_source(version))


def record_path(version: str, root: Path = RECORDS) -> Path:
    return root / f"vllm-{releases.base_version(version)}.json"


def load_records(root: Path = RECORDS) -> dict[str, dict[str, Any]]:
    return {json.loads(p.read_text())["release"]: json.loads(p.read_text())
            for p in sorted(root.glob("vllm-*.json"))}


def table(records: dict[str, dict[str, Any]]) -> str:
    """The README's compat table: per release, passed/total per kind of check."""
    head = "| release | source | " + " | ".join(KINDS) + " | all |"
    rule = "|" + "---|" * (len(KINDS) + 3)
    lines = [head, rule]
    for version, r in records.items():
        cells = [f"{r['counts'][k]['passed']}/{r['counts'][k]['total']}" for k in KINDS]
        lines.append(f"| {version} | `{r['source']}` | " + " | ".join(cells)
                     + f" | {'pass' if r['ok'] else 'FAIL'} |")
    return "\n".join(lines)


def write_readme_table(records: dict[str, dict[str, Any]], readme: Path = README) -> None:
    text = readme.read_text()
    pattern = re.compile(re.escape(TABLE_BEGIN) + ".*?" + re.escape(TABLE_END), re.S)
    block = f"{TABLE_BEGIN}\n{table(records)}\n{TABLE_END}"
    if not pattern.search(text):
        raise RuntimeError(f"{readme} has no {TABLE_BEGIN} ... {TABLE_END} block")
    readme.write_text(pattern.sub(lambda _m: block, text))


def failures(record: dict[str, Any]) -> list[str]:
    return [f"{r['kind']} {r['name']}: {r['where']}" for r in record["checks"] if not r["ok"]]


def main(versions: list[str], out: Path = RECORDS, cache: Path = CACHE,
         readme: Path | None = README, reference: Path | None = test_script.REFERENCE) -> int:
    """Check each release's wheel, write its record and the README table, and re-derive
    vLLM's PD + EAGLE3 test flags (``reference``) from the releases' sdists; 1 if any failed."""
    out.mkdir(parents=True, exist_ok=True)
    bad = 0
    for v in versions:
        record = check_wheel(v, cache)
        path = record_path(v, out)
        path.write_text(json.dumps(record, indent=1) + "\n")
        status = "every check passes" if record["ok"] else "FAILED"
        print(f"vllm {v} ({record['source']}): {len(record['checks'])} checks, {status}; "
              f"wrote {path}")
        for f in failures(record):
            print(f"  fail: {f}", file=sys.stderr)
        bad += not record["ok"]
    if reference is not None:
        bad += not test_script.write_reference(versions, cache, reference)
    if readme is not None:
        write_readme_table(load_records(out), readme)
    return 1 if bad else 0
