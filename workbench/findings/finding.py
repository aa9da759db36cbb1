"""One finding: what vLLM does and where, the experiment that shows it, and its detector.

A detector is a function of one run's ``result.json`` (as a dict) that answers ``present``,
``absent`` or ``inconclusive`` with the numbers it looked at. Controls prove it can see both
answers: under the positive control it must say ``present``, under the negative one
``absent``; a control that does not behave makes the verdict ``detector-broken``, and one
whose run failed makes it ``inconclusive`` (a server failure says nothing of the detector). A
control given as None is the finding's own run (no knob re-creates the bug independently of
the build): it proves nothing, and is shown as ``own run``, never ``ok``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..measuring.kv_compare import expand
from ..measuring.results import first_diff

PRESENT, ABSENT, INCONCLUSIVE = "present", "absent", "inconclusive"
BROKEN, NOT_APPLICABLE = "detector-broken", "not-applicable"
# A run the verdict needed did not finish (a server died, a request failed): no measurement,
# so no expectation of ``inconclusive`` may pass it; only one that names the failure does.
FAILED = "run-failed"
VERDICTS = (PRESENT, ABSENT, INCONCLUSIVE, BROKEN, NOT_APPLICABLE, FAILED)
# A control's status, as check.json, the table, JUnit and the reports show it.
CONTROL_OK, CONTROL_BAD, OWN_RUN, RUN_FAILED = "ok", "BAD", "own run", "run failed"

Detection = tuple[str, dict[str, Any]]  # (verdict, evidence)
# The differences the fuzz oracle tells apart, per request (``fuzz/oracle.py``): D's greedy
# tokens, its draft counts, its accepted counts per position, its KV against P's and against
# the baseline's.
DIFFERENCES = ("tokens", "drafts", "accepts", "kv_vs_p", "kv_vs_baseline")
Detector = Callable[[dict[str, Any]], Detection]
# Where a finding lets one request's KV differ, as its preconditions in that request predict
# it: "vs_p:drafter" / "vs_baseline:target" ... -> prompt positions. Several findings can hit
# one request (P's chunks, a host buffer and a shared prefix at once); the fuzz oracle
# explains the request's KV only where the union of their claims covers every differing
# position (``fuzz/attribute.composed``). An upper bound, never a detection.
Claims = dict[str, set[int]]
Claimer = Callable[[dict[str, Any], dict[str, Any]], Claims]  # (result, row) -> claims


@dataclass(frozen=True)
class Finding:
    """A known acceptance bug (or a regression that must stay away), as a re-runnable check.

    ``experiment``: ``ExperimentConfig`` fields over the check's base (knobs at their
    as-released values: vLLM untouched). ``positive`` / ``negative`` / each of ``also``:
    overrides of it (fields, and ``knobs``). ``profiles`` and ``connectors``: the profiles
    and KV connectors it applies to (empty: all). ``measured`` / ``inferred``: the statements
    a report makes, split by how they are known. ``fix``: a patch against the release
    (``patches/vllm-<release>/<id>.patch``)."""

    id: str
    title: str
    where: str
    found_on: str
    experiment: dict[str, Any]
    detect: Detector
    positive: dict[str, Any] | None
    negative: dict[str, Any] | None
    also: dict[str, dict[str, Any]] = field(default_factory=dict)
    profiles: tuple[str, ...] = ()
    connectors: tuple[str, ...] = ()  # the values of knob ``connector`` it applies to (all)
    measured: tuple[str, ...] = ()
    inferred: tuple[str, ...] = ()
    fix: str | None = None
    figure: str = "per_position"  # or "kv_probe", "extra_drafts": what a report draws
    # The negative control read another way from its run (the same run, when ``negative`` is
    # empty): the CPU forward thread after the profile's restore.
    negative_detect: Detector | None = None
    # What the detector reads; ``standalone``: whether a script with vLLM alone shows it too
    # (the per-request spec-decode counts do; the KV probe and thread affinities need the
    # plugin inside vLLM's processes).
    reads: str = "each response's metrics.speculative_decoding"
    standalone: bool = True
    # A prompt length that takes D's engine down (a finding's loud half): the standalone
    # script sends one such prompt after the run's, and says whether D failed on it. 0: none.
    loud_prompt_tokens: int = 0
    # What it costs a user, in a report's words: "changes tokens", "acceptance only" (the
    # drafter's KV), "metrics only" (the counters), "performance only" (where work runs).
    severity: str = ""
    # A native run of an old release (``releases --check``, the plugin observe-only): the
    # observe-only instrument that feeds the detector where the release's source allows it
    # ("affinity": ``cpu_pin.observe``; the KV probe: any run with ``kv_probe``), and the
    # controls such a run cannot make, with why.
    observes: str | None = None
    native_not_run: dict[str, str] = field(default_factory=dict)
    # What the standalone reproduction's last line reports: "drafts" (D's drafts minus the
    # baseline's), "tokens" (requests whose tokens differ) or "inside" (read in vLLM's
    # processes only: the script shows the acceptance side and says so).
    symptom: str = "drafts"
    # The fuzz oracle's differences (``DIFFERENCES``) this finding accounts for in a request
    # where its detector says present: the padded load step adds a draft and nothing else.
    # None unless named: a finding that explains everything says so (``DIFFERENCES``).
    explains: tuple[str, ...] = ()
    claims: Claimer | None = None  # per position, for a request several findings hit


def control_status(control: dict) -> str:
    """``ok``, ``BAD``, ``own run`` or ``run failed`` (older records: from ``ok``)."""
    if "status" in control:
        return control["status"]
    return OWN_RUN if control.get("run") == "main" else {
        True: CONTROL_OK, False: CONTROL_BAD, None: RUN_FAILED}[control.get("ok")]


def controls_line(controls: dict[str, dict]) -> str:
    """``positive own run, negative ok``: each control by what it is."""
    return ", ".join(f"{w} {control_status(c)}" for w, c in controls.items()) or "-"


# What a finding read from the KV probe declares: its figure, what it reads, and that vLLM
# alone (a standalone script) cannot read it.
KV_PROBE_READER: dict[str, Any] = {
    "figure": "kv_probe", "standalone": False,
    "reads": "the KV probe (digests of every KV layer per request, taken in vLLM's workers)"}


def rows(result: dict[str, Any], *keys: str) -> list[dict[str, Any]]:
    """The request rows that carry every one of ``keys``."""
    return [r for r in result.get("requests") or [] if all(r.get(k) is not None for k in keys)]


def kv_probed(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each probed request's KV probe record, with its prompt length beside it."""
    return [{**r["kv_probe"], "prompt_len": r.get("prompt_len")} for r in rows(result, "kv_probe")]


