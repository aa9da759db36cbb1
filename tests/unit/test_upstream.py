"""``python -m workbench upstream`` without vLLM's tree: crafted findings and a fake tests tree
(the live run over vLLM 0.32.0's sdist is ``make upstream``; its record is committed)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest

from workbench.config import ConfigError
from workbench.upstream import command, tree

FAILING = "def test_it():\n    assert 1 == 2, 'the bug'\n"
PASSING = "def test_it():\n    assert True\n"


def finding(root: Path, fid: str, body: str) -> Path:
    d = root / fid
    d.mkdir(parents=True)
    (d / f"test_{fid.replace('-', '_')}.py").write_text(
        f"# Location in vLLM's tree: tests/v1/core/test_{fid.replace('-', '_')}.py\n{body}")
    return d


@pytest.fixture
def fake(tmp_path, monkeypatch):
    ups, tests_root = tmp_path / "upstream", tmp_path / "vllm-tree"
    (tests_root / "tests").mkdir(parents=True)
    monkeypatch.setattr(command, "FINDINGS", ups)
    monkeypatch.setattr(command, "PATCHES", tmp_path / "patches")
    monkeypatch.setattr(command.tree, "tests_tree", lambda rel: tests_root)
    return ups, tests_root


def test_a_test_that_fails_on_the_release_with_no_patch_is_the_expected_outcome(fake, tmp_path):
    ups, _ = fake
    finding(ups, "bug-a", FAILING)
    assert command.main(Namespace(out=str(tmp_path / "out"), only=None)) == 0
    (row,) = json.loads((tmp_path / "out" / "upstream.json").read_text())["findings"]
    assert (row["released"], row["patched"], row["expected"]) == ("fails", "no patch", True)
    assert row["test"] == "tests/v1/core/test_bug_a.py" and "the bug" in row["detail"]


def test_a_test_that_passes_on_the_release_is_unexpected(fake, tmp_path, capsys):
    ups, _ = fake
    finding(ups, "not-a-bug", PASSING)
    assert command.main(Namespace(out=str(tmp_path / "out"), only=None)) == 1
    assert "<-- unexpected" in capsys.readouterr().out


def test_a_test_that_fails_on_something_else_than_its_assertion_is_an_error(fake, tmp_path):
    """Failing for another reason (an import, a missing file) is no evidence of the bug."""
    ups, _ = fake
    finding(ups, "broken", "def test_it():\n    raise FileNotFoundError('/tmp/x')\n")
    assert command.main(Namespace(out=str(tmp_path / "out"), only=None)) == 1
    (row,) = json.loads((tmp_path / "out" / "upstream.json").read_text())["findings"]
    assert row["released"] == "error" and row["detail"].startswith("FileNotFoundError")


def test_an_unknown_finding_is_refused_by_name(fake):
    ups, _ = fake
    finding(ups, "bug-a", FAILING)
    with pytest.raises(ConfigError, match="no such upstream/ finding; allowed: bug-a"):
        command.findings("bug-b")


def test_a_test_without_its_location_line_is_refused(tmp_path):
    t = tmp_path / "test_x.py"
    t.write_text(PASSING)
    with pytest.raises(ValueError, match="Location in vLLM's tree"):
        tree.location(t)


def test_the_extracted_tree_is_reused_without_fetching_the_sdist(tmp_path, monkeypatch):
    root = tmp_path / "upstream" / "vllm-9.9.9"
    root.mkdir(parents=True)
    (root / ".extracted").write_text("vllm-9.9.9.tar.gz\n")

    def no_fetch(*a, **k):
        raise AssertionError("fetched again")

    monkeypatch.setattr(tree, "fetch_sdist", no_fetch)
    assert tree.tests_tree("9.9.9", cache=tmp_path) == root


def test_every_committed_upstream_test_names_its_place_and_cites_a_thread():
    for d in sorted(p for p in command.FINDINGS.iterdir() if p.is_dir()):
        (test,) = d.glob("test_*.py")
        assert tree.location(test).startswith("tests/v1/")
        issue = (d / "ISSUE.md").read_text()
        assert "#" in issue.split("## Related", 1)[1], d.name
        assert "/work/" not in issue and "workbench" not in issue.lower(), d.name


def test_the_docs_status_table_says_what_the_committed_run_measured():
    from workbench.paths import DATA, REPO

    doc = (REPO / "docs" / "upstream.md").read_text()
    table = doc.split("<!-- upstream:begin -->", 1)[1].split("<!-- upstream:end -->", 1)[0]
    rows = {cells[0].strip("` "): [c.strip("` ") for c in cells[1:4]]
            for line in table.strip().splitlines()[2:]
            for cells in [line.strip("|").split("|")]}
    run = json.loads((DATA / "upstream" / "upstream.json").read_text())
    assert rows == {f["id"]: [f["test"], f["released"], f["patched"]] for f in run["findings"]}
