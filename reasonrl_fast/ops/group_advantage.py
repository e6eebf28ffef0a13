"""group_advantage: GRPO's per-group reward normalisation in one kernel (SPEC.md §2)."""

from __future__ import annotations

import torch

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

    A group of one response uses mean 0 and std 1 (the reference trainer's convention).
    Returns float32 [B]. Not differentiable (rewards are data, not parameters).
    """
    if rewards.device != group_ids.device:
        raise ValueError(
            f"group_advantage: rewards are on {rewards.device} but group_ids on {group_ids.device}"
        )
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"group_advantage: rewards and group_ids must both be [B], got "
            f"{tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )
    if not rewards.is_floating_point():
        raise TypeError(f"group_advantage: rewards must be floating point, got {rewards.dtype}")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise TypeError(f"group_advantage: group_ids must be integer, got {group_ids.dtype}")
    if eps < 0:
        raise ValueError(f"group_advantage: eps must be >= 0, got {eps}")
    return _op.group_advantage(rewards, group_ids, float(eps), bool(norm_by_std))


@torch.library.register_fake("reasonrl_fast::group_advantage")
def _(rewards, group_ids, eps, norm_by_std):
    return rewards.new_empty(rewards.shape, dtype=torch.float32)
