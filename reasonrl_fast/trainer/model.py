"""The embedded tiny model: a Qwen2-architecture causal LM built from a config, and a
character-level tokenizer saved as a standard `tokenizer.json` (loads with AutoTokenizer)."""

from __future__ import annotations

import json
import os
import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

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


def check_model_dir(path: str) -> None:
    """Models load from local directories only. Without this, a missing directory reaches the
    Hub client, whose complaint ("Repo id must use alphanumeric chars") hides the real problem."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"model.path={path!r}: no such directory (model.path must be a local "
                                f"Hugging Face model directory; nothing is downloaded)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"model.path={path!r}: the directory has no config.json (model.path "
                                f"must be a local Hugging Face model directory; nothing is downloaded)")


def load_tokenizer(path: str):
    """AutoTokenizer, except for a plain `tokenizers` tokenizer (our character tokenizer):
    transformers 5 swaps in the model type's class (Qwen2Tokenizer for a qwen2 config.json),
    whose pre-tokenizer drops spaces, so that one is loaded as the class it was saved as."""
    check_model_dir(path)
    cfg_file = os.path.join(path, "tokenizer_config.json")
    declared = json.load(open(cfg_file)).get("tokenizer_class") if os.path.exists(cfg_file) else None
    if declared in ("PreTrainedTokenizerFast", "TokenizersBackend"):
        tok = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(path: str, dtype: torch.dtype = torch.float32):
    check_model_dir(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")


def decoder_layers(model) -> list[torch.nn.Module]:
    """The transformer blocks FSDP shards one by one (Qwen2/Llama-style `model.model.layers`,
    else any module whose class name ends with DecoderLayer)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return list(inner.layers)
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
