"""What one run tells its user, as the lines ``run`` prints: did the bug show? The first is
the bottom line (``bottom_line``, also in ``result.json``).

Per position: both sides' rates, D minus the baseline paired by request with its 95%
interval, and the headline verdict (known findings attributed, the raw verdict beside it);
token agreement with how many requests diverged and where first; and, when no interval can
decide, how many prompts a decision needs at the spread this run measured.
"""

from __future__ import annotations

import math
from typing import Any

from .stats import INCONCLUSIVE, TOLERANCE


def bottom_line(result: Any) -> str | None:
    """The run's answer in one line: token agreement (by affected / unaffected request where
    the prompt set is built that way), then per position the headline verdict, which rate it
    is about, its n and how many prompts would decide an inconclusive one."""
    parts = [p for p in (tokens_part(result), acceptance_part(result)) if p]
    return "; ".join(parts) or None


def tokens_part(result: Any) -> str | None:
    both = [r for r in result.requests if r.get("agree") is not None]
    if not both:
        return None
    off = [r for r in both if not r["agree"]]
    groups = {a: [r for r in both if bool(r.get("affected")) is a] for a in (True, False)}
    if result.prompt_set == "badcase" and all(groups.values()):
        hit = {a: sum(not r["agree"] for r in g) for a, g in groups.items()}
        head = "bug visible" if hit[True] and not hit[False] else (
            "tokens differ" if off else "no token differs")
        return (f"{head}: {hit[True]} of {len(groups[True])} affected requests diverged, "
                f"{hit[False]} of {len(groups[False])} unaffected")
    if not off:
        return f"no token differs: all {len(both)} requests equal the baseline's"
    return f"tokens differ: {len(off)} of {len(both)} requests diverged from the baseline"


def acceptance_part(result: Any) -> str | None:
    head = (result.effect or {}).get("headline")
    if not head or not result.baseline:
        return None
    which = ("D's padded load step set aside" if head["attributed"] else "raw rates")
    n = result.num_prompts
    said = []
    for i, v in enumerate(head["verdict"]):
        need = (prompts_needed(head["per_position_diff"][i], head["per_position_diff_ci95"][i],
                               result.baseline["per_position"][i], n)
                if v == INCONCLUSIVE else None)
        said.append(f"{i} {v}" + (f" (~{need} prompts would decide)" if need else ""))
    return f"acceptance vs baseline ({which}, n={n}): position " + ", ".join(said)


def report(result: Any, verbose: bool = False) -> str:
    """What ``run`` prints and the notebook shows: the bottom line first, then the detail;
    each note in its first sentence unless ``verbose`` (``result.json`` keeps them whole)."""
    notes = [n if verbose else first_sentence(n) for n in result.notes]
    head = [f"bottom line: {result.bottom_line}"] if result.bottom_line else []
    return "\n".join([*head, *lines(result), *(f"note: {n}" for n in notes)])


def lines(result: Any) -> list[str]:
    out = [runner_line(result.runner)] if getattr(result, "runner", None) else []
    out += [side_line(side, getattr(result, side)) for side in ("baseline", "pd")
            if getattr(result, side)]
    eff = result.effect or {}
    head = eff.get("headline")
    if head and result.pd and result.baseline:
        out += position_lines(result.pd, result.baseline, head)
    if result.token_agreement is not None:
        out.append(agreement_line(result))
    if head and all(v == INCONCLUSIVE for v in head["verdict"]):
        out.append(too_small_line(head, result.baseline, result.num_prompts))
    return out


def runner_line(by_role: dict[str, str]) -> str:
    """The model runner each role's workers built (the knob ``runner``, read back)."""
    return "  runner: " + ", ".join(f"{role} {r}" for role, r in by_role.items()) + (
        " (read back from the workers)")


def side_line(side: str, s: dict) -> str:
    rates = " / ".join(f"{r:.3f}" for r in s["per_position"])
    return (f"{side:>8}: raw per position {rates}  acceptance length "
            f"{s['acceptance_length']:.3f}"
            f"  drafts {s['num_drafts']} ({s.get('num_requests')} requests)")


def position_lines(pd_: dict, base: dict, head: dict) -> list[str]:
    out = []
    shown = (pd_.get("per_position_without_extra_drafts") if head["attributed"]
             else None) or pd_["per_position"]
    for i, (diff, ci, says) in enumerate(zip(head["per_position_diff"],
                                             head["per_position_diff_ci95"], head["says"],
                                             strict=True)):
        interval = f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "[no interval]"
        which = "padded step set aside" if head["attributed"] else "raw"
        out.append(f"position {i} ({which}): D {shown[i]:.3f} vs baseline "
                   f"{base['per_position'][i]:.3f}, "
                   f"D - baseline {_num(diff)} {interval} (95%, paired) -> {says}")
    return out


def agreement_line(result: Any) -> str:
    both = [r for r in result.requests if r.get("agree") is not None]
    diverged = [r for r in both if not r["agree"]]
    line = f"token agreement: {result.token_agreement:.3f} ("
    if not diverged:
        return line + f"all {len(both)} requests equal, token for token)"
    first = min(diverged, key=lambda r: r.get("first_diff") or 0)
    return line + (f"{len(diverged)} of {len(both)} requests diverged; the earliest at token "
                   f"{first.get('first_diff')} of request {first.get('id')})")


def too_small_line(head: dict, base: dict, n: int) -> str:
    """Every verdict inconclusive: how many prompts would let position 0's interval clear
    the 5% band's edge, at this run's spread (intervals narrow as 1/sqrt(n))."""
    need = prompts_needed(head["per_position_diff"][0], head["per_position_diff_ci95"][0],
                          base["per_position"][0], n)
    tail = (f"position 0 needs about {need} prompts at the spread measured here"
            if need else "at this difference no prompt count decides (it sits on the band's "
            "edge)")
    return (f"too small to decide: every position is inconclusive with {n} prompts "
            f"(an interval straddles the {TOLERANCE:.0%} band's edge); {tail}")


def prompts_needed(diff: float | None, ci: list[float] | None, base_rate: float,
                   n: int) -> int | None:
    """Prompts for the interval's half-width to fit between ``diff`` and the band's edge."""
    if diff is None or not ci or not base_rate:
        return None
    half, margin = (ci[1] - ci[0]) / 2, abs(abs(diff) - TOLERANCE * base_rate)
    if margin <= 0 or half <= 0:
        return None
    return max(n + 1, math.ceil(n * (half / margin) ** 2))


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.3f}"


def first_sentence(note: str) -> str:
    """A note up to its first full stop (the rest: ``--verbose`` and ``result.json``)."""
    cut = note.find(". ")
    return note if cut < 0 else note[:cut + 1] + " (more: --verbose)"
