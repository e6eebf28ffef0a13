"""A small stand-in for a recipe's model where its weights are not at hand (the CPU rehearsal,
`python -m reasonrl_fast.rehearse`): the real model's config.json fields, the same architecture
with small sizes (`shrink`), random weights, and the embedded character tokenizer.

The stand-in keeps everything of the architecture the trainer decides on or loads differently
(model_type, the query:key/value head ratio, tied embeddings, the vocabulary size, RoPE, the
context, biases): only the widths and the depth shrink. Its vocabulary is the real one, far larger
than the character tokenizer's 99 tokens: a sampled id beyond the tokenizer decodes to nothing,
as an id a tokenizer does not know does in `tokenizers`."""

from __future__ import annotations

import math

from reasonrl_fast.errors import ConfigError

HEAD_DIM = 16
"""The stand-in's head size: the smallest that keeps RoPE's frequencies and sdpa's kernels
ordinary."""
LAYERS = 2
"""Decoder layers: two, so that FSDP2 shards more than one layer unit besides the root."""

MINIMAL_CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
"""For records whose prompts are chat messages: a real model's tokenizer has a template, and the
trainer renders such prompts through it (data/records.py); this one adds a newline per message."""


def hf_config(fields: dict):
    """transformers' config for `fields` (config.json's), by the config class of its model_type."""
    from transformers import AutoConfig

    rest = {k: v for k, v in fields.items() if k != "model_type"}
    try:
        return AutoConfig.for_model(fields["model_type"], **rest)
    except (KeyError, ValueError) as e:
        raise ConfigError(f"model_type {fields.get('model_type')!r}: transformers has no config class for it "
                          f"({e})") from None


def shrink(fields: dict, tensor_parallel: int = 1, head_dim: int = HEAD_DIM, sequence_parallel: int = 1) -> dict:
    """`fields` with small sizes, the architecture kept: query and key/value heads divided by their
    greatest common divisor (Qwen2.5-7B's 28:4 -> 7:1), then multiplied by the least factor that
    lets `tensor_parallel` engine ranks split the key/value heads and `sequence_parallel` Ulysses
    ranks the query heads (Qwen2.5-32B's 40:8 -> 5:1 -> 10:2 at 2 of either), `head_dim`-wide
    heads, the hidden size heads x head_dim, the MLP in the real ratio to the hidden size (rounded
    to a multiple of 8 x `tensor_parallel`), LAYERS layers. The vocabulary, tied embeddings, RoPE,
    the context and every other field stay."""
    heads = fields["num_attention_heads"]
    kv = fields.get("num_key_value_heads") or heads
    g = math.gcd(heads, kv)
    k = math.lcm(tensor_parallel // math.gcd(tensor_parallel, kv // g),
                 sequence_parallel // math.gcd(sequence_parallel, heads // g))
    small_heads, small_kv = heads // g * k, kv // g * k
    hidden = small_heads * head_dim
    ratio = fields["intermediate_size"] / fields["hidden_size"]
    step = 8 * tensor_parallel
    out = {**fields, "hidden_size": hidden, "num_attention_heads": small_heads, "num_key_value_heads": small_kv,
           "intermediate_size": max(step, step * round(hidden * ratio / step)), "num_hidden_layers": LAYERS}
    if "head_dim" in fields:
        out["head_dim"] = head_dim
    if isinstance(fields.get("layer_types"), list):  # one entry per layer: the first LAYERS
        out["layer_types"] = fields["layer_types"][:LAYERS]
    if "max_window_layers" in fields:
        out["max_window_layers"] = min(fields["max_window_layers"], LAYERS)
    return out


def tokenizer(chat: bool):
    """The stand-in's tokenizer: the embedded character tokenizer, with MINIMAL_CHAT_TEMPLATE when
    the records' prompts are chat messages (`chat`)."""
    from reasonrl_fast.models.tiny import char_tokenizer

    tok = char_tokenizer()
    if chat:
        tok.chat_template = MINIMAL_CHAT_TEMPLATE
    return tok


def build(fields: dict, out_dir: str, tok, seed: int = 0) -> str:
    """Save a randomly initialised model of `fields` (config.json's, e.g. `shrink`'s) with `tok`
    (`tokenizer`'s) into `out_dir`; returns it. The token ids the model's config names (pad,
    bos, eos) are the tokenizer's, so that sampling stops at the tokenizer's end token."""
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config({**fields, "pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id,
                        "eos_token_id": tok.eos_token_id})
    if config.vocab_size < len(tok):
        raise ConfigError(f"vocab_size={config.vocab_size} is below the character tokenizer's {len(tok)} tokens")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return out_dir
