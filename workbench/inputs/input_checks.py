"""What a config's fields point to, checked before any server starts and before any tokenizer
loads: the prompt file line by line, a prompt set's size, and what the models' config.json
allow (context length, vocabulary, the KV cache one request needs); with :func:`check_machine`
what this machine allows (the host, the memory), and with :func:`check_prompt_lengths` the
built prompts against ``max_model_len``.

``ExperimentConfig``'s own checks look at each field alone; without these, each of these
inputs started three servers and failed a minute later (a vLLM error in a server log, a
request refused with a 400, a result never written), or after the tokenizer loaded with a
message that named the wrong thing. ``config.ExperimentConfig.validate`` calls :func:`check`;
the CLI calls the other two right before it starts servers. The config is read by attribute
only (this module does not import ``config``, which imports it).
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from .. import paths
from . import models, profiles

# What a prompt file's line must be; every prompt-file message ends with it.
LINE_FORMS = ('one JSON object per line: {"text": "..."} or {"prompt_token_ids": [1, 2, 3]} '
              '(an optional "id": printable ASCII, unique)')
# vLLM seeds numpy with the server's --seed (vllm/utils/torch_utils.py: set_random_seed), and
# np.random.seed takes 0..2**32 - 1: a larger seed kills the engine at start.
SEED_MAX = 2**32 - 1
# The prompt sets that read a fixed file (the others make any number of prompts).
SET_FILES = {"mt_bench": paths.MT_BENCH, "indomain": paths.INDOMAIN}
# vLLM's keys for a model's longest context, in its order
# (vllm/transformers_utils/model_arch_config_convertor.py, possible_keys).
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "model_max_length", "max_target_positions", "max_sequence_length",
                "max_seq_length", "seq_len")
DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


class InputError(ValueError):
    """An input that cannot run; the message names the value and what is allowed."""


def check(cfg: Any) -> None:
    """Every check that needs neither a tokenizer nor this machine's state; raises InputError."""
    if cfg.seed > SEED_MAX:
        raise InputError(f"seed={cfg.seed} is too large: vLLM seeds numpy with it at start "
                         f"(np.random.seed); allowed: 0..{SEED_MAX}")
    if cfg.max_tokens >= cfg.max_model_len:
        raise InputError(
            f"max_tokens={cfg.max_tokens} plus the longest prompt (at least 1 token) exceeds "
            f"max_model_len={cfg.max_model_len}: a request's prompt and its new tokens must "
            f"fit in max_model_len together; allowed: max_tokens <= {cfg.max_model_len - 1} "
            "less the longest prompt's tokens")
    rows = _prompt_rows(cfg)
    if not cfg.require_models or models.is_hub_id(cfg.target) or models.is_hub_id(cfg.drafter):
        return  # a Hub model's files are read by the servers once downloaded
    target = _read_json(Path(cfg.target).expanduser() / "config.json")
    drafter = _read_json(Path(cfg.drafter).expanduser() / "config.json")
    _check_context(cfg, target)
    _check_vocab(cfg.prompt_file, rows, target)
    _check_kv_cache(cfg, target, drafter)


