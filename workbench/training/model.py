"""Small Llama target and EAGLE3 drafter, written so that their state dicts
carry exactly the names that Hugging Face ``LlamaForCausalLM`` and vLLM 0.32's
``LlamaForCausalLMEagle3`` (``vllm/model_executor/models/llama_eagle3.py``) load.

Target: HF Llama (pre-norm, RMSNorm, rotary "neox" half-rotation, SwiGLU MLP).

Aux hidden states: vLLM's ``LlamaModel.forward`` calls
``_maybe_add_hidden_state(aux, i, hidden_states, residual)`` with ``i = 0``
before the first layer and ``i = idx + 1`` after layer ``idx``; the value is
``hidden_states + residual``, i.e. the residual stream entering layer ``i``
(``i = 0``: the token embeddings; ``i = L``: the last layer's output before the
final norm). :meth:`Llama.forward` with ``aux_ids`` returns the same tensors.

Drafter (vLLM semantics, ``norm_before_residual`` false, no ``fc_norm``):
``h = fc(cat(aux_0, aux_1, aux_2))`` for the first step; then per step
``e = input_layernorm(embed(tok))``, ``residual = h``, ``x = cat(e, hidden_norm(h))``
(2H), ``h2 = o_proj(attn(x)) + residual``, ``pre = mlp(post_attention_layernorm(h2)) + h2``,
``logits = lm_head(norm(pre))`` over the draft vocabulary, ``pre`` feeds the next step.
Checkpoint names: ``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``,
``embed_tokens.weight``, ``d2t``, ``t2d``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LlamaShape:
    """What the target and the drafter's one layer share: sizes, norms, rotary, special ids."""

    vocab_size: int = 2048
    hidden_size: int = 256
    intermediate_size: int = 688
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass
class TargetConfig(LlamaShape):
    num_hidden_layers: int = 6
    tie_word_embeddings: bool = True

    def hf_dict(self) -> dict:
        d = asdict(self)
        d.update(
            architectures=["LlamaForCausalLM"],
            model_type="llama",
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            attention_dropout=0.0,
            initializer_range=0.02,
            head_dim=self.head_dim,
            rope_scaling=None,
            torch_dtype="float32",
            use_cache=True,
        )
        return d


