"""Live runs, checks, tables and figures for the two chunked-prefill findings.

``chunked-prefill-drafter-kv``: the EAGLE3 drafter's KV at the last position of every
non-final prefill chunk (vLLM's padded drafter batch gives a partial prefill the prompt's last
token as its "next" token). ``host-buffer-chunk-boundary``: with a host staging buffer, P
copies each block to the host once, in the step that allocated it, so the slots a later chunk
writes into that block never reach D.

    python scripts/chunked_findings.py run --out DIR --points NAME,... [--prompts N]
    python scripts/chunked_findings.py check --runs DIR            # positions, per request
    python scripts/chunked_findings.py table --runs DIR --reference NAME --out FILE.csv
    python scripts/chunked_findings.py figures --runs DIR --out DIR [--points NAME,...]

``run`` starts the servers once (``experiment.Session``; a role restarts only when its own
shape changes) and runs the named points in the order given, each into ``DIR/NAME``; a point
whose ``result.json`` is complete is skipped. Wrap it in ``flock /tmp/wb-live.lock``.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import sys
from pathlib import Path
from typing import Any

import numpy as np

from workbench.config import ExperimentConfig
from workbench.measuring import stats
from workbench.measuring.results import Result

# name -> ExperimentConfig overrides (every point: 64 tokens, greedy, the CPU profile).
F1 = "indomain"
POINTS: dict[str, dict[str, Any]] = {}
for _c in (1, 32):
    POINTS[f"unchunked-c{_c}"] = {"concurrency": _c}
    for _b in (32, 64, 128, 256):
        POINTS[f"p{_b}-padded-c{_c}"] = {"concurrency": _c, "max_num_batched_tokens": {"p": _b}}
        POINTS[f"p{_b}-unpadded-c{_c}"] = {"concurrency": _c, "padded_drafter_batch": False,
                                           "max_num_batched_tokens": {"p": _b}}
    POINTS[f"unchunked-unpadded-c{_c}"] = {"concurrency": _c, "padded_drafter_batch": False}
    # every server chunked, the baseline too: D (= P) against a chunked baseline
    POINTS[f"all64-padded-c{_c}"] = {"concurrency": _c, "max_num_batched_tokens": 64}
    POINTS[f"all64-unpadded-c{_c}"] = {"concurrency": _c, "max_num_batched_tokens": 64,
                                       "padded_drafter_batch": False}
# host-buffer-chunk-boundary: transfer=host-staged, P's budget puts chunk boundaries inside
# blocks (40, 48, 80, 100) or on block multiples (32, 64, 128); block size 32.
for _c in (1, 32):
    POINTS[f"hs-unchunked-c{_c}"] = {"concurrency": _c, "knobs": {"transfer": "host-staged"}}
    for _b in (32, 40, 48, 64, 80, 100, 128):
        POINTS[f"hs-p{_b}-c{_c}"] = {"concurrency": _c, "knobs": {"transfer": "host-staged"},
                                     "max_num_batched_tokens": {"p": _b}}
        # P's lookahead off: a step allocates only the blocks its own chunk writes into
        POINTS[f"hs-p{_b}-la0-c{_c}"] = {
            "concurrency": _c, "knobs": {"transfer": "host-staged", "prefill_lookahead": "0"},
            "max_num_batched_tokens": {"p": _b}}


def config(name: str, prompts: int, probe: bool) -> ExperimentConfig:
    over = dict(POINTS[name])
    knobs = over.pop("knobs", {})
    cfg = ExperimentConfig(num_prompts=prompts, prompt_set=F1, kv_probe=probe, label=name,
                           **over)
    cfg.knobs.update(knobs)
    cfg.validate()
    return cfg


def cmd_run(a: argparse.Namespace) -> None:
    from workbench.experiment import Session

    out = Path(a.out)
    names = a.points.split(",")
    unknown = [n for n in names if n not in POINTS]
    if unknown:
        sys.exit(f"unknown points {unknown}; known: {', '.join(POINTS)}")
    command = shlex.join([sys.executable, *sys.argv])
    with Session() as s:
        for name in names:
            done = out / name / "result.json"
            if done.exists() and Result.load(done).complete:
                print(f"{name}: done before, skipped", flush=True)
                continue
            cfg = config(name, a.prompts, not a.no_probe)
            r = s.run(cfg, command=command, out_dir=out / name)
            print(f"{name}: {r.wall_seconds:.1f} s, agreement {r.token_agreement}, "
                  f"pd {fmt(r.pd)}, baseline {fmt(r.baseline)}", flush=True)


def fmt(side: dict | None) -> str:
    if not side:
        return "-"
    return "/".join(f"{x:.3f}" for x in side["per_position"]) + \
        f" AL {side['acceptance_length']:.3f}"


# --- where D's KV should differ ---------------------------------------------------------
def chunk_ends(chunks: list[int] | None) -> list[int]:
    """The last position of every non-final chunk."""
    return list(np.cumsum(chunks)[:-1] - 1) if chunks else []


def expected_drafter(pr: dict, padded: bool, ref: str, ids: list[int]) -> set[int]:
    """Finding 1: D (holding P's KV) against ``ref``, drafter layer: with the padded drafter
    batch, the last position c - 1 of each non-final chunk of P's prefill or of the
    reference's, where only one of the two ended a chunk (the same wrong token is written at a
    shared one), and where the prompt's last token (what vLLM writes there) is not token c
    (what an unchunked prefill writes there)."""
    if not padded or ref == "vs_p":
        return set()
    ends = set(chunk_ends(pr["prefill_chunks"].get("p")))
    ends ^= set(chunk_ends(pr["prefill_chunks"].get("baseline")))
    return {int(e) for e in ends if ids[e + 1] != ids[-1]}


def expected_host_buffer(pr: dict, bs: int, lookahead: int) -> set[int]:
    """Finding 2: the positions written into a block in a step after the one that allocated
    it (``workbench.findings.host_buffer_chunk_boundary.lost_positions``); every layer."""
    from workbench.findings.host_buffer_chunk_boundary import lost_positions

    return lost_positions(pr["prefill_chunks"].get("p"), pr["positions_compared"], bs,
                          lookahead)


def kv_ranges(pos: set[int]) -> list[list[int]]:
    from workbench.measuring.kv_compare import ranges

    return ranges(sorted(int(p) for p in pos))


def observed(cmp: dict) -> dict[str, set[int]]:
    """Each layer's differing positions, from the probe's inclusive runs (``kv_compare.expand``,
    the one place that undoes ``kv_compare.ranges``)."""
    from workbench.measuring.kv_compare import expand

    return {layer: set(expand(runs)) for layer, runs in cmp["positions_differing"].items()}


def prompt_ids(cfg: dict) -> dict[str, list[int]]:
    """The run's prompts' token ids by request id (prompts.build, from its cache)."""
    from workbench.inputs import prompts

    ps = prompts.build(cfg["prompt_set"], cfg["num_prompts"], cfg["target"], seed=cfg["seed"],
                       block_size=cfg["block_size"], prompt_file=cfg.get("prompt_file"),
                       double_bos=cfg["knobs"].get("double_bos") == "on")
    return {p.id: list(p.token_ids) for p in ps}


def check_run(r: Result, fixed: set[str] = frozenset()) -> dict[str, Any]:
    """Each probed request's differing positions against the prediction; ``fixed``: the
    findings the build under test carries a fix for (their positions are then predicted
    equal)."""
    cfg = r.config
    padded = cfg.get("padded_drafter_batch", True) and "chunked-prefill-drafter-kv" not in fixed
    staged = cfg["knobs"].get("transfer") == "host-staged" and \
        "host-buffer-chunk-boundary" not in fixed
    bs = cfg["block_size"]
    lookahead = cfg["k_p"] if cfg["knobs"].get("prefill_lookahead", "default") == "default" else 0
    ids = prompt_ids(cfg)
    out: dict[str, Any] = {"requests": 0, "chunked_p": 0, "chunked_baseline": 0,
                           "match": {"vs_p": 0, "vs_baseline": 0}, "mismatches": []}
    for q in r.requests:
        pr = q.get("kv_probe")
        if not pr:
            continue
        out["requests"] += 1
        ch = pr["prefill_chunks"]
        out["chunked_p"] += len(ch.get("p") or []) > 1
        out["chunked_baseline"] += len(ch.get("baseline") or []) > 1
        layers = pr["layers"]
        hb = expected_host_buffer(pr, bs, lookahead) if staged else set()
        for ref in ("vs_p", "vs_baseline"):
            dr = expected_drafter(pr, padded, ref, ids[q["id"]])
            want = {}
            for layer, group in layers.items():
                pos = set(hb) | (dr if group == "drafter" else set())
                if pos:
                    want[layer] = pos
            got = observed(pr[ref])
            if got == want:
                out["match"][ref] += 1
            else:
                out["mismatches"].append({
                    "id": q["id"], "ref": ref, "prompt_len": q["prompt_len"], "chunks": ch,
                    "expected": {k: kv_ranges(v) for k, v in want.items()},
                    "observed": pr[ref]["positions_differing"]})
    return out


def cmd_check(a: argparse.Namespace) -> None:
    import json

    report = {}
    for d in sorted(Path(a.runs).iterdir()):
        if not (d / "result.json").exists():
            continue
        r = Result.load(d)
        if not any(q.get("kv_probe") for q in r.requests):
            continue
        c = check_run(r, set(a.fixed.split(",")) if a.fixed else set())
        report[d.name] = c
        print(f"{d.name}: {c['requests']} requests, chunked on P {c['chunked_p']}, on the "
              f"baseline {c['chunked_baseline']}; as predicted vs P {c['match']['vs_p']}, "
              f"vs baseline {c['match']['vs_baseline']}; mismatches {len(c['mismatches'])}")
        for m in c["mismatches"][:a.show]:
            print("   ", json.dumps(m))
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1) + "\n")


# --- the acceptance table ----------------------------------------------------------------
def side_arrays(r: Result, side: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = sorted(r.requests, key=lambda q: q["id"])
    d = np.array([q[side]["num_drafts"] for q in rows], dtype=float)
    a = np.array([q[side]["accepted_per_pos"] for q in rows], dtype=float)
    n = np.array([q[side]["num_accepted"] for q in rows], dtype=float)
    return d, a, n


def tokens(r: Result, side: str) -> list[str]:
    return [q[f"{side}_tokens"] for q in sorted(r.requests, key=lambda q: q["id"])]


def _ci(iv) -> tuple[str, str]:
    return ("", "") if iv is None else (f"{iv[0]:.4f}", f"{iv[1]:.4f}")


def table_rows(runs: dict[str, Result], reference: str,
               ref_for: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per point and side, rates with intervals and the paired difference from the point's
    reference (``ref_for[point]``, else ``reference``), request by request."""
    out = []
    for name, r in runs.items():
        ref_name = (ref_for or {}).get(name, reference)
        ref = runs[ref_name]
        cfg = r.config
        for side in ("pd", "baseline"):
            if not r.requests or not r.requests[0].get(side):
                continue
            d, a, n = side_arrays(r, side)
            ci = stats.side_intervals(d, a, n)
            rd, ra, rn = side_arrays(ref, side)
            diff, diff_ci = stats.paired_diff(d, np.column_stack([a, n]), rd,
                                              np.column_stack([ra, rn]))
            agree = np.array([x == y for x, y in zip(tokens(r, side), tokens(ref, side),
                                                      strict=True)], dtype=float)
            probed = [q["kv_probe"] for q in r.requests if q.get("kv_probe")]
            role = "p" if side == "pd" else "baseline"
            chunks = [len(pr["prefill_chunks"].get(role) or [1]) for pr in probed]
            budget = cfg.get("max_num_batched_tokens")
            b = budget.get(role, "default") if isinstance(budget, dict) else (budget or "default")
            row = {"point": name, "side": "D" if side == "pd" else "baseline",
                   "budget": b, "padded_drafter_batch": cfg.get("padded_drafter_batch", True),
                   "transfer": cfg["knobs"].get("transfer"),
                   "concurrency": cfg["concurrency"], "requests": len(d),
                   "chunked_requests": sum(c > 1 for c in chunks) if probed else "",
                   "mean_chunks": f"{np.mean(chunks):.3f}" if probed else "",
                   "drafts": int(d.sum())}
            rates = a.sum(0) / d.sum()
            for i in range(a.shape[1]):
                row[f"p{i}"] = f"{rates[i]:.4f}"
                row[f"p{i}_lo"], row[f"p{i}_hi"] = _ci(ci["per_position_ci95"][i])
            row["acceptance_length"] = f"{1 + n.sum() / d.sum():.4f}"
            row["acceptance_length_lo"], row["acceptance_length_hi"] = _ci(
                ci["acceptance_length_ci95"])
            for i in range(a.shape[1]):
                row[f"diff_p{i}"] = f"{diff[i]:.4f}"
                row[f"diff_p{i}_lo"], row[f"diff_p{i}_hi"] = _ci(diff_ci[i])
            row["diff_acceptance_length"] = f"{diff[-1]:.4f}"
            row["diff_acceptance_length_lo"], row["diff_acceptance_length_hi"] = _ci(
                diff_ci[-1])
            row["token_agreement_vs_reference"] = f"{agree.mean():.4f}"
            lo_hi = stats.mean_ci(agree)
            row["token_agreement_lo"], row["token_agreement_hi"] = _ci(lo_hi)
            row["token_agreement_in_run"] = r.token_agreement if side == "pd" else ""
            row["reference"] = ref_name
            out.append(row)
    return out


