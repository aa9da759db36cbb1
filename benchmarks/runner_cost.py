"""What Model Runner V2 costs on the CPU against the V1 runner, side by side in one run.

    .venv/bin/python benchmarks/runner_cost.py [--prompts 64] [--repeats 1] [--no-docs]

For each variant (``v1``; ``v2``, every kernel in Triton's interpreter; ``v2+standins``, the
hottest kernels on their stand-ins, ``knobs/triton_cpu/standins.py``), one after the other
(``--repeats`` alternates them again), on fresh servers:

* start: P, D and the baseline from nothing to healthy;
* run: ``--prompts`` in-domain prompts, 32 in flight, baseline and PD (the default sweep's
  shape), wall time;
* PD phase: the same run again with its baseline cached, so its busy time is P and D alone,
  and each role's interpreted Triton kernels over it (``knobs/triton_cpu/profile.py``:
  launches and seconds per kernel, summed in each server process, stand-in launches included);
* step: 4 prompts one at a time; D's seconds per verify step (its leg's time over its drafts).

Prints a line per measurement, the medians and each v2 variant's ratio to v1; writes
``data/runners/cost.json``, ``data/runners/cost.png``, the table between the markers in
docs/performance.md and the ratio line between the README's (``--no-docs``: none of them;
``--docs-only``: the figure and the pages again from the committed ``cost.json``,
running nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import doc_tables  # a sibling script

from workbench import paths
from workbench.config import ExperimentConfig
from workbench.experiment import Session
from workbench.inputs import profiles
from workbench.knobs.triton_cpu import profile as triton_profile
from workbench.knobs.triton_cpu import standins
from workbench.provenance import atomic_write_json

OUT = paths.REPO / "data" / "runners"
DOC = paths.REPO / "docs" / "performance.md"
README = paths.REPO / "README.md"
MARKERS = "runner-cost"  # <!-- runner-cost:begin/end --> in docs/performance.md and README
VARIANTS = {"v1": ("v1", "off"), "v2": ("v2", "off"), "v2+standins": ("v2", "on")}


def measure(variant: str, prompts: int) -> dict:
    """One fresh start of the three servers for ``variant`` and the three measurements."""
    runner, mode = VARIANTS[variant]
    prof_dir = Path(tempfile.mkdtemp(prefix="workbench-triton-profile-"))
    cpu = profiles.PROFILES["cpu"]
    profiles.PROFILES["cpu"] = replace(cpu, server_env={
        **cpu.server_env, triton_profile.ENV: str(prof_dir), standins.ENV: mode})
    cfg = ExperimentConfig(num_prompts=prompts, knobs={"runner": runner})
    try:
        with Session(baseline_cache=prof_dir / "baselines") as s:
            t = time.monotonic()
            s.ensure(cfg)
            out = {"start_s": time.monotonic() - t}
            out["run_s"] = s.run(cfg).wall_seconds
            before = _settled(prof_dir)
            pd_run = s.run(cfg)
            out["pd_phase_s"] = pd_run.engine_seconds
            out["kernels"] = _delta(_settled(prof_dir), before)
            out["step_s"] = step_seconds(s.run(replace(cfg, num_prompts=4, concurrency=1)))
            out["agreement"] = pd_run.token_agreement
            out["runner_read_back"] = pd_run.runner
    finally:
        profiles.PROFILES["cpu"] = cpu
    return out


def _settled(prof_dir: Path) -> dict:
    time.sleep(2.5)  # the profile files are written every second
    return triton_profile.read(prof_dir)


def _delta(after: dict, before: dict) -> dict:
    return {role: {k: {key: n - before.get(role, {}).get(k, {}).get(key, 0)
                       for key, n in v.items()} for k, v in kernels.items()}
            for role, kernels in after.items()}


def step_seconds(result) -> float:
    """D's leg time over its verify steps, one request at a time."""
    rows = result.requests
    return sum(r["d_seconds"] for r in rows) / sum(r["pd"]["num_drafts"] for r in rows)


def interpreted_share(m: dict, role: str) -> float:
    return sum(k["seconds"] for k in m["kernels"].get(role, {}).values()) / m["pd_phase_s"]


def summary(rows: dict[str, list[dict]]) -> dict:
    keys = ("start_s", "run_s", "pd_phase_s", "step_s")
    med = {r: {k: statistics.median(m[k] for m in rows[r]) for k in keys} for r in rows}
    for r in rows:
        med[r]["d_interpreted_share"] = statistics.median(
            interpreted_share(m, "d") for m in rows[r])
    return {"median": med, "repeats": len(rows["v1"]),
            **{f"ratio_{v.replace('+', '_')}_over_v1": {
                k: med[v][k] / med["v1"][k] for k in keys} for v in rows if v != "v1"},
            **{f"d_kernels_{v.replace('+', '_')}": top_kernels(rows[v][-1])
               for v in rows if v != "v1"}}


def top_kernels(m: dict) -> list[dict]:
    top = sorted(m["kernels"].get("d", {}).items(), key=lambda kv: -kv[1]["seconds"])
    return [{"kernel": k, **v, "share_of_pd_phase": v["seconds"] / m["pd_phase_s"]}
            for k, v in top]


