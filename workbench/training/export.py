"""Write the trained pair in the formats Hugging Face and vLLM load: ``target/`` as a
``LlamaForCausalLM`` with its tokenizer, ``drafter/`` as a ``LlamaForCausalLMEagle3``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from .model import DrafterConfig, Eagle3Drafter, Llama, TargetConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def save_target(model: Llama, cfg: TargetConfig, tok_dir: str | Path, out_dir: str | Path) -> None:
    out = _save_weights(model.export_state_dict(), cfg.hf_dict(), out_dir)
    generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
                  "pad_token_id": cfg.pad_token_id, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(Path(tok_dir, name), out / name)


def save_drafter(drafter: Eagle3Drafter, cfg: DrafterConfig, out_dir: str | Path) -> None:
    _save_weights(drafter.export_state_dict(), cfg.hf_dict(), out_dir)


def _save_weights(state: dict[str, torch.Tensor], hf_config: dict, out_dir: str | Path) -> Path:
    """``model.safetensors`` (float32, the integer vocab maps kept) and ``config.json``."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: (v.float() if v.is_floating_point() else v).cpu().contiguous()
          for k, v in state.items()}
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config, indent=2))
    return out
