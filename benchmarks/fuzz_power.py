"""How well ``workbench fuzz`` hunts (docs/fuzz.md), in four figures:

- **mutation score**: each bug the reference sweep re-creates with a knob, fixed in an
  otherwise built-in space (no prompt set chosen for it), attribution limited to the findings
  the released build has (its expectations), caught when the run reports an unexplained
  failure; a control run of each shape without the knob shows what is unexplained there
  anyway; goal: each within 5 minutes, shrunk to a few requests;
- **rediscovery**: attribution off on the released build, the built-in space from a blank
  start: the budget spent until a reported failure is one that ``chunked-prefill-drafter-kv``,
  ``padded-load-step`` or ``host-buffer-chunk-boundary`` explains (their detectors, asked
  afterwards); goal: all three within 20 minutes;
- **false alarms**: the dev build with ``patches/vllm-0.32.0/`` applied, attribution on, the
  built-in space: unexplained failures (goal: 0);
- **throughput**: trials per minute on warm servers (goal: at least 6) and the share of the
  time spent starting servers, over every trial above.

    .venv/bin/python benchmarks/fuzz_power.py [--part mutation,rediscovery,false-alarms]
        [--out data/fuzz/power] [--mutation-budget 5m] [--budget 20m]
    .venv/bin/python benchmarks/fuzz_power.py --report   # print the figures of a run kept

Each part keeps its fuzz directories and ``power.json`` under ``--out``; a part already in
``power.json`` is not run again (``--again`` reruns it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from workbench.experiment import Session
from workbench.fuzz import attribute, command, oracle, trial
from workbench.fuzz.hunt import Hunt
from workbench.fuzz.records import Book
from workbench.fuzz.space import Space
from workbench.provenance import atomic_write_json, atomic_write_text

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "patches" / "vllm-0.32.0"
# The knob settings the reference sweep marks as bugs (grid "default", data/reference-sweep).
MUTATIONS = {
    "block_handoff=legacy": ({"block_handoff": "legacy"}, "direct"),
    "legacy, blocks=zeroed": ({"block_handoff": "legacy", "blocks": "zeroed"}, "direct"),
    "legacy, blocks=dirty": ({"block_handoff": "legacy", "blocks": "dirty"}, "direct"),
    "legacy, blocks=poisoned": ({"block_handoff": "legacy", "blocks": "poisoned"}, "direct"),
    "finalize=eager, host-staged": ({"finalize": "eager"}, "host-staged"),
    "double_bos=on": ({"double_bos": "on"}, "direct"),
}
REDISCOVER = ("chunked-prefill-drafter-kv", "padded-load-step", "host-buffer-chunk-boundary")
ONE_SHAPE = {"budget_p": [None], "budget_d": [None], "k_p": [1], "k_d": [3],
             "block_size": [32], "kv_cache_mib": [256], "padded_drafter_batch": [True],
             "shape_trials": 1000}


def one_shape(transfer: str, knobs: dict | None = None) -> Space:
    return Space.from_dict({**ONE_SHAPE, "transfer": [transfer], "knobs": knobs or {}})


def present_on_release() -> list[str]:
    """The findings the released build has (its committed expectations): what a mutation run
    may attribute to. A regression a knob re-creates is expected absent there, so a mutation
    run cannot explain its own bug away."""
    doc = json.loads((REPO / "data" / "findings" / "expected-0.32.0.json").read_text())
    return sorted(f for f, v in doc["findings"].items() if v == "present")


def hunt(session: Session, out: Path, space: Space, budget_s: float, attribute_on: bool,
         stop=None, seen=None, only=None) -> Book:
    base = command.base_config_for()
    pool, vocab = command.pool_and_vocab(base)
    book = Book.open(out, {"space": space.to_dict(), "seed": 0, "attribute": attribute_on})

    def run(sc):
        t = trial.run(session, sc, base, attribute_on, only)
        if seen is not None:
            seen(book, t)
        return t

    Hunt(book, space, run, base, budget_s, 0, pool, vocab, stop=stop).go()
    return book


def mutation(session: Session, out: Path, budget_s: float) -> dict:
    """Each mutation with attribution to the released build's findings only; a control run
    of each shape without the mutation shows what that attribution leaves unexplained there
    (expected: nothing)."""
    only = present_on_release()
    control = {}
    for transfer in ("direct", "host-staged"):
        book = hunt(session, out / f"control-{transfer}", one_shape(transfer), budget_s / 2,
                    True, only=only)
        control[transfer] = sorted(book.failures)
    rows = {}
    for name, (knobs, transfer) in MUTATIONS.items():
        book = hunt(session, out / slug(name),
                    one_shape(transfer, knobs), budget_s, True,
                    stop=lambda b: bool(b.failures), only=only)
        hits = [book.hits[f"unexplained: {s}"] for s in book.failures]
        rows[name] = {"caught": bool(book.failures), "signatures": sorted(book.failures),
                      "trials": book.trials,
                      "minutes_to_catch": round(min(h.first_s for h in hits) / 60, 2)
                      if hits else None,
                      "smallest": [h.smallest for h in hits], "budget_min": budget_s / 60}
        print(f"{name}: {'caught ' + ', '.join(book.failures) if hits else 'not caught'}",
              flush=True)
    return {"attributed_to": only, "control": control, "mutations": rows}


def rediscovery(session: Session, out: Path, budget_s: float) -> dict:
    first: dict[str, float] = {}
    sig: dict[str, str] = {}  # finding -> the signature of the request it explained first

    def seen(book: Book, t) -> None:
        for j, row in zip(t.judged, t.result.get("requests") or [], strict=False):
            if j.unexplained:
                for f in attribute.present_in(t.result, row):
                    first.setdefault(f, round(book.spent() / 60, 2))
                    sig.setdefault(f, oracle.signature(j))

    def done(b: Book) -> bool:  # each found, and its failure written (shrunk) as well
        return all(f in first and sig[f] in b.failures for f in REDISCOVER)

    book = hunt(session, out / "rediscovery", Space(), budget_s, False, stop=done, seen=seen)
    return {"minutes_to_find": {f: first.get(f) for f in REDISCOVER},
            "other_explained": {f: m for f, m in first.items() if f not in REDISCOVER},
            "failures": sorted(book.failures), "trials": book.trials,
            "budget_min": budget_s / 60}


def false_alarms(out: Path, budget: str) -> dict:
    """The CLI on the dev build (a subprocess with the build first on PYTHONPATH)."""
    from workbench import devbuild

    with tempfile.TemporaryDirectory(prefix="fuzz-dev-") as tmp:
        dev = devbuild.make(Path(tmp) / "dev", patches=sorted(PATCHES.glob("*.patch")))
        env = {**os.environ, "PYTHONPATH": str(dev)}
        runs = out / "false-alarms"
        p = subprocess.run([sys.executable, "-m", "workbench", "fuzz", "--budget", budget,
                            "--out", str(runs)], env=env, cwd=REPO, check=False)
    state = json.loads((runs / "state.json").read_text())
    return {"exit": p.returncode, "unexplained": sorted(state["failures"]),
            "trials": state["trials"], "budget": budget,
            "patches": sorted(x.name for x in PATCHES.glob("*.patch"))}


def throughput(out: Path) -> dict:
    lines = [json.loads(x) for f in sorted(out.rglob("trials.jsonl"))
             for x in f.read_text().splitlines()]
    warm = [x["seconds"] for x in lines if x["start_seconds"] < 1.0]
    total = sum(x["seconds"] for x in lines)
    starts = sum(x["start_seconds"] for x in lines)
    return {"trials": len(lines), "warm_trials": len(warm),
            "warm_trials_per_minute": round(60 * len(warm) / sum(warm), 1) if warm else None,
            "median_warm_trial_s": round(statistics.median(warm), 2) if warm else None,
            "start_share": round(starts / total, 3) if total else None}


def leftover(runs: Path, only=None) -> dict[str, list[str]]:
    """Each failure of a run asked again with today's detectors (those in ``only``, when
    given): {failure hash: the kinds no finding explains} for those where some are left. A
    finding added after the run explains what it found."""
    out = {}
    for rec in sorted(runs.glob("failures/*/records.json")):
        doc = json.loads(rec.read_text())
        rows = {r["id"]: r for r in doc["result"].get("requests") or []}
        left = set()
        for j in doc["judged"]:
            if j.get("unexplained") and j["id"] in rows:
                found = attribute.present_in(doc["result"], rows[j["id"]], only)
                left |= set(j["unexplained"]) - {k for ks in found.values() for k in ks}
        if left:
            out[rec.parent.name] = sorted(left)
    return out


def slug(name: str) -> str:
    return name.replace(", ", "-").replace("=", "-")


def report(doc: dict, out: Path) -> None:
    m = (doc.get("mutation") or {}).get("mutations") or {}
    if m:
        only = doc["mutation"].get("attributed_to")
        now = {name: bool(leftover(out / slug(name), only)) for name in m}
        print(f"mutation score: {sum(now.values())}/{len(m)} caught, asked again with "
              f"today's detectors ({sum(r['caught'] for r in m.values())} as the run judged; "
              f"control runs left {doc['mutation']['control']} unexplained)")
        for name, r in m.items():
            print(f"  {name:30} {'caught' if now[name] else 'missed':7} "
                  f"{r['minutes_to_catch']} min, smallest {r['smallest']}, {r['trials']} "
                  f"trials" + ("" if now[name] == r["caught"] else
                               f"; the run's catch {r['signatures']} is a finding's now"))
    if r := doc.get("rediscovery"):
        print(f"rediscovery (minutes of budget, {r['budget_min']:.0f} min budget): "
              f"{r['minutes_to_find']}; failures {r['failures']}; left unexplained when "
              f"asked with attribution: {leftover(out / 'rediscovery') or 'none'}")
    if r := doc.get("false-alarms"):
        print(f"false alarms on the dev build ({', '.join(r['patches'])}; {r['budget']}): "
              f"{len(r['unexplained'])} unexplained {r['unexplained']} in {r['trials']} trials")
    if r := doc.get("throughput"):
        print(f"throughput: {r['warm_trials_per_minute']} trials/min warm (median trial "
              f"{r['median_warm_trial_s']} s), {r['start_share']:.0%} of the time in server "
              f"starts, over {r['trials']} trials")


DOC = REPO / "docs" / "fuzz.md"  # its table between these markers, written by --report
BEGIN, END = "<!-- power:begin -->", "<!-- power:end -->"


def table(doc: dict, out: Path) -> str:
    """The four figures as docs/fuzz.md shows them, from ``power.json`` and the runs' failure
    records asked again with today's detectors (``leftover``)."""
    rows = ["| figure | goal | measured |", "|---|---|---|"]
    if m := (doc.get("mutation") or {}).get("mutations"):
        only = doc["mutation"].get("attributed_to")
        now = {name: bool(leftover(out / slug(name), only)) for name in m}
        each = ", ".join(f"`{name}` {r['minutes_to_catch']} min" for name, r in m.items()
                         if now[name])
        missed = ", ".join(f"`{name}`" for name in m if not now[name]) or "none"
        rows.append(f"| mutation score | 6 of 6, each within 5 min, shrunk to a few requests | "
                    f"**{sum(now.values())} of {len(m)}** ({each}); missed: {missed} |")
    if r := doc.get("rediscovery"):
        found = ", ".join(f"`{f}` {v} min" for f, v in r["minutes_to_find"].items())
        other = ", ".join(f"`{f}` {v} min" for f, v in r.get("other_explained", {}).items())
        rows.append(f"| rediscovery, attribution off | all three within 20 min | {found} "
                    f"({r['trials']} trials); also explained: {other or 'none'} |")
    if r := doc.get("false-alarms"):
        rows.append(f"| false alarms, patched dev build | 0 unexplained, or each investigated | "
                    f"{len(r['unexplained'])} unexplained signature(s) "
                    f"({', '.join(f'`{u}`' for u in r['unexplained']) or '-'}) in "
                    f"{r['trials']} trials |")
    if r := doc.get("throughput"):
        rows.append(f"| throughput | at least 6 trials/min warm | {r['warm_trials_per_minute']} "
                    f"trials/min (median trial {r['median_warm_trial_s']} s) over "
                    f"{r['warm_trials']} warm trials; {r['start_share']:.0%} of all the time "
                    "in server starts |")
    return "\n".join(rows)


