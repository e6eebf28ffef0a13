"""The embedded tiny model: a Qwen2-architecture causal LM built from a config, and a
character-level tokenizer saved as a standard `tokenizer.json` (loads with AutoTokenizer)."""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

# EOS is spelled like Qwen2's so that AutoTokenizer (which picks Qwen2Tokenizer for a qwen2
# config.json) finds it in the vocabulary instead of appending a token the model does not have.
PAD, BOS, EOS = "<pad>", "<s>", "<|endoftext|>"
CHARS = string.digits + string.ascii_letters + string.punctuation + " \n"


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII) plus pad/bos/eos; unknown chars are dropped."""
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


def tiny_model(cfg, vocab_size: int, tokenizer) -> Qwen2ForCausalLM:
    """A small Qwen2 (GQA, RoPE, RMSNorm, SwiGLU) from `cfg` (ModelConfig); untied embeddings so
    FSDP shards embedding and LM head independently."""
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=max(1, cfg.num_heads // 2),
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    return Qwen2ForCausalLM(config)
