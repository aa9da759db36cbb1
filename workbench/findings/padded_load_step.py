"""D's padded load step: one all-rejected draft per request more than the baseline."""

from __future__ import annotations

from .finding import ABSENT, INCONCLUSIVE, PRESENT, Detection, Finding, rows


def detect(result: dict) -> Detection:
    """Per request whose tokens equal the baseline's, D's drafts minus the baseline's
    (``extra_pd_drafts``) and what D accepted at its first verify step: one extra draft, all
    rejected, in every such request is ``present``; none in any is ``absent``."""
    counted = rows(result, "extra_pd_drafts")
    # Draft counts compare only where D's tokens are the baseline's: another output drafts
    # otherwise for its own reasons (another finding's request, on an old release).
    both = [r for r in counted if r.get("agree", True)]
    extra = [r["extra_pd_drafts"] for r in both]
    first = [((r.get("pd_spec") or {}).get("per_step_accepted") or [None])[0] for r in both]
    evidence = {"requests": len(both), "requests_with_one_extra_draft": extra.count(1),
                "extra_drafts": sum(extra), "d_first_step_accepted_zero": first.count(0),
                "token_agreement": result.get("token_agreement")}
    if len(both) < len(counted):
        evidence["requests_whose_tokens_differ"] = len(counted) - len(both)
    if both and all(a is None for a in first):
        # No per-step counts (a release before --per-request-spec-decode-metrics, counted by
        # /metrics scrapes): the extra draft was all rejected iff D accepted, per position,
        # exactly what the baseline did.
        rejected = [r["pd"]["accepted_per_pos"] == r["baseline"]["accepted_per_pos"]
                    for r in both]
        evidence["d_accepted_as_baseline"] = sum(rejected)
    else:
        rejected = [a == 0 for a in first]
    if both and all(e == 1 for e in extra) and all(rejected):
        return PRESENT, evidence
    if both and all(e == 0 for e in extra):
        return ABSENT, evidence
    return INCONCLUSIVE, evidence


FINDING = Finding(
    id="padded-load-step",
    severity="metrics only (the counters; tokens and real acceptance unchanged)",
    title="D counts one all-rejected draft per request more than a standalone server",
    where="vllm/v1/core/sched/scheduler.py, Scheduler.schedule: pad_spec_decode pads the first "
    "step after NIXL's asynchronous load lands (Scheduler._update_waiting_for_remote_kv leaves "
    "num_computed_tokens = num_tokens - 1) to 1 + num_spec_tokens rows of placeholder drafts",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain"},
    detect=detect,
    positive=None,
    negative={"knobs": {"load_step": "gated-async"}},
    also={"load_step=gated (vLLM PR #50173 as written)": {"knobs": {"load_step": "gated"}}},
    measured=("D's drafts minus the baseline's, per request, from each response's "
              "metrics.speculative_decoding (per-request counts, cross-checked against "
              "/metrics)", "D's accepted tokens at its first verify step (per_step_accepted)",
              "the same counts with load_step=gated-async and load_step=gated"),
    inferred=("the extra draft is Scheduler.schedule's pad_spec_decode on the first step after "
              "the asynchronous load (read in the source; the gated-async knob removes exactly "
              "that padding and the extra draft with it)",
              "vLLM PR #50173's gate tests a synchronous external hit, which NIXL never reports "
              "(get_num_new_matched_tokens returns load_kv_async=True for remote prefill)"),
    fix="patches/vllm-0.32.0/padded-load-step.patch",
    figure="extra_drafts",  # its evidence: one draft more per request, not a set-aside rate
    explains=("drafts",),  # one draft more; tokens and accepted counts unchanged
)
