"""What the stages train on: the corpus list, the tokenizer and the token ids (each cached
in the work dir, built once), and the deterministic windows cut from the ids."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..provenance import atomic_path
from . import corpus as corpus_mod
from . import tok as tok_mod
from .config import TrainConfig
from .loop import Log


@dataclass(frozen=True)
class Data:
    corpus: corpus_mod.Corpus
    info: dict
    """``Corpus.info()``: the file-list hashes and sizes ``training_info.json`` records."""
    tok_dir: Path
    tokenizer: Any
    """The raw ``tokenizers.Tokenizer`` (exported as a PreTrainedTokenizerFast)."""
    train: np.ndarray
    """int64 token ids of the training files, each file followed by EOS."""
    held: np.ndarray


def prepare_data(cfg: TrainConfig, work: Path, log: Log, stdlib_root: str | None = None) -> Data:
    """Corpus list, tokenizer and token ids (cached in ``work``)."""
    c = corpus_mod.load_corpus(stdlib_root, max_files=cfg.max_files)
    info = c.info()
    _record_corpus(work / "corpus.json", c, info)
    tok_dir = work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        log(f"tokenizer: training byte-level BPE, vocab {cfg.vocab}, "
            f"on {len(c.train_files)} files")
        tk = tok_mod.train_tokenizer((c.read(f) for f in c.train_files), cfg.vocab)
        tok_mod.save_tokenizer(tk, tok_dir)
    tk = tok_mod.load_raw(tok_dir)
    train, held = _token_ids(work / "ids.npz", c, tk)
    return Data(c, info, tok_dir, tk, train, held)


def _record_corpus(path: Path, c: corpus_mod.Corpus, info: dict) -> None:
    """The work dir's file list; the caches beside it are only valid for that list."""
    if path.exists():
        old = json.loads(path.read_text())
        if old["file_list_sha256"] != info["file_list_sha256"]:
            raise SystemExit(f"{path.parent} was made from a different file list; "
                             "use another --work-dir")
    meta = {**info, "train_files": c.train_files, "heldout_files": c.heldout_files,
            "excluded": c.excluded}
    path.write_text(json.dumps(meta, indent=1))


def _token_ids(path: Path, c: corpus_mod.Corpus, tk: Any) -> tuple[np.ndarray, np.ndarray]:
    if not path.exists():
        with atomic_path(path) as tmp, tmp.open("wb") as f:  # a file: savez adds no suffix
            np.savez(f, train=_encode(c, c.train_files, tk), held=_encode(c, c.heldout_files, tk))
    with np.load(path) as z:
        return z["train"].astype(np.int64), z["held"].astype(np.int64)


def _encode(c: corpus_mod.Corpus, files: list[str], tk: Any) -> np.ndarray:
    from tqdm import tqdm

    out: list[int] = []
    for f in tqdm(files, desc="tokenize", dynamic_ncols=True, mininterval=2):
        out.extend(tok_mod.encode_plain(tk, c.read(f)))
        out.append(tok_mod.EOS)
    return np.array(out, dtype=np.uint16)


def _with_bos(x: np.ndarray) -> np.ndarray:
    bos = np.full((len(x), 1), tok_mod.BOS, dtype=np.int64)
    return np.concatenate([bos, x.astype(np.int64)], axis=1)


def sample_batch(ids: np.ndarray, step: int, cfg: TrainConfig, seed: int,
                 device: torch.device) -> torch.Tensor:
    """Deterministic per step: BOS followed by seq-1 tokens from a random offset."""
    rng = np.random.default_rng(seed * 1_000_003 + step)
    offs = rng.integers(0, len(ids) - cfg.seq, size=cfg.batch)
    x = np.stack([ids[o : o + cfg.seq - 1] for o in offs])
    return torch.from_numpy(_with_bos(x)).to(device)


def eval_windows(ids: np.ndarray, n: int, seq: int) -> np.ndarray:
    """``n`` evenly spaced windows (fewer when the ids are short), BOS first."""
    n = min(n, max(1, (len(ids) - 1) // (seq - 1)))
    stride = max(1, (len(ids) - seq) // n)
    return _with_bos(np.stack([ids[i * stride : i * stride + seq - 1] for i in range(n)]))
