"""How long the CLI takes to answer: ``--help``, ``run --help`` and a refused bad flag, the
median of 5 fresh processes each, for this checkout and, side by side, an older one.

    git worktree add /tmp/wb-old <commit before the change>    # once
    .venv/bin/python benchmarks/cli_time.py --old /tmp/wb-old

What a user waits for is a whole ``python -m workbench`` process (interpreter start and the
imports included), so each run is one. PYTHONPATH points at the tree measured, so its package
is the one imported (it comes before the editable install's finder). The two trees' runs
alternate, so a machine busy with something else slows both alike; the load average is
printed beside the figures. Both trees get the same model directories (this checkout's), so
the refusal is the same one: ``--k-d 0``, refused by the config's validation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "data" / "models"


def commands(out: str) -> list[tuple[str, list[str], int]]:
    """(label, argv after ``python -m workbench``, the exit code expected)."""
    pair = ["--target", str(MODELS / "target"), "--drafter", str(MODELS / "drafter")]
    return [("--help", ["--help"], 0),
            ("run --help", ["run", "--help"], 0),
            ("run --k-d 0 (refused)", ["run", "--out", out, *pair, "--k-d", "0"], 2)]


def once(tree: Path, argv: list[str], want_rc: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "workbench", *argv], env=env, cwd=tree,
                          capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode != want_rc:
        raise SystemExit(f"{tree}: {' '.join(argv)} exited {proc.returncode}, not {want_rc}:\n"
                         f"{proc.stderr[-2000:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="another checkout of the repository to compare with")
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    trees = {"this tree": REPO}
    if args.old:
        trees["old tree"] = Path(args.old).resolve()
    out = str(Path(tempfile.mkdtemp(prefix="cli-time-")) / "out")
    load_before = os.getloadavg()[0]
    rows = []
    for label, argv, rc in commands(out):
        times: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.runs):
            for name, tree in trees.items():  # alternate: a busy spell slows both
                times[name].append(once(tree, argv, rc))
        rows.append((label, {n: statistics.median(t) for n, t in times.items()}))
    print(f"python -m workbench, median of {args.runs} runs (s); load average "
          f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs")
    print(f"{'':<24}" + "".join(f"{name:>12}" for name in trees))
    for label, med in rows:
        print(f"{label:<24}" + "".join(f"{med[name]:>12.2f}" for name in trees))


if __name__ == "__main__":
    main()
