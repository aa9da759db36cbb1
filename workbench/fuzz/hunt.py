"""The fuzz loop: server shapes outside (one server set each, reused by every scenario of
the shape), Hypothesis inside (generation and shrinking), the budget over both.

A trial with a request whose unexplained difference has a signature not yet found
(``oracle.signature``), or that vLLM failed (``crash``: a server died, an HTTP error, a
timeout), makes the Hypothesis test fail, so Hypothesis shrinks it; while it
shrinks, only trials with a request of that same signature count as failing (a shrink must
not wander into another difference), and after
``shrink_s`` seconds every new candidate counts as passing, which ends the shrink at the
smallest case so far. Trials are cached by scenario, so Hypothesis's final replay of the
smallest case reruns nothing and cannot turn flaky.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hseed
from hypothesis.database import DirectoryBasedExampleDatabase

from ..config import ExperimentConfig
from . import failure
from .records import Book
from .scenario import Scenario, scenarios, shape_config
from .space import Space
from .trial import Trial

SHRINK_S = 150.0  # seconds one failure may spend shrinking
Runner = Callable[[Scenario], Trial]


class Unexplained(Exception):
    def __init__(self, trial: Trial, signature: str) -> None:
        super().__init__(signature)
        self.trial, self.signature = trial, signature


class ShapeFailed(Unexplained):
    """A server of the shape could not start: the scenario plays no part, so nothing is
    shrunk and the shape's other trials are not run."""


@dataclass
class Round:
    """One Hypothesis run on one shape: generation, then (on a failure) its shrink."""

    limit: int  # trials to generate
    wanted: str | None = None  # a signature met earlier while shrinking another: only it fails
    generated: int = 0
    target: str | None = None  # the signature being shrunk
    deadline: float | None = None
    aside: dict[str, Trial] = field(default_factory=dict)  # new signatures met while shrinking


