"""Loading a model and its tokenizer from a local Hugging Face directory (nothing is downloaded)."""

from __future__ import annotations

import json
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from reasonrl_fast.errors import ConfigError, UserError
from reasonrl_fast import layout
from reasonrl_fast.layout.shape import context_overrides


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


# The weight files `from_pretrained` reads (transformers.utils' SAFE_WEIGHTS_NAME, ...): one of
# them, or a sharded checkpoint's index, must be in a model directory.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def check_weights(path: str, what: str | None = None) -> None:
    """ModelPathError naming the directory when it holds no weights `load_model` could read.
    Checked by the preflight, before the warm start and Ray, and again where a worker loads the
    model (a glance at file names; the files themselves are read only there)."""
    check_model_dir(path, what)
    if not any(os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES):
        raise ModelPathError(f"{what or f'model.path={path!r}'}: the directory has no weights (none of "
                             f"{', '.join(WEIGHT_FILES)}; a local Hugging Face model directory is expected)")


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


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name of the Layout (layout/)."""
    return getattr(torch, name)


def master_dtype(setting: str) -> torch.dtype:
    """`model.dtype` as a torch dtype (layout/resolve.py `master_dtype`)."""
    return torch_dtype(layout.master_dtype(setting))


def load_model(path: str, dtype: torch.dtype = torch.float32, attn: str = "sdpa",
               max_position_embeddings: int | None = None):
    """The causal LM at `path`; `max_position_embeddings` (model.max_position_embeddings)
    replaces config.json's context when set (layout/shape.py `context_overrides`)."""
    check_weights(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn,
                                                **context_overrides(max_position_embeddings))


def load_model_config(path: str, max_position_embeddings: int | None = None, what: str | None = None):
    """The transformers config of the model at `path`, as `load_model` would build the model:
    with model.max_position_embeddings applied. A config.json transformers cannot read is a
    ModelPathError naming `what` (default `model.path=PATH`)."""
    check_model_dir(path, what)
    try:
        return AutoConfig.from_pretrained(path, **context_overrides(max_position_embeddings))
    except (OSError, ValueError, KeyError) as e:
        raise ModelPathError(f"{what or f'model.path={path!r}'}: config.json cannot be read "
                             f"({' '.join(str(e).split())})") from None


def enable_checkpointing(model) -> None:
    """Activation checkpointing of every decoder layer, non-reentrant (so it composes with FSDP2's
    hooks and with inputs that need no gradient); transformers' own switch, under its current
    name where it has one."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(f"model.gradient_checkpointing=true: {type(model).__name__} does not support it")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.20
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The transformer blocks FSDP shards one by one: the modules whose classes the model lists
    in transformers' `_no_split_modules` (Qwen2DecoderLayer, GPT2Block, ...: the units it keeps
    whole across devices, as accelerate's and verl's FSDP wrap policies read them), the
    outermost only; else any module whose class name ends with DecoderLayer. Empty when neither
    finds one: the root unit then holds the whole model (correct, without the per-layer saving)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found: list[torch.nn.Module] = []
    inside: set[int] = set()  # modules under a block already found
    for m in model.modules():
        if id(m) in inside:
            continue
        if type(m).__name__ in names:
            found.append(m)
            inside.update(id(x) for x in m.modules())
    return found or [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
