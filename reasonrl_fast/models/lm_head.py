"""Whether the trainer computes log-probs with the fused LM head (`model.fused_lm_head`).

Fused: `linear_token_logprob(h, lm_head.weight, ids)` turns the final hidden states into
log-probs and entropies without the [tokens, vocabulary] logits. That is exact only when the
model's logits are `h @ lm_head.weight.T`: `head_blocker` names what would make them anything
else, and the trainer then keeps the unfused path (docs/trainer.md lists the checks).
"""

from __future__ import annotations

import torch
from torch import nn

from reasonrl_fast.errors import ConfigError

# CPU only: `auto` fuses when one forward's response tokens x vocabulary reach this (2^27, 512 MiB
# of float32 logits). Read off benchmarks/bench_fused_lm_head.py's measurements of the update's
# forward + backward (benchmarks/RESULTS.md §7): on CPU the fused op was never clearly faster, as
# it forms the logits twice (forward and backward). What it buys is memory, several times less
# peak where the logits are large, for somewhat more time; where they are small it saves nothing
# and costs time. The embedded default (2,048 x 99 = 0.2 M) stays unfused.
FUSED_CPU_MIN_ELEMENTS = 1 << 27

# Config attributes (of the model's config or its text config) that change the logits after
# the head. A value of None, or 1 for the scale factors, leaves them alone.
_SOFTCAP = ("final_logit_softcapping",)  # Gemma 2/3/4, VaultGemma, ...
_SCALES = ("logit_scale",         # Cohere, Cohere2
           "logits_scaling",      # Granite family, MiniCPM3, HyperCLOVA X
           "lm_head_multiplier",  # Falcon-H1
           "output_multiplier")


def parse_setting(value, key: str = "model.fused_lm_head") -> str:
    """'auto', 'true' or 'false' from the config value of `key` (YAML booleans included)."""
    v = str(value).strip().lower()
    if v not in ("auto", "true", "false"):
        raise ConfigError(f"{key}={value!r}: must be auto, true or false")
    return v


def _configs(lm: nn.Module) -> list:
    cfg = getattr(lm, "config", None)
    if cfg is None:
        return []
    out = [cfg]
    get_text = getattr(cfg, "get_text_config", None)
    if callable(get_text):
        text = get_text()
        if text is not None and text is not cfg:
            out.append(text)
    return out


def decoder_of(lm: nn.Module) -> nn.Module | None:
    """The causal LM's decoder: the base model whose output's `last_hidden_state` is what the
    head reads (after the last norm). Found through transformers' own API, so any layout works
    (Llama's `model`, GPT-2's `transformer`, a multimodal model's `language_model`):
    `get_decoder()`, else the sub-module `base_model_prefix` names. None when neither gives a
    sub-module (get_decoder returns the model itself when it finds nothing)."""
    found = None
    get = getattr(lm, "get_decoder", None)
    if callable(get):
        try:
            found = get()
        except (AttributeError, NotImplementedError, ValueError, TypeError):
            found = None
    if not isinstance(found, nn.Module) or found is lm:
        prefix = getattr(lm, "base_model_prefix", "") or ""
        found = getattr(lm, prefix, None) if prefix else None
    return found if isinstance(found, nn.Module) and found is not lm else None


def head_of(lm: nn.Module) -> nn.Module | None:
    """The causal LM's output layer (transformers' `get_output_embeddings()`, `lm_head` for most
    models), or None."""
    get = getattr(lm, "get_output_embeddings", None)
    try:
        head = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        head = None
    return head if isinstance(head, nn.Module) else None


def trainable_blocker(lm: nn.Module) -> str | None:
    """Why the trainer cannot train `lm` (None: it can): it reads the final hidden states from
    the decoder (fused head, Z-head) and runs the output layer on the positions it needs."""
    name = type(lm).__name__
    if head_of(lm) is None:
        return f"{name} has no output layer (get_output_embeddings() gives none): not a causal LM with a head"
    if decoder_of(lm) is None:
        prefix = getattr(lm, "base_model_prefix", "") or ""
        return (f"{name} exposes no decoder: get_decoder() gives the model itself and base_model_prefix "
                f"{prefix!r} names no sub-module, so its final hidden states cannot be read")
    return None


def check_trainable(lm: nn.Module, what: str = "model.path") -> None:
    """ConfigError (one line, naming the model class and what it lacks) for a model the trainer
    cannot train; checked on the meta device before Ray starts, and by the trainer's Actor."""
    blocker = trainable_blocker(lm)
    if blocker is not None:
        raise ConfigError(f"{what}: the trainer cannot train this model: {blocker}")


def head_blocker(lm: nn.Module) -> str | None:
    """Why `lm`'s logits are not `final hidden @ head.weight.T` (None: they are)."""
    untrainable = trainable_blocker(lm)
    if untrainable is not None:
        return untrainable
    head = head_of(lm)
    if type(head) is not nn.Linear:  # a subclass (quantised, ...) may compute something else
        return f"the output layer is a {type(head).__name__}, not a plain nn.Linear"
    if head.bias is not None:
        return "the output layer has a bias"
    for c in _configs(lm):
        for key in _SOFTCAP:
            if getattr(c, key, None) is not None:
                return f"config.{key}={getattr(c, key)} soft-caps the logits"
        for key in _SCALES:
            v = getattr(c, key, None)
            if v is not None and float(v) != 1.0:
                return f"config.{key}={v} scales the logits"
    return None


def _refusal(blocker: str) -> ConfigError:
    return ConfigError(f"model.fused_lm_head=true, but {blocker}: the fused head computes "
                       f"hidden @ lm_head.weight.T only; use model.fused_lm_head=auto or false")


def use_fused(setting: str, lm: nn.Module, device: torch.device, tokens: int) -> tuple[bool, str]:
    """(fuse?, one line saying why). `tokens`: the most response tokens one forward sees.

    Raises ConfigError when `setting` is 'true' and the head is not a plain linear layer."""
    setting = parse_setting(setting)
    if setting == "false":
        return False, "fused LM head off (model.fused_lm_head=false)"
    blocker = head_blocker(lm)
    if blocker is not None:
        if setting == "true":
            raise _refusal(blocker)
        return False, f"fused LM head off: {blocker} (logits from the model's own forward)"
    if setting == "true":
        return True, "fused LM head on (model.fused_lm_head=true)"
    if device.type != "cpu":
        return True, f"fused LM head on (auto: {device.type})"
    vocab = head_of(lm).weight.shape[0]
    elements = tokens * vocab
    if elements >= FUSED_CPU_MIN_ELEMENTS:
        return True, f"fused LM head on (auto: {tokens} tokens x {vocab} vocabulary on CPU)"
    return False, (f"fused LM head off (auto: {tokens} tokens x {vocab} vocabulary = {elements} "
                   f"< {FUSED_CPU_MIN_ELEMENTS} on CPU)")


def check_model(setting: str, config) -> str | None:
    """Driver-side check before any worker starts: builds the model on the meta device from its
    Hugging Face config (no weights, no memory), refuses a model the trainer cannot train
    (`check_trainable`) and applies `head_blocker`. Raises ConfigError for those and, for 'true',
    a head that is not plain; returns the fallback line for 'auto', else None."""
    setting = parse_setting(setting)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    check_trainable(lm)
    if setting == "false":
        return None
    blocker = head_blocker(lm)
    if blocker is not None and setting == "true":
        raise _refusal(blocker)
    if blocker is None:
        return None
    return f"fused LM head off: {blocker} (logits from the model's own forward)"
