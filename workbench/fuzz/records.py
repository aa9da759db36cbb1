"""What a fuzz run writes under its ``--out`` directory, and how it resumes.

``trials.jsonl``: one line per trial (scenario, verdict, signature, seconds), appended and
flushed as each ends; ``state.json``: the run's space, seed, budget spent, shapes done and
the failure signatures found (written atomically); ``failures/<hash>/``: each unexplained
difference at its smallest (``case.json`` for ``--replay``, ``records.json``, a KV figure,
``report.md``); ``summary.md``: per finding and per unexplained signature, how many trials
hit it, the smallest case and the time to the first hit.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..provenance import atomic_write_json, atomic_write_text
from .trial import Trial

CASES = "cases"  # each hit's smallest case, replayable


@dataclass
class Hit:
    """How often one finding (or unexplained signature) showed, and its smallest case."""

    trials: int = 0
    first_s: float | None = None  # budget seconds spent when it first showed
    smallest: dict[str, Any] | None = None  # {"hash", "requests", "tokens"}
    shapes: list[int] = field(default_factory=list)  # the shapes it showed on


def logged_verdicts(out: Path) -> dict[str, int]:
    """Trials per verdict as ``trials.jsonl`` logged them."""
    log = out / "trials.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return dict(Counter(json.loads(x)["verdict"] for x in lines if x.strip()))


@dataclass
class Book:
    out: Path
    run: dict[str, Any]  # {"space", "seed", "attribute"}: what a resume must match
    elapsed_s: float = 0.0
    trials: int = 0
    shapes_done: list[int] = field(default_factory=list)
    failures: dict[str, str] = field(default_factory=dict)  # signature -> failure hash
    hits: dict[str, Hit] = field(default_factory=dict)  # finding id or "unexplained: sig"
    verdicts: dict[str, int] = field(default_factory=dict)  # trial verdict -> trials
    stopped: str | None = None  # why the hunt ended before the budget did
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def open(cls, out: Path, run: dict[str, Any]) -> Book:
        """A new record, or the one under ``out`` when it was made with the same space,
        seed and attribution (a different one is refused: its budget and shapes would not
        mean the same)."""
        out.mkdir(parents=True, exist_ok=True)
        state = out / "state.json"
        if not state.exists():
            return cls(out, run)
        old = json.loads(state.read_text())
        if old.get("run") != run:
            raise ConfigError(f"--out {out} holds a fuzz run with another space, seed or "
                              "attribution (state.json); pass another --out to start anew")
        hits = {k: Hit(**v) for k, v in old.get("hits", {}).items()}
        verdicts = old.get("verdicts") or logged_verdicts(out)  # older records: from the log
        return cls(out, run, old["elapsed_s"], old["trials"], old["shapes_done"],
                   old["failures"], hits, verdicts, old.get("stopped"))

    def spent(self) -> float:
        return self.elapsed_s + (time.monotonic() - self.started)

    def save(self) -> None:
        atomic_write_json(self.out / "state.json", {
            "run": self.run, "elapsed_s": round(self.spent(), 1), "trials": self.trials,
            "shapes_done": self.shapes_done, "failures": self.failures,
            "hits": {k: asdict(h) for k, h in self.hits.items()}, "verdicts": self.verdicts,
            "stopped": self.stopped}, indent=2)

    def log(self, t: Trial, shape: int, phase: str) -> None:
        """One trial into ``trials.jsonl`` (flushed to disk before the next starts)."""
        self.trials += 1
        self.verdicts[t.verdict] = self.verdicts.get(t.verdict, 0) + 1
        line = {"trial": self.trials, "shape": shape, "phase": phase, "hash": t.scenario.hash,
                "verdict": t.verdict, "signatures": t.signatures,
                "explained": sorted({f for j in t.judged for f in j.explained}),
                "noise": sorted({k for j in t.judged for k in j.noise}),
                "unmeasured": {j.id: j.unmeasured for j in t.judged if j.unmeasured},
                "seconds": round(t.seconds, 2), "start_seconds": round(t.start_seconds, 2),
                "error": t.error,
                "crash": {k: v for k, v in t.crash.to_dict().items() if k != "log_tail"}
                if t.crash else None, "scenario": t.scenario.to_dict()}
        with (self.out / "trials.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
            f.flush()
            os.fsync(f.fileno())
        errors = ["error (the workbench's instruments failed; trials.jsonl has each)"] \
            if t.error and not t.crash else []
        gaps = sorted({f"unmeasured: {k}" for j in t.judged for k in j.unmeasured})
        for name in line["explained"] + [f"unexplained: {s}" for s in t.signatures] + gaps \
                + errors:
            self.hit(name, t, shape)
        self.save()

    def hit(self, name: str, t: Trial, shape: int) -> None:
        h = self.hits.setdefault(name, Hit())
        h.trials += 1
        if shape not in h.shapes:
            h.shapes.append(shape)
        if h.first_s is None:
            h.first_s = round(self.spent(), 1)
        n, tokens = t.scenario.size()
        if h.smallest is None or (n, tokens) < (h.smallest["requests"], h.smallest["tokens"]):
            h.smallest = {"hash": t.scenario.hash, "requests": n, "tokens": tokens}
            self.keep_case(t)

    def keep_case(self, t: Trial) -> Path:
        """``cases/<hash>.json``: a hit's smallest case, replayable with ``--replay`` (an
        explained hit writes no failure directory)."""
        return atomic_write_json(self.out / CASES / f"{t.scenario.hash}.json",
                                 t.scenario.to_dict(), indent=1)

    def bottom_line(self) -> str:
        """What the run found, in one line: its trials by verdict (``unexplained``, a crash
        included; ``explained`` with the findings; ``same``; ``unmeasured``)."""
        v = self.verdicts
        known = {k: h.trials for k, h in sorted(self.hits.items())
                 if not k.startswith(("unexplained: ", "unmeasured: ", "error"))}
        by = ", ".join(f"{k} {n}" for k, n in known.items())
        parts = [f"{v.get('unexplained', 0) + v.get('crash', 0)} unexplained",
                 f"{v.get('explained', 0)} explained" + (f" ({by})" if by else ""),
                 f"{v.get('same', 0) + v.get('noise', 0)} same",
                 f"{v.get('unmeasured', 0)} unmeasured"]
        if v.get("error"):
            parts.append(f"{v['error']} failed in the workbench")
        return f"{self.trials} trials: " + ", ".join(parts)

    def summary(self) -> str:
        lines = ["# Fuzz summary", "", self.bottom_line(), "",
                 *([self.stopped, ""] if self.stopped else []),
                 f"{self.spent() / 60:.1f} min of budget spent, "
                 f"{len(self.shapes_done)} server shapes done, seed {self.run['seed']}, "
                 f"attribution {'on' if self.run['attribute'] else 'off'}.", "",
                 "| finding or unexplained difference | trials | shapes | first hit (min) | "
                 "smallest case (requests, prompt tokens) |", "|---|---|---|---|---|"]
        for name, h in sorted(self.hits.items()):
            first = f"{h.first_s / 60:.1f}" if h.first_s is not None else "-"
            s = h.smallest or {}
            where = self.failures.get(name.removeprefix("unexplained: "))
            case = (f"[{s.get('hash')}](failures/{where}/report.md)" if where else
                    f"[{s.get('hash')}]({CASES}/{s.get('hash')}.json)")
            shapes = ", ".join(map(str, sorted(h.shapes))) or "-"
            lines.append(f"| {name} | {h.trials} | {shapes} | {first} | {case} "
                         f"({s.get('requests')}, {s.get('tokens')}) |")
        if not self.hits:
            lines.append("| (nothing differed) | 0 | - | - | - |")
        lines += ["", "Replay a case: `python -m workbench fuzz --replay DIR/cases/<hash>.json "
                  "--out DIR2` (a failure's: `DIR/failures/<hash>/case.json`)."]
        return "\n".join(lines) + "\n"

    def write_summary(self) -> Path:
        self.save()
        return atomic_write_text(self.out / "summary.md", self.summary())