# --- prompts -----------------------------------------------------------------------------
def read_prompt_file(path: str) -> list[tuple[int, dict]]:
    """``(line number, object)`` for each non-blank line, as ``prompts.from_file`` reads them
    (its ``str.splitlines`` included), with an error that names the file and the line."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"prompt file {path!r} is a directory; allowed: a file of {LINE_FORMS}")
    try:
        raw = p.read_bytes()
    except OSError as e:
        what = "does not exist" if isinstance(e, FileNotFoundError) else \
            f"cannot be read ({e.strerror})"
        raise InputError(f"prompt file {path!r} {what}; allowed: a file of {LINE_FORMS}") \
            from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise InputError(f"prompt file {path!r} is not UTF-8 text: line {line} holds the byte "
                         f"0x{raw[e.start]:02x}; allowed: UTF-8 text, {LINE_FORMS}") from None
    rows = [(n, _prompt_line(path, n, line))
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not rows:
        what = "is empty" if not raw else "holds only blank lines"
        raise InputError(f"prompt file {path!r} {what}: no prompts; allowed: {LINE_FORMS}")
    return rows


def _prompt_line(path: str, n: int, line: str) -> dict:
    where = f"prompt file {path!r}, line {n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{where} is not JSON ({e.msg}, column {e.colno}): {line[:60]!r}; "
                         f"allowed: {LINE_FORMS}") from None
    if not isinstance(row, dict):
        raise InputError(f"{where} holds a JSON {type(row).__name__}, not an object: "
                         f"{line[:60]!r}; allowed: {LINE_FORMS}")
    if "prompt_token_ids" in row:
        ids = row["prompt_token_ids"]
        if not (isinstance(ids, list) and ids and all(_is_int(t) and t >= 0 for t in ids)):
            raise InputError(f"{where}: prompt_token_ids={_short(ids)} must be a non-empty "
                             f"list of token ids (integers >= 0); allowed: {LINE_FORMS}")
    elif "text" in row:
        if not isinstance(row["text"], str):
            raise InputError(f"{where}: text={_short(row['text'])} must be a string; "
                             f"allowed: {LINE_FORMS}")
    else:
        raise InputError(f"{where} has neither 'text' nor 'prompt_token_ids' (its keys: "
                         f"{sorted(row)}); allowed: {LINE_FORMS}")
    return row


def _prompt_rows(cfg: Any) -> list[tuple[int, dict]]:
    """The prompt file's rows a run uses (checked: ids, token-id lengths), or [] for a set."""
    if cfg.prompt_file is None:
        _check_set_size(cfg)
        return []
    rows = read_prompt_file(cfg.prompt_file)
    if len(rows) < cfg.num_prompts:
        raise InputError(f"num_prompts={cfg.num_prompts}: prompt file {cfg.prompt_file!r} "
                         f"holds only {len(rows)} prompts; allowed: 1..{len(rows)} (--prompts), "
                         "or more lines in the file")
    rows = rows[:cfg.num_prompts]
    seen: dict[str, int] = {}
    extra = 1 if cfg.knobs.get("double_bos") == "on" else 0  # a second BOS in front
    for i, (n, row) in enumerate(rows):
        where = f"prompt file {cfg.prompt_file!r}, line {n}"
        pid = str(row.get("id", i))  # as prompts.from_file names it
        if not all(" " <= ch <= "~" for ch in pid):
            raise InputError(f"{where}: id {pid!r} is sent in the X-Request-Id header; "
                             "allowed: printable ASCII characters")
        if pid in seen:
            raise InputError(f"{where}: id {pid!r} is line {seen[pid]}'s too; each prompt "
                             "needs its own id (its requests are named by it)")
        seen[pid] = n
        if "prompt_token_ids" in row:
            length = len(row["prompt_token_ids"]) + extra
            if length + cfg.max_tokens > cfg.max_model_len:
                raise InputError(
                    f"{where}: the prompt's {length} tokens plus max_tokens={cfg.max_tokens} "
                    f"exceed max_model_len={cfg.max_model_len}; allowed: max_tokens <= "
                    f"{max(cfg.max_model_len - length, 0)}, or a shorter prompt")
    return rows


def _check_set_size(cfg: Any) -> None:
    path = SET_FILES.get(cfg.prompt_set)
    if path is None:
        return
    if not path.is_file():
        raise InputError(f"prompt set {cfg.prompt_set!r} reads {str(path)!r}, which is missing; "
                         "allowed: another set (badcase, lastblock, random) or --prompt-file")
    count = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
    if cfg.num_prompts > count:
        raise InputError(f"num_prompts={cfg.num_prompts}: prompt set {cfg.prompt_set!r} has "
                         f"only {count} prompts ({path.name}); allowed: 1..{count}, or a set that "
                         "makes any number (badcase, lastblock, random)")


