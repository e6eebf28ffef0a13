"""Fused ops as torch.library custom ops (namespace `reasonrl_fast`, see csrc/ops.cpp).

    from reasonrl_fast.ops import token_logprob, linear_token_logprob, group_advantage, tb_loss, ZHead, masked_mean
"""

import torch  # noqa: F401  (loads libc10/libtorch, which _C links against, before _C)

from reasonrl_fast import _C  # noqa: F401  (registers torch.ops.reasonrl_fast.*)
from reasonrl_fast.ops.group_advantage import group_advantage
from reasonrl_fast.ops.linear_token_logprob import linear_token_logprob
from reasonrl_fast.ops.masked_mean import masked_mean
from reasonrl_fast.ops.tb_loss import tb_loss
from reasonrl_fast.ops.token_logprob import token_logprob
from reasonrl_fast.ops.zhead import ZHead

__all__ = [
    "token_logprob",
    "linear_token_logprob",
    "group_advantage",
    "tb_loss",
    "ZHead",
    "masked_mean",
]
