"""What a model directory holds: whether a target and an EAGLE3 drafter fit each other, and
a cheap identity of their files for a sweep point's digest.

A leaf module (the standard library only). vLLM finds a misfit pair only after loading the
weights (a shape error in the drafter's first forward, tens of seconds into a start on the
CPU, minutes on a GPU); every check here reads ``config.json`` alone, before any server starts.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# vLLM's registry (vllm/model_executor/models/registry.py) maps both names to
# llama_eagle3.Eagle3LlamaForCausalLM, the drafter the workbench's profiles run.
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tekken.json")
# Files up to this size are identified by their content; bigger ones (weights of real models,
# 16 GB for an 8B target) by name, size and mtime: hashing them would cost minutes per sweep.
CONTENT_HASH_MAX_BYTES = 64 * 2**20


class ModelFilesError(ValueError):
    """A model directory that cannot serve its role; the message names the value."""


def read_config(model_dir: str | os.PathLike, role: str) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFilesError(f"{role} config {str(path)!r} is not readable JSON: {e}") from None
    if not isinstance(data, dict):
        raise ModelFilesError(f"{role} config {str(path)!r} must hold a JSON object")
    return data


def _drafter_view(cfg: dict[str, Any]) -> dict[str, Any]:
    """A drafter config with a speculators-format ``transformer_layer_config`` folded in."""
    inner = cfg.get("transformer_layer_config")
    return {**inner, **cfg} if isinstance(inner, dict) else cfg


def aux_layer_ids(drafter: dict[str, Any]) -> list | None:
    ids = drafter.get("eagle_aux_hidden_state_layer_ids")
    if ids is None and isinstance(drafter.get("eagle_config"), dict):
        ids = drafter["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    return ids


def check_target(target_dir: str | os.PathLike) -> dict[str, Any]:
    """The target's config; raise if it has no tokenizer (prompts are sent as token ids)."""
    t = Path(target_dir)
    if not any((t / n).is_file() for n in TOKENIZER_FILES):
        raise ModelFilesError(f"target model directory {str(t)!r} has no tokenizer (one of "
                              f"{', '.join(TOKENIZER_FILES)}): the prompts are tokenized with it")
    return read_config(t, "target")


def check_pair(target_dir: str | os.PathLike, drafter_dir: str | os.PathLike) -> None:
    """Raise ModelFilesError when the drafter cannot run on the target."""
    tc = check_target(target_dir)
    if Path(drafter_dir).resolve() == Path(target_dir).resolve():
        raise ModelFilesError(f"drafter directory {str(drafter_dir)!r} is the target directory: "
                              "pass the EAGLE3 drafter's own directory")
    raw = read_config(drafter_dir, "drafter")
    dc = _drafter_view(raw)
    archs = raw.get("architectures") or []
    if raw.get("speculators_model_type") != "eagle3" and not set(archs) & set(
            EAGLE3_ARCHITECTURES):
        what = ("holds a target model, not an EAGLE3 drafter"
                if any("Eagle" not in str(a) for a in archs) else "is not an EAGLE3 drafter")
        raise ModelFilesError(f"drafter directory {str(drafter_dir)!r} {what}: architectures "
                              f"{archs}; allowed: {', '.join(EAGLE3_ARCHITECTURES)} (or a "
                              "speculators eagle3 config)")
    _check_shapes(tc, dc, str(drafter_dir))


def _check_shapes(tc: dict[str, Any], dc: dict[str, Any], where: str) -> None:
    hidden = tc.get("hidden_size")
    want = dc.get("target_hidden_size", dc.get("hidden_size"))  # vLLM's default, llama_eagle3
    if hidden is not None and want is not None and want != hidden:
        raise ModelFilesError(f"drafter {where!r}: target_hidden_size={want} does not fit the "
                              f"target's hidden_size={hidden}")
    vocab = tc.get("vocab_size")
    if vocab is not None and dc.get("vocab_size") not in (None, vocab):
        raise ModelFilesError(f"drafter {where!r}: vocab_size={dc['vocab_size']} differs from "
                              f"the target's vocab_size={vocab}")
    draft_vocab = dc.get("draft_vocab_size")
    if vocab is not None and draft_vocab is not None and not 0 < draft_vocab <= vocab:
        raise ModelFilesError(f"drafter {where!r}: draft_vocab_size={draft_vocab} must be in "
                              f"1..{vocab} (the target's vocab_size)")
    layers, ids = tc.get("num_hidden_layers"), aux_layer_ids(dc)
    if layers is not None and ids is not None:
        # vLLM 0.32's llama.py: id i is the residual stream entering layer i, 0 the
        # embeddings, L the last layer's output; an id past L is never collected and the
        # drafter's fc layer gets fewer inputs than it was built for.
        bad = ids if not isinstance(ids, list) else [
            i for i in ids if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i <= layers]
        if bad:
            raise ModelFilesError(
                f"drafter {where!r}: eagle_aux_hidden_state_layer_ids={ids} has ids out of "
                f"range {bad}; allowed: 0..{layers} (the target has {layers} layers)")


def identity(model_dir: str | os.PathLike) -> dict[str, Any]:
    """What identifies a model directory's files: a content hash of every file up to
    ``CONTENT_HASH_MAX_BYTES`` (configs, tokenizer, the CPU pair's weights), name, size and
    mtime of bigger ones. A retrained CPU pair of the same shape has the same sizes, so its
    weights are hashed; a copied 16 GB checkpoint changes mtime (a spurious mismatch, which
    ``--restart`` settles) rather than costing minutes of hashing per sweep."""
    d = Path(model_dir).expanduser().resolve()
    files: dict[str, Any] = {}
    for p in sorted(d.iterdir()) if d.is_dir() else []:
        if p.name.startswith(".") or not p.is_file():
            continue
        st = p.stat()
        if st.st_size <= CONTENT_HASH_MAX_BYTES:
            files[p.name] = "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            files[p.name] = f"size {st.st_size}, mtime_ns {st.st_mtime_ns}"
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"path": str(d), "sha256": digest, "files": files}
