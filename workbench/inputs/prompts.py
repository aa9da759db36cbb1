"""Prompt sets, templating and token ids.

Prompts go to vLLM as token-id lists, so the server adds nothing: the only BOS is the one the
chat template or the tokenizer put there (``double_bos=on`` adds a second one on purpose, the
client-side bug behind part of the original regression).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from .. import paths
from . import prompt_cache

# Prompt sets that need D to hold the prompt's prefix before the PD request, so that D loads only
# the tail from P (the README's 'last block' points).
PRIME_D_SETS = ("lastblock",)


@dataclass
class Prompt:
    id: str
    token_ids: list[int]
    source: str = ""
    text: str | None = None
    prime_d: bool = False  # send the plain prompt to D first, so D loads only the tail from P
    meta: dict = field(default_factory=dict)


@lru_cache(maxsize=8)
def load_tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def encode(text: str, tokenizer, *, chat: bool = True) -> list[int]:
    """Token ids with the chat template when the tokenizer has one, else with its own BOS."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)
    return list(tokenizer(text, add_special_tokens=True)["input_ids"])


def apply_double_bos(ids: list[int], bos_id: int | None) -> list[int]:
    if bos_id is None:
        raise ValueError("double_bos=on needs a tokenizer with a BOS token")
    return [bos_id] + ids


