"""docs/performance.md's measured tables are the benchmarks' own, rendered again here from
their committed records (``data/performance/*.json``), not typed in."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from workbench.paths import REPO

TABLES = {"server-start": "server_start_profile", "one-request-run": "start_vs_import",
          "check-starts": "check_time", "fuzz-starts": "fuzz_start_share",
          "make-test": "make_test_time", "openmp-under-load": "openmp_under_load"}


def _script(name: str):
    sys.path.insert(0, str(REPO / "benchmarks"))  # the scripts import their sibling doc_tables
    try:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.mark.parametrize("table", sorted(TABLES))
def test_each_table_is_its_benchmarks_rendering_of_its_record(table):
    script, tables = _script(TABLES[table]), _script("doc_tables")
    if not (tables.RECORDS / f"{table}.json").exists():
        assert tables.block(table) == "", f"{table}: a table with no record behind it"
        pytest.skip(f"{table}: not measured in this checkout ({TABLES[table]}.py --docs)")
    assert tables.block(table) == script.table(tables.record(table)).strip()