def load_runs(runs_dir: str, names: str | None) -> dict[str, Result]:
    """Runs by name from ``DIR`` or ``DIR,PREFIX=DIR2,...`` (DIR2's runs named PREFIX + name);
    ``names``: the ones to keep, in that order (all when None)."""
    first, *more = runs_dir.split(",")
    dirs = {"": Path(first), **{k: Path(v) for k, v in (m.split("=", 1) for m in more)}}
    found = {prefix + d.name: d for prefix, root in dirs.items()
             for d in sorted(root.iterdir()) if (d / "result.json").exists()}
    wanted = names.split(",") if names else list(found)
    return {n: Result.load(found[n]) for n in wanted}


def cmd_table(a: argparse.Namespace) -> None:
    runs = load_runs(a.runs, a.points)
    ref_for = dict(x.split("=", 1) for x in a.ref_for)
    every = load_runs(a.runs, None)
    for ref in {a.reference, *ref_for.values()} - set(runs):
        runs[ref] = every[ref]
    rows = table_rows(runs, a.reference, ref_for)
    with Path(a.out).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    for row in rows:
        print(f"{row['point']:26s} {row['side']:8s} p0 {row['p0']} [{row['p0_lo']}, "
              f"{row['p0_hi']}] AL {row['acceptance_length']} diff AL "
              f"{row['diff_acceptance_length']} [{row['diff_acceptance_length_lo']}, "
              f"{row['diff_acceptance_length_hi']}] diff p0 {row['diff_p0']} "
              f"[{row['diff_p0_lo']}, {row['diff_p0_hi']}] tokens= "
              f"{row['token_agreement_vs_reference']} chunked {row['chunked_requests']}")


