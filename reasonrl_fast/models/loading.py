"""Loading a model and its tokenizer from a local Hugging Face directory (nothing is downloaded)."""

from __future__ import annotations

import json
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from reasonrl_fast.errors import UserError


class ModelPathError(UserError, FileNotFoundError):
    """A model path that is not a local Hugging Face model directory; the message names it."""


def check_model_dir(path: str, what: str | None = None) -> None:
    """Models load from local directories only. Without this, a missing directory reaches the
    Hub client, whose complaint ("Repo id must use alphanumeric chars") hides the real problem.
    `what` names the setting in the message (default `model.path=PATH`)."""
    what = what or f"model.path={path!r}"
    if not os.path.isdir(path):
        raise ModelPathError(f"{what}: no such directory (a local Hugging Face model directory is "
                                f"expected; nothing is downloaded)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelPathError(f"{what}: the directory has no config.json (a local Hugging Face model "
                                f"directory is expected; nothing is downloaded)")


def load_tokenizer(path: str, what: str | None = None):
    """AutoTokenizer, except for a plain `tokenizers` tokenizer (our character tokenizer):
    transformers 5 swaps in the model type's class (Qwen2Tokenizer for a qwen2 config.json),
    whose pre-tokenizer drops spaces, so that one is loaded as the class it was saved as."""
    check_model_dir(path, what)
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