def check_prompt_lengths(cfg: Any, prompts: list) -> None:
    """The longest built prompt plus ``max_tokens`` fits in ``max_model_len`` (vLLM refuses a
    longer request with a 400 after the servers started, or cuts its output short)."""
    if not prompts:
        return
    longest = max(prompts, key=lambda p: len(p.token_ids))
    n = len(longest.token_ids)
    if n + cfg.max_tokens > cfg.max_model_len:
        raise InputError(
            f"the longest prompt ({longest.id!r}, {n} tokens) plus max_tokens={cfg.max_tokens} "
            f"is {n + cfg.max_tokens} tokens, more than max_model_len={cfg.max_model_len}; "
            f"allowed: max_tokens <= {max(cfg.max_model_len - n, 0)}, or shorter prompts")


def chunking_note(cfg: Any, prompts: list) -> str | None:
    """Why a host-staged run may lose KV: P splits a prefill into chunks once the prompts in
    flight need more tokens than its step budget, and vLLM's NIXL host buffer keeps only the
    blocks a step newly allocated (``check`` finding ``host-buffer-chunk-boundary``)."""
    if cfg.knobs.get("transfer") != "host-staged" or not prompts:
        return None
    budget = cfg.budget("p") or profiles.get(cfg.profile).step_budget
    longest = max(len(p.token_ids) for p in prompts)
    in_flight = min(cfg.concurrency, len(prompts))
    if in_flight * longest <= budget:
        return None
    return (f"host staging with {in_flight} in flight: P may split a prefill into chunks "
            f"({in_flight} x {longest} tokens, P's step budget {budget}), and a build with "
            "the host-buffer-chunk-boundary finding then loses KV on its way to D; at most "
            f"{budget // longest} in flight keep every prefill whole")


# --- what the models' config.json allow --------------------------------------------------
def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}  # modelfiles.check_pair names an unreadable config.json
    return data if isinstance(data, dict) else {}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any) -> str:
    text = json.dumps(v)
    return text if len(text) <= 60 else text[:57] + "..."


def context_limit(model_cfg: dict, model_dir: str | Path) -> tuple[int, str] | None:
    """The longest context vLLM derives for a model (the least of its config.json's context
    keys and the tokenizer's model_max_length) and where it comes from; None when vLLM would
    scale it (rope_scaling) or the config names none."""
    if model_cfg.get("rope_scaling") or model_cfg.get("rope_parameters"):
        return None
    found = [(model_cfg[k], f"{k}={model_cfg[k]} in config.json") for k in CONTEXT_KEYS
             if _is_int(model_cfg.get(k))]
    tok = _read_json(Path(model_dir).expanduser() / "tokenizer_config.json")
    if _is_int(tok.get("model_max_length")):
        found.append((tok["model_max_length"],
                      f"model_max_length={tok['model_max_length']} in tokenizer_config.json"))
    return min(found) if found else None


def _check_context(cfg: Any, target: dict) -> None:
    limit = context_limit(target, cfg.target)
    if limit is None or cfg.max_model_len <= limit[0]:
        return
    if os.environ.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").strip().lower() in ("1", "true"):
        return  # vLLM lets it through with a warning
    raise InputError(f"max_model_len={cfg.max_model_len} is longer than the target's context "
                     f"({limit[1]}): vLLM refuses it at start; allowed: max_model_len <= "
                     f"{limit[0]}")


def _check_vocab(path: str | None, rows: list[tuple[int, dict]], target: dict) -> None:
    vocab = target.get("vocab_size")
    if not _is_int(vocab):
        return
    for n, row in rows:
        ids = row.get("prompt_token_ids") or []
        if ids and max(ids) >= vocab:
            raise InputError(f"prompt file {path!r}, line {n}: token id {max(ids)} is outside the "
                             f"target's vocabulary (vocab_size={vocab} in config.json); "
                             f"allowed: 0..{vocab - 1}")


def attention_shape(model_cfg: dict) -> list[int] | None:
    """Per attention layer, the KV values one token stores (kv heads x head dim, for K and V
    each), from config.json as vLLM's Llama reads it; None when a key is missing."""
    inner = model_cfg.get("transformer_layer_config")  # the speculators format
    c = {**inner, **model_cfg} if isinstance(inner, dict) else model_cfg
    layers, heads = c.get("num_hidden_layers"), c.get("num_attention_heads")
    kv_heads = c.get("num_key_value_heads", heads)
    head_dim = c.get("head_dim")
    if head_dim is None and _is_int(c.get("hidden_size")) and _is_int(heads) and heads:
        head_dim = c["hidden_size"] // heads
    if not all(_is_int(v) and v > 0 for v in (layers, kv_heads, head_dim)):
        return None
    return [kv_heads * head_dim] * layers


