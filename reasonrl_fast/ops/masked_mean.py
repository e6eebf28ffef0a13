"""masked_mean: the Z-head's prompt pooling, sum_t x m / sum_t m, as one fused op (SPEC.md §5)."""

from __future__ import annotations

import torch

_op = torch.ops.reasonrl_fast


def masked_mean(hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of hidden_states [B, T, H] over the positions where mask [B, T] is non-zero.

    The mask may be bool, integer or floating (a float mask weights the positions). A row
    with an empty mask gives zeros (and zero gradient). Accumulates in float32 and returns the
    dtype of hidden_states; differentiable w.r.t. hidden_states.
    """
    if hidden_states.device != mask.device:
        raise ValueError(
            f"masked_mean: hidden_states are on {hidden_states.device} but mask on {mask.device}"
        )
    if hidden_states.dim() != 3:
        raise ValueError(f"masked_mean: hidden_states must be [B, T, H], got {tuple(hidden_states.shape)}")
    if tuple(mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(
            f"masked_mean: mask must be [B, T] = {tuple(hidden_states.shape[:2])}, got {tuple(mask.shape)}"
        )
    if not hidden_states.is_floating_point():
        raise TypeError(f"masked_mean: hidden_states must be floating point, got {hidden_states.dtype}")
    return _op.masked_mean(hidden_states, mask)


@torch.library.register_fake("reasonrl_fast::masked_mean")
def _(x, mask):
    return x.new_empty((x.shape[0], x.shape[2]))


@torch.library.register_fake("reasonrl_fast::masked_mean_backward")
def _(grad, mask):
    return grad.new_empty((mask.shape[0], mask.shape[1], grad.shape[1]))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _backward(ctx, grad):
    (mask,) = ctx.saved_tensors
    return _op.masked_mean_backward(grad, mask), None


torch.library.register_autograd("reasonrl_fast::masked_mean", _backward, setup_context=_setup_context)
