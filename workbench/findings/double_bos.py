"""A regression that must stay away: prompts sent with two BOS tokens."""

from __future__ import annotations

from .finding import ABSENT, INCONCLUSIVE, PRESENT, Detection, Finding, rows


def detect_double_bos(result: dict) -> Detection:
    """Every prompt sent starts with the same token twice (BOS from the chat template and
    again from the tokenizer): ``present``; none does: ``absent``."""
    firsts = [r["prompt_token_ids"][:2] for r in rows(result, "prompt_token_ids")]
    doubled = sum(len(f) == 2 and f[0] == f[1] for f in firsts)
    evidence = {"prompts": len(firsts), "doubled_first_token": doubled}
    if firsts and doubled == len(firsts):
        return PRESENT, evidence
    return (ABSENT if firsts and not doubled else INCONCLUSIVE), evidence


FINDING = Finding(
    id="double-bos",
    title="Prompts sent with two BOS tokens (chat template plus tokenizer)",
    where="client side: a chat-templated prompt tokenized with add_special_tokens=True; "
    "vLLM's PD acceptance test sends add_special_tokens=false",
    found_on="0.32.0",
    experiment={"prompt_set": "indomain"},
    detect=detect_double_bos,
    positive={"knobs": {"double_bos": "on"}},
    negative=None,
    measured=("the first two token ids of every prompt sent",),
)
