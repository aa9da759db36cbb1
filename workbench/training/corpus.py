"""Corpus: the running interpreter's own standard-library source (``*.py``).

Fixed, sorted file list; directories of tests and generated tables are left
out, and so is any file that is mostly tables or repeated lines (see
:func:`is_tabular`).  A deterministic subset of files (by SHA-1 of the relative
path) is held out: neither model trains on it, and the in-domain prompt set is
cut from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

EXCLUDE_TOP = ("encodings", "test", "idlelib", "site-packages", "pydoc_data", "lib2to3/tests")
EXCLUDE_PARTS = {"test", "tests", "__pycache__"}
HELDOUT_PERCENT = 8  # files whose path hash falls in the lowest 8% are held out

_TABLE_LINE = re.compile(r"""^([\(\[]?['"0-9x\-\.]|['"\w]+\s*:\s*['"0-9])""")


def stdlib_dir() -> str:
    return sysconfig.get_paths()["stdlib"]


VERSION_FILE = ".python_version"  # in a copied stdlib (e.g. carried to a GPU box): its release


def python_version(root: str | None = None) -> str:
    """The release the stdlib at ``root`` belongs to (not the interpreter's, for a copy)."""
    if root and (marker := Path(root, VERSION_FILE)).exists():
        return marker.read_text().strip()
    return ".".join(str(n) for n in sys.version_info[:3])


def is_tabular(text: str) -> tuple[bool, str]:
    """Heuristic: data tables, code-page maps, repeated boilerplate."""
    b = text.encode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return True, "empty"
    tab = sum(1 for line in lines if _TABLE_LINE.match(line)) / len(lines)
    dup = 1 - len(set(lines)) / len(lines)
    ratio = len(zlib.compress(b, 9)) / max(1, len(b))
    if tab > 0.45:
        return True, f"table-like lines {tab:.2f}"
    if dup > 0.40:
        return True, f"duplicate lines {dup:.2f}"
    if len(b) > 2000 and ratio < 0.17:
        return True, f"compresses to {ratio:.2f}"
    return False, ""


def list_files(root: str | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """Returns (kept relative paths sorted, [(excluded path, reason)]).

    ``os.walk`` (sorted, top-down) rather than ``Path.rglob``: the excluded list keeps the
    order the shipped ``training_info.json`` records (and ``Path.walk`` needs 3.12)."""
    base = Path(root or stdlib_dir())
    kept, excluded = [], []
    for dp, dn, fn in os.walk(base):
        dn.sort()
        rel_dir = Path(dp).relative_to(base).as_posix()
        for f in sorted(fn):
            rel = f if rel_dir == "." else f"{rel_dir}/{f}"
            if not f.endswith(".py") or _skipped_dir(rel):
                continue
            why = _exclusion(base / rel, f)
            if why:
                excluded.append((rel, why))
            else:
                kept.append(rel)
    kept.sort()
    return kept, excluded


def _skipped_dir(rel: str) -> bool:
    """Under a test or generated-table directory: left out without a mention."""
    if any(rel == t or rel.startswith(t + "/") for t in EXCLUDE_TOP):
        return True
    return bool(set(rel.split("/")[:-1]) & EXCLUDE_PARTS)


def _exclusion(path: Path, name: str) -> str:
    """Why a stdlib file is kept out of the corpus ("" to keep it)."""
    if name.startswith("_sysconfigdata"):
        return "generated build data"
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as e:
        return f"unreadable: {type(e).__name__}"
    return is_tabular(text)[1]


def is_heldout(rel: str) -> bool:
    h = int(hashlib.sha1(rel.encode()).hexdigest()[:8], 16)
    return h % 100 < HELDOUT_PERCENT


def file_list_hash(files: list[str]) -> str:
    return hashlib.sha256("\n".join(files).encode()).hexdigest()


@dataclass
class Corpus:
    root: str
    train_files: list
    heldout_files: list
    excluded: list

    @property
    def all_files(self):
        return sorted(self.train_files + self.heldout_files)

    def read(self, rel: str) -> str:
        return Path(self.root, rel).read_text(encoding="utf-8")

    def info(self) -> dict:
        return {
            "python_version": python_version(self.root),
            "stdlib_dir": self.root,
            "n_files": len(self.all_files),
            "n_train_files": len(self.train_files),
            "n_heldout_files": len(self.heldout_files),
            "file_list_sha256": file_list_hash(self.all_files),
            "heldout_list_sha256": file_list_hash(self.heldout_files),
            "train_bytes": sum(len(self.read(f).encode()) for f in self.train_files),
            "heldout_bytes": sum(len(self.read(f).encode()) for f in self.heldout_files),
        }


def load_corpus(root: str | None = None, max_files: int | None = None) -> Corpus:
    root = root or stdlib_dir()
    files, excluded = list_files(root)
    if max_files:
        # tiny path: a deterministic, spread-out subset
        step = max(1, len(files) // max_files)
        files = files[::step][:max_files]
    held = [f for f in files if is_heldout(f)]
    train = [f for f in files if not is_heldout(f)]
    return Corpus(root, train, held, excluded)


def build_prompts(corpus: Corpus, tokenizer, n_prompts: int = 128, min_tokens: int = 48,
                  max_tokens: int = 160, seed: int = 1234) -> list[dict]:
    """Chunks of held-out source, each ending at a line boundary, 48..160 tokens."""
    import random

    rng = random.Random(seed)
    per_file = []
    for rel in corpus.heldout_files:
        lines = corpus.read(rel).splitlines(keepends=True)
        cands = []
        i = 0
        while i < len(lines):
            # grow a chunk line by line until it passes a random length in range
            want = rng.randint(min_tokens + 16, max_tokens - 8)
            j, ntok = i, 0
            while j < len(lines) and ntok < want:
                ntok += len(tokenizer.encode(lines[j], add_special_tokens=False))
                j += 1
            text = "".join(lines[i:j])
            n = len(tokenizer.encode(text, add_special_tokens=False))
            if min_tokens <= n <= max_tokens and text.strip():
                cands.append((i, j, text, n))
            i = j + rng.randint(20, 60)  # leave a gap: chunks do not overlap
        rng.shuffle(cands)
        per_file.append((rel, cands))
    out = []
    k = 0
    while len(out) < n_prompts and any(c for _, c in per_file):
        for rel, cands in per_file:
            if cands and len(out) < n_prompts:
                i, j, text, n = cands.pop()
                out.append({"id": f"indomain-{k:04d}", "text": text,
                            "source": f"Lib/{rel}:{i + 1}-{j}", "n_tokens": n})
                k += 1
    return out


def write_prompts(prompts: list[dict], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with Path(path).open("w") as f:
        for p in prompts:
            f.write(json.dumps({"id": p["id"], "text": p["text"], "source": p["source"]}) + "\n")
