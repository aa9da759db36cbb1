"""The Result of one run: result.json, DataFrames, and the append-only results store."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..inputs import profiles
from ..knobs import spec as knob_spec
from ..provenance import atomic_path, atomic_write_json
from ..serving import rundir
from . import metrics, stats
from .readout import bottom_line


@dataclass
class Result:
    """One run: aggregate acceptance for PD and the baseline, plus one row per request.

    ``pd`` / ``baseline`` hold the summary of counter deltas (see ``metrics.SpecCounters``).
    ``knobs`` holds the values requested and those read back from each server's processes.
    """

    config: dict[str, Any]
    command: str
    vllm_version: str
    git_commit: str
    created: str
    prompt_set: str
    num_prompts: int
    wall_seconds: float
    engine_seconds: float
    knobs: dict[str, Any]
    pd: dict[str, Any] | None
    baseline: dict[str, Any] | None
    token_agreement: float | None
    requests: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The answer in one line, first in ``run``'s printout (``readout.bottom_line``).
    bottom_line: str | None = None
    complete: bool = True
    error: str | None = None
    # How the counts were measured: "source" ("per-request" or "metrics-scrape"),
    # "concurrency", "crosscheck" / "crosscheck_mismatch" (per-request sums against each
    # server's /metrics delta), and per side the phase record (``measure.Requests.phases``).
    measurement: dict[str, Any] = field(default_factory=dict)
    # PD minus the baseline, paired by request: "per_position_diff", "per_position_diff_ci95",
    # "verdict" (within / outside / inconclusive against vLLM's 5% tolerance), on vLLM's raw
    # rates, and the same under "without_extra_drafts" (D's padded first step removed).
    effect: dict[str, Any] | None = None
    # With kv_probe: per layer group (target, drafter) and reference (vs_p, vs_baseline), the
    # share of requests whose KV differs, by affected / unaffected; the probe's cost.
    kv_probe_summary: dict[str, Any] | None = None
    # The release's entry in knobs/release.RELEASES (vllm_version without "+cpu"), and the
    # model runner the servers' workers ran ("v1", "v2"; "v1,v2" mixed; None: no read-back).
    vllm_release: str | None = None
    model_runner: str | None = None
    # The knob ``runner`` as each role's workers read it back (the model runner class they
    # built, ``knobs/runner.py``): {"p": "v2", "d": "v2", "baseline": "v2"}; None: no read-back.
    runner: dict[str, str] | None = None
    # The build the run used (knobs/build.py): {version, table_entry, source ("table" |
    # "installed-source"), checks_passed, checks_total (the entry's patch checks on the
    # installed source), commit (vllm._version.__commit_id__, None where the build has none)};
    # None for an old release run natively (no table entry serves it: releases/native_result).
    vllm_build: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, out_dir: str | Path) -> Path:
        return atomic_write_json(Path(out_dir) / "result.json", self.to_dict(), indent=2,
                                 sort_keys=False, portable=True)

    @classmethod
    def load(cls, path: str | Path) -> Result:
        p = Path(path)
        if p.is_dir():
            p = p / "result.json"
        return cls(**json.loads(p.read_text()))

    # --- tables --------------------------------------------------------------------------
    def to_dataframe(self) -> pd.DataFrame:
        """Long table: one row per (side, position) with the rate and the run's knob values."""
        rows = []
        for side in ("baseline", "pd"):
            s = getattr(self, side)
            if not s:
                continue
            pairs = zip(s["per_position"], s["conditional"], strict=True)
            for pos, (rate, cond) in enumerate(pairs):
                rows.append({
                    "side": side, "position": pos, "rate": rate, "conditional": cond,
                    "acceptance_length": s["acceptance_length"], "num_drafts": s["num_drafts"],
                    **self.flat_meta(),
                })
        return pd.DataFrame(rows)

    def requests_frame(self) -> pd.DataFrame:
        rows = []
        for r in self.requests:
            row = {k: v for k, v in r.items() if not isinstance(v, (list, dict))}
            for side in ("baseline", "pd"):
                c = r.get(side) or {}
                row[f"{side}_num_drafts"] = c.get("num_drafts")
                for i, a in enumerate(c.get("accepted_per_pos", [])):
                    row[f"{side}_accepted_pos{i}"] = a
            rows.append(row)
        return pd.DataFrame(rows)

    def flat_meta(self) -> dict[str, Any]:
        """The columns that identify a run in a results store."""
        meta = {f"knob_{k}": v for k, v in knobs_in_force(self.knobs).items()}
        meta.update({
            "prompt_set": self.prompt_set, "num_prompts": self.num_prompts,
            "concurrency": self.measurement.get("concurrency", 1),
            "measurement_source": self.measurement.get("source", "metrics-scrape"),
            "crosscheck": self.measurement.get("crosscheck"),
            "k_p": self.config.get("k_p"), "k_d": self.config.get("k_d"),
            "vllm_version": self.vllm_version, "model_runner": self.model_runner,
            "git_commit": self.git_commit,
            "created": self.created, "wall_seconds": self.wall_seconds,
            "engine_seconds": self.engine_seconds, "token_agreement": self.token_agreement,
        })
        return meta

    def summary_row(self) -> dict[str, Any]:
        """One row per run: what a results store keeps."""
        row = self.flat_meta()
        for side in ("baseline", "pd"):
            s = getattr(self, side)
            if not s:
                continue
            row[f"{side}_acceptance_length"] = s["acceptance_length"]
            row[f"{side}_num_drafts"] = s["num_drafts"]
            for i, r in enumerate(s["per_position"]):
                row[f"{side}_pos{i}"] = r
            for i, r in enumerate(s.get("per_position_without_extra_drafts") or []):
                row[f"{side}_pos{i}_without_extra_drafts"] = r
            _interval_columns(row, side, s)
            # A profile with reference figures (gpu: vLLM's test) gets pass/fail next to them.
            expected = profiles.get(self.config.get("profile", "cpu")).expected
            if expected:
                check = profiles.check_expected(s, expected)
                row[f"{side}_vs_expected"] = "pass" if check["pass"] else "fail"
                row[f"{side}_rel_err_acceptance_length"] = check["rel_err_acceptance_length"]
        _effect_columns(row, self.effect)
        _kv_columns(row, self.kv_probe_summary)
        return row


