"""Writes ``MODEL_CARD.md`` next to the checkpoints from ``training_info.json``
and (when present) ``eval_results.json``.

The card is one template (:data:`CARD`, ``str.format`` over the two JSON files); the
parts that appear only for some runs (unlikelihood stage, vLLM measurements, notes) are
small templates of their own, rendered to "" when absent.
"""

from __future__ import annotations

import json
from pathlib import Path

CARD = """\
# Model card: stdlib-Llama target + EAGLE3 drafter

{tiny_banner}\
A small Llama-architecture causal LM (`LlamaForCausalLM`, Hugging Face format) trained from \
scratch on the Python standard library's own source code, and an EAGLE3 draft head \
(`LlamaForCausalLMEagle3`, the format vLLM 0.32 loads) trained on the target's hidden states. \
Made for exercising speculative decoding (vLLM, prefill/decode disaggregation) on a CPU; \
it writes plausible-looking Python, nothing more.

| path | what |
|---|---|
| `target/` | config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json |
| `drafter/` | config.json, model.safetensors (float32): `fc`, `midlayer.*`, `norm`, `lm_head`, \
`embed_tokens`, `d2t`, `t2d` |
| `training_info.json` | every figure below, machine-readable |
{extra_files}
Total size on disk: {size_mib:.1f} MiB.

## Rebuild

```
python -m workbench.training.train --out data/models     # resumable; checkpoints in training-work/
python -m workbench.training.evaluate --models data/models --prompts 64 --kv-corruption
```

Seed {i[seed]}, device {device}, torch {i[torch]}. Recorded command: `{i[command]}`.
{rebuild_notes}
## Corpus

- Python {c[python_version]} standard library source (`{c[stdlib_dir]}`, `*.py`), \
excluding `encodings/`, `test/`, `idlelib/`, `lib2to3/tests/`, `site-packages/`, `pydoc_data/`, \
every `test`/`tests` subdirectory, and files that are mostly tables or repeated lines \
({i[n_excluded_files]} files, listed in `training_info.json`).
- {c[n_files]} files in a fixed sorted list, SHA-256 of the list `{c[file_list_sha256]}`.
- Held out (SHA-1 of path mod 100 < 8): {c[n_heldout_files]} files, \
{i[heldout_tokens]:,} tokens, list SHA-256 `{c[heldout_list_sha256]}`. Neither model trains \
on them; `data/prompts/indomain.jsonl` is cut from them.
- Training: {c[n_train_files]} files, {c[train_bytes]:,} bytes, {i[train_tokens]:,} tokens.
- License: the Python standard library is distributed under the Python Software Foundation \
License Version 2 (PSF-2.0); the weights are a derivative of that text. Copyright (c) 2001-2023 \
Python Software Foundation; All Rights Reserved.

## Tokenizer

Byte-level BPE (HF `tokenizers`), vocabulary {hp[vocab]}, trained on the training files only; \
`<pad>`=0, `<s>`=1 (BOS, prepended by the post-processor), `</s>`=2 (EOS, appended after each file \
in training). Saved as a `PreTrainedTokenizerFast`; no chat template.

## Target

`LlamaForCausalLM`: {tc[num_hidden_layers]} layers, hidden {tc[hidden_size]}, MLP \
{tc[intermediate_size]}, {tc[num_attention_heads]} heads, tied embeddings, \
{i[target_params]:,} parameters.
Trained {t[steps]} steps of {hp[batch]} x {hp[seq]} tokens (each window is BOS + a random \
slice of the token stream): {t[tokens_seen]:,} tokens, {t[epochs]:.2f} epochs, \
{target_min:.1f} min. AdamW (0.9, 0.95), lr {hp[target_lr]} after a 100-step warmup, \
cosine to 10% over the last 25% of steps, weight decay {hp[weight_decay]}, {dropout}, grad clip 1.0.
Held-out: loss {t[heldout][loss]:.3f}, perplexity {t[heldout][ppl]:.2f}, next-token top-1 \
{t[heldout][top1]:.3f} (training sample: ppl {t[train_sample][ppl]:.2f}).
{unlikelihood}
## Drafter (EAGLE3)

One decoder layer (attention input 2x{dc[hidden_size]}: normed embeddings ++ normed hidden), \
`fc` {n_aux}x{dc[target_hidden_size]} -> {dc[hidden_size]} over the target's \
aux hidden states at layers `eagle_aux_hidden_state_layer_ids = {dc[aux_layer_ids]}` (vLLM's \
numbering: id i is the residual stream entering layer i, 0 = embeddings, \
{tc[num_hidden_layers]} = last layer's output before the final norm), draft vocabulary \
{dc[draft_vocab_size]} (the most frequent training tokens, `d2t` offsets / `t2d` mask), embeddings \
copied from the target and frozen; {i[drafter_params]:,} parameters.
Trained {d[steps]} steps ({d[tokens_seen]:,} tokens, {drafter_min:.1f} min) against the \
target's own next-token distribution (soft cross-entropy over the draft vocabulary) with a \
{d[ttt_steps]}-step training-time-test unroll: steps 2..{d[ttt_steps]} take the drafter's own \
output hidden state and attend to step-1 keys of earlier positions plus their own chain, exactly \
the drafter KV that vLLM holds; step loss weights {step_weights}.
Held-out argmax agreement with the target (teacher-forced tokens), per step: {drafter_match}.

## Measured in vLLM

{measured}
{notes}"""

