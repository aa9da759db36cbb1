"""Spec-decode counters from a vLLM server's /metrics, their deltas, and the acceptance math.

Definitions follow vLLM's ``vllm/v1/spec_decode/metrics.py``: the per-position rate at i is
accepted_per_pos[i] / num_drafts (position i counts a draft only when drafts 0..i were all
accepted), acceptance length is 1 + accepted / num_drafts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

# Sample names as vLLM exports them (counters carry the _total suffix).
NUM_DRAFTS = "vllm:spec_decode_num_drafts_total"
NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"


@dataclass
class SpecCounters:
    """A snapshot (or a delta) of the spec-decode counters of one server."""

    num_drafts: float = 0.0
    num_draft_tokens: float = 0.0
    num_accepted: float = 0.0
    accepted_per_pos: list[float] = field(default_factory=list)
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    generation_tokens: float = 0.0

    def _combine(self, other: SpecCounters, op) -> SpecCounters:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        a = self.accepted_per_pos + [0.0] * (n - len(self.accepted_per_pos))
        b = other.accepted_per_pos + [0.0] * (n - len(other.accepted_per_pos))
        scalars = ("num_drafts", "num_draft_tokens", "num_accepted", "prefix_queries",
                   "prefix_hits", "generation_tokens")
        return SpecCounters(
            accepted_per_pos=[op(x, y) for x, y in zip(a, b, strict=True)],
            **{f: op(getattr(self, f), getattr(other, f)) for f in scalars},
        )

    @classmethod
    def from_summary(cls, s: dict) -> SpecCounters:
        """The counters back from a ``summary()`` (a request row's stored deltas)."""
        return cls(num_drafts=s["num_drafts"], num_draft_tokens=s["num_draft_tokens"],
                   num_accepted=s["num_accepted"], accepted_per_pos=list(s["accepted_per_pos"]),
                   prefix_queries=s.get("prefix_cache_queries") or 0,
                   prefix_hits=s.get("prefix_cache_hits") or 0)

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        return self._combine(before, lambda x, y: x - y)

    def __add__(self, other: SpecCounters) -> SpecCounters:
        return self._combine(other, lambda x, y: x + y)

    # --- acceptance math -------------------------------------------------------------------
    def per_position(self) -> list[float]:
        if self.num_drafts <= 0:
            return [0.0] * len(self.accepted_per_pos)
        return [a / self.num_drafts for a in self.accepted_per_pos]

    def conditional(self) -> list[float]:
        """Rate at i given position i-1 was accepted (rate[i] / rate[i-1])."""
        rates = self.per_position()
        out: list[float] = []
        for i, r in enumerate(rates):
            prev = 1.0 if i == 0 else rates[i - 1]
            out.append(r / prev if prev > 0 else 0.0)
        return out

    def acceptance_length(self) -> float:
        if self.num_drafts <= 0:
            return 1.0
        return 1.0 + self.num_accepted / self.num_drafts

    def summary(self) -> dict:
        return {
            "per_position": self.per_position(),
            "conditional": self.conditional(),
            "acceptance_length": self.acceptance_length(),
            "num_drafts": int(self.num_drafts),
            "num_draft_tokens": int(self.num_draft_tokens),
            "num_accepted": int(self.num_accepted),
            "accepted_per_pos": [int(x) for x in self.accepted_per_pos],
            "prefix_cache_queries": int(self.prefix_queries),
            "prefix_cache_hits": int(self.prefix_hits),
        }


def parse(text: str) -> SpecCounters:
    """Sum the counters over every engine and model label in one /metrics page."""
    c = SpecCounters()
    per_pos: dict[int, float] = {}
    scalar = {
        NUM_DRAFTS: "num_drafts",
        NUM_DRAFT_TOKENS: "num_draft_tokens",
        NUM_ACCEPTED: "num_accepted",
        PREFIX_QUERIES: "prefix_queries",
        PREFIX_HITS: "prefix_hits",
        GENERATION_TOKENS: "generation_tokens",
    }
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in scalar:
                attr = scalar[s.name]
                setattr(c, attr, getattr(c, attr) + s.value)
            elif s.name == ACCEPTED_PER_POS:
                pos = int(s.labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + s.value
    c.accepted_per_pos = [per_pos.get(i, 0.0) for i in range(max(per_pos, default=-1) + 1)]
    return c


RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def in_flight(text: str) -> int:
    """Requests a server is still running or holding in its queue (its scheduler gauges)."""
    return int(sum(s.value for family in text_string_to_metric_families(text)
                   for s in family.samples if s.name in (RUNNING, WAITING)))


def total(summaries: list[dict]) -> SpecCounters:
    """The sum of several requests' counter deltas."""
    out = SpecCounters()
    for s in summaries:
        out = out + SpecCounters.from_summary(s)
    return out


def counts_from_steps(sd: dict) -> dict:
    """One request's counters from its response's ``metrics.speculative_decoding``, the way
    ``/metrics`` counts them (``SpecDecodingStats.observe_draft`` in
    ``vllm/v1/spec_decode/metrics.py``): one draft per verify step, and position i accepted
    in a step when that step accepted more than i tokens. Prefix-cache counters are not per
    request (None here; a run reports them from the ``/metrics`` delta)."""
    accepted = sd.get("per_step_accepted") or []
    drafted = sd.get("per_step_drafted") or []
    c = SpecCounters(num_drafts=len(drafted), num_draft_tokens=sum(drafted),
                     num_accepted=sum(accepted),
                     accepted_per_pos=[sum(1 for a in accepted if a > i)
                                       for i in range(int(sd["num_spec_tokens"]))])
    out = c.summary()
    out["prefix_cache_queries"] = out["prefix_cache_hits"] = None
    return out


def mismatch(summaries: list[dict], delta: dict) -> int:
    """The largest absolute count difference between the sum of several requests' counters
    and a server's ``/metrics`` delta (drafts, draft tokens, accepted, accepted per position)."""
    total_ = total(summaries)
    d = SpecCounters.from_summary(delta)
    n = max(len(total_.accepted_per_pos), len(d.accepted_per_pos))
    pad = [0.0] * n
    diffs = [abs(getattr(total_, k) - getattr(d, k))
             for k in ("num_drafts", "num_draft_tokens", "num_accepted")]
    diffs += [abs(a - b) for a, b in zip((total_.accepted_per_pos + pad)[:n],
                                         (d.accepted_per_pos + pad)[:n], strict=True)]
    return int(max(diffs))