def differing(cmp: dict[str, Any]) -> dict[str, set[int]]:
    """A KV comparison's differing positions, per layer, as sets."""
    return {layer: set(expand(runs)) for layer, runs in
            (cmp.get("positions_differing") or {}).items()}


def shared(a: list[int], b: list[int]) -> int:
    """How many leading tokens two prompts share."""
    d = first_diff(a, b)
    return min(len(a), len(b)) if d is None else d


def p_prefill(row: dict[str, Any]) -> tuple[int, list[int]]:
    """Where P's prefill of ``row`` began (its prefix-cache hit) and its chunks, as the KV
    probe measured them (the start from the chunks where the record predates it)."""
    pr = row.get("kv_probe") or {}
    chunks = (pr.get("prefill_chunks") or {}).get("p") or []
    start = (pr.get("prefill_p") or {}).get("start")
    return (max(0, (row.get("prompt_len") or 0) - sum(chunks)) if start is None else start,
            chunks)


def observed(row: dict[str, Any], cmp: str) -> dict[str, set[int]]:
    """One request's differing positions in ``cmp`` ("vs_p", "vs_baseline") per layer
    group."""
    pr = row.get("kv_probe") or {}
    out: dict[str, set[int]] = {}
    for layer, ps in differing(pr.get(cmp) or {}).items():
        out.setdefault((pr.get("layers") or {}).get(layer, "target"), set()).update(ps)
    return out


def claim(positions: set[int], groups: tuple[str, ...] = ("target", "drafter"),
          cmps: tuple[str, ...] = ("vs_p", "vs_baseline")) -> Claims:
    return {f"{c}:{g}": set(positions) for c in cmps for g in groups}


@dataclass
class VsP:
    """D's KV against P's per probed request (``vs_p``), against the positions a finding
    predicts from P's measured chunks: how many requests were probed, chunked on P,
    predicted to differ, differ as predicted (``match``), and differ otherwise."""

    probed: int = 0
    chunked: int = 0
    predicted: int = 0
    exact: int = 0
    other: int = 0


def tally_vs_p(result: dict[str, Any], predict: Callable[[list[int], int], set[int]],
               match: Callable[[dict[str, set[int]], dict, set[int], int], bool]) -> VsP:
    """``predict(chunks on P, positions compared)`` gives the positions D should differ at;
    ``match(differing per layer, layers, predicted, positions compared)`` says whether a
    request differs exactly that way."""
    t = VsP()
    for pr in kv_probed(result):
        cmp = pr.get("vs_p") or {}
        chunks = (pr.get("prefill_chunks") or {}).get("p") or []
        n = pr["positions_compared"]
        want = predict(chunks, n)
        t.probed += 1
        t.chunked += len(chunks) > 1
        t.predicted += bool(want)
        if match(differing(cmp), pr.get("layers") or {}, want, n):
            t.exact += 1
        elif not cmp.get("identical"):
            t.other += 1
    return t


def gaps(cmps: list[dict[str, Any]], evidence: dict[str, Any]) -> int:
    """How many of ``cmps`` (KV comparisons a detector needs) were not made (no record, or
    the reference capture ``missing``); where any, ``evidence`` says so. A detector decides
    nothing on them: a missing comparison is not an identical one."""
    n = sum(not c or bool(c.get("missing")) for c in cmps)
    if n:
        evidence["comparisons_missing"] = n
        evidence["why"] = (f"{n} KV comparison(s) this needs could not be made (a capture "
                           "missing on the reference server): no verdict from them")
    return n


def decide(present: bool, absent: bool, evidence: dict[str, Any]) -> Detection:
    """``present`` before ``absent``; neither: ``inconclusive``."""
    return (PRESENT if present else ABSENT if absent else INCONCLUSIVE), evidence
