"""ZHead: FlowRL's learned log-partition function log Z(x) (docs/math.md §Z-head)."""

from __future__ import annotations

import torch
from torch import nn

from reasonrl_fast.ops.masked_mean import masked_mean


POOLINGS = ("all", "published")
"""The prompt positions log Z pools: all of them (SPEC §5), or all but the last (published:
verl's FlowRL actors average positions 0..P-2, `full_last_hidden[:, :-response_length - 1]`)."""


def without_last_token(prompt_mask: torch.Tensor) -> torch.Tensor:
    """`prompt_mask` [B, T] without each row's last marked position, where the row marks more than
    one: a one-token prompt keeps its token (verl's mean over no position would be 0 / 0)."""
    m = prompt_mask.bool()
    count = m.sum(-1, keepdim=True)
    last = m & (m.cumsum(-1) == count)
    return (m & ~(last & (count > 1))).to(prompt_mask.dtype)


class ZHead(nn.Module):
    """log Z = MLP(mean of the last-layer hidden states over the prompt tokens).

    ``net`` is ``(num_layers - 1) x [Linear(H, H), GELU, LayerNorm(H), Dropout] + Linear(H, 1)``,
    so state_dict keys are ``net.0.weight``, ``net.0.bias``, ``net.2.weight``, ... and verl's
    FlowRL ``proj_z.*`` tensors load as they are. The pooled states are not
    detached: the TB loss trains the backbone through log Z too.
    """

    def __init__(self, hidden_size: int, num_layers: int = 3, dropout: float = 0.1, pooling: str = "all"):
        super().__init__()
        if hidden_size < 1 or num_layers < 1:
            raise ValueError(f"ZHead: hidden_size and num_layers must be >= 1, got {hidden_size}, {num_layers}")
        if pooling not in POOLINGS:
            raise ValueError(f"ZHead: pooling={pooling!r}, expected one of {POOLINGS}")
        self.pooling = pooling
        layers: list[nn.Module] = []
        for _ in range(num_layers - 1):
            layers += [nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size), nn.Dropout(dropout)]
        layers.append(nn.Linear(hidden_size, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, hidden_states: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """hidden_states [B, T, H], prompt_mask [B, T] -> log Z [B] (in the head's dtype)."""
        return self.from_pooled(masked_mean(hidden_states, self.pooled_positions(prompt_mask)))

    def pooled_positions(self, prompt_mask: torch.Tensor) -> torch.Tensor:
        """The positions of `prompt_mask` [B, T] that the mean pools."""
        return without_last_token(prompt_mask) if self.pooling == "published" else prompt_mask

    def from_pooled(self, pooled: torch.Tensor, own_gradient: bool = True) -> torch.Tensor:
        """log Z [B] of the pooled states [B, H]. `own_gradient=False`: the same values and the
        gradient to `pooled`, but a zero one to this head's parameters (a rank of a
        sequence-parallel group that is not the one whose parameters count the head's gradient;
        zero rather than none, so that every rank reduces the same gradients)."""
        x = pooled.to(self.net[0].weight.dtype)
        if own_gradient:
            return self.net(x).squeeze(-1)
        held = {n: p.detach() + 0 * p for n, p in self.net.named_parameters()}
        return torch.func.functional_call(self.net, held, (x,)).squeeze(-1)