def figure(s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    keys = ("start_s", "run_s", "pd_phase_s")
    width = 0.8 / len(VARIANTS)
    colour = {v: f"C{i}" for i, v in enumerate(VARIANTS)}
    for i, v in enumerate(VARIANTS):
        a.bar([j + width * i for j in range(len(keys))], [s["median"][v][k] for k in keys],
              width, label=v, color=colour[v])
    a.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))],
                 ["server start", "64-prompt run", "PD phase"])
    a.set_ylabel("seconds (median)")
    a.legend(title="runner")
    a.set_title("V1 runner and Model Runner V2 on the CPU")
    names = [t["kernel"] for t in s["d_kernels_v2"][:10]][::-1]
    for i, v in enumerate(v for v in VARIANTS if v != "v1"):
        top = {t["kernel"]: t for t in s[f"d_kernels_{v.replace('+', '_')}"]}
        b.barh([j + 0.4 * i for j in range(len(names))],
               [top.get(n, {}).get("share_of_pd_phase", 0.0) for n in names], 0.4, label=v,
               color=colour[v])
    b.set_yticks([j + 0.2 for j in range(len(names))], [n.split(":")[-1] for n in names])
    b.set_xlabel("share of each variant's own PD phase in D's worker")
    b.set_title("MRV2: D's ten costliest Triton kernels")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


ROWS = (("server start (P, D, baseline)", "start_s"), ("64-prompt run", "run_s"),
        ("PD phase (baseline cached)", "pd_phase_s"), ("D, one verify step", "step_s"))


def table(s: dict) -> str:
    m, q, r = s["median"], s["ratio_v2_over_v1"], s["ratio_v2_standins_over_v1"]
    lines = ["| | v1 | v2 | v2 + stand-ins | v2 / v1 | v2 + stand-ins / v1 |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {m['v1'][k]:.3g} s | {m['v2'][k]:.3g} s | "
              f"{m['v2+standins'][k]:.3g} s | {q[k]:.2f} | {r[k]:.2f} |" for name, k in ROWS]
    lines.append(f"| D's worker in Triton launches | {m['v1']['d_interpreted_share']:.0%} | "
                 f"{m['v2']['d_interpreted_share']:.0%} | "
                 f"{m['v2+standins']['d_interpreted_share']:.0%} | | |")
    return "\n".join([*lines, "", f"Medians of {s['repeats']} start(s) per variant, one "
                      f"after the other in one run. {_kernels_line(s)}"])


def _kernels_line(s: dict) -> str:
    def top(key: str) -> str:
        return ", ".join(f"`{t['kernel'].split(':')[-1]}` {t['share_of_pd_phase']:.0%}"
                         for t in s[key][:5])

    covered = [t for t in s["d_kernels_v2_standins"] if t.get("standin")]
    return (f"D's costliest kernels as shares of the PD phase, interpreted: {top('d_kernels_v2')}; "
            f"with the stand-ins: {top('d_kernels_v2_standins')}. On stand-ins: "
            + ", ".join(f"`{t['kernel'].split(':')[-1]}` ({t['standin']} of {t['launches']} "
                        "launches)" for t in covered) + ".")


def readme_line(s: dict) -> str:
    q, r = s["ratio_v2_over_v1"], s["ratio_v2_standins_over_v1"]
    return (f"On the CPU, `runner=v2` took {r['run_s']:.1f}x the V1 runner's time for a "
            f"64-prompt run with the kernel stand-ins ({q['run_s']:.1f}x with every kernel "
            f"interpreted) and {r['step_s']:.1f}x for one decode step on D "
            f"(`benchmarks/runner_cost.py`), so `v1` stays the CPU's default.")


def write_between(path: Path, text: str) -> None:
    doc_tables.write_block(path, MARKERS, text)


def write_docs(s: dict) -> None:
    write_between(DOC, table(s))
    write_between(README, readme_line(s))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--docs-only", action="store_true")
    args = ap.parse_args()
    if args.docs_only:
        summary_ = json.loads((OUT / "cost.json").read_text())["summary"]
        figure(summary_, OUT / "cost.png")
        write_docs(summary_)
        return
    rows: dict[str, list[dict]] = {r: [] for r in VARIANTS}
    for i in range(args.repeats):
        for r in VARIANTS:
            m = measure(r, args.prompts)
            rows[r].append(m)
            print(f"{r} #{i}: start {m['start_s']:.1f} s, run {m['run_s']:.1f} s, PD phase "
                  f"{m['pd_phase_s']:.1f} s, D step {m['step_s'] * 1e3:.1f} ms, D interpreted "
                  f"{interpreted_share(m, 'd'):.0%}, agreement {m['agreement']}, runner "
                  f"{m['runner_read_back']}", flush=True)
    s = summary(rows)
    print(table(s))
    if not args.no_docs:
        OUT.mkdir(parents=True, exist_ok=True)
        atomic_write_json(OUT / "cost.json", {"summary": s, "runs": rows}, indent=1)
        figure(s, OUT / "cost.png")
        write_docs(s)
        print(f"wrote {OUT / 'cost.json'}, {OUT / 'cost.png'}, {DOC} and {README}")


if __name__ == "__main__":
    main()