UNLIKELIHOOD = """\
Then {u[steps]} steps ({u[tokens_seen]:,} tokens, {minutes:.1f} min) of cross-entropy plus \
{u[weight]} x copy-continuation unlikelihood (Welleck et al. 2019; where continuing an earlier \
repeated bigram would be wrong, -log(1 - p(copy))), lr {u[lr]}: it curbs greedy loops. \
Held-out after it: loss {u[heldout][loss]:.3f}, perplexity {u[heldout][ppl]:.2f}, \
top-1 {u[heldout][top1]:.3f}.
"""

NOT_MEASURED = "Not measured yet: run `python -m workbench.training.evaluate --models DIR`."

# the two spaces after the command: a Markdown line break
MEASURED = "Command: `{e[command]}`  \n" + """\
vLLM {e[vllm_version]} (CPU), {e[n_prompts]} held-out prompts from `{e[prompts_file]}`, \
{e[max_tokens]} new tokens each, greedy, EAGLE3 k={e[k]}, block size {e[block_size]}, \
dtype {e[dtype]}; engine start {e[engine_start_s]:.0f} s, generation {m[wall_s]:.0f} s.

| figure | value | bar | ok |
|---|---|---|---|
{check_rows}
Drafts {m[num_drafts]}, draft tokens {m[num_draft_tokens]}, accepted {m[num_accepted]}; \
per-position acceptance {per_pos}; acceptance length {m[acceptance_length]:.3f}; \
distinct-token fraction per request: median {m[distinct_median]:.3f}, min {m[distinct_min]:.3f}; \
largest single-token share {m[max_token_share]:.3f}.\
{kv_dependence}{samples}{shortfall}"""

CHECK_ROW = "| {r[name]} | {r[value]} | {r[bar]} | {ok} |\n"

KV_DEPENDENCE = """

Drafter KV dependence ({what}): the drafter layer's K/V {what} for every prompt \
position of every request (a hook on the drafter's attention, `--kv-corruption`; \
{k[n_groups]} groups of equal prompt length): per-position acceptance {per_pos} \
vs clean {clean}: position 0 drops by {drop_pct:.1f}% \
relative; target output unchanged on {k[same_output]} of {n_prompts} prompts."""
KV_MODES = (("corrupt", "zeroed"), ("corrupt_noise", "overwritten with N(0, 10^2) noise"))

SAMPLE = "\n\n```python\n{tail}⟨⟩{output}\n```"

SHORTFALL = "\n\n**Not every figure meets the bar; see the table.**"

NOTES = "\n## Notes and known shortfalls\n\n{items}\n"