@dataclass
class Hunt:
    book: Book
    space: Space
    runner: Runner
    base: ExperimentConfig | None
    budget_s: float
    seed: int = 0
    pool: list[list[int]] = field(default_factory=list)
    vocab: int = 2048
    shrink_s: float = SHRINK_S
    progress: Callable[[Hunt, int], None] | None = None
    stop: Callable[[Book], bool] | None = None  # ends the hunt early (the benchmark's goals)
    smallest: dict[str, Trial] = field(default_factory=dict)  # per signature, the least case
    longest_start_s: float = 0.0  # the longest server start a trial waited for so far

    def over(self) -> bool:
        return self.book.spent() >= self.budget_s or bool(self.stop and self.stop(self.book))

    def go(self) -> Book:
        """Every shape in the space's order until the budget is spent."""
        for i, shape in enumerate(self.space.shapes(self.seed, self.restarts())):
            if self.over():
                break
            if i in self.book.shapes_done:
                continue
            left = self.budget_s - self.book.spent()
            if left < self.longest_start_s:  # a start that eats the rest runs no trial
                self.book.stopped = (f"Stopped before shape {i}: {left:.0f} s of budget left, "
                                     f"less than the longest server start so far "
                                     f"({self.longest_start_s:.0f} s).")
                break
            self.explore(i, shape)
            if not self.over():  # a shape cut by the budget is done again on a resume
                self.book.shapes_done.append(i)
                self.book.save()
        self.book.write_summary()
        return self.book

    def restarts(self):
        """How many of a shape's servers the next shape restarts (``ServerSet.stale``: the
        roles whose ``server_key`` differs), for ``Space.shapes`` to order them by."""
        if self.base is None:
            return None
        keys: dict[str, dict] = {}

        def key(shape: dict) -> dict:
            name = json.dumps(shape, sort_keys=True)
            if name not in keys:
                cfg = shape_config(shape, self.base, self.space.knobs)
                keys[name] = {r: cfg.server_key(r) for r in cfg.roles()}
            return keys[name]

        return lambda a, b: sum(key(a)[r] != key(b).get(r) for r in key(a))

    def explore(self, i: int, shape: dict) -> None:
        """Rounds on one shape until its trials are generated. A signature met while another
        was shrinking is wanted by the next round (which shrinks it when it meets it again),
        and written as met, unshrunk, if no round does."""
        cache: dict[str, Trial] = {}
        pending: dict[str, Trial] = {}
        left, rounds = self.space.shape_trials, 0
        while left > 0 and not self.over():
            r = Round(limit=left, wanted=next(iter(pending), None))
            try:
                self.search(i, shape, cache, r, rounds)
            except ShapeFailed as e:
                self.found(e.signature, e.trial, cache, i)
                break
            except Unexplained as e:
                self.found(e.signature, e.trial, cache, i)
                pending.pop(e.signature, None)
            pending.update({s: t for s, t in r.aside.items()
                            if s not in pending and s not in self.book.failures})
            left -= max(r.generated, 1)
            rounds += 1
        for sig, t in pending.items():
            self.found(sig, t, cache, i)

    def search(self, i: int, shape: dict, cache: dict[str, Trial], r: Round, rounds: int):
        def check(sc: Scenario) -> None:
            t = cache.get(sc.hash)
            if t is None:
                if self.skip(r):
                    return
                t = self.trial(sc, cache, i, "shrink" if r.target else "generate")
                r.generated += r.target is None
                if r.deadline is not None:  # a restart after a crash is not shrinking time
                    r.deadline += t.start_seconds
            self.judge(t, r)

        db = DirectoryBasedExampleDatabase(str(self.book.out / "hypothesis" / f"shape-{i}"))
        test = settings(database=db, max_examples=r.limit, deadline=None, print_blob=False,
                        verbosity=Verbosity.quiet,  # failures are written up here, not printed
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=False,
                        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink))(
            hseed(self.seed * 7919 + i * 101 + rounds)(
                given(scenarios(shape, self.space, self.pool, self.vocab))(check)))
        test()

    def skip(self, r: Round) -> bool:
        """Run no more trials: the budget is spent, the shrink's time is up, or this round
        generated its share."""
        return (self.over() or (r.deadline is not None and time.monotonic() > r.deadline)
                or (r.target is None and r.generated >= r.limit))

    def judge(self, t: Trial, r: Round) -> None:
        if t.crash is not None and t.crash.kind == "start":
            raise ShapeFailed(t, t.crash.signature)
        new = [s for s in t.signatures if s not in self.book.failures]
        if not new:
            return
        if r.target is None and (r.wanted is None or r.wanted in new):
            r.target, r.deadline = r.wanted or new[0], time.monotonic() + self.shrink_s
        for sig in new:
            if sig != r.target:
                r.aside.setdefault(sig, t)
        if r.target in new:
            raise Unexplained(t, r.target)

    def trial(self, sc: Scenario, cache: dict[str, Trial], shape: int, phase: str) -> Trial:
        """Run ``sc`` once (its record logged), keeping the smallest case per signature."""
        t = cache[sc.hash] = self.runner(sc)
        self.longest_start_s = max(self.longest_start_s, t.start_seconds)
        self.book.log(t, shape, phase)
        for sig in t.signatures:
            old = self.smallest.get(sig)
            if old is None or t.scenario.size() < old.scenario.size():
                self.smallest[sig] = t
        if self.progress:
            self.progress(self, shape)
        return t

    def alone(self, sig: str, t: Trial, cache: dict[str, Trial], shape: int) -> Trial:
        """``t``'s requests one at a time, for the first that shows ``sig`` by itself:
        Hypothesis's shrinker may stop (its five minutes, our ``shrink_s``) before it tries
        to drop a request, and a failure that needs a restart makes each try slow."""
        for r in t.scenario.requests if len(t.scenario.requests) > 1 else ():
            sc = replace(t.scenario, requests=(r,))
            if self.over():
                break
            one = cache.get(sc.hash) or self.trial(sc, cache, shape, "alone")
            if sig in one.signatures:
                return one
        return t

    def found(self, sig: str, t: Trial, cache: dict[str, Trial], shape: int) -> None:
        """Write the failure ``sig`` at the smallest case met (by requests, then tokens),
        reduced to one request where one shows it alone."""
        if sig in self.book.failures:
            return
        least = self.smallest.get(sig)
        t = least if least is not None and least.scenario.size() < t.scenario.size() else t
        t = self.alone(sig, t, cache, shape)
        where = failure.write(self.book.out, t, self.base, sig) if self.base else None
        self.book.failures[sig] = t.scenario.hash
        self.book.save()
        if where is not None:
            print(f"unexplained {sig}: {t.scenario.size()[0]} request(s), written to "
                  f"{Path(where)}", flush=True)