def _kv_columns(row: dict, summary: dict | None) -> None:
    """``kv_{group}_{ref}_{split}``: the share of requests whose KV on D differs (KV probe)."""
    for group in ("target", "drafter") if summary else ():
        for ref, splits in summary[group].items():
            for split, v in splits.items():
                row[f"kv_{group}_{ref}_{split}"] = v["share"]


def _interval_columns(row: dict, side: str, s: dict) -> None:
    """``{side}_pos{i}_ci95_low/high`` and ``{side}_acceptance_length_ci95_low/high``."""
    for i, ci in enumerate(s.get("per_position_ci95") or []):
        row[f"{side}_pos{i}_ci95_low"], row[f"{side}_pos{i}_ci95_high"] = ci or (None, None)
    ci = s.get("acceptance_length_ci95")
    if "acceptance_length_ci95" in s:
        low, high = ci or (None, None)
        row[f"{side}_acceptance_length_ci95_low"] = low
        row[f"{side}_acceptance_length_ci95_high"] = high


def _effect_columns(row: dict, effect: dict | None) -> None:
    """``effect_pos{i}_diff``, ``..._ci95_low/high``, ``..._verdict`` (raw rates), and the
    same with ``effect_without_extra_drafts_`` for the rates without D's extra drafts."""
    if not effect:
        return
    for prefix, part in (("effect", effect), ("effect_without_extra_drafts",
                                              effect.get("without_extra_drafts") or {}),
                         ("effect_headline", effect.get("headline") or {})):
        cis = part.get("per_position_diff_ci95") or []
        for i, diff in enumerate(part.get("per_position_diff") or []):
            row[f"{prefix}_pos{i}_diff"] = diff
            row[f"{prefix}_pos{i}_diff_ci95_low"], row[f"{prefix}_pos{i}_diff_ci95_high"] = (
                cis[i] if i < len(cis) and cis[i] else (None, None))
            row[f"{prefix}_pos{i}_verdict"] = part["verdict"][i]


