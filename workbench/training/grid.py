"""Train several settings side by side, probe each offline, and pick one to ship.

    python -m workbench.training.grid --out grid-out [--tiny] [--stdlib-root DIR]

Why: on a GPU each run takes minutes, so a handful of settings run at once and the
choice is made by the quality bar's figures (``probe``, no vLLM) rather than by
hand.  Phase 1 trains the targets; phase 2 reuses a phase-1 target (a copy of its
finished checkpoint) for drafter or unlikelihood variants.  The tokenizer and token
ids come from ``--seed-work`` (the cache ``train`` already built), so every variant
shares them.  ``grid.json`` records every variant's command, its probe figures and
the pick.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .evaluate import BAR

BIG = ["--layers", "8", "--hidden", "256", "--inter", "704", "--heads", "4", "--seq", "512",
       "--batch", "32", "--drafter-steps", "1000"]
# name: (parent or None, extra train arguments)
GPU_GRID: dict[str, tuple[str | None, list[str]]] = {
    "d10": (None, BIG + ["--dropout", "0.1", "--target-steps", "1520"]),  # ~10 epochs
    "d20": (None, BIG + ["--dropout", "0.1", "--target-steps", "3040"]),  # ~20 epochs
    "n5": (None, BIG + ["--dropout", "0.0", "--target-steps", "760"]),  # ~5 epochs, no dropout
    "d10-aux148": ("d10", BIG + ["--dropout", "0.1", "--target-steps", "1520",
                                 "--aux-layers", "1,4,8"]),
    "d10-ul": ("d10", BIG + ["--dropout", "0.1", "--target-steps", "1520", "--ul-steps", "300"]),
    "d20-ul": ("d20", BIG + ["--dropout", "0.1", "--target-steps", "3040", "--ul-steps", "300"]),
    # second round: no dropout (n5 had the largest KV dependence) plus unlikelihood
    "n5-ul": ("n5", BIG + ["--dropout", "0.0", "--target-steps", "760", "--ul-steps", "300"]),
    "n5-ul600": ("n5", BIG + ["--dropout", "0.0", "--target-steps", "760", "--ul-steps", "600"]),
    "n8": (None, BIG + ["--dropout", "0.0", "--target-steps", "1216"]),
    "n8-ul": ("n8", BIG + ["--dropout", "0.0", "--target-steps", "1216", "--ul-steps", "300"]),
}
TINY_GRID = {
    "a": (None, ["--tiny", "--target-steps", "20", "--drafter-steps", "10"]),
    "a-ul": ("a", ["--tiny", "--target-steps", "20", "--drafter-steps", "10", "--ul-steps", "5"]),
}
SEED_FILES = ("corpus.json", "ids.npz", "tokenizer")
PARENT_FILES = ("target_final.pt",)
POLL_S = 2


def score(p: dict) -> tuple:
    """Order by bar checks passed (with a small margin), then by non-degeneracy."""
    pp = p["clean"]["per_pos"]
    checks = [
        BAR["acc_len"][0] + 0.1 <= p["clean"]["acceptance_length"] <= BAR["acc_len"][1] - 0.1,
        all(a > b for a, b in itertools.pairwise(pp)),
        pp[0] >= BAR["pos0_min"] + 0.05,
        pp[-1] <= (BAR["pos2_over_pos0_max"] - 0.05) * pp[0],
        p["distinct_median"] >= BAR["distinct_median_min"] + 0.03,
        p["max_token_share"] <= BAR["max_token_share_max"] - 0.03,
        p["kv_pos0_rel_drop"] >= BAR["kv_pos0_rel_drop_min"] + 0.05,
    ]
    return (sum(checks), p["distinct_median"], p["kv_pos0_rel_drop"])


def _seed(work: Path, src: Path, files) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for f in files:
        a, b = src / f, work / f
        if a.is_dir():
            shutil.copytree(a, b, dirs_exist_ok=True)
        elif a.exists():
            shutil.copy(a, b)


def select(grid: dict, variants: str | None) -> dict:
    """The ``--variants`` subset of ``grid`` (each listed with its parent), or all of it."""
    if not variants:
        return grid
    want = variants.split(",")
    bad = [n for n in want if n not in grid or (grid[n][0] and grid[n][0] not in want)]
    if bad:
        raise SystemExit(f"--variants: unknown, or parent not listed: {bad}; known: {list(grid)}")
    return {n: grid[n] for n in want}


class GridRun:
    """Every variant of a grid, each started once its parent has finished and probed as soon
    as it ends, so ``grid.json`` holds every finished result even if the run is cut short."""

    def __init__(self, args: argparse.Namespace, grid: dict):
        self.args, self.grid, self.out = args, grid, Path(args.out)
        self.t0 = time.time()
        self.record: dict = {"grid": {n: {"parent": p, "args": a} for n, (p, a) in grid.items()},
                             "variants": {}}
        self.pending, self.running = list(grid), {}
        self.done: set[str] = set()
        self.failed: set[str] = set()

    def log(self, msg: str) -> None:
        print(f"[{time.time() - self.t0:6.0f}s] {msg}", file=sys.stderr, flush=True)

    def save(self) -> None:
        ok = {n: v for n, v in self.record["variants"].items() if not v.get("failed")}
        self.record["ranked"] = sorted(ok, key=lambda n: tuple(ok[n]["score"]), reverse=True)
        self.record["wall_s"] = time.time() - self.t0
        (self.out / "grid.json").write_text(json.dumps(self.record, indent=1))

    def run(self) -> list[str]:
        self.out.mkdir(parents=True, exist_ok=True)
        while self.pending or self.running:
            self.start_ready()
            time.sleep(POLL_S)
            self.collect_finished()
        self.save()
        return self.record["ranked"]

    def start_ready(self) -> None:
        for name in list(self.pending):
            parent = self.grid[name][0]
            if parent in self.failed:
                self.pending.remove(name)
                self.failed.add(name)
                self.record["variants"][name] = {"failed": True, "why": f"parent {parent} failed"}
            elif parent is None or parent in self.done:
                self.pending.remove(name)
                if self.args.deadline and time.time() - self.t0 > self.args.deadline:
                    self.record["variants"][name] = {"failed": True,
                                                     "why": "not started: past --deadline"}
                else:
                    self.running[name] = self.launch(name)

    def launch(self, name: str) -> tuple[subprocess.Popen, list[str]]:
        parent, extra = self.grid[name]
        work = self.out / "work" / name
        _seed(work, Path(self.args.seed_work), SEED_FILES)
        if parent:
            _seed(work, self.out / "work" / parent, PARENT_FILES)
        cmd = [sys.executable, "-m", "workbench.training.train", "--out", str(self.out / name),
               "--work-dir", str(work), "--prompts-out", str(work / "prompts.jsonl"), *extra]
        if self.args.stdlib_root:
            cmd += ["--stdlib-root", self.args.stdlib_root]
        self.log(f"{name}: start: {' '.join(cmd)}")
        with (self.out / f"{name}.log").open("w") as err:  # the child keeps its own copy
            return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err), cmd

    def collect_finished(self) -> None:
        for name, (proc, cmd) in list(self.running.items()):
            if proc.poll() is None:
                continue
            del self.running[name]
            if proc.returncode != 0:
                self.failed.add(name)
                self.record["variants"][name] = {
                    "failed": True, "why": f"train exited {proc.returncode}", "cmd": cmd}
                self.log(f"{name}: train exited {proc.returncode} (see {name}.log)")
            else:
                self.done.add(name)
                self.record["variants"][name] = self.probe_variant(name, cmd)
            self.save()

    def probe_variant(self, name: str, cmd: list[str]) -> dict:
        from .probe import probe

        p = probe(str(self.out / name), n=self.args.prompts,
                  max_tokens=16 if self.args.tiny else 128)
        p["score"] = list(score(p))
        p["cmd"] = cmd
        info = json.loads((self.out / name / "training_info.json").read_text())
        p["train_info"] = {"target": info["target"], "drafter": info["drafter"]}
        self.log(f"{name}: distinct {p['distinct_median']:.3f}, share {p['max_token_share']:.3f}, "
                 "per-pos " + "/".join(f"{v:.3f}" for v in p["clean"]["per_pos"])
                 + f", kv drop {p['kv_pos0_rel_drop']:.3f}, "
                 f"held-out ppl {info['target']['heldout']['ppl']:.2f}")
        return p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="grid-out")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--seed-work", default="training-work",
                    help="work dir holding corpus.json, tokenizer/, ids.npz")
    ap.add_argument("--stdlib-root", default=None)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--variants", default=None,
                    help="comma-separated subset of the grid (parents included)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="start no variant after this many seconds")
    args = ap.parse_args(argv)
    grid = select(TINY_GRID if args.tiny else GPU_GRID, args.variants)
    run = GridRun(args, grid)
    ranked = run.run()
    run.log(f"ranked: {ranked}")
    return 0 if ranked else 1


if __name__ == "__main__":
    sys.exit(main())