def bad_case(n: int, lookahead: int, block_size: int) -> bool:
    """P's lookahead slots spill into a block D never allocates: ceil((N+L)/bs) > ceil(N/bs)."""
    return lookahead > 0 and -(-(n + lookahead) // block_size) > -(-n // block_size)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def mt_bench(n: int, tokenizer, seed: int = 0) -> list[Prompt]:
    rows = _read_jsonl(paths.MT_BENCH)[:n]
    return [
        Prompt(f"mt{r['question_id']}", encode(r["turns"][0], tokenizer), "mt_bench", r["turns"][0])
        for r in rows
    ]


def indomain(n: int, tokenizer, seed: int = 0) -> list[Prompt]:
    if not paths.INDOMAIN.is_file():
        raise FileNotFoundError(f"in-domain prompt set {paths.INDOMAIN} is missing")
    rows = _read_jsonl(paths.INDOMAIN)[:n]
    return [
        Prompt(str(r.get("id", i)), encode(r["text"], tokenizer, chat=False), "indomain", r["text"])
        for i, r in enumerate(rows)
    ]


def _trimmed(n: int, tokenizer, lengths: list[int], name: str, prime_d: bool) -> list[Prompt]:
    """Real text token ids trimmed to chosen lengths (from the in-domain set, else MT-Bench)."""
    base = indomain if paths.INDOMAIN.is_file() else mt_bench
    pool = [t for p in base(10_000, tokenizer) for t in p.token_ids[1:]]  # drop each BOS
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    out, pos = [], 0
    for i in range(n):
        length = lengths[i % len(lengths)]
        body = length - len(bos)
        if pos + body > len(pool):
            pos = 0
        out.append(Prompt(f"{name}{i}", bos + pool[pos:pos + body], name, prime_d=prime_d,
                          meta={"target_len": length}))
        pos += body
    return out


def badcase(n: int, tokenizer, seed: int = 0, block_size: int = 32) -> list[Prompt]:
    """Alternate lengths inside and outside the bad case (N % bs == 0 hits it for L = 1)."""
    lengths = []
    for m in (2, 3, 4):
        lengths += [m * block_size, m * block_size + 5]
    return _trimmed(n, tokenizer, lengths, "badcase", prime_d=False)


def lastblock(n: int, tokenizer, seed: int = 0, block_size: int = 32) -> list[Prompt]:
    """Bad-case lengths of 3+ blocks, with D primed so it loads only the last block from P.

    With EAGLE the prefix cache never reuses the last matched block, so a prefix must span two
    or more blocks to be reused at all (``SingleTypeKVCacheManager.find_longest_cache_hit`` in
    ``vllm/v1/core/single_type_kv_cache_manager.py`` drops the last matched block for EAGLE).
    """
    return _trimmed(n, tokenizer, [4 * block_size, 5 * block_size], "lastblock", prime_d=True)


def blockprefix(n: int, tokenizer, seed: int = 0, block_size: int = 32,
                short: bool = False) -> list[Prompt]:
    """Pairs, D primed with each in order: a prompt of exactly four blocks (``short``: one
    token less), then the same prompt with 40 more tokens. The first's last block is full at
    its prefill, so it is cached with the drafter's KV at its last slot computed from that
    request's sampled token; the second recomputes the block (the EAGLE drop) under the same
    block hash, and ``BlockPool.get_cached_block`` returns the first one cached."""
    length = 4 * block_size - int(short)
    parts = _trimmed(2 * n, tokenizer, [length, 41], "blockprefix", prime_d=True)
    name = "blockshort" if short else "blockprefix"
    out = []
    for i in range(0, n, 2):
        a, tail = parts[2 * i], parts[2 * i + 1].token_ids[1:]
        out += [Prompt(f"{name}{i}", a.token_ids, name, prime_d=True),
                Prompt(f"{name}{i + 1}", a.token_ids + tail, name, prime_d=True)]
    return out[:n]


def blockshort(n: int, tokenizer, seed: int = 0, block_size: int = 32) -> list[Prompt]:
    """``blockprefix`` with the first prompt one token short of four blocks (its last block
    is never full, so never cached): the negative control."""
    return blockprefix(n, tokenizer, seed, block_size, short=True)


def random_ids(n: int, tokenizer, seed: int = 0, block_size: int = 32) -> list[Prompt]:
    """Random token ids of mixed lengths: for randomly initialised model pairs."""
    rng = random.Random(seed)
    vocab = len(tokenizer)
    lengths = [2 * block_size, 2 * block_size + 3, 3 * block_size - 1, 3 * block_size]
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    return [
        Prompt(f"rand{i}",
               bos + [rng.randrange(2, vocab) for _ in range(lengths[i % 4] - len(bos))], "random")
        for i in range(n)
    ]


def from_file(path: str, n: int, tokenizer) -> list[Prompt]:
    """A user's JSONL: each line {"text": ...} (templated) or {"prompt_token_ids": [...]}."""
    out = []
    for i, r in enumerate(_read_jsonl(Path(path))[:n]):
        if "prompt_token_ids" in r:
            ids = [int(t) for t in r["prompt_token_ids"]]
        elif "text" in r:
            ids = encode(r["text"], tokenizer)
        else:
            raise ValueError(f"{path}:{i + 1}: need a 'text' or 'prompt_token_ids' key")
        out.append(Prompt(str(r.get("id", i)), ids, Path(path).name, r.get("text")))
    return out


PromptSource = Callable[..., list[Prompt]]
SOURCES: dict[str, PromptSource] = {
    "mt_bench": mt_bench,
    "indomain": indomain,
    "badcase": badcase,
    "lastblock": lastblock,
    "blockprefix": blockprefix,
    "blockshort": blockshort,
    "random": random_ids,
}


def build(name: str, n: int, model_dir: str, *, seed: int = 0, block_size: int = 32,
          prompt_file: str | None = None, double_bos: bool = False) -> list[Prompt]:
    """The prompts of a set (or a file), as token ids; from ``prompt_cache`` when the same
    inputs were built before (no tokenizer load), else built and stored there."""
    args = {"name": name, "n": n, "seed": seed, "block_size": block_size,
            "prompt_file": prompt_file, "double_bos": double_bos}
    k = prompt_cache.key(args, str(model_dir))
    cached = prompt_cache.load(k, Prompt)
    if cached is not None:
        return cached
    prompts = _build(name, n, model_dir, seed=seed, block_size=block_size,
                     prompt_file=prompt_file, double_bos=double_bos)
    prompt_cache.store(k, prompts)
    return prompts


def for_config(cfg: Any) -> list[Prompt]:
    """The prompts an ``ExperimentConfig`` runs."""
    return build(cfg.prompt_set, cfg.num_prompts, cfg.target, seed=cfg.seed,
                 block_size=cfg.block_size, prompt_file=cfg.prompt_file,
                 double_bos=cfg.knobs["double_bos"] == "on")


def _build(name: str, n: int, model_dir: str, *, seed: int, block_size: int,
           prompt_file: str | None, double_bos: bool) -> list[Prompt]:
    tok = load_tokenizer(str(model_dir))
    if prompt_file is not None:
        prompts = from_file(prompt_file, n, tok)
    else:
        if name not in SOURCES:
            raise ValueError(f"prompt set {name!r} is unknown; allowed: {', '.join(SOURCES)}")
        src = SOURCES[name]
        try:
            prompts = src(n, tok, seed=seed, block_size=block_size)
        except TypeError:
            prompts = src(n, tok, seed=seed)
    if len(prompts) < n:
        raise ValueError(f"prompt set {name!r} has only {len(prompts)} prompts, {n} asked for")
    if double_bos:
        for p in prompts:
            p.token_ids = apply_double_bos(p.token_ids, tok.bos_token_id)
    return prompts
