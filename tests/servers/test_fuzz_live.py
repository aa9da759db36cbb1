"""One short live fuzz run on the shared servers: with ``block_handoff=legacy`` injected and
attribution off, it must find the hand-off's difference, shrink it to a small case on a block
multiple, and replay it; with attribution on, the same case is the known finding's."""

from __future__ import annotations

import json
from pathlib import Path

import papermill as pm

from workbench.fuzz import trial
from workbench.fuzz.command import pool_and_vocab
from workbench.fuzz.hunt import Hunt
from workbench.fuzz.records import Book
from workbench.fuzz.scenario import Scenario
from workbench.fuzz.space import Space

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
# The default shape only (the shared servers' own), small requests: a few seconds a trial.
SPACE = Space(budget_p=(None,), budget_d=(None,), k_p=(1,), block_size=(32,),
              kv_cache_mib=(256,), padded_drafter_batch=(True,), transfer=("direct",),
              knobs={"block_handoff": "legacy"}, max_requests=2, max_prompt_len=96,
              max_new_tokens=8, shape_trials=3)


def test_a_short_fuzz_run_finds_the_legacy_handoff_shrinks_and_replays_it(
        pd_session, base_cfg, tmp_path):
    out = tmp_path / "fuzz"
    book = Book.open(out, {"space": SPACE.to_dict(), "seed": 0, "attribute": False})
    pool, vocab = pool_and_vocab(base_cfg)
    Hunt(book, SPACE, lambda sc: trial.run(pd_session, sc, base_cfg, False), base_cfg,
         budget_s=120, seed=0, pool=pool, vocab=vocab, shrink_s=20).go()
    found = [s for s in book.failures if s.startswith("kv_vs_p:")]
    assert found, f"no hand-off difference in {book.trials} trials: {book.failures}"
    case = out / "failures" / book.failures[found[0]]
    sc = Scenario.from_dict(json.loads((case / "case.json").read_text()))
    assert len(sc.requests) <= 2 and any(len(r.tokens) % 32 == 0 for r in sc.requests)
    assert (case / "report.md").read_text().startswith(f"# Fuzz: unexplained `{found[0]}`")

    again = trial.run(pd_session, sc, base_cfg, attribute_on=False)
    assert found[0] in again.signatures
    known = trial.run(pd_session, sc, base_cfg, attribute_on=True)
    assert known.signatures == [] and any("unclipped-handoff" in j.explained
                                           for j in known.judged)

    shown = tmp_path / "fuzz.ipynb"
    pm.execute_notebook(str(NOTEBOOKS / "fuzz.ipynb"), str(shown), kernel_name="python3",
                        parameters={"show_dir": str(out)}, cwd=str(NOTEBOOKS))
    text = shown.read_text()
    assert "Fuzz summary" in text and found[0] in text
