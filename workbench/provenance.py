"""Where a result came from, and writing files so that no reader sees half of one.

A leaf module (the standard library and ``paths``): the plugin inside vLLM's processes writes
its state files with :func:`atomic_write_json` too.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .paths import REPO


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A unique temporary path beside ``path`` to write to; renamed over ``path`` when the
    block ends without an error (``os.replace`` is atomic on POSIX), removed otherwise.
    Readers see the old file or the new one, never a part, and two writers never share a
    temporary name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def portable_text(text: str, root: str | os.PathLike = REPO) -> str:
    """``text`` with the repository's absolute path (``root``) taken out: ``ROOT/x`` -> ``x``,
    ``ROOT`` alone -> ``.``; a record then reads the same in a clone anywhere. A session's
    temporary run directory (``workbench-*`` under the system's) reads ``RUN_DIR``."""
    root = re.escape(str(root).rstrip("/"))
    text = re.sub(root + "/", "", text)
    text = re.sub(root + r"(?![\w.-])", ".", text)
    return re.sub(re.escape(tempfile.gettempdir().rstrip("/")) + r"/workbench-[\w-]+",
                  "RUN_DIR", text)


def atomic_write_json(path: str | os.PathLike, data: Any, *, indent: int = 1,
                      sort_keys: bool = True, portable: bool = False) -> Path:
    """``portable``: a record (result, point, check), written with no path of this checkout."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=str)
    return atomic_write_text(path, (portable_text(text) if portable else text) + "\n")


def git_commit() -> str:
    """The repository's commit, with ``-dirty`` when tracked files have changed."""
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                             timeout=5)
        return out.stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")