def cmd_figures(a: argparse.Namespace) -> None:
    from workbench.figures import kv_plots

    runs = load_runs(a.runs, a.points)
    for name, r in runs.items():
        if r.kv_probe_summary:
            paths = kv_plots.kv_probe([r], a.out, stem="kv_probe-" + name.replace(":", "-"),
                                      request_id=a.request)
            print(name, [str(p) for p in paths])


def cmd_positions(a: argparse.Namespace) -> None:
    """One request across runs: the positions where D's KV differs (filled: from the baseline,
    per layer group; x: from P) and where the model predicts them (open circles), with P's
    chunk ends as dotted lines and block boundaries as grey ticks."""
    import matplotlib.pyplot as plt

    from workbench.figures.figstyle import STYLE, provenance, save

    runs = load_runs(a.runs, a.points)
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(len(runs), 1, figsize=(11, 0.9 + 1.0 * len(runs)),
                                 sharex=True, squeeze=False)
        for ax, (name, r) in zip(axes[:, 0], runs.items(), strict=True):
            q = next(q for q in r.requests if q["id"] == a.request)
            pr = q["kv_probe"]
            cfg = r.config
            bs, n = cfg["block_size"], pr["positions_compared"]
            la = cfg["k_p"] if cfg["knobs"].get("prefill_lookahead", "default") == "default" \
                else 0
            staged = cfg["knobs"].get("transfer") == "host-staged"
            ids = prompt_ids(cfg)[q["id"]]
            hb = expected_host_buffer(pr, bs, la) if staged else set()
            dr = expected_drafter(pr, cfg.get("padded_drafter_batch", True), "vs_baseline", ids)
            rows = {"target": 1.0, "drafter": 0.0}
            for group, y in rows.items():
                layers = [k for k, g in pr["layers"].items() if g == group]
                got = set().union(*(observed(pr["vs_baseline"]).get(k, set()) for k in layers))
                vs_p = set().union(*(observed(pr["vs_p"]).get(k, set()) for k in layers))
                want = hb | (dr if group == "drafter" else set())
                ax.scatter(sorted(got), [y] * len(got), s=14, marker="s", color="tab:red",
                           label="differs from the baseline" if y else None)
                ax.scatter(sorted(want), [y + 0.25] * len(want), s=14, facecolors="none",
                           edgecolors="black",
                           label="predicted for 0.32.0 as released" if y else None)
                ax.scatter(sorted(vs_p), [y - 0.25] * len(vs_p), s=14, marker="x",
                           color="tab:cyan", label="differs from P" if y else None)
            for e in chunk_ends(pr["prefill_chunks"].get("p")):
                ax.axvline(e + 0.5, color="tab:blue", ls=":", lw=1)
            for b in range(0, n + 1, bs):
                ax.axvline(b - 0.5, color="0.8", lw=0.6, zorder=0)
            ax.set_xlim(-1, n)
            ax.set_ylim(-0.6, 1.6)
            ax.set_yticks([0, 1], ["drafter", "target (8)"])
            ax.set_title(f"{name}: P's chunks {pr['prefill_chunks'].get('p')}, "
                         f"lookahead {la}, {cfg['knobs'].get('transfer')}", fontsize=8,
                         loc="left")
            ax.grid(False)
        axes[-1, 0].set_xlabel(f"prompt position of request {a.request} (grey: block "
                               f"boundaries, block size {bs}; blue dotted: P's chunk ends)")
        axes[0, 0].legend(loc="lower right", fontsize=7, ncol=3)
        fig.tight_layout()
        paths = save(fig, a.out, a.stem, provenance(list(runs.values())))
    print([str(p) for p in paths])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("run")
    p.add_argument("--out", required=True)
    p.add_argument("--points", required=True)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--no-probe", action="store_true")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("check")
    p.add_argument("--runs", required=True)
    p.add_argument("--show", type=int, default=3)
    p.add_argument("--fixed", help="finding ids the runs' build fixes (comma-separated)")
    p.add_argument("--out")
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("table")
    p.add_argument("--runs", required=True)
    p.add_argument("--reference", required=True)
    p.add_argument("--ref-for", action="append", default=[], metavar="POINT=REF",
                   help="another reference for one point (repeatable)")
    p.add_argument("--points")
    p.add_argument("--out", required=True)
    p.set_defaults(fn=cmd_table)
    p = sub.add_parser("figures")
    p.add_argument("--runs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--points")
    p.add_argument("--request")
    p.set_defaults(fn=cmd_figures)
    p = sub.add_parser("positions")
    p.add_argument("--runs", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--points", required=True)
    p.add_argument("--request", required=True)
    p.add_argument("--stem", required=True)
    p.set_defaults(fn=cmd_positions)
    a = ap.parse_args(argv)
    a.fn(a)


if __name__ == "__main__":
    main()