@dataclass
class DrafterConfig(LlamaShape):
    draft_vocab_size: int = 1024
    target_hidden_size: int = 256
    aux_layer_ids: list = field(default_factory=lambda: [1, 3, 5])

    def hf_dict(self) -> dict:
        ids = [int(i) for i in self.aux_layer_ids]
        return dict(
            architectures=["LlamaForCausalLMEagle3"],
            model_type="llama",
            vocab_size=self.vocab_size,
            draft_vocab_size=self.draft_vocab_size,
            hidden_size=self.hidden_size,
            target_hidden_size=self.target_hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_theta=self.rope_theta,
            rope_scaling=None,
            hidden_act="silu",
            attention_bias=False,
            mlp_bias=False,
            tie_word_embeddings=False,
            bos_token_id=self.bos_token_id,
            eos_token_id=self.eos_token_id,
            pad_token_id=self.pad_token_id,
            torch_dtype="float32",
            # read by vLLM's gpu_model_runner (top level) to pick the target's aux
            # layers; also inside eagle_config, which llama_eagle3.py consults
            eagle_aux_hidden_state_layer_ids=ids,
            num_aux_hidden_states=len(ids),
            eagle_config={
                "eagle_aux_hidden_state_layer_ids": ids,
                "use_aux_hidden_state": True,
            },
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    half = torch.arange(0, head_dim, 2, device=positions.device).float()
    inv = 1.0 / (theta ** (half / head_dim))
    f = positions.float()[..., None] * inv  # (..., d/2)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x: (B, nh, T, d); cos/sin: (T, d) or (B, 1, T, d)
    d = x.shape[-1]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = torch.cat([-x2, x1], dim=-1)
    return x * cos + rot * sin


class MLP(nn.Module):
    def __init__(self, h, i):
        super().__init__()
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, in_dim, hidden, n_heads, n_kv):
        super().__init__()
        self.nh, self.nkv, self.hd = n_heads, n_kv, hidden // n_heads
        self.q_proj = nn.Linear(in_dim, n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(in_dim, n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(in_dim, n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(n_heads * self.hd, hidden, bias=False)

    def qkv(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.nkv != self.nh:
            r = self.nh // self.nkv
            k = k.repeat_interleave(r, dim=1)
            v = v.repeat_interleave(r, dim=1)
        return q, k, v

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class DecoderLayer(nn.Module):
    def __init__(self, c: TargetConfig, dropout: float = 0.0):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.self_attn = Attention(c.hidden_size, c.hidden_size, c.num_attention_heads,
                                   c.num_key_value_heads)
        self.mlp = MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, h, cos, sin):
        h = h + self.drop(self.self_attn(self.input_layernorm(h), cos, sin))
        return h + self.drop(self.mlp(self.post_attention_layernorm(h)))


class LlamaInner(nn.Module):
    def __init__(self, c: TargetConfig, dropout: float = 0.0):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(c, dropout) for _ in range(c.num_hidden_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Llama(nn.Module):
    """HF-compatible LlamaForCausalLM (state dict names ``model.*``, ``lm_head.weight``).

    ``dropout`` (residual branches, training only) lets the small corpus be seen for
    several epochs without the target memorising it; it is not part of the export."""

    def __init__(self, c: TargetConfig, dropout: float = 0.0):
        super().__init__()
        self.config = c
        self.model = LlamaInner(c, dropout)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.apply(_init_weights)
        if c.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # scaled init of residual-output projections (GPT-2 style)
        std = 0.02 / math.sqrt(2 * c.num_hidden_layers)
        for layer in self.model.layers:
            nn.init.normal_(layer.self_attn.o_proj.weight, std=std)
            nn.init.normal_(layer.mlp.down_proj.weight, std=std)

    def forward(self, ids, aux_ids=None):
        """Returns logits (B,T,V) and, if aux_ids given, list of aux hidden states."""
        c = self.config
        T = ids.shape[1]
        pos = torch.arange(T, device=ids.device)
        cos, sin = rope_cos_sin(pos, c.head_dim, c.rope_theta)
        h = self.model.embed_tokens(ids)
        aux = []
        want = set(aux_ids or [])
        if 0 in want:
            aux.append((0, h))
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin)
            if i + 1 in want:
                aux.append((i + 1, h))
        logits = self.lm_head(self.model.norm(h))
        if aux_ids is None:
            return logits
        d = dict(aux)
        return logits, [d[i] for i in aux_ids]

    def export_state_dict(self):
        sd = {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}
        if self.config.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        return sd


def _init_weights(m):
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)


class MidLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        H = c.hidden_size
        self.self_attn = Attention(2 * H, H, c.num_attention_heads, c.num_key_value_heads)
        self.mlp = MLP(H, c.intermediate_size)
        self.input_layernorm = RMSNorm(H, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, c.rms_norm_eps)


class Eagle3Drafter(nn.Module):
    """EAGLE3 head. State dict names match what vLLM's LlamaForCausalLMEagle3 loads."""

    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.config = c
        H = c.hidden_size
        n_aux = len(c.aux_layer_ids)
        self.embed_tokens = nn.Embedding(c.vocab_size, H)
        self.fc = nn.Linear(n_aux * c.target_hidden_size, H, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        self.lm_head = nn.Linear(H, c.draft_vocab_size, bias=False)
        self.apply(_init_weights)
        # draft id -> target id offsets; t2d: which target ids are in the draft vocab
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))

    def set_vocab_map(self, draft_to_target: torch.Tensor):
        draft_to_target = draft_to_target.long().sort().values
        self.d2t.copy_(draft_to_target - torch.arange(len(draft_to_target)))
        self.t2d.zero_()
        self.t2d[draft_to_target] = True

    def draft_ids(self):
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def _step_inputs(self, tok, h, pos):
        m = self.midlayer
        e = m.input_layernorm(self.embed_tokens(tok))
        residual = h
        x = torch.cat([e, m.hidden_norm(h)], dim=-1)
        cos, sin = rope_cos_sin(pos, self.config.head_dim, self.config.rope_theta)
        return x, residual, cos, sin

    def _finish(self, a, residual):
        m = self.midlayer
        h2 = m.self_attn.o_proj(a) + residual
        pre = m.mlp(m.post_attention_layernorm(h2)) + h2
        return pre, self.lm_head(self.norm(pre))

    def forward_ttt(self, tokens, aux, n_steps: int, zero_kv_before: int = 0):
        """Training-time test unroll.

        tokens: (B, T) ids; aux: list of (B, T, Ht) target aux states at the same
        positions.  Row j of step s has input token tokens[:, j+s+1] (teacher forced),
        hidden = fc(aux)[j] for s=0 else the step s-1 output at row j, rotary
        position j+s; it attends to step-0 keys at rows <= j and to the keys of
        steps 1..s at its own row (exactly what vLLM's drafter KV cache holds when it
        drafts token s+1 after position j).  Returns a list of draft-vocab logits,
        step s of shape (B, T-1-s, Vd): row j predicts the token at position j+s+2.
        ``zero_kv_before`` > 0 zeroes the step-0 K/V of rows below it, as
        ``evaluate --kv-corruption`` does to the prompt's drafter KV in vLLM.
        """
        B, T = tokens.shape
        attn = self.midlayer.self_attn
        h = self.fc(torch.cat(aux, dim=-1))[:, : T - 1]
        keys, vals = [], []
        outs = []
        for s in range(n_steps):
            n = T - 1 - s  # rows 0..n-1 valid
            tok = tokens[:, s + 1 : s + 1 + n]
            h = h[:, :n]
            pos = torch.arange(n, device=tokens.device) + s
            x, residual, cos, sin = self._step_inputs(tok, h, pos)
            q, k, v = attn.qkv(x, cos, sin)  # (B, nh, n, d)
            scale = 1.0 / math.sqrt(attn.hd)
            if s == 0:
                if zero_kv_before > 0:
                    keep = (torch.arange(n, device=k.device) >= zero_kv_before)[:, None].to(k.dtype)
                    k, v = k * keep, v * keep
                k0, v0 = k, v
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                keys.append(k)
                vals.append(v)
                sc0 = (q @ k0[:, :, :n].transpose(-1, -2)) * scale  # (B,nh,n,n)
                mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
                sc0 = sc0.masked_fill(~mask, float("-inf"))
                diag = [((q * kk[:, :, :n]).sum(-1, keepdim=True) * scale) for kk in keys]
                sc = torch.cat([sc0] + diag, dim=-1)
                p = sc.softmax(-1)
                y = p[..., :n] @ v0[:, :, :n]
                for i, vv in enumerate(vals):
                    y = y + p[..., n + i : n + i + 1] * vv[:, :, :n]
            y = y.transpose(1, 2).reshape(B, n, -1)
            pre, logits = self._finish(y, residual)
            outs.append(logits)
            h = pre
        return outs

    def export_state_dict(self):
        return {k: v.detach().contiguous().clone() for k, v in self.state_dict().items()}


def count_params(m: nn.Module) -> int:
    seen, n = set(), 0
    for p in m.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n
