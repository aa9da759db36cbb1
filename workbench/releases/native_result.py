"""A native old-release run (``trial.py``) as a ``result.json`` of the workbench's own shape.

Why: the issue asks for the same ``result.json`` per release, so the tables, figures and
intervals that read the installed release's runs read the old release's too. The rows are
built the way ``experiment.Session`` builds them (``id``, ``affected``, the tokens and the
counts of each side) and summed by the same ``results.aggregate``, so intervals, token
agreement, D's extra drafts and the paired effect against the baseline are computed once,
in one place. ``measurement.source`` is ``"metrics-scrape"``: the old releases have no
per-request spec-decode field, so the trial sent the requests one at a time with a
``/metrics`` scrape before and after each (and there is no cross-check to make).

    python -m workbench.releases.native_result data/releases/0.24.0 badcase32
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..knobs import spec as knob_spec
from ..measuring.results import Result, aggregate
from ..provenance import git_commit


def request_rows(base: list[dict], pd: list[dict]) -> list[dict[str, Any]]:
    """One row per prompt, in ``experiment.Session``'s shape."""
    by_id = {b["id"]: b for b in base}
    rows = []
    for d in pd:
        b = by_id[d["id"]]
        rows.append({"id": d["id"], "prompt_len": d["n"], "prompt_len_mod_block": d["n_mod_block"],
                     "affected": d["bad_case"], "blocks_handed": d["blocks_handed"],
                     "baseline_tokens": b["token_ids"], "baseline": b["delta"],
                     "baseline_seconds": b["seconds"], "pd_tokens": d["token_ids"],
                     "pd": d["delta"], "p_spec": d["p_delta"],
                     "pd_seconds": d["seconds"].get("total")})
    return rows


def build(trial: dict[str, Any], base: list[dict], pd: list[dict], command: str) -> Result:
    """The Result of one native trial (its record, baseline rows and PD rows)."""
    cpu = ExperimentConfig.for_profile("cpu")  # the servers' shape, as trial.specs_for
    r = Result(
        config={"prompt_set": trial["prompt_set"], "num_prompts": trial["num_prompts"],
                "request": trial["request"], "k_p": cpu.k_p, "k_d": cpu.k_d, "concurrency": 1,
                "python": trial["python"], "servers": trial["commands"]},
        command=command, vllm_version=trial["vllm_version"], git_commit=git_commit(),
        created=trial.get("created", ""), prompt_set=trial["prompt_set"],
        num_prompts=trial["num_prompts"], wall_seconds=trial.get("pd_wall_s", 0.0)
        + trial.get("baseline_wall_s", 0.0), engine_seconds=0.0,
        knobs={"requested": knob_spec.defaults(), "mode": "observe-only",
               "plugin": trial.get("plugin", {})},
        pd=None, baseline=None, token_agreement=None,
        notes=[f"vLLM {trial['vllm_version']} natively: no knob installed (the workbench "
               "plugin observe-only; compatibility fixes applied per process are under "
               "knobs.plugin)"],
        measurement={"source": "metrics-scrape", "concurrency": 1,
                     "sides": {"pd": {"source": "metrics-scrape"},
                               "baseline": {"source": "metrics-scrape"}}},
        vllm_release=trial["vllm_version"].split("+", 1)[0])
    r.requests = request_rows(base, pd)
    aggregate(r, r.requests)
    r.notes = [n for n in r.notes if not n.startswith("D counted")] + extra_draft_note(r)
    return r


def extra_draft_note(r: Result) -> list[str]:
    """``results.add_extra_drafts`` explains D's extra drafts by 0.32.0's padded load step;
    say instead where the old release's came from (it has no ``pad_spec_decode``)."""
    extra = [q for q in r.requests if q.get("extra_pd_drafts")]
    if not extra:
        return [f"D counted the baseline's drafts exactly in every request: vLLM "
                f"{r.vllm_version}'s Scheduler has no pad_spec_decode (no padded draft after "
                "the KV load)"]
    differ = [q for q in extra if not q["agree"]]
    net = sum(q["extra_pd_drafts"] for q in extra)
    return [f"D's draft count differs from the baseline's in {len(extra)} request(s) (net "
            f"{net:+d}), {len(differ)} of them with tokens unlike the baseline's (a different "
            f"text drafts differently); vLLM "
            f"{r.vllm_version}'s Scheduler has no pad_spec_decode, so no padded draft"]


def write(run_dir: Path, tag: str) -> Path:
    """``run_dir/<tag>/result.json`` from ``run_dir/{trial,baseline,pd}-<tag>.json``."""
    def read(kind: str):
        return json.loads((run_dir / f"{kind}-{tag}.json").read_text())

    command = f"python -m workbench.releases.native_result {run_dir} {tag}"
    return build(read("trial"), read("baseline"), read("pd"), command).save(run_dir / tag)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="data/releases/<release>")
    ap.add_argument("tag", help="<prompt set><prompts>, e.g. badcase32")
    args = ap.parse_args(argv)
    print(write(Path(args.run_dir), args.tag))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
