"""Tiny Hugging Face model directories for the trainer's tests, built from a config with the
character tokenizer (nothing is downloaded): a GPT-2 (its decoder is `transformer`, its blocks
`transformer.h`, its head tied to the embeddings), and Llama-family models whose decoder is
`model`."""

from __future__ import annotations

import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from reasonrl_fast.models.tiny import TINY_CONTEXT, char_tokenizer


def _ids(tok) -> dict:
    return {"pad_token_id": tok.pad_token_id, "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}


def tiny_lm(arch: str, seed: int = 0) -> torch.nn.Module:
    """A 2-layer causal LM of `arch` (gpt2, llama, qwen2) over the character tokenizer's vocabulary."""
    tok = char_tokenizer()
    torch.manual_seed(seed)
    if arch == "gpt2":
        return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=len(tok),
                                          n_positions=TINY_CONTEXT, **_ids(tok)))
    common = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=TINY_CONTEXT, **_ids(tok))
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    raise ValueError(arch)


def model_dir(path, arch: str = "gpt2", weights: bool = True) -> str:
    """`path` holding a tiny `arch` model and the character tokenizer; `weights=False`: its
    config.json and tokenizer only (a directory the workers could not load)."""
    path = str(path)
    lm = tiny_lm(arch)
    if weights:
        lm.save_pretrained(path)
    else:
        os.makedirs(path, exist_ok=True)
        lm.config.save_pretrained(path)
    char_tokenizer().save_pretrained(path)
    return path
