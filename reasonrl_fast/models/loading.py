"""Loading a model and its tokenizer from a local Hugging Face directory (nothing is downloaded)."""

from __future__ import annotations

import importlib.util
import json
import os

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from reasonrl_fast.errors import ConfigError, UserError
from reasonrl_fast.models.shape import context_overrides


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


def master_dtype(setting: str) -> torch.dtype:
    """`model.dtype` as a torch dtype: the weights a model loads in, and in the trainer the master
    weights' (so AdamW's states'); "auto" is float32."""
    return torch.bfloat16 if setting == "bfloat16" else torch.float32


def load_model(path: str, dtype: torch.dtype = torch.float32, attn: str = "sdpa",
               max_position_embeddings: int | None = None):
    """The causal LM at `path`; `max_position_embeddings` (model.max_position_embeddings)
    replaces config.json's context when set (models/shape.py `context_overrides`)."""
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


def attention_implementation(device: torch.device, dtype: torch.dtype) -> tuple[str, str]:
    """(transformers' attn_implementation, a log line saying which and why). flash-attn (the
    optional `[gpu]` extra) where it can run: on CUDA when the forward computes in bf16 (`dtype`:
    trainer/fsdp.py `compute_dtype`; it has no float32 kernels). Float32 master weights under
    FSDP2 compute in bf16, and the reference model and the sampler's copy are held in bf16 then;
    a single worker without FSDP computes in its weights' dtype. Packed rows then go through its
    variable-length kernels; sdpa reads them through a block-diagonal mask instead."""
    if device.type != "cuda":
        return "sdpa", "attention: sdpa"
    if importlib.util.find_spec("flash_attn") is None:
        return "sdpa", "attention: sdpa (flash-attn is not installed: pip install 'reasonrl_fast[gpu]')"
    if dtype != torch.bfloat16:
        return "sdpa", (f"attention: sdpa (flash-attn needs bf16 compute; this worker computes in {dtype}: "
                        "bf16 compute over float32 master weights is FSDP2's, trainer.sharding=fsdp)")
    return "flash_attention_2", "attention: flash_attention_2 (packed rows through flash-attn's variable-length kernels)"


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


PACKED_FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
"""Model types whose attention reads packed rows from restarting position ids (transformers'
masks for sdpa and eager, flash-attn's variable-length boundaries), checked against the padded
forward in tests/trainer/test_packing.py."""


def config_packing_blocker(c) -> str | None:
    """What in the model's config (a transformers config) rules packing out, or None: the part
    of `packing_blocker` the preflight can judge before any model is loaded."""
    if c.model_type not in PACKED_FAMILIES:
        return f"model_type {c.model_type!r} is not one of {PACKED_FAMILIES}"
    if any(t != "full_attention" for t in (getattr(c, "layer_types", None) or [])) or \
            (c.model_type == "mistral" and getattr(c, "sliding_window", None)):
        return "sliding-window attention"
    return None


def packing_refusal(blocker: str) -> ConfigError:
    """data.packing=true on a model that cannot pack: one line, the same in preflight and worker."""
    return ConfigError(f"data.packing=true: {blocker}; packed rows are not read right by this model "
                       f"(set data.packing=auto or false)")


def packing_blocker(model) -> str | None:
    """Why a micro-batch of `model` cannot run as one packed row, or None when it can."""
    c = model.config
    blocker = config_packing_blocker(c)
    if blocker:
        return blocker
    impl = getattr(c, "_attn_implementation", None)
    if impl not in ("sdpa", "eager", "flash_attention_2", "flash_attention_3"):
        return f"attention implementation {impl!r}"
    return None


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
