"""The exact oracle, per request: D against the baseline, and two baseline runs against each
other (what differs between those is noise, never a bug).

The differences (``finding.DIFFERENCES``): ``tokens`` (D's greedy tokens), ``drafts`` (D's
draft and draft-token counts), ``accepts`` (accepted counts per position), ``kv_vs_p``
(every position D loaded against P's, every layer) and ``kv_vs_baseline`` (every prompt
position against the baseline's). Each KV difference carries the layer groups it touched, so
that a drafter-only difference and a target one are different signatures.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ..measuring import kv_compare

COUNTS = ("num_drafts", "num_draft_tokens", "accepted_per_pos")
SAME, NOISE, EXPLAINED, UNEXPLAINED, ERROR = "same", "noise", "explained", "unexplained", "error"
CRASH = "crash"  # vLLM failed the trial: a server died, an HTTP error, a timeout (``crash``)
# A comparison the trial needed but could not make (a side's counts, the probe's record or a
# capture missing): never read as "same".
UNMEASURED = "unmeasured"


def counts_differ(a: dict | None, b: dict | None) -> set[str]:
    """``drafts`` / ``accepts`` between two sides' per-request counts."""
    if a is None or b is None:
        return set()
    out = set()
    if (a["num_drafts"], a["num_draft_tokens"]) != (b["num_drafts"], b["num_draft_tokens"]):
        out.add("drafts")
    if a["accepted_per_pos"] != b["accepted_per_pos"]:
        out.add("accepts")
    return out


def kv_kinds(probe: dict | None) -> dict[str, list[str]]:
    """The KV differences of one request's probe record: kind -> layer groups."""
    out: dict[str, list[str]] = {}
    for kind, ref in (("kv_vs_p", "vs_p"), ("kv_vs_baseline", "vs_baseline")):
        cmp = (probe or {}).get(ref) or {}
        if cmp and not cmp.get("identical") and not cmp.get("missing"):
            out[kind] = sorted(cmp.get("groups_differing") or [])
    return out


def unmeasured(row: dict, probe_errors: list[str] = ()) -> dict[str, str]:
    """What of one request could not be compared, kind -> why: D's or the baseline's counts,
    the KV probe's record, or one of its two comparisons (a capture missing). A probe that
    failed anywhere in the run (``probe_errors``: a capture or a step hook raised) leaves
    every request's KV unmeasured: the step it failed in may have been this request's."""
    out = {}
    if probe_errors:
        out["kv_probe_errors"] = "; ".join(sorted(set(probe_errors)))[:500]
    gone = [side for side in ("pd", "baseline") if row.get(side) is None]
    if gone:
        out["counts"] = f"no per-request counts from {' and '.join(gone)}"
    probe = row.get("kv_probe")
    if probe is None:
        out["kv"] = "no KV probe record for this request"
        return out
    for kind, ref in (("kv_vs_p", "vs_p"), ("kv_vs_baseline", "vs_baseline")):
        cmp = probe.get(ref)
        if not cmp:
            out[kind] = f"the probe made no {ref} comparison"
        elif cmp.get("missing"):
            out[kind] = f"a capture is missing: {cmp['missing']}"
    return out


def differences(row: dict) -> dict[str, Any]:
    """What differs in one judged request: kind -> detail (first differing token, groups)."""
    out: dict[str, Any] = {}
    if row.get("pd_tokens") != row.get("baseline_tokens"):
        out["tokens"] = {"first_diff": row.get("first_diff")}
    for kind in counts_differ(row.get("pd"), row.get("baseline")):
        out[kind] = {side: {k: row[side][k] for k in COUNTS} for side in ("pd", "baseline")}
    for kind, groups in kv_kinds(row.get("kv_probe")).items():
        out[kind] = {"groups": groups}
    return out


def noise(a: dict, b: dict, kv_a: dict | None, kv_b: dict | None) -> set[str]:
    """What differs between the two baseline runs of one request (``kv_a`` / ``kv_b``: the
    baseline's probe records of the prompt): tokens, counts, KV. A KV difference there makes
    D's ``kv_vs_baseline`` noise too."""
    out = counts_differ(a.get("baseline"), b.get("baseline"))
    if a.get("baseline_tokens") != b.get("baseline_tokens"):
        out.add("tokens")
    if kv_a is not None and kv_b is not None and not kv_compare.compare(kv_b, kv_a)["identical"]:
        out.add("kv_vs_baseline")
    return out


