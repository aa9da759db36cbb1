"""What a fuzz run may vary: the server fields (one server set per shape, an outer loop) and
the request fields (drawn by Hypothesis on warm servers).

A ``--space FILE`` is a JSON object of these fields; each server field lists the values a
shape may take, ``knobs`` fixes knob values for every shape (how a bug is injected: the
benchmark's mutation score), and an unknown field or value is refused by name.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..knobs import spec as knob_spec

MIB = 2**20
Restarts = Callable[[dict, dict], int]
SHAPE_FIELDS = ("budget_p", "budget_d", "k_p", "k_d", "block_size", "kv_cache_mib",
                "padded_drafter_batch", "transfer", "connector", "runner")
ARRIVALS = ("together", "staggered", "burst")
ABORTS = ("none", "after-p", "during-d")
ORDERS = ("baseline-first", "pd-first")
SOURCES = ("prompts", "random")


@dataclass(frozen=True)
class Space:
    """The fuzz space. Server fields are tuples of allowed values; the first value of each is
    the as-released default shape, which a run always visits first."""

    budget_p: tuple = (None, 64, 96)  # P's --max-num-batched-tokens (None: vLLM's default)
    budget_d: tuple = (None, 64)  # D's; the baseline stays unchunked, the reference
    k_p: tuple = (1, 2)
    k_d: tuple = (3,)  # D's and the baseline's k
    block_size: tuple = (32, 64)
    kv_cache_mib: tuple = (256, 24)  # 24 MiB: about 42 blocks of 32 for the shipped pair
    padded_drafter_batch: tuple = (True, False)
    transfer: tuple = ("direct", "host-staged")
    connector: tuple = ("nixl",)
    runner: tuple = ("v1",)  # the model runner (docs/runners.md); "v2" is slower on the CPU
    knobs: dict = field(default_factory=dict)  # fixed knob values on every shape
    max_requests: int = 6
    max_prompt_len: int = 300
    max_new_tokens: int = 32
    sources: tuple = SOURCES
    arrivals: tuple = ARRIVALS
    aborts: tuple = ("none", "during-d")
    orders: tuple = ORDERS
    shape_trials: int = 12  # generated trials per shape before the next (shrinking extra)

    def __post_init__(self) -> None:
        check(self)

    def shapes(self, seed: int, restarts: Restarts | None = None) -> list[dict[str, Any]]:
        """Every combination of the server fields, the default first, the rest in a seeded
        order (a 20-minute run visits the first few). With ``restarts`` (how many servers a
        change from one shape to another restarts), each next shape is the one that restarts
        fewest after the one before, the seeded order breaking ties."""
        combos = [shape for c in itertools.product(*(getattr(self, f) for f in SHAPE_FIELDS))
                  if runnable(shape := _shape(dict(zip(SHAPE_FIELDS, c, strict=True)))) is None]
        rest = combos[1:]
        random.Random(seed).shuffle(rest)
        return [combos[0], *(chain(combos[0], rest, restarts) if restarts else rest)]

    @classmethod
    def load(cls, path: str | Path | None) -> Space:
        if path is None:
            return cls()
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"--space {path}: cannot read a JSON object: {e}") from None
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: Any, where: str = "space") -> Space:
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: must be a JSON object of fields, got "
                              f"{type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown fields {unknown}; allowed: {sorted(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v, tuple) else v)
                for f in fields(self) for v in [getattr(self, f.name)]}


def chain(first: dict, rest: list[dict], restarts: Restarts) -> list[dict]:
    """``rest`` in the order that restarts fewest servers from one shape to the next."""
    out, now, left = [], first, list(rest)
    while left:
        now = min(left, key=lambda s: restarts(now, s))  # the first of equals: seeded order
        left.remove(now)
        out.append(now)
    return out


def _shape(shape: dict[str, Any]) -> dict[str, Any]:
    """A shape as cases record it: ``runner`` only when it is not the V1 runner, so cases
    recorded before the field existed keep their hash."""
    if shape.get("runner") == "v1":
        del shape["runner"]
    return shape


ALLOWED: dict[str, tuple] = {
    "runner": knob_spec.KNOBS["runner"].values,
    "transfer": knob_spec.KNOBS["transfer"].values,
    "connector": ("nixl", "nixl-push", "example", "multi"),
    "padded_drafter_batch": (True, False),
    "sources": SOURCES, "arrivals": ARRIVALS, "aborts": ABORTS, "orders": ORDERS,
}


def check(s: Space) -> None:
    """Each field's values: non-empty, of the allowed set or range, named when not."""
    for name in (*SHAPE_FIELDS, "sources", "arrivals", "aborts", "orders"):
        values = getattr(s, name)
        if not isinstance(values, tuple) or not values:
            raise ConfigError(f"space field {name}={values!r}: a non-empty list of values")
        bad = [v for v in values if not _allowed(name, v)]
        if bad:
            raise ConfigError(f"space field {name}: {bad} not allowed; {_rule(name)}")
    for name in ("max_requests", "max_prompt_len", "max_new_tokens", "shape_trials"):
        v = getattr(s, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"space field {name}={v!r}: a whole number >= 1")
    if not isinstance(s.knobs, dict):
        raise ConfigError(f"space field knobs={s.knobs!r}: an object of knob name -> value")
    try:
        knob_spec.validate(dict(s.knobs))
    except ValueError as e:
        raise ConfigError(f"space field knobs: {e}") from None
    first = _shape(dict(zip(SHAPE_FIELDS, (getattr(s, f)[0] for f in SHAPE_FIELDS),
                            strict=True)))
    if (why := runnable(first)) is not None:  # the as-released shape every run visits first
        raise ConfigError(f"space: its first shape {first} cannot run: {why}")
    owned = sorted(set(s.knobs) & {"transfer", "connector", "runner", "kv_probe"})
    if owned:
        raise ConfigError(f"space field knobs: {owned} are shape fields (or the oracle's "
                          "probe); list their values in the field of that name")