def knobs_in_force(knobs: dict[str, Any]) -> dict[str, str]:
    """One value per knob, read back from the role it acts on (P-only knobs from P: D always
    reports its own untouched hand-off), client-side knobs from the request."""
    out = {}
    for name, k in knob_spec.KNOBS.items():
        if k.client_side:
            value = (knobs.get("client") or knobs.get("requested") or {}).get(name)
        else:
            value = (knobs.get(k.read_back_role) or {}).get(name)
            if value is None:
                value = (knobs.get("p") or {}).get(name)
        if value is not None:
            out[name] = value
    return out


def runner_in_force(knobs: dict[str, Any]) -> str | None:
    """The model runner the workers reported (their state files' ``runner``), one value when
    every role agrees, else the sorted values joined; None when no worker reported."""
    seen = set()
    for detail in (knobs.get("detail") or {}).values():
        worker = ((detail or {}).get("components") or {}).get("worker")
        for st in worker if isinstance(worker, list) else [worker]:
            if isinstance(st, dict) and st.get("runner"):
                seen.add(st["runner"])
    return ",".join(sorted(seen)) or None


def runner_by_role(knobs: dict[str, Any]) -> dict[str, str] | None:
    """Per role, the ``runner`` its workers read back (None when no role reported one)."""
    out = {role: knobs[role]["runner"] for role in ("p", "d", "baseline")
           if isinstance(knobs.get(role), dict) and knobs[role].get("runner")}
    return out or None


