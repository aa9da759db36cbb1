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
    assert command.main(Namespace(out=str(tmp_path / "out"), only=None, vllm=None)) == 0
    (row,) = json.loads((tmp_path / "out" / "upstream.json").read_text())["findings"]
    assert (row["released"], row["patched"], row["expected"]) == ("fails", "no patch", True)
    assert row["test"] == "tests/v1/core/test_bug_a.py" and "the bug" in row["detail"]


def test_a_test_that_passes_on_the_release_is_unexpected(fake, tmp_path, capsys):
    ups, _ = fake
    finding(ups, "not-a-bug", PASSING)
    assert command.main(Namespace(out=str(tmp_path / "out"), only=None, vllm=None)) == 1
    assert "<-- unexpected" in capsys.readouterr().out


def test_a_test_that_fails_on_something_else_than_its_assertion_is_an_error(fake, tmp_path):
    """Failing for another reason (an import, a missing file) is no evidence of the bug."""
    ups, _ = fake
    finding(ups, "broken", "def test_it():\n    raise FileNotFoundError('/tmp/x')\n")
    assert command.main(Namespace(out=str(tmp_path / "out"), only=None, vllm=None)) == 1
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
    rows = {cells[0].strip("` "): [c.strip("` ") for c in cells[1:6]]
            for line in table.strip().splitlines()[2:]
            for cells in [line.strip("|").split("|")]}
    run = json.loads((DATA / "upstream" / "upstream.json").read_text())
    later = {f["id"]: f for f in json.loads(
        (DATA / "upstream" / "0.34.0" / "upstream.json").read_text())["findings"]}
    assert rows == {f["id"]: [f["test"], f["released"], f["patched"],
                              later[f["id"]]["released"], later[f["id"]]["patched"]]
                    for f in run["findings"]}


# how an ISSUE.md's "Versions and runner" says what its test did on 0.34.0
SAYS = {"fails": "this test **fails**", "passes": "this test **passes**",
        "code removed": "this test **cannot run**"}


def test_each_issue_says_what_its_test_did_on_0_34_0():
    from workbench.paths import DATA

    run = json.loads((DATA / "upstream" / "0.34.0" / "upstream.json").read_text())
    for f in run["findings"]:
        issue = (command.FINDINGS / f["id"] / "ISSUE.md").read_text()
        versions = " ".join(issue.split("## Versions", 1)[1].split("\n## ", 1)[0].split())
        assert SAYS[f["released"]] in versions, f["id"]
        assert ("it **passes** with the fix" in versions) == (f["patched"] == "passes"), f["id"]


GONE = "def test_it():\n    import vllm.no_such_module_here  # noqa: F401\n"


def test_a_test_whose_vllm_module_is_gone_says_code_removed_and_builds_no_fix(fake, tmp_path,
                                                                              monkeypatch):
    """A later release that dropped the code under test answers "code removed", not error;
    no dev build is made for it (a fix of removed code has nothing to patch)."""
    ups, _ = fake
    finding(ups, "gone", GONE)
    patches = tmp_path / "patches" / "vllm-9.9.9"
    patches.mkdir(parents=True)
    (patches / "gone.patch").write_text("+++ b/vllm/x.py\n")
    monkeypatch.setattr(command, "patched", lambda *a: pytest.fail("built a fix"))
    rel = command.Release("9.9.9", command.sys.executable, tmp_path)
    row = command.one(ups / "gone", rel, command.tree.tests_tree(rel.version))
    assert (row.released, row.patched) == ("code removed", "no patch")
    assert row.detail == "ModuleNotFoundError: No module named 'vllm.no_such_module_here'"
    assert row.answered and not row.expected


@pytest.mark.parametrize("released, patched, answered", [
    ("fails", "passes", True), ("passes", "no patch", True), ("code removed", "no patch", True),
    ("error", "no patch", False), ("fails", "fails", False), ("fails", "error", False)])
def test_another_release_is_answered_when_each_test_says_something_and_each_fix_holds(
        released, patched, answered):
    row = command.Upstream("x", "tests/v1/t.py", "9.9.9", released, patched, 1.0)
    assert row.answered is answered
    assert row.expected is (released == "fails" and answered)


def test_a_release_that_is_not_x_y_z_is_refused_naming_what_is_allowed():
    with pytest.raises(ConfigError, match=r"--vllm 'latest': give a release X\.Y\.Z"):
        command.release_of("latest")


def test_the_installed_release_is_the_default_and_runs_on_this_python():
    from workbench.knobs import release

    rel = command.release_of(None)
    assert (rel.version, rel.python, rel.installed) == (
        release.current().version, command.sys.executable, True)
