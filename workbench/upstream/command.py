"""The flags of ``python -m workbench upstream``, each finding's test on the release and on
its fix, and ``DIR/upstream.json``."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..config import ConfigError
from ..knobs import triton_cpu
from ..paths import DEFAULT_DRAFTER, DEFAULT_TARGET, REPO
from ..provenance import atomic_write_json
from . import tree

FINDINGS = REPO / "upstream"
PATCHES = REPO / "patches"
FAILS, PASSES, ERROR, NO_PATCH = "fails", "passes", "error", "no patch"
REMOVED = "code removed"  # the vLLM module the test imports is not in that release
# pytest: 0 every test passed, 1 some failed; anything else (collection, usage) is no answer
OUTCOME = {0: PASSES, 1: FAILS}
# A test fails for the finding's reason only on its assertion; any other exception is an error.
ASSERTED = ("AssertionError", "assert ")
# A later release that dropped the code under test (0.34.0 removed the V1 runner's EAGLE
# proposer with that runner) cannot collect the test: that is an answer, not an error.
GONE = re.compile(r"^ModuleNotFoundError: No module named 'vllm\.")


@dataclass
class Upstream:
    """One finding's test, as vLLM's CI would run it, on the release and on its fix."""

    id: str
    test: str  # its path in vLLM's tree
    vllm: str
    released: str  # fails (expected) / passes / error / code removed
    patched: str  # passes (expected) / fails / error / no patch
    seconds: float
    detail: str = ""  # the failing assertion's line, on the release

    @property
    def expected(self) -> bool:
        """What the finding says of the release it was measured on: the bug, and its fix."""
        return self.released == FAILS and self.patched in (PASSES, NO_PATCH)

    @property
    def answered(self) -> bool:
        """What another release can say: the bug is there, gone, or its code is; a fix that
        exists for that release fixes it."""
        return self.released != ERROR and self.patched in (PASSES, NO_PATCH)

    def met(self, installed: bool) -> bool:
        """The exit rule: ``expected`` on the installed release, ``answered`` on another."""
        return self.expected if installed else self.answered


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="directory for upstream.json")
    ap.add_argument("--only", help="comma-separated finding ids (default: every upstream/ dir)")
    ap.add_argument("--vllm", metavar="RELEASE",
                    help="run the tests on this release's tests/ tree and Python (default: the "
                         "installed one; another runs in its environment, .venvs/vllm-RELEASE, "
                         "built when missing: make release-env)")


def findings(only: str | None) -> list[Path]:
    have = sorted(p for p in FINDINGS.iterdir() if p.is_dir())
    if not only:
        return have
    want = [x.strip() for x in only.split(",") if x.strip()]
    unknown = sorted(set(want) - {p.name for p in have})
    if unknown:
        raise ConfigError(f"--only {unknown}: no such upstream/ finding; allowed: "
                          f"{', '.join(p.name for p in have)}")
    return [p for p in have if p.name in want]


@dataclass(frozen=True)
class Release:
    """The vLLM the tests run on: its version, its Python, and (another environment's) its
    ``site-packages``, where a dev build of it is made from."""

    version: str
    python: str
    site: Path | None = None

    @property
    def installed(self) -> bool:
        return self.site is None


def release_of(version: str | None) -> Release:
    """The installed release, or ``version``'s environment (built when missing)."""
    from ..knobs import release

    have = release.current().version
    if version is None or version == have:
        return Release(have, sys.executable)
    if not re.fullmatch(r"\d+\.\d+\.\d+", version):
        raise ConfigError(f"--vllm {version!r}: give a release X.Y.Z (installed: {have}; "
                          f"another runs in its environment, make release-env)")
    from ..releases import envs

    python = envs.env_python(version)
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    return Release(version, str(python), site)


def pytest(test: Path, root: Path, build: Path | None,
           rel: Release | None = None) -> tuple[str, str]:
    """Run one placed test from the tree's root (``tests`` importable; only the conftest files
    of the test's own directory, ``--confcutdir``: ``tests/conftest.py`` needs vLLM's test
    requirements, the helpers and their directory's fixtures do not) with ``rel``'s Python
    (default: this one); with ``build`` first on ``PYTHONPATH``; ``VLLM_TEST_MODEL`` and
    ``VLLM_TEST_EAGLE3_MODEL``: the shipped target and drafter, for a helper that reads a
    model's config (offline)."""
    python = rel.python if rel else sys.executable
    path = os.pathsep.join(str(p) for p in (build, root) if p)
    # a test whose helper reads a model's config takes it from here, not from the hub
    env = {"VLLM_TEST_MODEL": str(DEFAULT_TARGET), "VLLM_TEST_EAGLE3_MODEL": str(DEFAULT_DRAFTER),
           **os.environ, "PYTHONPATH": path}
    # vLLM's Triton kernels (the padded drafter path's) run under Triton's own interpreter on a
    # CPU, as Model Runner V2 does here (knobs/triton_cpu); no test without one is changed by it
    env.update(triton_cpu.server_env(env))
    place = test.relative_to(root)
    proc = subprocess.run([python, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           f"--confcutdir={place.parent}", str(place)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    said = next((ln[1:].strip() for ln in proc.stdout.splitlines() if ln.startswith("E   ")), "")
    outcome = OUTCOME.get(proc.returncode, ERROR)
    if GONE.match(said):
        return REMOVED, said
    if outcome == FAILS and not said.startswith(ASSERTED):  # failed, but not on its assertion
        outcome = ERROR
    return outcome, said


def patched(fid: str, rel: Release, test: Path, root: Path) -> str:
    patch = PATCHES / f"vllm-{rel.version}" / f"{fid}.patch"
    if not patch.exists():
        return NO_PATCH
    from .. import devbuild

    with tempfile.TemporaryDirectory(prefix="workbench-upstream-") as tmp:
        build = devbuild.make(Path(tmp) / "build", patches=[patch], site=rel.site)
        return pytest(test, root, build, rel)[0]


def one(d: Path, rel: Release, root: Path) -> Upstream:
    t0 = time.monotonic()
    test = next(d.glob("test_*.py"), None)
    if test is None:
        raise ConfigError(f"{d}: no test_*.py (each upstream/ finding has its vLLM-layout test)")
    placed = tree.place(test, root)
    released, said = pytest(placed, root, None, rel)
    fixed = NO_PATCH if released == REMOVED else patched(d.name, rel, placed, root)
    return Upstream(d.name, tree.location(test), rel.version, released, fixed,
                    round(time.monotonic() - t0, 1), said)


def table(rows: list[Upstream], installed: bool) -> str:
    head = f"{'finding':28} {'vLLM':8} {'released':12} {'patched':9} {'s':>5}  test"
    lines = [head, "-" * len(head)]
    for r in rows:
        mark = "" if r.met(installed) else "  <-- unexpected"
        lines.append(f"{r.id:28} {r.vllm:8} {r.released:12} {r.patched:9} {r.seconds:5.0f}  "
                     f"{r.test}{mark}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Exit 0 when every test fails on the installed release and passes with its fix (or has
    none); on another release (``--vllm``), when every test gave an answer there (fails,
    passes, or its code is removed) and every fix written for it passes."""
    dirs = findings(args.only)
    rel = release_of(args.vllm)
    root = tree.tests_tree(rel.version)
    rows = [one(d, rel, root) for d in dirs]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "upstream.json", {"vllm": rel.version, "findings": [
        {**asdict(r), "expected": r.expected} for r in rows]}, indent=1, portable=True)
    print(table(rows, rel.installed))
    return 0 if all(r.met(rel.installed) for r in rows) else 1
