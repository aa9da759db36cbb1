"""A native old-release run against the knob that re-creates its bug on 0.32.0, request by request.

    python -m workbench.releases.compare --native data/releases/0.24.0/pd-indomain16.json \
        --out data/releases/knobs-0.32.0

Runs the native run's prompts (same set, count, tokens and greedy settings, one request at a
time) on the installed release with each knob setting of :data:`SETTINGS`, and compares D with
the native D per request: the generated token ids, and the drafts and accepted tokens per
position. The native release's D (0.24.0) has no ``pad_spec_decode``, so the setting that matches
it exactly on 0.32.0 must gate that padding too (``load_step=gated-async``); the plain knob is
kept beside it to show that difference. Writes ``results.csv`` (one row per setting) and each
run's ``result.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..experiment import Session
from ..provenance import atomic_write_text

SETTINGS: dict[str, dict[str, str]] = {
    "legacy": {"block_handoff": "legacy"},
    "legacy, load step gated-async": {"block_handoff": "legacy", "load_step": "gated-async"},
    "fixed, load step gated-async": {"load_step": "gated-async"},
}


def compare(native: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per request: D's tokens and D's per-position counts, native against this run."""
    by_id = {q["id"]: q for q in rows}
    same_tokens = same_counts = 0
    differing: list[str] = []
    for n in native:
        q = by_id[n["id"]]
        tok = n["token_ids"] == q["pd_tokens"]
        cnt = (n["delta"]["num_drafts"] == q["pd"]["num_drafts"]
               and n["delta"]["accepted_per_pos"] == q["pd"]["accepted_per_pos"])
        same_tokens += tok
        same_counts += cnt
        if not (tok and cnt):
            differing.append(n["id"])
    return {"requests": len(native), "same_d_tokens": same_tokens,
            "same_d_counts": same_counts, "differing": differing}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--native", required=True, help="a native run's pd-*.json (trial.py)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    native = json.loads(Path(args.native).read_text())
    trial = json.loads(Path(args.native).with_name(
        Path(args.native).name.replace("pd-", "trial-")).read_text())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ExperimentConfig(prompt_set=trial["prompt_set"], num_prompts=trial["num_prompts"],
                           max_tokens=trial["request"]["max_tokens"], concurrency=1)
    table = []
    with Session(out / "logs") as s:
        for name, knobs in SETTINGS.items():
            r = s.run(replace(cfg, knobs={**cfg.knobs, **knobs}),
                      out_dir=out / name.replace(", ", "-").replace(" ", "-"))
            c = compare(native, r.requests)
            row = {"setting": name, "vllm": r.vllm_version, "native": trial["vllm_version"],
                   **{k: v for k, v in c.items() if k != "differing"},
                   "differing": " ".join(c["differing"]), "d_num_drafts": r.pd["num_drafts"],
                   "native_d_num_drafts": trial["d"]["num_drafts"],
                   "d_accepted_per_pos": r.pd["accepted_per_pos"],
                   "native_d_accepted_per_pos": trial["d"]["accepted_per_pos"],
                   "token_agreement": r.token_agreement,
                   "native_token_agreement": trial["token_agreement"]}
            table.append(row)
            print(json.dumps(row), flush=True)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(table[0]))
    w.writeheader()
    w.writerows(table)
    atomic_write_text(out / "results.csv", buf.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
