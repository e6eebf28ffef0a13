"""The parts of a causal LM the trainer reads (its decoder and output layer), and what in a built
model keeps the fused LM head (`model.fused_lm_head`) off; layout/ makes the decision.

Fused: `linear_token_logprob(h, lm_head.weight, ids)` turns the final hidden states into
log-probs and entropies without the [tokens, vocabulary] logits. That is exact only when the
model's logits are `h @ lm_head.weight.T`: `head_blocker` names what would make them anything
else, and the trainer then keeps the unfused path (docs/trainer.md lists the checks).
"""

from __future__ import annotations

import torch
from torch import nn

from reasonrl_fast.errors import ConfigError
from reasonrl_fast.layout import config_head_blocker, refuse_fused_head


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
    return config_head_blocker(lm.config) if getattr(lm, "config", None) is not None else None


def meta_model(config) -> nn.Module:
    """The causal LM of a Hugging Face config built on the meta device: its modules, no weights,
    no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def check_model(setting: str, config) -> None:
    """Driver-side check before any worker starts: builds the model on the meta device, refuses a
    model the trainer cannot train (`check_trainable`), and with model.fused_lm_head `setting`
    'true' a head that is not plain (`head_blocker`, refused by the workers' own rule,
    layout/resolve.py `refuse_fused_head`). ConfigError for either; what `auto` then does is the
    workers' `fused_head`, logged by them."""
    lm = meta_model(config)
    check_trainable(lm)
    refuse_fused_head(setting, head_blocker(lm))
