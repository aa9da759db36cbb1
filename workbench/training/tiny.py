"""A randomly initialised tiny Llama target + EAGLE3 drafter (with tokenizer), in seconds.

For pipeline tests that must not depend on trained weights::

    from workbench.training.tiny import make_random_pair
    target_dir, drafter_dir = make_random_pair(tmp_path)

Same file formats as the trained pair (HF ``LlamaForCausalLM`` + vLLM
``LlamaForCausalLMEagle3``), 2 layers, 64 wide, vocabulary 512 (draft 256).
"""

from __future__ import annotations

import os

import torch

from . import tok as tok_mod
from .model import DrafterConfig, Eagle3Drafter, Llama, TargetConfig
from .train import aux_layer_ids, save_drafter, save_target


def _tokenizer_text():
    import json
    import textwrap

    # a few small, always-present stdlib modules (deterministic; no network, no data files)
    import bisect
    import colorsys
    import contextlib
    import fnmatch
    import keyword
    import shlex
    import string

    texts = []
    for mod in (bisect, colorsys, contextlib, fnmatch, keyword, shlex, string, textwrap, json):
        with open(mod.__file__, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


def make_random_pair(out_dir, seed: int = 0, vocab: int = 512, hidden: int = 64, layers: int = 2,
                     heads: int = 2, draft_vocab: int = 256) -> tuple[str, str]:
    """Writes ``out_dir/target`` and ``out_dir/drafter``; returns their paths."""
    out_dir = str(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    tok_dir = os.path.join(out_dir, "tokenizer")
    tk = tok_mod.train_tokenizer(_tokenizer_text(), vocab)
    tok_mod.save_tokenizer(tk, tok_dir)
    vocab = tk.get_vocab_size()
    g = torch.random.fork_rng()
    with g:
        torch.manual_seed(seed)
        tc = TargetConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                          num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads)
        dc = DrafterConfig(vocab_size=vocab, draft_vocab_size=min(draft_vocab, vocab), hidden_size=hidden,
                           target_hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                           num_attention_heads=heads, num_key_value_heads=heads,
                           aux_layer_ids=aux_layer_ids(layers))
        target = Llama(tc)
        drafter = Eagle3Drafter(dc)
        drafter.set_vocab_map(torch.arange(dc.draft_vocab_size))  # the first ids
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    tdir, ddir = os.path.join(out_dir, "target"), os.path.join(out_dir, "drafter")
    save_target(target, tc, tok_dir, tdir)
    save_drafter(drafter, dc, ddir)
    return tdir, ddir
