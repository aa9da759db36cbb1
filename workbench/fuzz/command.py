"""``python -m workbench fuzz``: its flags, the live runner (one ``Session``: every server
stops on every way out) and ``--replay``."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from ..config import ConfigError, ExperimentConfig
from ..experiment import Session
from ..inputs import prompts
from ..paths import DEFAULT_DRAFTER, DEFAULT_TARGET
from . import failure, trial
from .hunt import Hunt
from .records import Book
from .scenario import Scenario
from .space import Space, on_release

UNITS = {"s": 1, "m": 60, "h": 3600, "": 1}
POOL_PROMPTS = 32  # prompts of the indomain set laid end to end for "prompts" tokens


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--budget", default="20m", help="how long to search: 90s, 20m, 1h "
                    "(default 20m); server starts count, shrinking too")
    ap.add_argument("--out", required=True, help="directory for trials.jsonl, summary.md, "
                    "failures/ and the Hypothesis example database; a rerun resumes it")
    ap.add_argument("--seed", type=int, default=0, help="orders the shapes and seeds "
                    "Hypothesis (default 0)")
    ap.add_argument("--space", help="a JSON file of the space's fields (docs/fuzz.md); "
                    "default: the built-in space")
    ap.add_argument("--replay", help="run one case.json once and judge it (no search)")
    ap.add_argument("--no-attribute", action="store_true", help="count every difference as "
                    "unexplained, the known findings' too")
    ap.add_argument("--target", default=str(DEFAULT_TARGET), help="target model directory")
    ap.add_argument("--drafter", default=str(DEFAULT_DRAFTER), help="EAGLE3 drafter directory")
    ap.add_argument("--log-dir", default=None, help="server logs and the knob channel")


def parse_budget(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"--budget {text!r}: a positive duration like 90s, 20m or 1h")
    return float(m.group(1)) * UNITS[m.group(2)]


def base_config(args: argparse.Namespace) -> ExperimentConfig:
    return base_config_for(args.target, args.drafter)


def base_config_for(target: str = str(DEFAULT_TARGET),
                    drafter: str = str(DEFAULT_DRAFTER)) -> ExperimentConfig:
    """The CPU profile with this model pair: what every scenario's config starts from."""
    return ExperimentConfig.for_profile("cpu", target=target, drafter=drafter)


def installed(space: Space, given: bool) -> Space:
    """``space`` on the installed vLLM's release (``space.on_release``)."""
    from ..knobs import release

    try:
        rel = release.current()
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    return on_release(space, given, rel)


def fits(space: Space, base: ExperimentConfig) -> None:
    """The longest prompt (a second BOS included) and its tokens within the servers'
    ``--max-model-len``, checked before any server starts."""
    need = space.max_prompt_len + 1 + space.max_new_tokens
    if need > base.max_model_len:
        raise ConfigError(f"space max_prompt_len={space.max_prompt_len} + max_new_tokens="
                          f"{space.max_new_tokens} (+1 BOS) = {need} exceeds the servers' "
                          f"max_model_len={base.max_model_len}")


def pool_and_vocab(base: ExperimentConfig) -> tuple[list[list[int]], int]:
    """The prompt set's token ids (the "prompts" source) and the target's vocabulary."""
    pool = [p.token_ids for p in prompts.build("indomain", POOL_PROMPTS, base.target)]
    vocab = json.loads((Path(base.target) / "config.json").read_text())["vocab_size"]
    return pool, int(vocab)


def bar(budget_s: float):
    from tqdm import tqdm

    b = tqdm(total=int(budget_s), unit="s", desc="fuzz",
             bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total} s {postfix}")

    def update(h: Hunt, shape: int) -> None:
        b.n = min(int(h.book.spent()), b.total)
        b.set_postfix_str(f"trials {h.book.trials}, shape {shape}, failures "
                          f"{len(h.book.failures)}")

    return b, update


def main(args: argparse.Namespace) -> int:
    """Exit status: 0 nothing unexplained, 1 an unexplained difference, 2 bad input."""
    budget = parse_budget(args.budget)
    space = installed(Space.load(args.space), args.space is not None)
    base = base_config(args)
    fits(space, base)
    out = Path(args.out)
    if args.replay:
        return replay(Path(args.replay), out, base, not args.no_attribute, args.log_dir)
    book = Book.open(out, {"space": space.to_dict(), "seed": args.seed,
                           "attribute": not args.no_attribute})
    pool, vocab = pool_and_vocab(base)
    b, update = bar(budget)
    try:
        with Session(log_dir=args.log_dir) as session:
            Hunt(book, space, lambda sc: trial.run(session, sc, base, not args.no_attribute),
                 base, budget, args.seed, pool, vocab, progress=update).go()
    finally:
        b.close()
        book.write_summary()
    print(book.summary())
    return 1 if book.failures else 0


def replay(case: Path, out: Path, base: ExperimentConfig, attribute_on: bool,
           log_dir: str | None) -> int:
    try:
        sc = Scenario.from_dict(json.loads(case.read_text()))
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--replay {case}: cannot read a case: {e}") from None
    with Session(log_dir=log_dir) as session:
        t = trial.run(session, sc, base, attribute_on)
    where = failure.write(out / "replay", t, base)
    print(f"{sc.hash}: {t.verdict}" + (f" ({', '.join(t.signatures)})" if t.signatures else "")
          + (f"; error: {t.error}" if t.error else "") + f"; records in {where}")
    return 1 if t.signatures or t.error else 0
