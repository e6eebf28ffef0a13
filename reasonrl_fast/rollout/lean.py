"""A lean decoder for Llama-family causal LMs (Llama, Qwen2, Qwen3, Mistral without a sliding
window): the model's own weights run as a few tensor ops per layer over a preallocated KV cache,
with q/k/v and gate/up each one matmul. At small sizes a Hugging Face forward is mostly
per-module Python, mask building and cache bookkeeping: sampling 32 rows x 16 new tokens of a
0.8 M-parameter Qwen2 on CPU is faster here than through the model's forward
(benchmarks/RESULTS.md §9).

The math is the model's: RMSNorm in float32 cast back to the model's dtype, then its weight;
rotary embedding from the model's own rotary module (so its scaling type applies), Qwen3's
per-head q/k norms, grouped-query SDPA with the model's scaling, and the SiLU-gated MLP."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def unsupported(model: nn.Module) -> str | None:
    """Why the lean decoder cannot run `model` (a Hugging Face causal LM), or None when it can."""
    c = getattr(model, "config", None)
    kind = getattr(c, "model_type", None)
    if kind not in SUPPORTED:
        return f"model_type {kind!r} is not one of {SUPPORTED}"
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"hidden_act {c.hidden_act!r} (the lean decoder's MLP is SiLU-gated)"
    types = getattr(c, "layer_types", None) or []
    if any(t != "full_attention" for t in types) or (kind == "mistral" and getattr(c, "sliding_window", None)):
        return "sliding-window attention"
    base = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if not (isinstance(head, nn.Linear) and hasattr(base, "rotary_emb") and hasattr(base, "layers")):
        return "not the Llama-family layout (model.layers, model.rotary_emb, lm_head)"
    for layer in base.layers:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(isinstance(getattr(a, n, None), nn.Linear) for n in ("q_proj", "k_proj", "v_proj", "o_proj")) \
                or not all(isinstance(getattr(m, n, None), nn.Linear) for n in ("gate_proj", "up_proj", "down_proj")):
            return "a decoder layer without the q/k/v/o and gate/up/down projections"
    return None


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input. The modules' parameters
    become row slices of it, so writes into the model's parameters (weight refresh) land in the
    fused tensors and no second copy of the weights is kept."""
    w = torch.cat([lin.weight.detach() for lin in linears])
    with_bias = [lin.bias is not None for lin in linears]
    if any(with_bias) and not all(with_bias):
        raise ValueError("lean decoder: projections with and without bias cannot be fused")
    b = torch.cat([lin.bias.detach() for lin in linears]) if all(with_bias) else None
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(w[start:start + n], requires_grad=False)
        if b is not None:
            lin.bias = nn.Parameter(b[start:start + n], requires_grad=False)
        start += n
    return w, b


def _norm(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The model's RMSNorm: normalised in float32, cast back, times the weight (one fused call
    when everything is float32: the same product)."""
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", 1e-6)
    if x.dtype == torch.float32 and module.weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), module.weight, eps)
    return module.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


class LeanDecoder:
    """Decoding steps of `model` (evaluation mode, weights frozen) for `engines.sample`, which
    picks the tokens. Construction fuses the model's q/k/v and gate/up weights in place (see
    `_fuse`); the model's own forward still works."""

    def __init__(self, model: nn.Module):
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"lean decoder: {why}")
        c = model.config
        self.model, self.base = model, model.model
        self.heads, self.kv_heads = c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.layers = []
        for layer in self.base.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = _fuse([a.q_proj, a.k_proj, a.v_proj])
            gate_up = _fuse([m.gate_proj, m.up_proj])
            self.layers.append((layer, qkv, gate_up, getattr(a, "scaling", self.head_dim ** -0.5)))

    def _hidden(self, ids, pos, mask, cache, t0: int) -> torch.Tensor:
        """Final hidden states of `ids` [B, T] at positions `pos`, attending through `mask`
        [B, 1, T, t0 + T] to the cache, whose slots t0..t0+T-1 this call writes."""
        b, t = ids.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        x = self.base.embed_tokens(ids)
        cos, sin = self.base.rotary_emb(x, pos)
        cos, sin = cos[:, :, None], sin[:, :, None]  # [B, T, 1, head_dim]: broadcast over heads
        for (layer, (w_qkv, b_qkv), (w_gu, b_gu), scale), (k_cache, v_cache) in zip(self.layers, cache):
            a, m = layer.self_attn, layer.mlp
            y = F.linear(_norm(x, layer.input_layernorm), w_qkv, b_qkv).view(b, t, h + 2 * kv, d)
            if hasattr(a, "q_norm"):  # Qwen3: per-head RMSNorm of q and k before the rotation
                qk = torch.cat([_norm(y[:, :, :h], a.q_norm), _norm(y[:, :, h:h + kv], a.k_norm)], 2)
            else:
                qk = y[:, :, :h + kv]
            qk = _rotate(qk, cos, sin).transpose(1, 2)  # q and k rotated together: half the ops
            k_cache[:, :, t0:t0 + t] = qk[:, h:]
            v_cache[:, :, t0:t0 + t] = y[:, :, h + kv:].transpose(1, 2)
            o = F.scaled_dot_product_attention(qk[:, :h], k_cache[:, :, :t0 + t], v_cache[:, :, :t0 + t],
                                               attn_mask=mask, scale=scale, enable_gqa=kv != h)
            x = x + F.linear(o.transpose(1, 2).reshape(b, t, h * d), a.o_proj.weight, a.o_proj.bias)
            gate, up = F.linear(_norm(x, layer.post_attention_layernorm), w_gu, b_gu).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, m.down_proj.weight, m.down_proj.bias)
        return _norm(x, self.base.norm)

    def stepper(self, ids: torch.Tensor, attn: torch.Tensor, max_new_tokens: int) -> Callable:
        """For left-padded `ids`/`attn` [B, P]: a function that, called with None, runs the prompt
        and returns the next-token logits [B, V]; called with the tokens just chosen [B], appends
        them and returns the logits after them. At most `max_new_tokens` calls after the first."""
        b, p = ids.shape
        total = p + max_new_tokens
        like = self.model.lm_head.weight
        cache = [(like.new_empty(b, self.kv_heads, total, self.head_dim),
                  like.new_empty(b, self.kv_heads, total, self.head_dim)) for _ in self.layers]
        valid = torch.zeros(b, total, dtype=torch.bool, device=ids.device)
        valid[:, :p] = attn.bool()
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        state = {"t": p, "pos": pos[:, -1:]}

        def step(tok: torch.Tensor | None) -> torch.Tensor:
            if tok is None:
                causal = torch.ones(p, p, dtype=torch.bool, device=ids.device).tril()
                # a padding position attends to itself only, so that no row is empty (NaN)
                eye = torch.eye(p, dtype=torch.bool, device=ids.device)
                mask = ((causal & valid[:, None, :p]) | eye)[:, None]
                h = self._hidden(ids, pos, mask, cache, 0)[:, -1]
            else:
                t = state["t"]
                if t >= total:
                    raise RuntimeError(f"lean decoder: more than max_new_tokens={max_new_tokens} steps")
                valid[:, t] = True
                state["t"], state["pos"] = t + 1, state["pos"] + 1
                h = self._hidden(tok[:, None], state["pos"], valid[:, None, None, :t + 1], cache, t)[:, -1]
            return self.model.lm_head(h)

        return step
