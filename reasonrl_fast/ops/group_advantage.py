"""group_advantage: GRPO's per-group reward normalisation in one kernel
(docs/math.md §Group advantage)."""

from __future__ import annotations

import torch

from reasonrl_fast.ops._checks import check_devices, check_kernel_float, dtype, value

_op = torch.ops.reasonrl_fast


def group_advantage(
    rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """A[b] = (r[b] - mean of its group) / (unbiased std of its group + eps).

    Args:
        rewards: [B] floating point, one scalar per response.
        group_ids: [B] integer; responses with the same id form a group (e.g. the prompt
            index). Groups need not be contiguous or of equal size.
        eps: added to the std.
        norm_by_std: False gives Dr.GRPO's r - mean.

    A group of one response uses mean 0 and std 1 (verl's convention).
    Returns float32 [B]. Not differentiable (rewards are data, not parameters).
    """
    # Shapes, dtypes, devices and eps are checked by the kernels (and the fake implementation).
    return _op.group_advantage(rewards, group_ids, float(eps), bool(norm_by_std))


def check_inputs(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float) -> None:
    """The op's checks and messages (the C++ kernels' check_group_advantage): its fake
    implementation runs them, and so does the Triton kernel (ops/triton/group_advantage.py).
    Conditions through torch._check_*: they hold for symbolic shapes too."""
    b = rewards.shape[0] if rewards.dim() else None
    value(rewards.dim() == 1, f"group_advantage: rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    value(group_ids.dim() == 1 and group_ids.shape[0] == b, f"group_advantage: group_ids must be 1-D [B] "
          f"with one id per reward (B = {b}), got shape {tuple(group_ids.shape)}")
    check_kernel_float("group_advantage", "rewards", rewards)
    gdt = group_ids.dtype
    dtype(not (gdt.is_floating_point or gdt.is_complex or gdt == torch.bool),
          f"group_advantage: group_ids must be an integer tensor, got {gdt}")
    value(eps >= 0, f"group_advantage: eps must be >= 0, got {eps}")
    check_devices("group_advantage", rewards, group_ids)


@torch.library.register_fake("reasonrl_fast::group_advantage")
def _(rewards, group_ids, eps, norm_by_std):
    check_inputs(rewards, group_ids, eps)
    return rewards.new_empty(rewards.shape, dtype=torch.float32)
