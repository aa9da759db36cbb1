"""The legacy block hand-off by model runner: what never-written KV blocks hold after each
runner's own start-up, and how far D's acceptance drops on each.

vLLM's NIXL PD + spec-decode acceptance test failed only under Model Runner V2, and the
explanation given upstream was that the lookahead cache-trimming bug corrupted KV under both
runners, but the V1 runner's affected blocks were fresh zeros while MRV2 "runs a warmup at
startup which uses some kv blocks". This measures that on the CPU, per runner and prompt set:

* fresh servers (each point starts its own, so no earlier request wrote a block);
* ``block_handoff=legacy``, ``blocks=dirty`` with ``dirty_source=warmup``: nothing is written,
  the blocks keep what start-up left, and each worker records, when the run's knob version
  arrives and before its first request, what blocks 1..128 hold (the ids a fresh engine hands
  out first; ``knobs/blocks.observe``);
* the KV probe: which requests' KV on D differs from P's and the baseline's, and by how much.

    python scripts/runner_handoff.py [--prompts 32] [--out data/runners/handoff]

Writes one ``result.json`` per point under ``--out`` (a complete one is kept: delete it to
measure again), ``summary.csv``, ``handoff.png`` and the table between the markers in
docs/findings.md. Servers start one point at a time: run it alone on the machine.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from workbench import paths
from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.measuring.results import Result

RUNNERS = ("v1", "v2")
PROMPT_SETS = ("lastblock", "badcase")
KNOBS = {"block_handoff": "legacy", "blocks": "dirty", "dirty_source": "warmup"}
DOC = paths.REPO / "docs" / "findings.md"
BEGIN, END = "<!-- runner-handoff:begin -->", "<!-- runner-handoff:end -->"


def point(out: Path, runner: str, prompt_set: str, prompts: int) -> Result:
    path = out / f"{runner}-{prompt_set}"
    if (path / "result.json").is_file():
        r = Result.load(path)
        if r.complete:
            return r
    cfg = ExperimentConfig(num_prompts=prompts, prompt_set=prompt_set, kv_probe=True,
                           knobs={"runner": runner, **KNOBS}, label=f"{runner}, {prompt_set}")
    with Session(out / "logs" / f"{runner}-{prompt_set}") as s:
        r = s.run(cfg)
    r.save(path)
    return r


def start_blocks(r: Result) -> dict[str, dict]:
    """Per role, what the worker saw in blocks 1..128 before the run's first request."""
    out = {}
    for role, detail in (r.knobs.get("detail") or {}).items():
        w = (detail or {}).get("components", {}).get("worker")
        for st in w if isinstance(w, list) else [w]:
            fill = ((st or {}).get("events") or {}).get("blocks", {}).get("fill")
            if fill:
                out[role] = fill
    return out


def row(runner: str, prompt_set: str, r: Result) -> dict:
    seen = start_blocks(r)
    kv = r.kv_probe_summary or {}
    drop = [d - b for d, b in zip(r.pd["per_position"], r.baseline["per_position"],
                                  strict=True)]
    affected = [q for q in r.requests if q.get("affected")]
    return {
        "runner": runner, "prompt_set": prompt_set, "read_back": ",".join(
            sorted(set((r.runner or {}).values()))),
        "p_blocks_nonzero_at_start": seen.get("p", {}).get("nonzero_fraction"),
        "d_blocks_nonzero_at_start": seen.get("d", {}).get("nonzero_fraction"),
        "requests": len(r.requests), "affected": len(affected),
        "token_agreement": r.token_agreement,
        **{f"d_minus_baseline_pos{i}": v for i, v in enumerate(drop)},
        "target_kv_differs_vs_baseline": _share(kv, "target"),
        "drafter_kv_differs_vs_baseline": _share(kv, "drafter"),
        "max_abs_kv_diff": max((q.get("kv_probe", {}).get("vs_baseline", {}).get(
            "max_abs_diff") or 0.0 for q in affected), default=None),
    }


def _share(kv: dict, group: str) -> float | None:
    a = ((kv.get(group) or {}).get("vs_baseline") or {}).get("affected") or {}
    return a.get("share")


def figure(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PROMPT_SETS), figsize=(11, 4), sharey=True)
    for ax, ps in zip(axes, PROMPT_SETS, strict=True):
        for i, runner in enumerate(RUNNERS):
            r = next(x for x in rows if x["runner"] == runner and x["prompt_set"] == ps)
            vals = [r[f"d_minus_baseline_pos{p}"] for p in range(3)]
            ax.bar([p + 0.4 * i for p in range(3)], vals, 0.4,
                   label=f"{runner}: blocks at start {r['p_blocks_nonzero_at_start']:.0%} "
                   f"non-zero on P; agreement {r['token_agreement']:.2f}")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks([p + 0.2 for p in range(3)], [f"position {p}" for p in range(3)])
        ax.set_title(f"legacy hand-off, {ps} prompts")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("D - baseline, per-position rate")
    fig.suptitle("The legacy hand-off on the V1 runner and Model Runner V2 (CPU, fresh servers)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(rows: list[dict]) -> str:
    head = ("| runner | prompts | blocks 1..128 non-zero at start (P / D) | token agreement | "
            "D - baseline, pos 0 / 1 / 2 | affected requests whose target / drafter KV "
            "differs from the baseline's |")
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        drop = " / ".join(f"{r[f'd_minus_baseline_pos{i}']:+.3f}" for i in range(3))
        lines.append(
            f"| {r['runner']} | {r['prompt_set']} ({r['affected']} of {r['requests']} "
            f"affected) | {r['p_blocks_nonzero_at_start']:.1%} / "
            f"{r['d_blocks_nonzero_at_start']:.1%} | {r['token_agreement']:.3f} | {drop} | "
            f"{_pct(r['target_kv_differs_vs_baseline'])} / "
            f"{_pct(r['drafter_kv_differs_vs_baseline'])} |")
    return "\n".join(lines)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0%}"


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN, 1)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{rest.split(END, 1)[1]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--out", default=str(paths.REPO / "data" / "runners" / "handoff"))
    args = ap.parse_args()
    out = Path(args.out)
    rows = []
    for runner in RUNNERS:
        for ps in PROMPT_SETS:
            rows.append(row(runner, ps, point(out, runner, ps, args.prompts)))
            print(json.dumps(rows[-1]), flush=True)
    with (out / "summary.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    figure(rows, out / "handoff.png")
    print(table(rows))
    write_doc(table(rows))
    print(f"wrote {out / 'summary.csv'}, {out / 'handoff.png'} and {DOC}")


if __name__ == "__main__":
    main()
