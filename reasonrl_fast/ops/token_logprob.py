"""token_logprob: per-token log-probabilities (and entropy) straight from the logits (SPEC.md §1).

One pass over the logits in forward, one in backward, no float32 copy of the [N, V] logits.
"""

from __future__ import annotations

import torch

_op = torch.ops.reasonrl_fast


def token_logprob(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = -100,
    return_entropy: bool = False,
    inplace_backward: bool = False,
):
    """log softmax(logits / temperature)[token_ids], and optionally the entropy of that softmax.

    Args:
        logits: [..., V] floating point (fp32, bf16, fp16 or fp64). Only the last dimension
            must be contiguous: a slice such as ``logits[:, :-1]`` is read in place.
        token_ids: [...] integer ids; entries equal to ``ignore_index`` give 0 and no gradient.
        temperature: divides the logits before the softmax; must be > 0.
        return_entropy: also return the entropy of softmax(logits / temperature) per token.
        inplace_backward: write the gradient over the logits' storage instead of a new
            [N, V] buffer. Only safe when nothing else needs the logits after this op's
            backward (the usual case for an LM head's output).

    Returns:
        logprob [...] in float32 (float64 for float64 logits), and entropy [...] when asked.

    Raises:
        IndexError: a token id outside [0, V) that is not ``ignore_index``.
        ValueError / RuntimeError: a non-positive temperature, mismatched shapes or devices,
            non-floating logits.
    """
    if not isinstance(logits, torch.Tensor) or not isinstance(token_ids, torch.Tensor):
        raise TypeError("token_logprob: logits and token_ids must be tensors")
    if not float(temperature) > 0:
        raise ValueError(f"token_logprob: temperature must be > 0, got {temperature}")
    if logits.device != token_ids.device:
        raise ValueError(
            f"token_logprob: logits and token_ids must be on one device, got {logits.device} and {token_ids.device}"
        )
    if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(token_ids.shape):
        raise ValueError(
            f"token_logprob: token_ids shape {tuple(token_ids.shape)} must equal the logits "
            f"shape {tuple(logits.shape)} without its last (vocabulary) dimension"
        )
    if not logits.is_floating_point():
        raise TypeError(f"token_logprob: logits must be floating point, got {logits.dtype}")
    if token_ids.is_floating_point() or token_ids.dtype == torch.bool:
        raise TypeError(f"token_logprob: token_ids must be integer, got {token_ids.dtype}")
    if inplace_backward:
        lp, ent = _TokenLogprobInplace.apply(
            logits, token_ids, float(temperature), int(ignore_index), return_entropy
        )
    else:
        lp, ent, _ = _op.token_logprob(
            logits, token_ids, float(temperature), int(ignore_index), return_entropy
        )
    return (lp, ent) if return_entropy else lp


@torch.library.register_fake("reasonrl_fast::token_logprob")
def _(logits, target, temperature, ignore_index, compute_entropy):
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    lp = target.new_empty(target.shape, dtype=dtype)
    ent = target.new_empty(target.shape if compute_entropy else (0,), dtype=dtype)
    return lp, ent, target.new_empty(target.shape, dtype=dtype)


@torch.library.register_fake("reasonrl_fast::token_logprob_backward")
def _(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature, ignore_index):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.register_fake("reasonrl_fast::token_logprob_backward_")
def _(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature, ignore_index):
    return None


def _setup_context(ctx, inputs, output):
    logits, target, temperature, ignore_index, _ = inputs
    _, ent, lse = output
    ctx.save_for_backward(logits, target, lse, ent)
    ctx.temperature, ctx.ignore_index = temperature, ignore_index


def _backward(ctx, grad_lp, grad_ent, _grad_lse):
    logits, target, lse, ent = ctx.saved_tensors
    if grad_lp is None:
        grad_lp = torch.zeros_like(lse)
    if ent.numel() != lse.numel():
        grad_ent = None
    grad = _op.token_logprob_backward(
        grad_lp, grad_ent, logits, target, lse, ent, ctx.temperature, ctx.ignore_index
    )
    return grad, None, None, None, None


torch.library.register_autograd(
    "reasonrl_fast::token_logprob", _backward, setup_context=_setup_context
)


class _TokenLogprobInplace(torch.autograd.Function):
    """The same op, with a backward that overwrites the saved logits with their gradient."""

    @staticmethod
    def forward(ctx, logits, target, temperature, ignore_index, compute_entropy):
        lp, ent, lse = _op.token_logprob(logits, target, temperature, ignore_index, compute_entropy)
        ctx.save_for_backward(logits, target, lse, ent)
        ctx.temperature, ctx.ignore_index = temperature, ignore_index
        ctx.mark_non_differentiable(lse)
        return lp, ent

    @staticmethod
    def backward(ctx, grad_lp, grad_ent):
        logits, target, lse, ent = ctx.saved_tensors
        if grad_lp is None:
            grad_lp = torch.zeros_like(lse)
        if ent.numel() != lse.numel():
            grad_ent = None
        _op.token_logprob_backward_(
            grad_lp, grad_ent, logits, target, lse, ent, ctx.temperature, ctx.ignore_index
        )
        return logits, None, None, None, None
