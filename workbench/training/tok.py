"""Byte-level BPE tokenizer (HF ``tokenizers``), saved as a PreTrainedTokenizerFast.

Special tokens: ``<pad>`` = 0, ``<s>`` (BOS) = 1, ``</s>`` (EOS) = 2.  The
post-processor prepends BOS, so ``tokenizer(text)`` in transformers and vLLM
both yield ``[1, ...]``.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<pad>", "<s>", "</s>"]
PAD, BOS, EOS = 0, 1, 2


def train_tokenizer(texts, vocab_size: int = 2048):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS)]
    )
    assert tok.token_to_id("<s>") == BOS and tok.token_to_id("</s>") == EOS
    return tok


def save_tokenizer(tok, out_dir: str | Path, model_max_length: int = 1024) -> None:
    """``tokenizer.json`` plus the two files transformers and vLLM read it through."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "unk_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    specials = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))


def load_raw(path_dir: str | Path):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(path_dir) / "tokenizer.json"))


def encode_plain(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


class _HFLike:
    """Minimal adapter so corpus.build_prompts can use a raw tokenizers.Tokenizer."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids
