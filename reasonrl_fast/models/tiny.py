"""The embedded tiny model: a Qwen2-architecture causal LM built from a config, and a
character-level tokenizer saved as a standard `tokenizer.json` (loads with AutoTokenizer).
tokenizers and transformers are imported where they are used: the config's checks read this
module's constants where torch is not installed."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from reasonrl_fast.layout.shape import Shape

# EOS is spelled like Qwen2's so that AutoTokenizer (which picks Qwen2Tokenizer for a qwen2
# config.json) finds it in the vocabulary instead of appending a token the model does not have.
PAD, BOS, EOS = "<pad>", "<s>", "<|endoftext|>"
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII) plus pad/bos/eos; unknown chars are dropped."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, BOS: 1, EOS: 2}
    for c in CHARS:
        vocab.setdefault(c, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=PAD))
    # Split into single characters; the Fuse decoder joins them back without spaces.
    tok.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS)
    fast.padding_side = "left"
    return fast


TINY_CONTEXT = 256
"""The embedded model's context when model.max_position_embeddings is unset."""
TINY_SOURCE = "the embedded model built from model.*"
"""How messages name `tiny_config`'s config (in place of a config.json's path)."""


def tiny_context(cfg) -> int:
    """The max_position_embeddings the embedded model is built with (`cfg`: ModelConfig); also
    part of its warm start's cache key (trainer/sft.py)."""
    return TINY_CONTEXT if cfg.max_position_embeddings is None else cfg.max_position_embeddings


def tiny_config(cfg, tokenizer=None, vocab_size: int | None = None) -> Qwen2Config:
    """The embedded model's config from `cfg` (ModelConfig), before any weights exist: what the
    trainer's preflight and the planner read (`tokenizer`: the character tokenizer when None;
    `vocab_size`: its length when None). Untied embeddings, so FSDP shards embedding and LM head
    independently."""
    from transformers import Qwen2Config

    tokenizer = tokenizer if tokenizer is not None else char_tokenizer()
    return Qwen2Config(
        vocab_size=len(tokenizer) if vocab_size is None else vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=max(1, cfg.num_heads // 2),
        max_position_embeddings=tiny_context(cfg),
        architectures=["Qwen2ForCausalLM"],  # what its saved config.json names
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def tiny_model(cfg, vocab_size: int, tokenizer) -> Qwen2ForCausalLM:
    """A small Qwen2 (GQA, RoPE, RMSNorm, SwiGLU) from `cfg` (ModelConfig), as `tiny_config`."""
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM(tiny_config(cfg, tokenizer, vocab_size))


def tiny_shape(m) -> Shape:
    """The embedded tiny model's shape (layout/shape.py), from the config's model section."""
    from reasonrl_fast.layout.shape import shape_from_config

    return shape_from_config(tiny_config(m).to_dict(), TINY_SOURCE)
