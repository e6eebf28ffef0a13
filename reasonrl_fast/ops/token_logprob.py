"""token_logprob: per-token log-probabilities (and entropy) straight from the logits
(docs/math.md §Token log-prob and entropy).

One pass over the logits in forward, one in backward, no float32 copy of the [N, V] logits.
"""

from __future__ import annotations

import math

import torch

from reasonrl_fast.ops._checks import acc_dtype

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
            backward (the usual case for an LM head's output); an op that saved them for its
            own backward fails with autograd's "modified by an inplace operation" error.

    Returns:
        logprob [...] in float32 (float64 for float64 logits), and entropy [...] when asked.

    Raises:
        IndexError: a token id outside [0, V) that is not ``ignore_index``. On CUDA it fails a
            device-side assertion instead, a RuntimeError at the next synchronisation.
        ValueError: a temperature <= 0 (or so small that 1/temperature overflows float32),
            mismatched shapes or devices, ``inplace_backward`` on logits whose elements share
            memory (e.g. ``expand()``).
        TypeError: non-floating logits, non-integer ids.
    """
    # The op checks everything else itself (kernels and fake implementations alike).
    if not isinstance(logits, torch.Tensor) or not isinstance(token_ids, torch.Tensor):
        raise TypeError("token_logprob: logits and token_ids must be tensors")
    if inplace_backward:
        _check_no_self_overlap(logits)  # here, so the user learns before the forward runs
        lp, ent = _TokenLogprobInplace.apply(
            logits, token_ids, float(temperature), int(ignore_index), return_entropy
        )
    else:
        lp, ent, _ = _op.token_logprob(
            logits, token_ids, float(temperature), int(ignore_index), return_entropy
        )
    return (lp, ent) if return_entropy else lp


def _check_no_self_overlap(logits):
    """The in-place backward writes one gradient per element: no two may share memory. The rule
    of the kernel's check (csrc/checks.h): by increasing stride, each stride is at least the
    span of the smaller ones."""
    span = 1
    for stride, size in sorted((st, sz) for st, sz in zip(logits.stride(), logits.shape) if sz > 1):
        if stride < span and logits.numel() > 0:
            raise ValueError(
                f"token_logprob: inplace_backward needs logits whose elements do not share memory "
                f"(shape {tuple(logits.shape)}, strides {logits.stride()}); pass a contiguous "
                f"copy or use inplace_backward=False"
            )
        span += (size - 1) * stride


def _fake_check(logits, target, temperature):
    """check_token_logprob (csrc/checks.h), for tracing: same conditions, same error types."""
    torch._check_value(logits.dim() >= 1, lambda: "token_logprob: logits must have a vocabulary dimension")
    torch._check_type(logits.is_floating_point(),
                      lambda: f"token_logprob: logits must be floating point, got {logits.dtype}")
    torch._check_type(
        not (target.is_floating_point() or target.is_complex() or target.dtype == torch.bool),
        lambda: f"token_logprob: target ids must be an integer tensor, got {target.dtype}",
    )
    torch._check_value(
        tuple(target.shape) == tuple(logits.shape[:-1]),
        lambda: f"token_logprob: target shape {tuple(target.shape)} must equal the logits shape "
        f"without its last dimension {tuple(logits.shape)}",
    )
    min_t = torch.finfo(acc_dtype(logits.dtype)).tiny
    torch._check_value(
        math.isfinite(temperature) and temperature >= min_t,
        lambda: f"token_logprob: temperature must be a positive finite number of at least {min_t} "
        f"for {acc_dtype(logits.dtype)} accumulation, got {temperature}",
    )
    torch._check_value(logits.shape[-1] != 0 or target.numel() == 0,
                       lambda: "token_logprob: the vocabulary dimension is empty")
    torch._check_value(target.device == logits.device,
                       lambda: f"token_logprob: target and logits must be on one device, got "
                       f"target on {target.device} and logits on {logits.device}")


def _fake_check_backward(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature):
    """check_token_logprob_backward (csrc/checks.h), for tracing."""
    _fake_check(logits, target, temperature)
    acc = acc_dtype(logits.dtype)

    def like_target(t, name, exact_dtype):
        torch._check_value(
            tuple(t.shape) == tuple(target.shape),
            lambda: f"token_logprob_backward: {name} must have the target's shape "
            f"{tuple(target.shape)}, got {tuple(t.shape)}",
        )
        torch._check_value(t.device == logits.device,
                           lambda: f"token_logprob_backward: {name} must be on the logits' "
                           f"device {logits.device}, got {t.device}")
        ok = t.dtype == acc if exact_dtype else t.is_floating_point()
        torch._check_type(ok, lambda: f"token_logprob_backward: {name} has the wrong dtype {t.dtype}")

    like_target(grad_logprob, "grad_logprob", False)
    like_target(lse, "lse", True)
    if grad_entropy is not None:
        like_target(grad_entropy, "grad_entropy", False)
        like_target(entropy, "entropy (needed by an entropy gradient)", True)
    else:
        torch._check_value(entropy.device == logits.device,
                           lambda: f"token_logprob_backward: entropy must be on the logits' "
                           f"device {logits.device}, got {entropy.device}")


@torch.library.register_fake("reasonrl_fast::token_logprob")
def _(logits, target, temperature, ignore_index, compute_entropy):
    _fake_check(logits, target, temperature)
    dtype = acc_dtype(logits.dtype)
    lp = target.new_empty(target.shape, dtype=dtype)
    ent = target.new_empty(target.shape if compute_entropy else (0,), dtype=dtype)
    return lp, ent, target.new_empty(target.shape, dtype=dtype)


@torch.library.register_fake("reasonrl_fast::token_logprob_backward")
def _(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature, ignore_index):
    _fake_check_backward(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@torch.library.register_fake("reasonrl_fast::token_logprob_backward_")
def _(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature, ignore_index):
    _fake_check_backward(grad_logprob, grad_entropy, logits, target, lse, entropy, temperature)
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
        # The logits now hold their gradient, and the op has bumped their version counter
        # (csrc/ops.cpp): another op that saved them (z ** 3 before this one) fails with
        # autograd's "modified by an inplace operation" error instead of differentiating it.
        return logits, None, None, None, None
