"""One fuzz scenario (a server shape and its requests) and the Hypothesis strategy that draws
the requests for a shape.

The strategy is written so that Hypothesis's shrinking moves toward the cases people can
read: fewer requests, lengths on block multiples (the first branch of every length draw),
no abort, no shared prefix, arrivals together, D not primed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from hypothesis import strategies as st

from ..config import ConfigError, ExperimentConfig
from .space import MIB, Space

FIRST_ID = 3  # random prompts avoid the pair's special ids (0 pad, 1 BOS, 2 EOS)
GAPS = (0.05, 0.2, 0.5)  # seconds between staggered arrivals
CUTS = ("whole", "blocks", "blocks-1", "blocks+1")  # how a shared prefix is cut


@dataclass(frozen=True)
class Request:
    """One request: its prompt, how many tokens it asks for, when it arrives (seconds after
    its side's first request), whether the client abandons it, and whether D computes the
    prompt itself first (so that D finds it in its prefix cache and loads only the tail)."""

    tokens: tuple[int, ...]
    max_tokens: int
    delay_s: float = 0.0
    abort: str = "none"
    d_first: bool = False


@dataclass(frozen=True)
class Scenario:
    shape: dict[str, Any]
    requests: tuple[Request, ...]
    order: str = "baseline-first"
    knobs: dict[str, str] = field(default_factory=dict)  # fixed knob values (the space's)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["requests"] = [{**r, "tokens": list(r["tokens"])} for r in d["requests"]]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scenario:
        try:
            reqs = tuple(Request(**{**r, "tokens": tuple(r["tokens"])}) for r in d["requests"])
            return cls(shape=dict(d["shape"]), requests=reqs,
                       order=d.get("order", "baseline-first"),
                       knobs=dict(d.get("knobs") or {}))
        except (KeyError, TypeError) as e:
            raise ConfigError(f"not a fuzz case (shape, requests, order, knobs): {e}") from None

    @property
    def hash(self) -> str:
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def size(self) -> tuple[int, int]:
        """(requests, prompt tokens): what "smallest" means in the summary."""
        return len(self.requests), sum(len(r.tokens) for r in self.requests)

    def config(self, base: ExperimentConfig) -> ExperimentConfig:
        """The experiment the servers of this shape run (the probe on: it is the oracle)."""
        return replace(shape_config(self.shape, base, self.knobs), kv_probe=True,
                       num_prompts=len(self.requests), prompt_set="random",
                       max_tokens=max(r.max_tokens for r in self.requests),
                       concurrency=max(1, len(self.requests)), label=f"fuzz {self.hash}")


def shape_config(s: dict, base: ExperimentConfig, knobs: dict | None = None) -> ExperimentConfig:
    """``base`` with a shape's server fields (and ``knobs`` fixed on top of base's)."""
    budget = {r: v for r, v in (("p", s["budget_p"]), ("d", s["budget_d"])) if v}
    knobs = {**base.knobs, **(knobs or {}), "transfer": s["transfer"],
             "connector": s["connector"], "runner": s.get("runner", "v1")}
    return replace(base, k_p=s["k_p"], k_d=s["k_d"], block_size=s["block_size"],
                   kv_cache_bytes=s["kv_cache_mib"] * MIB,
                   padded_drafter_batch=s["padded_drafter_batch"],
                   max_num_batched_tokens=budget or None, knobs=knobs)


def make_tokens(source: str, seed: int, n: int, pool: list[list[int]], vocab: int) -> list[int]:
    """``n`` prompt tokens: from the prompt set's prompts laid end to end (text the pair was
    trained on), or uniform random ids."""
    if n <= 0:
        return []
    if source == "random" or not pool:
        rng = np.random.default_rng(seed)
        return [int(t) for t in rng.integers(FIRST_ID, vocab, n)]
    out: list[int] = []
    i = seed
    while len(out) < n:
        out += pool[i % len(pool)]
        i += 1
    return out[:n]


def lengths(bs: int, top: int) -> st.SearchStrategy[int]:
    """Prompt lengths, block multiples first, then one off a multiple, then anything."""
    blocks = max(1, top // bs)
    return st.one_of(st.integers(1, blocks).map(lambda k: k * bs),
                     st.tuples(st.integers(1, blocks), st.sampled_from((-1, 1))).map(
                         lambda t: t[0] * bs + t[1]),
                     st.integers(1, top)).map(lambda n: max(1, min(n, top)))


@dataclass(frozen=True)
class Spec:
    """What Hypothesis draws for one request, the same fields whatever its position, so that
    deleting a request (the shrinker's first move) leaves the others' draws in place."""

    share: bool  # a prefix of an earlier request's prompt (ignored for the first request)
    ref: int  # which earlier request (modulo how many there are)
    cut: str  # CUTS
    blocks: int  # where the cut falls, in blocks (modulo what the earlier prompt holds)
    length: int  # the prompt's own tokens (after the shared prefix, up to the space's max)
    source: str
    seed: int
    max_tokens: int
    abort: str
    d_first: bool


def specs(space: Space, bs: int) -> st.SearchStrategy[Spec]:
    top = space.max_prompt_len
    return st.builds(Spec, st.booleans(), st.integers(0, 255), st.sampled_from(CUTS),
                     st.integers(1, max(1, top // bs)), lengths(bs, top),
                     st.sampled_from(space.sources), st.integers(0, 2**16),
                     st.integers(min(2, space.max_new_tokens), space.max_new_tokens),
                     st.sampled_from(rare(space.aborts, "none")), st.booleans())


def shared_prefix(s: Spec, earlier: list[Request], bs: int) -> list[int]:
    """A prefix of an earlier request's prompt: all of it, or cut on a block multiple, one
    token short of it or one over."""
    base = list(earlier[s.ref % len(earlier)].tokens)
    if s.cut == "whole" or len(base) < bs:
        return base
    k = (1 + (s.blocks - 1) % (len(base) // bs)) * bs
    return base[:k + {"blocks": 0, "blocks-1": -1, "blocks+1": 1}[s.cut]]


def build(s: Spec, space: Space, bs: int, earlier: list[Request], pool, vocab: int) -> Request:
    prefix = shared_prefix(s, earlier, bs) if s.share and earlier else []
    n = min(s.length, space.max_prompt_len - len(prefix)) if prefix else s.length
    tokens = (prefix + make_tokens(s.source, s.seed, n, pool, vocab))[:space.max_prompt_len]
    return Request(tokens=tuple(tokens or [FIRST_ID]), max_tokens=s.max_tokens, abort=s.abort,
                   d_first=s.d_first)


def rare(values: tuple, common: str, weight: int = 4) -> list:
    """``values`` with ``common`` first and ``weight`` times as likely as each other one (an
    abort in one request of five: the others still get judged)."""
    return [common] * weight + [v for v in values if v != common] if common in values \
        else list(values)


def first(values: tuple, simplest: str) -> list:
    """``values`` with ``simplest`` first, where Hypothesis shrinks a ``sampled_from``."""
    return sorted(values, key=lambda v: v != simplest)


def delays(arrival: str, n: int, gap: float) -> list[float]:
    if arrival == "staggered":
        return [round(i * gap, 3) for i in range(n)]
    if arrival == "burst":
        return [round((i // 2) * 2 * gap, 3) for i in range(n)]
    return [0.0] * n


@st.composite
def scenarios(draw, shape: dict[str, Any], space: Space, pool: list[list[int]],
              vocab: int) -> Scenario:
    """A scenario on ``shape``: its requests, their arrivals and the order of the sides."""
    bs = shape["block_size"]
    reqs: list[Request] = []
    for s in draw(st.lists(specs(space, bs), min_size=1, max_size=space.max_requests)):
        reqs.append(build(s, space, bs, reqs, pool, vocab))
    n = len(reqs)
    arrival = draw(st.sampled_from(first(space.arrivals, "together")))
    gap = draw(st.sampled_from(GAPS))
    reqs = [replace(r, delay_s=d) for r, d in zip(reqs, delays(arrival, n, gap), strict=True)]
    return Scenario(shape=dict(shape), requests=tuple(reqs),
                    order=draw(st.sampled_from(space.orders)), knobs=dict(space.knobs))
