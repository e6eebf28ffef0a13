"""masked_mean: the Z-head's prompt pooling, sum_t x m / sum_t m, as one fused op
(docs/math.md §Masked mean)."""

from __future__ import annotations

import torch

from reasonrl_fast.ops._checks import check_devices, check_kernel_float, check_mask_dtype, value

_op = torch.ops.reasonrl_fast


def masked_mean(hidden_states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of hidden_states [B, T, H] over the positions where mask [B, T] is non-zero.

    The mask may be bool, integer or floating (a float mask weights the positions; weights are
    meant to be non-negative). A row whose mask sums to exactly 0 (as accumulated in float32)
    has no mean: it gives zeros and zero gradient. That covers an empty mask and also weights
    that cancel, such as [1, -1]. Accumulates in float32 and returns the dtype of
    hidden_states; differentiable w.r.t. hidden_states.
    """
    # Shapes, dtypes and devices are checked by the kernels (and the fake implementations).
    return _op.masked_mean(hidden_states, mask)


@torch.library.register_fake("reasonrl_fast::masked_mean")
def _(x, mask):
    value(x.dim() == 3, f"masked_mean: hidden states must be [B, T, H], got shape {tuple(x.shape)}")
    value(mask.shape == x.shape[:2],
          f"masked_mean: mask must be [B, T] = {list(x.shape[:2])}, got shape {tuple(mask.shape)}")
    check_kernel_float("masked_mean", "hidden states", x)
    check_mask_dtype("masked_mean", mask)
    check_devices("masked_mean", x, mask)
    return x.new_empty((x.shape[0], x.shape[2]))


@torch.library.register_fake("reasonrl_fast::masked_mean_backward")
def _(grad, mask):
    op = "masked_mean_backward"
    value(grad.dim() == 2, f"{op}: grad must be [B, H], got shape {tuple(grad.shape)}")
    value(mask.dim() == 2 and mask.shape[0] == grad.shape[0],
          f"{op}: mask must be [B, T] with B = {grad.shape[0]} like grad, got shape {tuple(mask.shape)}")
    check_kernel_float(op, "grad", grad)
    check_mask_dtype(op, mask)
    check_devices(op, grad, mask)
    return grad.new_empty((mask.shape[0], mask.shape[1], grad.shape[1]))


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _backward(ctx, grad):
    (mask,) = ctx.saved_tensors
    return _op.masked_mean_backward(grad, mask), None


torch.library.register_autograd("reasonrl_fast::masked_mean", _backward, setup_context=_setup_context)
