"""A randomly initialised tiny Llama target + EAGLE3 drafter (with tokenizer), in seconds.

For pipeline tests that must not depend on trained weights::

    from workbench.training.tiny import make_random_pair
    target_dir, drafter_dir = make_random_pair(tmp_path)

Same file formats as the trained pair (HF ``LlamaForCausalLM`` + vLLM
``LlamaForCausalLMEagle3``), 2 layers, 64 wide, vocabulary 512 (draft 256).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from . import tok as tok_mod
from .config import TINY
from .export import save_drafter, save_target
from .model import Eagle3Drafter, Llama


def _tokenizer_text() -> list[str]:
    # a few small, always-present stdlib modules (deterministic; no network, no data files)
    import bisect
    import colorsys
    import contextlib
    import fnmatch
    import json
    import keyword
    import shlex
    import string
    import textwrap

    mods = (bisect, colorsys, contextlib, fnmatch, keyword, shlex, string, textwrap, json)
    return [Path(mod.__file__).read_text(encoding="utf-8") for mod in mods]


def make_random_pair(out_dir, seed: int = 0, vocab: int = 512, hidden: int = 64, layers: int = 2,
                     heads: int = 2, draft_vocab: int = 256) -> tuple[str, str]:
    """Writes ``out_dir/target`` and ``out_dir/drafter``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tk = tok_mod.train_tokenizer(_tokenizer_text(), vocab)
    tok_mod.save_tokenizer(tk, out / "tokenizer")
    vocab = tk.get_vocab_size()
    # the tiny training settings' shapes (MLP 11/4 of the width), vLLM's default aux layers
    cfg = replace(TINY, vocab=vocab, hidden=hidden, inter=hidden * 11 // 4, layers=layers,
                  heads=heads, draft_vocab=min(draft_vocab, vocab), aux_layers="auto")
    tc, dc = cfg.target_config(), cfg.drafter_config()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = Llama(tc)
        drafter = Eagle3Drafter(dc)
        drafter.set_vocab_map(torch.arange(dc.draft_vocab_size))  # the first ids
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    save_target(target, tc, out / "tokenizer", out / "target")
    save_drafter(drafter, dc, out / "drafter")
    return str(out / "target"), str(out / "drafter")