def write_card(out_dir: str | Path) -> None:
    out = Path(out_dir)
    info = json.loads((out / "training_info.json").read_text())
    ev_path = out / "eval_results.json"
    ev = json.loads(ev_path.read_text()) if ev_path.exists() else None
    card = render_card(info, ev, has_grid=(out / "grid.json").exists(), size=_dir_size(out))
    (out / "MODEL_CARD.md").write_text(card)


def render_card(info: dict, ev: dict | None, has_grid: bool, size: int) -> str:
    """The card for ``training_info.json`` (``info``) and ``eval_results.json`` (``ev``)."""
    hp, t, d = info["hparams"], info["target"], info["drafter"]
    return CARD.format(
        i=info, hp=hp, c=info["corpus"], t=t, d=d, tc=info["target_config"],
        dc=info["drafter_config"], n_aux=len(info["drafter_config"]["aux_layer_ids"]),
        tiny_banner="**Tiny settings (test run): not a useful model.**\n\n" if info.get("tiny")
        else "",
        extra_files=_extra_files(has_grid, ev), size_mib=size / 2**20, device=_device(info),
        rebuild_notes=_rebuild_notes(info), target_min=t["wall_s"] / 60,
        dropout=f"dropout {hp['dropout']}" if hp.get("dropout") else "no dropout",
        unlikelihood=_unlikelihood(t.get("ul")), drafter_min=d["wall_s"] / 60,
        step_weights=_fmt_rates(d["step_weights"]),
        drafter_match=_fmt_rates(d["heldout_top1_match_per_step"]),
        measured=_measured(ev) if ev else NOT_MEASURED, notes=_notes(info.get("notes")),
    )


def _dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _fmt_rates(r: list[float]) -> str:
    return " / ".join(f"{v:.3f}" for v in r)


def _extra_files(has_grid: bool, ev: dict | None) -> str:
    rows = ""
    if has_grid:
        rows += ("| `grid.json` | every setting tried before this one was picked, with its "
                 "offline figures (`python -m workbench.training.grid`) |\n")
    if ev:
        rows += "| `eval_results.json` | vLLM measurements (below) |\n"
    return rows


def _device(info: dict) -> str:
    where = f" ({info['gpu']})" if info.get("gpu") else f" ({info['threads']} CPU threads)"
    return f"`{info['device']}`{where}"


def _rebuild_notes(info: dict) -> str:
    """Lines a person added to ``training_info.json`` about re-running (shipped pair)."""
    lines = ""
    if info.get("equivalent_command"):
        lines += f"Same settings as `{info['equivalent_command']}` (the defaults).\n"
    if info.get("rebuild_time"):
        lines += info["rebuild_time"] + "\n"
    return lines


def _unlikelihood(u: dict | None) -> str:
    return UNLIKELIHOOD.format(u=u, minutes=u["wall_s"] / 60) if u else ""


def _measured(ev: dict) -> str:
    m = ev["clean"]
    return MEASURED.format(
        e=ev, m=m, per_pos=_fmt_rates(m["per_pos"]),
        check_rows="".join(CHECK_ROW.format(r=row, ok="yes" if row["ok"] else "**no**")
                           for row in ev["checks"]),
        kv_dependence="".join(_kv_dependence(ev, key, what) for key, what in KV_MODES),
        samples=_samples(ev.get("samples")),
        shortfall="" if ev.get("all_ok", False) else SHORTFALL,
    )


def _kv_dependence(ev: dict, key: str, what: str) -> str:
    k = ev.get(key)
    if not k:
        return ""
    return KV_DEPENDENCE.format(
        what=what, k=k, per_pos=_fmt_rates(k["per_pos"]), clean=_fmt_rates(ev["clean"]["per_pos"]),
        drop_pct=100 * k["pos0_rel_drop"], n_prompts=ev["n_prompts"])


def _samples(samples: list[dict] | None) -> str:
    if not samples:
        return ""
    shown = "".join(SAMPLE.format(tail=s["prompt_tail"], output=s["output"]) for s in samples[:2])
    return "\n\nSample (prompt tail, then greedy continuation):" + shown


def _notes(notes: list[str] | None) -> str:
    if not notes:
        return ""
    return NOTES.format(items="\n".join(f"- {n}" for n in notes))
