"""Token ids of built prompt sets, kept on disk so a fresh process needs no tokenizer.

Why: every sweep point runs in its own notebook kernel, and loading the tokenizer there
(``transformers.AutoTokenizer``, its import included) took 5.3 s of each point's 20-40 s.
The ids a prompt set gets are a pure function of its inputs, so :func:`key` digests all of
them: the arguments of ``prompts.build``, the tokenizer's files, the prompt source files, a
user's prompt file, and the source of ``prompts.py`` itself (a change in how prompts are
built is a new key, never a stale hit). Only prompts built from a local model directory are
cached (a Hub id has no files to digest here). The entries live in ``.cache/prompts/``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import paths
from ..provenance import atomic_write_json

CACHE = paths.REPO / ".cache" / "prompts"
# The files of a model directory that decide its tokenizer's output.
TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab*",
                   "merges.txt", "chat_template*", "generation_config.json")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(model_dir: Path) -> dict[str, str]:
    found = {p for pattern in TOKENIZER_FILES for p in model_dir.glob(pattern) if p.is_file()}
    return {p.name: _digest(p) for p in sorted(found)}


def key(args: dict[str, Any], model_dir: str) -> str | None:
    """The cache key of one ``prompts.build`` call, or None when it cannot be cached."""
    mdir = Path(model_dir)
    if not mdir.is_dir():
        return None
    sources = [paths.INDOMAIN, paths.MT_BENCH, Path(__file__).with_name("prompts.py")]
    if args.get("prompt_file"):
        sources.append(Path(args["prompt_file"]))
    record = {"args": args, "tokenizer": _files(mdir),
              "sources": {str(p): _digest(p) if p.is_file() else None for p in sources}}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def load(k: str | None, cls: type) -> list | None:
    """The prompts stored under ``k`` (instances of ``cls``), or None."""
    path = CACHE / f"{k}.json"
    if k is None or not path.is_file():
        return None
    try:
        return [cls(**row) for row in json.loads(path.read_text())]
    except (ValueError, TypeError):
        return None  # unreadable: built again and stored again


def store(k: str | None, prompts: list) -> None:
    if k is not None:
        CACHE.mkdir(parents=True, exist_ok=True)
        atomic_write_json(CACHE / f"{k}.json", [asdict(p) for p in prompts], indent=None)