def on_release(s: Space, given: bool, rel) -> Space:
    """``s`` on the installed release ``rel`` (``knobs.release.Release``): the default space
    takes the model runner the release has and leaves out a setting it removed (0.34.0: the
    V1 runner, the unpadded drafter batch); a space the user gave that asks for either is
    refused by name before any server starts."""
    runners = tuple(r for r in s.runner if r in rel.runners)
    padded = tuple(p for p in s.padded_drafter_batch
                   if f"padded_drafter_batch={p}" not in rel.removed)
    if given and (runners != s.runner or padded != s.padded_drafter_batch):
        gone = sorted({*(f"runner={r}" for r in s.runner if r not in runners),
                       *(f"padded_drafter_batch={p}" for p in s.padded_drafter_batch
                         if p not in padded)})
        raise ConfigError(f"space: {', '.join(gone)} not on vLLM {rel.version} ({rel.note}); "
                          f"allowed: runner {list(rel.runners)}")
    return replace(s, runner=runners or rel.runners[:1], padded_drafter_batch=padded)


def runnable(shape: dict[str, Any]) -> str | None:
    """Why a shape's connector cannot take its other fields (ExampleConnector and host
    staging, say: ``connector.check``), or None: such a combination is never visited."""
    from ..knobs import connector as kv_connector

    try:
        kv_connector.check({k: shape[k] for k in ("connector", "transfer") if k in shape},
                           "cpu")
    except ValueError as e:
        return str(e)
    return None


def _allowed(name: str, v: Any) -> bool:
    if name in ALLOWED:
        return v in ALLOWED[name]
    if name in ("budget_p", "budget_d"):
        return v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 32)
    if name == "block_size":
        return isinstance(v, int) and v >= 32 and v % 32 == 0
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _rule(name: str) -> str:
    if name in ALLOWED:
        return "allowed: " + ", ".join(map(str, ALLOWED[name]))
    if name in ("budget_p", "budget_d"):
        return "allowed: null (vLLM's default) or a whole number of tokens >= 32"
    if name == "block_size":
        return "allowed: multiples of 32 (the CPU attention backend)"
    return "allowed: whole numbers >= 1"
