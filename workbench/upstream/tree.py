"""vLLM's ``tests/`` tree of one release, from its source distribution, and a test placed in it."""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

from ..compat.test_script import fetch_sdist
from ..paths import REPO

CACHE = REPO / ".cache"
LOCATION = re.compile(r"^# Location in vLLM's tree: (tests/\S+\.py)\s*$", re.M)


def tests_tree(release: str, cache: Path = CACHE) -> Path:
    """``cache/upstream/vllm-<release>/`` holding the sdist's ``tests/`` (extracted once; the
    sdist itself is cached under ``cache/compat/``, as ``make compat`` keeps it)."""
    root = cache / "upstream" / f"vllm-{release}"
    done = root / ".extracted"
    if done.exists():
        return root
    sdist = fetch_sdist(release, cache / "compat")
    prefix = f"vllm-{release}/tests/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        # the "data" filter (no links out, no devices) where this Python has it
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(root.parent, members=members, **safe)
    done.write_text(sdist.name + "\n")
    return root


def location(test: Path) -> str:
    """Where ``test`` belongs in vLLM's tree: its ``# Location in vLLM's tree:`` line."""
    m = LOCATION.search(test.read_text())
    if m is None:
        raise ValueError(f"{test}: no '# Location in vLLM's tree: tests/...py' line")
    return m.group(1)


def place(test: Path, root: Path) -> Path:
    """Copy ``test`` to its location under ``root``; return that path."""
    dest = root / location(test)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(test.read_text())
    return dest