def first_diff(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


BOOTSTRAP_SEED = 0  # fixed: the same result.json gives the same intervals
PER_REQUEST = {"baseline": "baseline", "d": "pd", "p": "p_spec"}  # server -> its row counts


def aggregate(result: Result, rows: list[dict]) -> None:
    """Sum the request rows into the result's sides (with bootstrap intervals), check them
    against the servers' ``/metrics`` deltas, and compare PD with the baseline request by
    request."""
    crosscheck(result)
    for side in ("baseline", "pd"):
        have = [r for r in rows if side in r]
        if have:
            setattr(result, side, side_summary(have, side, result.measurement))
    both = [r for r in rows if "pd_tokens" in r and "baseline_tokens" in r
            and "pd" in r and "baseline" in r]
    for r in both:
        d = first_diff(r["pd_tokens"], r["baseline_tokens"])
        r["agree"], r["first_diff"] = d is None, d
        r["extra_pd_drafts"] = r["pd"]["num_drafts"] - r["baseline"]["num_drafts"]
        r["padded_load_step"] = is_padded_load_step(r)
    if both:
        result.token_agreement = sum(r["agree"] for r in both) / len(both)
        add_extra_drafts(result, both)
        result.effect = effect(both)
    result.bottom_line = bottom_line(result)


def side_summary(rows: list[dict], side: str, measurement: dict) -> dict:
    """One side's counters summed over its requests, with 95% intervals; prefix-cache
    counters from the ``/metrics`` delta when the counts came from the responses (None when
    the side stopped before its delta was read: a failed run)."""
    summary = metrics.total([r[side] for r in rows]).summary()
    summary["num_requests"] = len(rows)
    phase = (measurement.get("sides") or {}).get(side) or {}
    if phase.get("source") == "per-request":
        server = phase["servers"].get({"pd": "d"}.get(side, side)) or {}
        for k in ("prefix_cache_queries", "prefix_cache_hits"):
            summary[k] = (server.get("metrics_delta") or {}).get(k)
    summary.update(stats.side_intervals(*_arrays(rows, side), seed=BOOTSTRAP_SEED))
    return summary


def _arrays(rows: list[dict], side: str, minus: list[int] | None = None):
    """(drafts, accepted per position, accepted) arrays of one side, one row per request."""
    drafts = np.array([r[side]["num_drafts"] for r in rows], dtype=float)
    if minus is not None:
        drafts = drafts - np.array(minus, dtype=float)
    per_pos = np.array([r[side]["accepted_per_pos"] for r in rows], dtype=float)
    return drafts, per_pos, np.array([r[side]["num_accepted"] for r in rows], dtype=float)


def effect(both: list[dict]) -> dict[str, Any]:
    """PD minus the baseline per position, paired by request, with intervals and verdicts;
    on vLLM's raw rates, without D's padded load step where a request has it
    (``without_extra_drafts``), and the ``headline``: the verdict with that known finding set
    aside, said in words beside the raw one."""
    base_d, base_a, _ = _arrays(both, "baseline")
    base_rates = metrics.total([r["baseline"] for r in both]).summary()["per_position"]
    out: dict[str, Any] = {}
    for name, minus in (("raw", None), ("without_extra_drafts",
                                         [int(r["padded_load_step"]) for r in both])):
        pd_d, pd_a, _ = _arrays(both, "pd", minus)
        diff, ci = stats.paired_diff(pd_d, pd_a, base_d, base_a, seed=BOOTSTRAP_SEED)
        part = {"per_position_diff": diff, "per_position_diff_ci95": ci,
                "verdict": stats.verdict(ci, base_rates)}
        if name == "raw":
            out.update(part)
        else:
            out[name] = part
    out["headline"] = headline(out, sum(r["padded_load_step"] for r in both))
    return out


PADDING_WORDS = "D's padded load step (known vLLM behaviour, finding padded-load-step)"


def headline(eff: dict[str, Any], padded: int) -> dict[str, Any]:
    """The verdict a reader should take per position: against the baseline with the known
    findings attributed (today: D's padded load step, where a request has it), and in words
    with the raw verdict beside it."""
    part = eff["without_extra_drafts"] if padded else eff
    says = []
    for v, raw in zip(part["verdict"], eff["verdict"], strict=True):
        if not padded:
            says.append(f"{v} (raw: no request has D's padded load step to set aside)")
        elif v == raw:
            says.append(f"{v}, with or without {PADDING_WORDS}")
        else:
            says.append(f"{v}, once {PADDING_WORDS} is set aside; raw: {raw}")
    return {"verdict": list(part["verdict"]), "raw_verdict": list(eff["verdict"]),
            "per_position_diff": part["per_position_diff"],
            "per_position_diff_ci95": part["per_position_diff_ci95"],
            "attributed": ["padded-load-step"] if padded else [],
            "padded_requests": padded, "says": says}


def crosscheck(result: Result) -> None:
    """Per-request sums against each server's ``/metrics`` delta, per side measured from the
    responses: ``crosscheck`` is True when every count matches on every server."""
    m = result.measurement
    worst, checked = 0, False
    for side, phase in (m.get("sides") or {}).items():
        if phase.get("source") != "per-request":
            continue
        rows = [r for r in result.requests if side in r]
        for role, srv in phase["servers"].items():
            srv["mismatch"] = metrics.mismatch(_server_counts(rows, role), srv["metrics_delta"])
            worst, checked = max(worst, srv["mismatch"]), True
    sources = {p.get("source") for p in (m.get("sides") or {}).values()}
    m["source"] = "per-request" if sources == {"per-request"} else "metrics-scrape"
    scraped = [s for s, p in (m.get("sides") or {}).items() if p.get("source") != "per-request"]
    if scraped and not any("one at a time" in n for n in result.notes):
        result.notes.append(
            f"{' and '.join(scraped)}: the server's responses carry no per-request spec-decode "
            "metrics (started without --per-request-spec-decode-metrics detailed), so those "
            "requests went one at a time with a /metrics scrape before and after each")
    m["crosscheck"] = (worst == 0) if checked else None
    m["crosscheck_mismatch"] = worst if checked else None


def _server_counts(rows: list[dict], role: str) -> list[dict]:
    key = PER_REQUEST[role]
    if role != "p":
        return [r[key] for r in rows]
    return [metrics.counts_from_steps(r[key]) for r in rows if r.get(key)]


def is_padded_load_step(r: dict) -> bool:
    """Whether a request's draft difference is D's padded load step (finding
    ``padded-load-step``): D's tokens equal the baseline's and D has exactly one draft more,
    all rejected, at its first step. Anywhere else the difference is the request's own, and so
    where D's per-step counts are unknown (a ``/metrics`` scrape): nothing is guessed."""
    steps = (r.get("pd_spec") or {}).get("per_step_accepted") or []
    return bool(r["agree"]) and r["extra_pd_drafts"] == 1 and steps[:1] == [0]


def add_extra_drafts(result: Result, both: list[dict]) -> None:
    """D counts one draft more per request than the baseline (its first decode step after
    the KV load verifies a draft, and every token of it is rejected; measured: with
    max_tokens=1 D counts 1 draft, the baseline 0). The scheduler's ``pad_spec_decode`` makes
    it: with that padding off, D counts the baseline's drafts exactly
    (test_extra_draft_on_d_is_the_schedulers_spec_decode_padding). Report the rates without
    the drafts of the requests where it is that padding (``is_padded_load_step``) next to
    vLLM's raw rates, so a reader can tell this accounting from lost acceptance; where D's
    output parted from the baseline's, the draft difference is the request's own."""
    extra = sum(r["extra_pd_drafts"] for r in both)
    padded = sum(r["padded_load_step"] for r in both)
    pd_ = result.pd
    pd_["extra_drafts_vs_baseline"] = extra
    pd_["padded_load_step_drafts"] = padded
    denom = pd_["num_drafts"] - padded
    pd_["per_position_without_extra_drafts"] = (
        [a / denom for a in pd_["accepted_per_pos"]] if denom > 0 else None)
    if padded:
        own = [r["id"] for r in both if r["extra_pd_drafts"] and not r["padded_load_step"]]
        result.notes.append(
            f"D counted {extra} more drafts than the baseline over {len(both)} requests; "
            f"{padded} of them are D's padded load step (known vLLM behaviour, finding "
            "padded-load-step: vLLM's Scheduler pads D's first step after the KV load with "
            "num_spec_tokens placeholder drafts, all rejected and counted as a draft; one per "
            "request whose tokens equal the baseline's), which lowers vLLM's per-position "
            f"rates on D by {padded}/{pd_['num_drafts']} relative. "
            "'per_position_without_extra_drafts' and the headline verdict set those aside"
            + (f"; the draft difference of {len(own)} request(s) whose output or counts "
               f"differ otherwise ({', '.join(map(str, own[:4]))}) is their own"
               if own else "")
            + "; the knob load_step=gated-async removes the padding itself.")


def append_to_store(result: Result, store: str | Path) -> Path:
    """Append one row per run to a CSV results store (created with a header on first use).

    Under a lock (``rundir.file_lock``), so writers in several processes keep every row. A
    row whose columns the header has is a real append (the file is never rewritten and never
    seen half-written by a reader of the rows before it); a row with new columns rewrites the
    store atomically with the widened header."""
    store = Path(store)
    row = pd.DataFrame([result.summary_row()])
    with rundir.file_lock(store):
        header = _store_header(store)
        if header is None:
            with atomic_path(store) as tmp:
                row.to_csv(tmp, index=False)
        elif set(row.columns) <= set(header):
            text = row.reindex(columns=header).to_csv(index=False, header=False)
            fd = rundir.open_append(store, 0o644)
            with os.fdopen(fd, "a") as f:
                f.write(text)
        else:
            table = pd.concat([pd.read_csv(store), row], ignore_index=True)
            with atomic_path(store) as tmp:
                table.to_csv(tmp, index=False)
    return store


def _store_header(store: Path) -> list[str] | None:
    """The store's columns, or None when it does not exist yet (or is empty)."""
    try:
        with store.open(newline="") as f:
            first = next(csv.reader(f), None)
    except FileNotFoundError:
        return None
    return first or None