def write_doc(doc: dict, out: Path) -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    atomic_write_text(DOC, f"{head}{BEGIN}\n{table(doc, out)}\n{END}{rest.split(END, 1)[1]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="mutation,rediscovery,false-alarms")
    ap.add_argument("--out", default=str(REPO / "data" / "fuzz" / "power"))
    ap.add_argument("--mutation-budget", default="5m")
    ap.add_argument("--budget", default="20m", help="rediscovery's and false alarms' budget")
    ap.add_argument("--again", action="store_true", help="rerun parts already measured")
    ap.add_argument("--report", action="store_true",
                    help="print the figures and write docs/fuzz.md's table; run nothing")
    args = ap.parse_args()
    out = Path(args.out)
    path = out / "power.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    parts = [] if args.report else [p for p in args.part.split(",") if args.again or p not in doc]
    live = [p for p in parts if p != "false-alarms"]
    if live:
        with Session() as session:
            for p in live:
                f = mutation if p == "mutation" else rediscovery
                budget = args.mutation_budget if p == "mutation" else args.budget
                doc[p] = f(session, out, command.parse_budget(budget))
                atomic_write_json(path, doc, indent=1, portable=True)
    if "false-alarms" in parts:
        doc["false-alarms"] = false_alarms(out, args.budget)
    if parts:
        doc["throughput"] = throughput(out)
        atomic_write_json(path, doc, indent=1, portable=True)
    report(doc, out)
    write_doc(doc, out)


if __name__ == "__main__":
    main()