def kv_cache_bytes_needed(target: dict, drafter: dict, dtype_bytes: int, block_size: int,
                          max_model_len: int) -> int | None:
    """The KV cache vLLM needs for one request of ``max_model_len`` tokens: each layer of the
    target and the drafter holds ceil(max_model_len / block_size) blocks of K and V, and the
    block pool keeps one more block back (its null block; vLLM's
    ``kv_cache_utils.check_enough_kv_cache_memory`` counts it)."""
    shapes = [attention_shape(target), attention_shape(drafter)]
    if None in shapes:
        return None
    per_block = sum(2 * v * block_size * dtype_bytes for s in shapes for v in s)
    blocks = -(-max_model_len // block_size) + 1
    return blocks * per_block


def _dtype_bytes(cfg: Any, target: dict) -> tuple[int, str] | None:
    name = profiles.PROFILES[cfg.profile].dtype
    if name == "auto":
        name = str(target.get("torch_dtype") or target.get("dtype") or "")
    return (DTYPE_BYTES[name], name) if name in DTYPE_BYTES else None


def _check_kv_cache(cfg: Any, target: dict, drafter: dict) -> None:
    if profiles.PROFILES[cfg.profile].device != "cpu":
        return  # a GPU server sizes its cache from gpu_memory_utilization, not this field
    dtype = _dtype_bytes(cfg, target)
    need = dtype and kv_cache_bytes_needed(target, drafter, dtype[0], cfg.block_size,
                                           cfg.max_model_len)
    if not need or cfg.kv_cache_bytes >= need:
        return
    raise InputError(
        f"kv_cache_bytes={cfg.kv_cache_bytes} cannot hold one request of max_model_len="
        f"{cfg.max_model_len} tokens: the target's and the drafter's KV at block_size="
        f"{cfg.block_size} and {dtype[1]} need {need} bytes ({need / 2**20:.1f} MiB, the "
        f"{-(-cfg.max_model_len // cfg.block_size)} blocks of one request and the one vLLM "
        f"keeps back); allowed: kv_cache_bytes >= {need}")


# --- this machine, right before the servers start ----------------------------------------
def available_memory() -> int:
    """Bytes of memory available now (``MemAvailable``; what vLLM's CPU worker compares a
    KV cache with)."""
    import psutil

    return int(psutil.virtual_memory().available)


def check_machine(cfg: Any) -> None:
    """The host is an address of this machine, and one server's KV cache fits in the memory
    available now (vLLM's CPU worker refuses a larger one at start)."""
    _check_bindable(cfg.host)
    if profiles.PROFILES[cfg.profile].device != "cpu":
        return
    avail = available_memory()
    if cfg.kv_cache_bytes > avail:
        raise InputError(f"kv_cache_bytes={cfg.kv_cache_bytes} is more than the memory available "
                         f"on this machine now ({avail} bytes): vLLM's CPU worker refuses it at "
                         f"start; allowed: kv_cache_bytes <= {avail}, for each of "
                         f"{len(cfg.roles())} servers")


def _check_bindable(host: str) -> None:
    """Some address ``host`` names can be bound here (a name may resolve to IPv6 first on a
    machine without it: any one that binds will do, as for the servers)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    except OSError as e:
        why = e.strerror or str(e)
    else:
        why = "no address"
        for family, _, _, _, addr in infos:
            try:
                with socket.socket(family, socket.SOCK_STREAM) as s:
                    s.bind(addr)
                return
            except OSError as e:
                why = e.strerror or str(e)
    raise InputError(f"host={host!r}: the servers cannot bind there ({why}); allowed: an "
                     "address of this machine (127.0.0.1, or with --allow-remote 0.0.0.0 or "
                     "one of its interfaces' addresses)")
