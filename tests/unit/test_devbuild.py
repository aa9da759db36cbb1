"""``python -m workbench devbuild``: the version it derives from the installed release, the
commit it records, and that a build which fails leaves nothing behind (real builds of the
installed vLLM into a temporary directory: links, seconds)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest
from vllm_edits import PATCHES

from workbench import cli, devbuild
from workbench.knobs import build
from workbench.knobs.source import DirSource

MISSING_TARGET = """\
diff --git a/vllm/no_such_module.py b/vllm/no_such_module.py
--- a/vllm/no_such_module.py
+++ b/vllm/no_such_module.py
@@ -1,2 +1,2 @@
 import os
-x = 1
+x = 2
"""


@pytest.mark.parametrize("release, dev", [
    ("0.32.0", "0.32.1.dev1+g0000000"),
    # the local part gives way to the commit but for cpu: vLLM tells a CPU build by its version
    ("0.32.0+cpu", "0.32.1.dev1+g0000000.cpu"),
    ("0.33.0", "0.33.1.dev1+g0000000"),
    ("1.0", "1.0.1.dev1+g0000000"),
    ("0.32.0.post1", "0.32.1.dev1+g0000000"),
    ("0.33.0rc1", "0.33.0rc2.dev1+g0000000"),
    ("0.32.1.dev4+gabc1234", "0.32.1.dev5+g0000000"),
])
def test_the_default_version_is_the_next_dev_version_of_the_release(release, dev):
    assert devbuild.next_dev_version(release) == dev


def test_a_derived_version_sorts_above_its_release_and_uses_its_entry():
    from packaging.version import Version

    from workbench.knobs import release

    dev = devbuild.next_dev_version("0.32.0")
    assert Version("0.32.0") < Version(dev) < Version("0.32.1")
    assert release.table_entry(dev) == ("0.32.0", "installed-source")


def test_an_unreadable_installed_version_asks_for_version():
    with pytest.raises(devbuild.DevBuildError, match="--version"):
        devbuild.next_dev_version("main")


def test_the_default_follows_the_installed_release():
    assert devbuild.default_version() == devbuild.next_dev_version(
        devbuild.installed()[1].version)


@pytest.mark.parametrize("version, commit", [
    ("0.32.1.dev1+g0000000", "0000000"),
    ("0.32.1.dev3+gdeadbeef1.d20260101", "deadbeef1"),  # setuptools-scm's dirty-tree form
    ("0.32.1", "unknown"),
    ("0.32.0+cpu", "unknown"),
    ("0.32.1+gnothex", "unknown"),
])
def test_the_commit_is_the_versions_own_or_unknown(version, commit):
    assert devbuild.commit_of(version) == commit


def test_a_build_whose_version_names_no_commit_records_unknown(tmp_path):
    out = devbuild.make(tmp_path / "dev", version="0.32.1")
    assert "commit_id = 'unknown'" in (out / "vllm/_version.py").read_text()
    assert build.check("0.32.1", DirSource(out, "dev")).commit == "unknown"
    (dist,) = metadata.distributions(path=[str(out)])
    assert dist.version == "0.32.1"


def test_a_patch_that_fails_half_way_leaves_nothing_behind(tmp_path):
    bad = tmp_path / "missing-target.patch"
    bad.write_text(MISSING_TARGET)
    pkg, _ = devbuild.installed()
    released = (pkg / "v1/core/sched/scheduler.py").read_text()
    out = tmp_path / "new" / "dev"  # both directories made by this build
    with pytest.raises(devbuild.DevBuildError, match="missing-target.patch"):
        devbuild.make(out, patches=[PATCHES / "padded-load-step.patch", bad])
    assert not (tmp_path / "new").exists() and tmp_path.exists()
    # the first patch went to a copy, now removed; the installed file is as released
    assert (pkg / "v1/core/sched/scheduler.py").read_text() == released


def test_the_subcommand_builds_the_derived_version(tmp_path, capsys):
    assert cli.main(["devbuild", "--out", str(tmp_path / "dev")]) == 0
    version = devbuild.default_version()
    assert f"vLLM {version} in {tmp_path / 'dev'}" in capsys.readouterr().out
    (dist,) = metadata.distributions(path=[str(tmp_path / "dev")])
    assert dist.version == version
    b = build.check(version, DirSource(tmp_path / "dev", "dev"))
    assert (b.version, b.commit, b.failures) == (version, "0000000", {})


def test_the_subcommand_says_why_a_build_failed_and_leaves_no_directory(tmp_path, capsys):
    bad = tmp_path / "missing-target.patch"
    bad.write_text(MISSING_TARGET)
    argv = ["devbuild", "--out", str(tmp_path / "dev"), "--patch", str(bad), "--version", "9.9"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "missing-target.patch does not apply" in err and "no_such_module.py" in err
    assert not (tmp_path / "dev").exists()


def test_an_existing_directory_is_refused_and_kept(tmp_path):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "mine").write_text("x")
    with pytest.raises(devbuild.DevBuildError, match="exists"):
        devbuild.make(tmp_path / "dev")
    assert (tmp_path / "dev" / "mine").read_text() == "x"


def test_the_module_stays_callable():
    p = subprocess.run([sys.executable, "-m", "workbench.devbuild", "--help"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--version" in p.stdout and "next dev version" in p.stdout


def test_a_dev_build_says_which_patches_it_carries(tmp_path):
    """The dist-info of a dev build names its patches (a release's names none), so every
    result made on it records them (``vllm_build.patches``) and the fuzzer's attribution lets
    no patched finding explain a difference there."""
    import json
    import os
    import subprocess
    import sys

    from workbench.knobs import release

    out = devbuild.make(tmp_path / "dev", patches=[PATCHES / "padded-load-step.patch"])
    (dist,) = metadata.distributions(path=[str(out)])
    assert json.loads(dist.read_text(release.DEVBUILD_RECORD)) == {
        "patches": ["padded-load-step.patch"]}
    assert release.devbuild_patches() == []  # the installed release carries none
    got = subprocess.run([sys.executable, "-c", "from workbench.knobs import release; "
                          "print(release.devbuild_patches())"], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(out)})
    assert got.stdout.strip() == "['padded-load-step.patch']"


def test_a_build_from_another_environment_without_record_keeps_its_metadata(tmp_path):
    """An assembled release's environment has no RECORD: the dist-info is copied from its
    directory, so the build has a version (vLLM picks its platform by it) and keeps ``cpu``."""
    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm" / "_version.py").write_text("__version__ = '9.9.9+cpu'\n")
    info = site / "vllm-9.9.9+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9+cpu\n")
    (info / "top_level.txt").write_text("vllm\n")
    out = devbuild.make(tmp_path / "build", site=site, commit="unknown")
    (built,) = out.glob("vllm-*.dist-info")
    assert built.name == "vllm-9.9.10.dev1+g0000000.cpu.dist-info"
    assert "Version: 9.9.10.dev1+g0000000.cpu" in (built / "METADATA").read_text()
    assert (built / "top_level.txt").is_file() and (out / "vllm" / "__init__.py").is_file()
