"""Writes ``MODEL_CARD.md`` next to the checkpoints from ``training_info.json``
and (when present) ``eval_results.json``."""

from __future__ import annotations

import json
import os


def _dir_size(path):
    tot = 0
    for dp, _, fn in os.walk(path):
        for f in fn:
            tot += os.path.getsize(os.path.join(dp, f))
    return tot


def _fmt_rates(r):
    return " / ".join(f"{v:.3f}" for v in r)


def write_card(out_dir: str):
    info = json.load(open(os.path.join(out_dir, "training_info.json")))
    ev_path = os.path.join(out_dir, "eval_results.json")
    ev = json.load(open(ev_path)) if os.path.exists(ev_path) else None
    hp, c, t, d = info["hparams"], info["corpus"], info["target"], info["drafter"]
    tc, dc = info["target_config"], info["drafter_config"]
    L = []
    w = L.append
    w("# Model card: stdlib-Llama target + EAGLE3 drafter")
    w("")
    if info.get("tiny"):
        w("**Tiny settings (test run): not a useful model.**")
        w("")
    w("A small Llama-architecture causal LM (`LlamaForCausalLM`, Hugging Face format) trained from "
      "scratch on the Python standard library's own source code, and an EAGLE3 draft head "
      "(`LlamaForCausalLMEagle3`, the format vLLM 0.32 loads) trained on the target's hidden states. "
      "Made for exercising speculative decoding (vLLM, prefill/decode disaggregation) on a CPU; "
      "it writes plausible-looking Python, nothing more.")
    w("")
    w("| path | what |")
    w("|---|---|")
    w("| `target/` | config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json |")
    w("| `drafter/` | config.json, model.safetensors (float32): `fc`, `midlayer.*`, `norm`, `lm_head`, "
      "`embed_tokens`, `d2t`, `t2d` |")
    w("| `training_info.json` | every figure below, machine-readable |")
    if os.path.exists(os.path.join(out_dir, "grid.json")):
        w("| `grid.json` | every setting tried before this one was picked, with its offline figures "
          "(`python -m workbench.training.grid`) |")
    if ev:
        w("| `eval_results.json` | vLLM measurements (below) |")
    w("")
    w(f"Total size on disk: {_dir_size(out_dir) / 2**20:.1f} MiB.")
    w("")
    w("## Rebuild")
    w("")
    w("```")
    w("python -m workbench.training.train --out data/models     # resumable; checkpoints in training-work/")
    w("python -m workbench.training.evaluate --models data/models --prompts 64 --kv-corruption")
    w("```")
    w("")
    dev = f"`{info['device']}`" + (f" ({info['gpu']})" if info.get("gpu") else f" ({info['threads']} CPU threads)")
    w(f"Seed {info['seed']}, device {dev}, torch {info['torch']}. Recorded command: `{info['command']}`.")
    if info.get("equivalent_command"):
        w(f"Same settings as `{info['equivalent_command']}` (the defaults).")
    if info.get("rebuild_time"):
        w(info["rebuild_time"])
    w("")
    w("## Corpus")
    w("")
    w(f"- Python {c['python_version']} standard library source (`{c['stdlib_dir']}`, `*.py`), "
      "excluding `encodings/`, `test/`, `idlelib/`, `lib2to3/tests/`, `site-packages/`, `pydoc_data/`, "
      "every `test`/`tests` subdirectory, and files that are mostly tables or repeated lines "
      f"({info['n_excluded_files']} files, listed in `training_info.json`).")
    w(f"- {c['n_files']} files in a fixed sorted list, SHA-256 of the list `{c['file_list_sha256']}`.")
    w(f"- Held out (SHA-1 of path mod 100 < 8): {c['n_heldout_files']} files, "
      f"{info['heldout_tokens']:,} tokens, list SHA-256 `{c['heldout_list_sha256']}`. Neither model trains "
      "on them; `data/prompts/indomain.jsonl` is cut from them.")
    w(f"- Training: {c['n_train_files']} files, {c['train_bytes']:,} bytes, {info['train_tokens']:,} tokens.")
    w("- License: the Python standard library is distributed under the Python Software Foundation "
      "License Version 2 (PSF-2.0); the weights are a derivative of that text. Copyright (c) 2001-2023 "
      "Python Software Foundation; All Rights Reserved.")
    w("")
    w("## Tokenizer")
    w("")
    w(f"Byte-level BPE (HF `tokenizers`), vocabulary {hp['vocab']}, trained on the training files only; "
      "`<pad>`=0, `<s>`=1 (BOS, prepended by the post-processor), `</s>`=2 (EOS, appended after each file "
      "in training). Saved as a `PreTrainedTokenizerFast`; no chat template.")
    w("")
    w("## Target")
    w("")
    w(f"`LlamaForCausalLM`: {tc['num_hidden_layers']} layers, hidden {tc['hidden_size']}, MLP "
      f"{tc['intermediate_size']}, {tc['num_attention_heads']} heads, tied embeddings, "
      f"{info['target_params']:,} parameters.")
    w(f"Trained {t['steps']} steps of {hp['batch']} x {hp['seq']} tokens (each window is BOS + a random "
      f"slice of the token stream): {t['tokens_seen']:,} tokens, {t['epochs']:.2f} epochs, "
      f"{t['wall_s'] / 60:.1f} min. AdamW (0.9, 0.95), lr {hp['target_lr']} after a 100-step warmup, "
      f"cosine to 10% over the last 25% of steps, weight decay {hp['weight_decay']}, "
      f"{'dropout ' + str(hp['dropout']) if hp.get('dropout') else 'no dropout'}, grad clip 1.0.")
    w(f"Held-out: loss {t['heldout']['loss']:.3f}, perplexity {t['heldout']['ppl']:.2f}, next-token top-1 "
      f"{t['heldout']['top1']:.3f} (training sample: ppl {t['train_sample']['ppl']:.2f}).")
    if t.get("ul"):
        u = t["ul"]
        w(f"Then {u['steps']} steps ({u['tokens_seen']:,} tokens, {u['wall_s'] / 60:.1f} min) of cross-entropy plus "
          f"{u['weight']} x copy-continuation unlikelihood (Welleck et al. 2019; where continuing an earlier "
          f"repeated bigram would be wrong, -log(1 - p(copy))), lr {u['lr']}: it curbs greedy loops. "
          f"Held-out after it: loss {u['heldout']['loss']:.3f}, perplexity {u['heldout']['ppl']:.2f}, "
          f"top-1 {u['heldout']['top1']:.3f}.")
    w("")
    w("## Drafter (EAGLE3)")
    w("")
    w(f"One decoder layer (attention input 2x{dc['hidden_size']}: normed embeddings ++ normed hidden), "
      f"`fc` {len(dc['aux_layer_ids'])}x{dc['target_hidden_size']} -> {dc['hidden_size']} over the target's "
      f"aux hidden states at layers `eagle_aux_hidden_state_layer_ids = {dc['aux_layer_ids']}` (vLLM's "
      "numbering: id i is the residual stream entering layer i, 0 = embeddings, "
      f"{tc['num_hidden_layers']} = last layer's output before the final norm), draft vocabulary "
      f"{dc['draft_vocab_size']} (the most frequent training tokens, `d2t` offsets / `t2d` mask), embeddings "
      f"copied from the target and frozen; {info['drafter_params']:,} parameters.")
    w(f"Trained {d['steps']} steps ({d['tokens_seen']:,} tokens, {d['wall_s'] / 60:.1f} min) against the "
      "target's own next-token distribution (soft cross-entropy over the draft vocabulary) with a "
      f"{d['ttt_steps']}-step training-time-test unroll: steps 2..{d['ttt_steps']} take the drafter's own "
      "output hidden state and attend to step-1 keys of earlier positions plus their own chain, exactly "
      f"the drafter KV that vLLM holds; step loss weights {_fmt_rates(d['step_weights'])}.")
    w(f"Held-out argmax agreement with the target (teacher-forced tokens), per step: "
      f"{_fmt_rates(d['heldout_top1_match_per_step'])}.")
    w("")
    w("## Measured in vLLM")
    w("")
    if not ev:
        w("Not measured yet: run `python -m workbench.training.evaluate --models DIR`.")
    else:
        m = ev["clean"]
        w(f"Command: `{ev['command']}`  ")
        w(f"vLLM {ev['vllm_version']} (CPU), {ev['n_prompts']} held-out prompts from `{ev['prompts_file']}`, "
          f"{ev['max_tokens']} new tokens each, greedy, EAGLE3 k={ev['k']}, block size {ev['block_size']}, "
          f"dtype {ev['dtype']}; engine start {ev['engine_start_s']:.0f} s, generation {m['wall_s']:.0f} s.")
        w("")
        w("| figure | value | bar | ok |")
        w("|---|---|---|---|")
        for row in ev["checks"]:
            w(f"| {row['name']} | {row['value']} | {row['bar']} | {'yes' if row['ok'] else '**no**'} |")
        w("")
        w(f"Drafts {m['num_drafts']}, draft tokens {m['num_draft_tokens']}, accepted {m['num_accepted']}; "
          f"per-position acceptance {_fmt_rates(m['per_pos'])}; acceptance length {m['acceptance_length']:.3f}; "
          f"distinct-token fraction per request: median {m['distinct_median']:.3f}, min {m['distinct_min']:.3f}; "
          f"largest single-token share {m['max_token_share']:.3f}.")
        for key, what in (("corrupt", "zeroed"), ("corrupt_noise", "overwritten with N(0, 10^2) noise")):
            if ev.get(key):
                k = ev[key]
                w("")
                w(f"Drafter KV dependence ({what}): the drafter layer's K/V {what} for every prompt "
                  f"position of every request (a hook on the drafter's attention, `--kv-corruption`; "
                  f"{k['n_groups']} groups of equal prompt length): per-position acceptance {_fmt_rates(k['per_pos'])} "
                  f"vs clean {_fmt_rates(m['per_pos'])}: position 0 drops by {100 * k['pos0_rel_drop']:.1f}% "
                  f"relative; target output unchanged on {k['same_output']} of {ev['n_prompts']} prompts.")
        if ev.get("samples"):
            w("")
            w("Sample (prompt tail, then greedy continuation):")
            for s in ev["samples"][:2]:
                w("")
                w("```python")
                w(s["prompt_tail"] + "⟨⟩" + s["output"])
                w("```")
        if not ev.get("all_ok", False):
            w("")
            w("**Not every figure meets the bar; see the table.**")
    if info.get("notes"):
        w("")
        w("## Notes and known shortfalls")
        w("")
        for n in info["notes"]:
            w(f"- {n}")
    w("")
    with open(os.path.join(out_dir, "MODEL_CARD.md"), "w") as f:
        f.write("\n".join(L))