@dataclass
class Judged:
    """One request's verdict: what differs, what is noise, what each finding explains, and
    what is left (``unexplained``: kind -> detail)."""

    id: str
    verdict: str
    differences: dict[str, Any] = field(default_factory=dict)
    noise: list[str] = field(default_factory=list)
    explained: dict[str, list[str]] = field(default_factory=dict)  # finding -> kinds
    unexplained: dict[str, Any] = field(default_factory=dict)
    aborted: str | None = None
    unmeasured: dict[str, str] = field(default_factory=dict)  # kind -> why not compared


def judge(row: dict, noisy: set[str], explains: dict[str, tuple[str, ...]],
          probe_errors: list[str] = ()) -> Judged:
    """``explains``: each finding present in this request and the kinds it accounts for;
    ``probe_errors``: the KV probe's own failures in the run (``unmeasured``)."""
    diff = differences(row)
    real = {k: v for k, v in diff.items() if k not in noisy}
    explained = {f: sorted(set(real) & set(kinds)) for f, kinds in explains.items()}
    explained = {f: ks for f, ks in explained.items() if ks}
    covered = {k for ks in explained.values() for k in ks}
    left = {k: v for k, v in real.items() if k not in covered}
    gaps = unmeasured(row, probe_errors)
    verdict = (UNEXPLAINED if left else UNMEASURED if gaps else EXPLAINED if explained else
               NOISE if diff else SAME)
    return Judged(row["id"], verdict, diff, sorted(set(diff) & noisy), explained, left,
                  unmeasured=gaps)


# The most upstream difference names a request's failure: KV that D loaded unlike P's comes
# before KV that P computed unlike the baseline, which comes before what decoding showed.
ROOTS = ("kv_vs_p", "kv_vs_baseline", "tokens", "accepts", "drafts")


def signature(j: Judged) -> str | None:
    """One request's unexplained difference as a stable name: its most upstream kind and its
    detail (``detail``): ``kv_vs_p:drafter+target``, ``tokens:first``, ``accepts:more``. Two
    requests that differ the same way, whatever followed from it downstream, count as one
    failure."""
    root = next((k for k in ROOTS if k in j.unexplained), None)
    if root is None:
        return None
    more = detail(root, j.unexplained[root] or {})
    return f"{root}:{more}" if more else root


def detail(kind: str, d: dict) -> str | None:
    """What sets apart two differences of one kind: the KV layer groups touched, whether the
    tokens differ from the first one (P's token, or D's first step) or later, and which way
    D's counts went against the baseline's (``more``, ``fewer``, ``mixed`` by position)."""
    if kind.startswith("kv"):
        return "+".join(d.get("groups") or []) or None
    if kind == "tokens":
        at = d.get("first_diff")
        return None if at is None else "first" if at == 0 else "later"
    if "pd" not in d or "baseline" not in d:
        return None
    keys = ("accepted_per_pos",) if kind == "accepts" else ("num_drafts", "num_draft_tokens")
    a = [x for k in keys for x in _listed(d["pd"][k])]
    b = [x for k in keys for x in _listed(d["baseline"][k])]
    steps = [x - y for x, y in itertools.zip_longest(a, b, fillvalue=0)]
    return ("more" if all(x >= 0 for x in steps) else "fewer" if all(x <= 0 for x in steps)
            else "mixed")


def _listed(v: Any) -> list:
    return list(v) if isinstance(v, list | tuple) else [v]


def signatures(judged: list[Judged]) -> list[str]:
    """A trial's failure signatures, one per distinct request signature, sorted."""
    return sorted({s for j in judged if (s := signature(j))})


def trial_verdict(judged: list[Judged]) -> str:
    """The worst request's verdict (unexplained > unmeasured > explained > noise > same)."""
    order = (UNEXPLAINED, UNMEASURED, EXPLAINED, NOISE, SAME)
    return next((v for v in order if any(j.verdict == v for j in judged)), SAME)

